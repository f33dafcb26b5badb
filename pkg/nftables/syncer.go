package nftables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/localnodeport"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Config are the nftables mode's inputs for one IP family.
type Config struct {
	Family v1.IPFamily
	// Kernel reads and writes the family's table: NewKernel, or a Fake.
	Kernel Kernel
	Params Params
	// LocalhostProxy, when set (Params.LocalhostNodePorts is
	// LocalhostNodePortsProxy), serves TCP NodePorts on the loopback
	// address: told the NodePorts and their endpoints after each
	// successful sync, as upstream's proxier tells its proxy.
	LocalhostProxy LocalhostProxy
}

// LocalhostProxy is the userspace proxy of localhost NodePorts
// (*localnodeport.Proxy).
type LocalhostProxy interface {
	Sync(specs []localnodeport.Spec)
}

// staleChainDelay is how long a flushed chain waits before it is deleted
// (in a transaction of its own, after a later sync's): kernels before 6.2
// keep a chain referenced for a moment after the map element pointing at
// it goes.
const staleChainDelay = time.Second

// The optional capabilities of the mode contract (pkg/proxy/mode.go) this
// mode has.
var (
	_ proxy.Describer       = (*Syncer)(nil)
	_ proxy.ServiceCIDRUser = (*Syncer)(nil)
	_ proxy.Prober          = (*Syncer)(nil)
	_ proxy.Deferrer        = (*Syncer)(nil)
	_ proxy.Tracer          = (*Syncer)(nil)
	_ proxy.FailureCounter  = (*Syncer)(nil)
)

// Syncer is the nftables mode for one IP family: the proxy core hands it
// the state, and it writes what differs from what the table holds, in one
// transaction per sync.
type Syncer struct {
	cfg Config
	now func() time.Time
	// maxTxOps bounds a large sync's transactions.
	maxTxOps int
	// generationLogged: the watch cannot read the ruleset generation
	// and lists the table every time instead, which it logs once.
	generationLogged bool

	mu sync.Mutex
	// table is what the syncer knows of the table (tablestate.go).
	table tableState
	// layout and applied are what the fixed part and each service port
	// asked for in the last sync (a port's chains by the print of their
	// rules); wanted counts who wants which element.
	layout  Layout
	applied map[state.ServicePortName]appliedObjects
	wanted  map[elemID]wantedElem
	// stale are the chains flushed and no longer wanted, to be deleted
	// by a later transaction.
	stale map[string]staleChain
}

// staleChain is when a chain was flushed, and whether deleting it failed.
type staleChain struct {
	flushed time.Time
	failed  bool
}

