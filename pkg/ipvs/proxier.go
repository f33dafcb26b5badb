// The IPVS mode's syncer: its configuration, state and the two syncs.
// What a sync sends is decided in diff.go, sent in ops.go and checked
// against the kernel in drift.go; draining is in drain.go.

package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Config are the IPVS mode's inputs.
type Config struct {
	Family   v1.IPFamily
	Kernel   ipvskernel.Interface
	IPTables iptables.Kernel
	Params   Params
	// NodePortAddresses picks the addresses NodePorts answer on from the
	// node's addresses (all of them unless nodePortAddresses says
	// otherwise).
	NodePortAddresses func(node []netip.Addr) []netip.Addr
	// ExcludeCIDRs hold virtual servers of other programs, which are never
	// deleted.
	ExcludeCIDRs []netip.Prefix
	// MaxDrain bounds how long a removed TCP real server keeps its
	// connections (at weight 0) before it is deleted anyway.
	MaxDrain time.Duration
	// DrainCheckInterval is how often draining real servers are checked;
	// 0 means every 10 s.
	DrainCheckInterval time.Duration
	// CheckInterval is how often the kernel is checked for other
	// programs' changes; 0 means every second. The check's listings of
	// every real server and address are spaced by a hundred times their
	// CPU time if that is longer (many services; see Watch).
	CheckInterval time.Duration
}

// DefaultCheckInterval lets a repair of rules another program changed
// land within about 2 s: a second to notice, then a full sync.
const DefaultCheckInterval = time.Second

// DefaultMaxDrain is upstream's former bound on graceful termination.
const DefaultMaxDrain = 15 * time.Minute

// The optional capabilities of the mode contract (pkg/proxy/mode.go) this
// mode has.
var (
	_ proxy.Describer      = (*Syncer)(nil)
	_ proxy.Preparer       = (*Syncer)(nil)
	_ proxy.Watcher        = (*Syncer)(nil)
	_ proxy.Tracer         = (*Syncer)(nil)
	_ proxy.FailureCounter = (*Syncer)(nil)
)

// Syncer is the IPVS mode for one IP family: the proxy core hands it the
// state, and it changes only the virtual servers, real servers, addresses
// and set entries of the service ports that changed. Each sync reads what
// it needs from the kernel, decides a plan (diff.go), applies it (ops.go)
// and publishes what it applied for the drift check (drift.go), which
// never takes the sync's lock.
type Syncer struct {
	cfg    Config
	chains *iptables.ChainSet

	// mu serializes the syncs with the drain checks.
	mu sync.Mutex
	// applied is what each service port has in the kernel now, and
	// objects what all of them have together.
	applied map[state.ServicePortName]ServiceObjects
	objects objectCounts
	addrs   Addresses
	// draining are real servers at weight 0, deleted once their
	// connections end or their time is up.
	draining map[drainKey]time.Time
	now      func() time.Time
	// limits are the hash sets' maxelem (the bitmap:port sets cannot
	// overflow), and left what the last sync left out of full sets.
	limits map[string]int
	left   error
	// prepared is the kernel as Prepare read it, for the first full sync.
	prepared *preparedKernel
	// last is the last snapshot made, which the next one is made from.
	last *appliedSnapshot
	// kernelState is what the syncs know of the kernel, with the
	// snapshot the drift check reads; jump is the drift check's own.
	kernelState kernelState
	jump        jumpCache
}

type drainKey struct {
	server ipvskernel.VirtualServerKey
	real   netip.AddrPort
}

// New returns the IPVS mode; proxy.NewCore runs it.
func New(cfg Config) *Syncer {
	if cfg.MaxDrain == 0 {
		cfg.MaxDrain = DefaultMaxDrain
	}
	if cfg.DrainCheckInterval == 0 {
		cfg.DrainCheckInterval = 10 * time.Second
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	metrics.IPVSRepairsTotal.WithLabelValues(string(cfg.Family))
	metrics.IPTablesRestoreFailuresTotal.WithLabelValues(string(cfg.Family))
	limits := map[string]int{}
	for _, s := range cfg.Params.Sets() {
		if s.Limit() > 0 {
			limits[s.Name] = s.Limit()
		}
	}
	return &Syncer{
		cfg:      cfg,
		chains:   iptables.NewChainSet(cfg.IPTables),
		applied:  map[state.ServicePortName]ServiceObjects{},
		objects:  newObjectCounts(),
		draining: map[drainKey]time.Time{},
		now:      time.Now,
		limits:   limits,
	}
}

// readAddresses reads the node's addresses.
func (p *Syncer) readAddresses() (Addresses, error) {
	node, err := p.cfg.Kernel.NodeAddresses()
	if err != nil {
		return Addresses{}, fmt.Errorf("listing the node's addresses: %w", err)
	}
	slices.SortFunc(node, netip.Addr.Compare)
	return Addresses{Node: node, NodePort: p.cfg.NodePortAddresses(node)}, nil
}

// objectsFor decides one service port's objects; none when it is gone.
func (p *Syncer) objectsFor(v state.View, name state.ServicePortName) ServiceObjects {
	svc, sel, ok := v.Select(name)
	if !ok {
		return ServiceObjects{}
	}
	return p.cfg.Params.ServiceObjects(svc, v.Endpoints[name], sel, p.addrs)
}

// PartialSync changes what the changed service ports own, trusting that
// the kernel holds what the last sync wrote.
func (p *Syncer) PartialSync(v state.View, changed map[state.ServicePortName]bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	addrs, err := p.readAddresses()
	if err != nil {
		return err
	}
	// New node addresses change every NodePort's virtual servers.
	if !slices.Equal(addrs.Node, p.addrs.Node) {
		return proxy.ErrFullSyncNeeded
	}
	wanted := make(map[state.ServicePortName]ServiceObjects, len(changed))
	for name := range changed {
		wanted[name] = p.objectsFor(v, name)
	}
	listed, err := p.readReals(wanted)
	if err != nil {
		return err
	}
	d := p.newDiff(nil, listed)
	for _, name := range slices.SortedFunc(maps.Keys(changed), state.ServicePortName.Compare) {
		d.replace(name, p.applied[name], wanted[name])
	}
	return p.run(d, false)
}

// FullSync reads the kernel once and writes what differs from the whole
// state: a restart over rules in place (ours or upstream's) writes
// nothing but what changed while no one was watching.
func (p *Syncer) FullSync(v state.View) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.fullSync(v)
	if repaired := p.kernelState.fullSyncEnded(err); repaired != nil {
		klog.InfoS("Restored the IPVS mode's kernel state another program had changed", "ipFamily", p.cfg.Family, "found", *repaired)
		metrics.IPVSRepairsTotal.WithLabelValues(string(p.cfg.Family)).Inc()
	}
	return err
}