// Family is the nftables family of an IP family's table.
func Family(family v1.IPFamily) knftables.Family {
	if family == v1.IPv6Protocol {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// New returns the nftables mode; proxy.NewCore runs it.
func New(cfg Config) (*Syncer, error) {
	if cfg.Kernel == nil {
		return nil, errors.New("nftables: no kernel")
	}
	cfg.Params.IPv6 = cfg.Family == v1.IPv6Protocol
	// Served from the start, at zero: a counter that first appears at 1
	// hides that first failure from increase() in alerts.
	for _, c := range []*prometheus.CounterVec{metrics.NFTablesRepairsTotal, metrics.NFTablesSyncFailuresTotal, metrics.NFTablesCleanupFailuresTotal} {
		c.WithLabelValues(string(cfg.Family))
	}
	return &Syncer{cfg: cfg, now: time.Now, maxTxOps: maxTxOps, stale: map[string]staleChain{}}, nil
}

// CountFailure counts every failed sync, partial or full, as upstream's
// nftables mode does.
func (s *Syncer) CountFailure(bool, error) {
	metrics.NFTablesSyncFailuresTotal.WithLabelValues(string(s.cfg.Family)).Inc()
}

// SetServiceCIDRs changes the ServiceCIDRs whose unallocated addresses are
// dropped; the next sync rewrites cluster-ips-check.
func (s *Syncer) SetServiceCIDRs(cidrs []netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Params.ServiceCIDRs = slices.Clone(cidrs)
}

// FullSync reads the table once and writes what differs from the whole
// state: over rules already in place (ours or upstream's) it writes
// nothing but what changed meanwhile. The table itself is never deleted:
// the affinity sets' entries live in it.
func (s *Syncer) FullSync(v state.View) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var repair map[string]rulesPrint
	if s.table.takeRepair() {
		repair = s.appliedChains()
		// A repair that fails stays due: the full sync the core retries
		// is the repair, logged and counted.
		defer func() {
			if err != nil {
				s.table.askRepair()
			}
		}()
	}
	// What the listing shows is the table at this generation or later.
	gen, genErr := s.cfg.Kernel.Generation()
	t, err := s.cfg.Kernel.ReadTable(context.TODO())
	if err != nil {
		s.table.lost()
		return fmt.Errorf("reading the %s table: %w", TableName, err)
	}
	s.table.read(t, gen, genErr)
	for name := range s.stale {
		if _, ok := t.chains[name]; !ok {
			delete(s.stale, name)
		}
	}
	w := s.planFull(v, repair)
	if err = w.run(); err != nil {
		return err
	}
	s.syncLocalhostProxy(v)
	if len(w.restored) > 0 {
		klog.InfoS("Restored the nftables table another program had changed", "ipFamily", s.cfg.Family, "restoredChains", len(w.restored), "chains", w.restored[:min(len(w.restored), 10)])
		metrics.NFTablesRepairsTotal.WithLabelValues(string(s.cfg.Family)).Inc()
	}
	return nil
}

// planFull plans a full sync over the table just read, against no
// layout and no service port applied: every port's objects, and the
// removal of what no one wants. repair, if not nil, are the prints of
// the rules each chain had, to tell what the sync restores.
func (s *Syncer) planFull(v state.View, repair map[string]rulesPrint) *write {
	w := s.newWrite(true)
	w.repair = repair
	w.replaceLayout(s.cfg.Params.Layout())
	for _, name := range slices.SortedFunc(maps.Keys(v.Services), state.ServicePortName.Compare) {
		w.replace(name, s.objectsFor(v, name))
	}
	w.removeUnwanted()
	w.planElements()
	return w
}

// appliedChains are the prints of the rules of every chain the last
// syncs wrote.
func (s *Syncer) appliedChains() map[string]rulesPrint {
	chains := map[string]rulesPrint{}
	for _, c := range s.layout.Chains {
		chains[c.Name] = printOf(c.Rules)
	}
	for _, objects := range s.applied {
		for _, c := range objects.Chains {
			chains[c.Name] = c.print
		}
	}
	return chains
}

// PartialSync rewrites only what the changed service ports own, trusting
// that the table holds what the last sync wrote.
func (s *Syncer) PartialSync(v state.View, changed map[state.ServicePortName]bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.table.phase() == phaseUnknown {
		return proxy.ErrFullSyncNeeded
	}
	if err := s.planPartial(v, changed).run(); err != nil {
		return err
	}
	s.syncLocalhostProxy(v)
	return nil
}

// planPartial plans a partial sync: the layout, and the changed service
// ports' objects.
func (s *Syncer) planPartial(v state.View, changed map[state.ServicePortName]bool) *write {
	w := s.newWrite(false)
	// A handful of chains, compared in memory: catches new ServiceCIDRs.
	w.replaceLayout(s.cfg.Params.Layout())
	for _, name := range slices.SortedFunc(maps.Keys(changed), state.ServicePortName.Compare) {
		w.replace(name, s.objectsFor(v, name))
	}
	w.planElements()
	return w
}

// syncLocalhostProxy has the localhost NodePort proxy serve the state's
// TCP NodePorts, once the rules are in place.
func (s *Syncer) syncLocalhostProxy(v state.View) {
	if s.cfg.LocalhostProxy != nil {
		s.cfg.LocalhostProxy.Sync(localnodeport.Specs(v))
	}
}

func (s *Syncer) objectsFor(v state.View, name state.ServicePortName) ServiceObjects {
	svc, sel, ok := v.Select(name)
	if !ok {
		return ServiceObjects{}
	}
	return s.cfg.Params.ServiceObjects(svc, sel)
}

// ProbeInterval is how often the core runs Probe.
func (s *Syncer) ProbeInterval() time.Duration { return time.Second }

// Probe reads the ruleset generation, which costs no process; only when
// it moved other than by our own transactions does it list one small
// chain to see whether the table was deleted or flushed (by `nft flush
// ruleset`, say): gone says what it found, and the core has a full sync
// restore it at once. Any other change by another program (a chain of
// ours flushed, a rule added to one) is reported as changed, and found by
// the full sync the core paces for it, which compares the whole table
// with what we want and writes only the difference.
func (s *Syncer) Probe(ctx context.Context) (gone string, changed bool) {
	gone, changed = s.check(ctx)
	if gone != "" {
		klog.InfoS("The nftables table was changed by another program; resyncing", "ipFamily", s.cfg.Family, "found", gone)
	}
	return gone, changed
}

// RepairNext has the next full sync log and count the chains it restores.
func (s *Syncer) RepairNext() {
	s.mu.Lock()
	s.table.askRepair()
	s.mu.Unlock()
}

// check is one look of the watch: what is missing of what the last sync
// wrote ("" when all is there, nothing was written yet, or the generation
// is still the one we know the table in place at), and whether another
// program changed the ruleset since the last look.
func (s *Syncer) check(ctx context.Context) (gone string, changed bool) {
	// Read with the generation, which a sync holding mu cannot move.
	s.mu.Lock()
	gen, err := s.cfg.Kernel.Generation()
	known, written := s.table.watched()
	s.mu.Unlock()
	if !written || (err == nil && gen == known) {
		return "", false
	}
	if err != nil && !s.generationLogged {
		// Without the generation, list every time.
		klog.ErrorS(err, "Reading the nftables ruleset generation; checking the table by listing it instead", "ipFamily", s.cfg.Family)
		s.generationLogged = true
	}
	gone = s.tableGone(ctx)
	if gone == "" && err == nil {
		s.mu.Lock()
		s.table.confirmed(known, gen)
		s.mu.Unlock()
	}
	return gone, true
}

// tableGone tells what is missing of what the last sync wrote, listing
// the chain every packet to a service passes: "" when all is there.
func (s *Syncer) tableGone(ctx context.Context) string {
	rules, err := s.cfg.Kernel.ListRules(ctx, chainNATPrerouting)
	switch {
	case knftables.IsNotFound(err):
		return "no " + chainNATPrerouting + " chain"
	case err != nil:
		if ctx.Err() == nil {
			klog.ErrorS(err, "Checking the nftables table", "ipFamily", s.cfg.Family)
		}
		return ""
	case len(rules) == 0:
		return chainNATPrerouting + " flushed"
	}
	return ""
}

// run runs one transaction of ours, after which the table holds sets;
// when it alone moved the generation from one the table was known in
// place at, the table is known in place at the new one.
func (s *Syncer) run(tx txPlan, sets tableSets) error {
	before, errBefore := s.cfg.Kernel.Generation()
	if err := s.cfg.Kernel.Run(context.TODO(), tx, sets); err != nil {
		return err
	}
	after, errAfter := s.cfg.Kernel.Generation()
	s.table.wrote(before, errBefore, after, errAfter)
	return nil
}

// Cleanup deletes the kube-proxy table of nft's family, if any.
func Cleanup(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	// Adding first makes the delete succeed when there is no table.
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	return nft.Run(ctx, tx)
}