func (p *Syncer) fullSync(v state.View) error {
	k := p.cfg.Kernel
	if err := k.EnsureDummyLink(); err != nil {
		return fmt.Errorf("creating %s: %w", ipvskernel.DummyLink, err)
	}
	if err := k.EnsureSets(p.cfg.Params.Sets()); err != nil {
		return fmt.Errorf("creating the ipsets: %w", err)
	}
	addrs, err := p.readAddresses()
	if err != nil {
		return err
	}
	p.addrs = addrs
	current := p.takePrepared()
	if current == nil {
		if current, err = p.readKernel(); err != nil {
			return err
		}
	}
	// Everything is written against what the kernel holds: the diff
	// starts from no applied objects and no counts. It reads neither the
	// old ones, which go now rather than at commit, so that they are not
	// held beside the next ones at the sync's peak.
	p.applied, p.objects = nil, objectCounts{}
	d := p.newDiff(current, current.reals)
	if len(current.servers) == 0 {
		// Into an empty kernel: a virtual server and an address per
		// service port, at least; sized once, the plan leaves no copies
		// behind. Over rules in place the plan is small.
		d.plan.steps = make([]op, 0, 2*len(v.Services))
	}
	for _, name := range slices.SortedFunc(maps.Keys(v.Services), state.ServicePortName.Compare) {
		d.replace(name, ServiceObjects{}, p.objectsFor(v, name))
	}
	return p.run(d, true)
}

// run ends a sync: it publishes the snapshot of what the diff decided as
// unsettled (a drift check leaves out what it changes), applies the
// plan, commits the state it leads to, then publishes that settled. A
// failed full sync withdraws it (kernelState.fullSyncEnded): the kernel
// holds an unknown part of it.
func (p *Syncer) run(d *diff, full bool) error {
	pl := d.finish(full)
	p.kernelState.publish(pl.next.snapshot, full)
	err := p.apply(pl)
	// Committed even when apply failed: a partial sync's failure leads to
	// a full sync, which reads the kernel, and until then the counts are
	// what the syncs meant to write.
	p.kernelState.publish(p.commit(pl.next), full)
	return err
}

// syncResult is the syncer's state after a sync, as its diff decided it.
type syncResult struct {
	applied mapEdit[state.ServicePortName, ServiceObjects]
	counts  countsEdit
	// snapshot is the next snapshot, unsettled; left what the sync left
	// out of full sets.
	snapshot *appliedSnapshot
	left     error
}

// commit makes r the syncer's state, and returns the snapshot it settles
// on. It is the one writer of applied, objects, left and last, but for
// a full sync dropping applied and objects before it plans.
func (p *Syncer) commit(r syncResult) *appliedSnapshot {
	p.applied = r.applied.done()
	p.objects = r.counts.done()
	if p.left = r.left; p.left != nil {
		klog.ErrorS(p.left, "Set entries left out: the service ports named may not work until their set has room", "ipFamily", p.cfg.Family)
	}
	settled := *r.snapshot
	settled.settled = true
	p.last = &settled
	return &settled
}

// restoreError is a sync's failed iptables-restore, the one failure of
// the IPVS mode that upstream's metric counts.
type restoreError struct{ error }

func (e restoreError) Unwrap() error { return e.error }

// CountFailure counts a failed sync whose iptables-restore failed, as
// upstream's IPVS mode does.
func (p *Syncer) CountFailure(_ bool, err error) {
	if errors.As(err, new(restoreError)) {
		metrics.IPTablesRestoreFailuresTotal.WithLabelValues(string(p.cfg.Family)).Inc()
	}
}

// LeftOut tells which set entries the last sync left out because their
// set was full (the service ports wanting them are only partly
// programmed), nil if none.
func (p *Syncer) LeftOut() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.left
}

// excluded says whether a is in one of the CIDRs of other programs'
// virtual servers.
func excluded(cidrs []netip.Prefix, a netip.Addr) bool {
	for _, c := range cidrs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}
