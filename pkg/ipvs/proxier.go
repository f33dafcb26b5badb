// Over 600 lines: reference counts, the early kernel read, the diff and
// write, set capacity, the drift check and draining share the syncer's lock
// today; issue #29 splits them into a pure plan, its apply, and drift and
// drain files.

package ipvs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Config are the IPVS mode's inputs.
type Config struct {
	Family   v1.IPFamily
	Kernel   Kernel
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

// DefaultCheckInterval lets a repair land within the 2 s that issue #16
// aims at: a second to notice, then a full sync.
const DefaultCheckInterval = time.Second

// DefaultMaxDrain is upstream's former bound on graceful termination.
const DefaultMaxDrain = 15 * time.Minute

// The core finds a mode's optional capabilities by type assertion: these
// make a renamed method a compile error instead of a capability silently
// switched off.
var (
	_ proxy.Describer = (*Syncer)(nil)
	_ proxy.Preparer  = (*Syncer)(nil)
	_ proxy.Watcher   = (*Syncer)(nil)
)

// Syncer is the IPVS mode for one IP family: the proxy core hands it the
// state, and it changes only the virtual servers, real servers, addresses
// and set entries of the service ports that changed.
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
	// written is true once a full sync succeeded: from then on the
	// kernel should hold what objects says.
	written bool
	// limits are the hash sets' maxelem (the bitmap:port sets cannot
	// overflow), and left what the last sync left out of full sets.
	limits map[string]int
	left   error
	// drifted is what the last drift check found changed by another
	// program, until a full sync has put it back.
	drifted string
	// syncs counts the syncs and fullSyncs the full ones (each adds one
	// under mu, as it starts): a drift check drops what it read while one
	// ran, but for the listing of the real servers, which only a full sync
	// voids (touched). Atomic, since a check waiting for mu reads them
	// without.
	syncs, fullSyncs atomic.Uint64
	// touched are the service ports partial syncs changed while a drift
	// check listed the real servers (nil when none lists): what the
	// listing read of them may predate the change, and is not compared.
	touched map[state.ServicePortName]bool
	// jumpSeenAt is the nat table's generation when the drift check last
	// saw the jump into KUBE-SERVICES (if jumpSeen); only the drift check
	// uses them.
	jumpSeenAt uint64
	jumpSeen   bool
	// prepared is the kernel as Prepare read it, for the first full sync.
	prepared *preparedKernel
}

type drainKey struct {
	server VirtualServerKey
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

// objectCounts counts how many service ports want each shared object: an
// address or set entry stays while one still does.
type objectCounts struct {
	servers map[VirtualServerKey]state.ServicePortName
	bound   map[netip.Addr]int
	entries map[SetEntry]int
	// setSizes count each set's entries in the kernel, and waiting the
	// entries wanted but not there because their set was full (by the
	// order they came in: seq), waitingIn by set.
	setSizes  map[string]int
	waiting   map[SetEntry]uint64
	waitingIn map[string]int
	seq       uint64
	outFilter map[iptables.Rule]int
}

func newObjectCounts() objectCounts {
	return objectCounts{
		servers: map[VirtualServerKey]state.ServicePortName{}, bound: map[netip.Addr]int{},
		entries: map[SetEntry]int{}, setSizes: map[string]int{}, outFilter: map[iptables.Rule]int{},
		waiting: map[SetEntry]uint64{}, waitingIn: map[string]int{},
	}
}

func (o *objectCounts) wait(e SetEntry) {
	o.seq++
	o.waiting[e] = o.seq
	o.waitingIn[e.Set]++
}

func (o *objectCounts) unwait(e SetEntry) {
	delete(o.waiting, e)
	if o.waitingIn[e.Set]--; o.waitingIn[e.Set] == 0 {
		delete(o.waitingIn, e.Set)
	}
}

func (o *objectCounts) resize(set string, by int) {
	if o.setSizes[set] += by; o.setSizes[set] == 0 {
		delete(o.setSizes, set)
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
	p.syncs.Add(1)
	if p.touched != nil {
		for name := range changed {
			p.touched[name] = true
		}
	}
	addrs, err := p.readAddresses()
	if err != nil {
		return err
	}
	// New node addresses change every NodePort's virtual servers.
	if !slices.Equal(addrs.Node, p.addrs.Node) {
		return proxy.ErrFullSyncNeeded
	}
	w := p.newWrite()
	for name := range changed {
		w.replace(name, p.applied[name], p.objectsFor(v, name))
	}
	return w.finish(false)
}

// FullSync reads the kernel once and writes what differs from the whole
// state: a restart over rules in place (ours or upstream's) writes
// nothing but what changed while no one was watching.
func (p *Syncer) FullSync(v state.View) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncs.Add(1)
	p.fullSyncs.Add(1)
	err := p.fullSync(v)
	p.written = err == nil
	if err == nil && p.drifted != "" {
		klog.InfoS("Restored the IPVS mode's kernel state another program had changed", "ipFamily", p.cfg.Family, "found", p.drifted)
		metrics.IPVSRepairsTotal.WithLabelValues(string(p.cfg.Family)).Inc()
		p.drifted = ""
	}
	return err
}

func (p *Syncer) fullSync(v state.View) error {
	k := p.cfg.Kernel
	if err := k.EnsureDummyLink(); err != nil {
		return fmt.Errorf("creating %s: %w", DummyLink, err)
	}
	if err := k.EnsureSets(p.cfg.Params.Sets()); err != nil {
		return fmt.Errorf("creating the ipsets: %w", err)
	}
	addrs, err := p.readAddresses()
	if err != nil {
		return err
	}
	p.addrs = addrs
	current, err := p.takePrepared()
	if current == nil && err == nil {
		current, err = p.readKernel()
	}
	if err != nil {
		return err
	}
	// Everything is written against what the kernel holds: the current
	// objects stand in for what was applied, under one pseudo-owner.
	p.applied = map[state.ServicePortName]ServiceObjects{}
	p.objects = newObjectCounts()
	w := p.newWrite()
	w.kernel = current
	for _, name := range slices.SortedFunc(maps.Keys(v.Services), state.ServicePortName.Compare) {
		w.replace(name, ServiceObjects{}, p.objectsFor(v, name))
	}
	return w.finish(true)
}

// kernelObjects is what a full sync found in the kernel.
type kernelObjects struct {
	servers map[VirtualServerKey]VirtualServer
	// reals are as the kernel lists them: a map per virtual server held
	// some 5 MB more at a restart's peak at 10,000 services x 5 endpoints.
	reals   map[VirtualServerKey][]RealServer
	bound   map[netip.Addr]bool
	entries map[string]map[string]bool
}

// preparedKernel is what Prepare read, with the sets' sizes and the time
// when it started reading, by which the first full sync judges whether it
// still holds.
type preparedKernel struct {
	objects *kernelObjects
	sizes   map[string]int
	at      time.Time
}

// maxPreparedAge is how old a read Prepare made may be for the first sync
// to take it: the informers' lists take seconds; a start that waited
// longer (the API server out of reach) reads again.
const maxPreparedAge = time.Minute

// Prepare reads the kernel while the informers list, before the first
// sync: a restart at 10,000 services spends seconds reading every real
// server (under emulation), the sets' entries and the iptables tables.
// The first full sync takes the read if it still holds (takePrepared).
// It writes nothing: a first start's sets and link are made by the sync.
func (p *Syncer) Prepare() {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := time.Now()
	sizes, err := p.cfg.Kernel.SetSizes(p.setNames())
	if err != nil {
		return
	}
	objects, err := p.readKernel()
	if err != nil {
		return
	}
	p.chains.Prepare(p.cfg.Params.Chains(func(string) bool { return false }, nil))
	p.prepared = &preparedKernel{objects: objects, sizes: sizes, at: at}
	klog.V(2).InfoS("Read the kernel before the first sync", "ipFamily", p.cfg.Family,
		"virtualServers", len(objects.servers), "elapsed", time.Since(at))
}

// takePrepared returns what Prepare read if it still holds, else nil; only
// the first full sync gets it. The iptables tables have generations, which
// ChainSet checks. IPVS, the link's addresses and ipsets have none: the
// sets' entry counts (one netlink dump of their headers, no process) must
// be those Prepare saw and the read at most maxPreparedAge old; another
// program's change to the virtual servers, real servers or addresses in
// those seconds is not seen then, as one landing just after any full
// sync's read is not, and the drift check's listings repair it later
// (docs/reliability.md).
func (p *Syncer) takePrepared() (*kernelObjects, error) {
	prepared := p.prepared
	p.prepared = nil
	if prepared == nil || time.Since(prepared.at) > maxPreparedAge {
		return nil, nil
	}
	sizes, err := p.cfg.Kernel.SetSizes(p.setNames())
	if err != nil {
		return nil, fmt.Errorf("listing the ipsets' headers: %w", err)
	}
	if !maps.Equal(sizes, prepared.sizes) {
		return nil, nil
	}
	return prepared.objects, nil
}

func (p *Syncer) setNames() []string {
	var names []string
	for _, s := range p.cfg.Params.Sets() {
		names = append(names, s.Name)
	}
	return names
}

func (p *Syncer) readKernel() (*kernelObjects, error) {
	k := p.cfg.Kernel
	current := &kernelObjects{
		servers: map[VirtualServerKey]VirtualServer{},
		bound:   map[netip.Addr]bool{}, entries: map[string]map[string]bool{},
	}
	servers, err := k.VirtualServers()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	current.reals = make(map[VirtualServerKey][]RealServer, len(servers))
	err = k.EachVirtualServer(func(key VirtualServerKey, reals []RealServer) error {
		current.reals[key] = slices.Clone(reals)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing IPVS real servers: %w", err)
	}
	for _, vs := range servers {
		current.servers[vs.VirtualServerKey] = vs
		if _, ok := current.reals[vs.VirtualServerKey]; !ok {
			current.reals[vs.VirtualServerKey] = nil // listed: none
		}
	}
	bound, err := k.BoundAddresses()
	if err != nil {
		return nil, fmt.Errorf("listing the addresses of %s: %w", DummyLink, err)
	}
	for _, a := range bound {
		current.bound[a] = true
	}
	entries, err := k.SetEntries(p.setNames())
	if err != nil {
		return nil, fmt.Errorf("listing the ipsets: %w", err)
	}
	for set, list := range entries {
		current.entries[set] = map[string]bool{}
		for _, e := range list {
			current.entries[set][e] = true
		}
	}
	return current, nil
}

// realsOf lists a virtual server's real servers, from what a full sync
// read or else from the kernel.
func (w *write) realsOf(key VirtualServerKey) ([]RealServer, error) {
	if w.kernel != nil {
		if reals, ok := w.kernel.reals[key]; ok {
			return reals, nil
		}
	}
	reals, err := w.p.cfg.Kernel.RealServers(key)
	if err != nil {
		return nil, fmt.Errorf("listing the real servers of %s: %w", key, err)
	}
	if w.kernel != nil {
		w.kernel.reals[key] = reals
	}
	return reals, nil
}

// write is one sync's changes, gathered service port by service port and
// applied in an order that keeps traffic flowing: new virtual servers,
// real servers and addresses first, then set entries and chains, then
// what is no longer wanted.
type write struct {
	p *Syncer
	// kernel is what a full sync read; nil in a partial sync, which
	// trusts what it applied.
	kernel *kernelObjects
	errs   []error
	// adds and deletes are the set entries to add and delete; an entry
	// one service port gives up and another takes up in the same sync
	// is in the kernel and stays: its deletion is cancelled (deleting
	// says which deletions still hold).
	adds     []SetEntry
	deletes  []SetEntry
	deleting map[SetEntry]bool
	// queued are the entries to add that this sync found, in order, for
	// admit; only those it cannot add then wait in objectCounts (at a
	// first sync, some 30,000 entries at 10,000 services).
	queued []SetEntry
	// unbind are the addresses to unbind at the end (false: taken up
	// again by another service port), and deleteVSs the virtual servers
	// to delete.
	unbind    map[netip.Addr]bool
	deleteVSs []VirtualServerKey
}

func (p *Syncer) newWrite() *write {
	return &write{p: p, deleting: map[SetEntry]bool{}, unbind: map[netip.Addr]bool{}}
}

// replace turns one service port's objects from old into updated.
func (w *write) replace(name state.ServicePortName, old, updated ServiceObjects) {
	p := w.p
	o := &p.objects
	wanted := map[VirtualServerKey]bool{}
	for _, s := range updated.Servers {
		if owner, taken := o.servers[s.VirtualServerKey]; taken && owner != name {
			klog.InfoS("Virtual server already belongs to another service port; skipping it", "servicePort", name, "virtualServer", s.VirtualServerKey, "owner", owner)
			continue
		}
		wanted[s.VirtualServerKey] = true
		w.server(s, findServer(old.Servers, s.VirtualServerKey))
		o.servers[s.VirtualServerKey] = name
	}
	for _, s := range old.Servers {
		if !wanted[s.VirtualServerKey] && o.servers[s.VirtualServerKey] == name {
			delete(o.servers, s.VirtualServerKey)
			w.deleteVSs = append(w.deleteVSs, s.VirtualServerKey)
		}
	}
	for _, a := range updated.Bound {
		if o.bound[a]++; o.bound[a] == 1 {
			w.bind(a)
		}
	}
	for _, a := range old.Bound {
		if o.bound[a]--; o.bound[a] == 0 {
			delete(o.bound, a)
			w.unbind[a] = true
			w.entry(SetEntry{Set: p.cfg.Params.setName(setIPVSAddresses), Entry: a.String()}, true)
		}
	}
	for _, e := range updated.Entries {
		if o.entries[e]++; o.entries[e] == 1 {
			w.entry(e, false)
		}
	}
	for _, e := range old.Entries {
		if o.entries[e]--; o.entries[e] == 0 {
			delete(o.entries, e)
			w.entry(e, true)
		}
	}
	for _, r := range updated.OutFilter {
		o.outFilter[r]++
	}
	for _, r := range old.OutFilter {
		if o.outFilter[r]--; o.outFilter[r] == 0 {
			delete(o.outFilter, r)
		}
	}
	if len(updated.Servers) == 0 && len(updated.Entries) == 0 {
		delete(p.applied, name)
	} else {
		p.applied[name] = updated
	}
}

func findServer(servers []Server, key VirtualServerKey) *Server {
	for i := range servers {
		if servers[i].VirtualServerKey == key {
			return &servers[i]
		}
	}
	return nil
}

// server makes the kernel hold one virtual server with its real servers;
// old is what was applied (nil if none, or in a full sync).
func (w *write) server(s Server, old *Server) {
	k := w.p.cfg.Kernel
	var exists, same bool
	if w.kernel != nil {
		have, ok := w.kernel.servers[s.VirtualServerKey]
		exists, same = ok, have == s.VirtualServer
		delete(w.kernel.servers, s.VirtualServerKey)
	} else if old != nil {
		exists, same = true, old.VirtualServer == s.VirtualServer
	}
	switch {
	case !exists:
		if err := k.AddVirtualServer(s.VirtualServer); err != nil {
			w.errs = append(w.errs, fmt.Errorf("adding virtual server %s: %w", s.VirtualServerKey, err))
			return
		}
	case !same:
		if err := k.UpdateVirtualServer(s.VirtualServer); err != nil {
			w.errs = append(w.errs, fmt.Errorf("updating virtual server %s: %w", s.VirtualServerKey, err))
		}
	}
	if !exists {
		for _, rs := range s.Reals {
			w.addReal(s.VirtualServerKey, rs, false)
		}
		return
	}
	w.reals(s)
}

// reals brings an existing virtual server's real servers in line with
// what the kernel holds (one dump of this virtual server): draining ones
// are at weight 0, and their connection counts say whether a removed one
// can go at once.
func (w *write) reals(s Server) {
	current, err := w.realsOf(s.VirtualServerKey)
	if err != nil {
		w.errs = append(w.errs, err)
		return
	}
	unwanted := make(map[netip.AddrPort]RealServer, len(current))
	for _, rs := range current {
		unwanted[rs.AddrPort()] = rs
	}
	for _, rs := range s.Reals {
		have, ok := unwanted[rs]
		delete(unwanted, rs)
		switch {
		case !ok:
			w.addReal(s.VirtualServerKey, rs, false)
		case have.Weight != 1:
			// Draining, or left at weight 0 by a previous run: wanted again.
			w.addReal(s.VirtualServerKey, rs, true)
		}
	}
	for _, have := range unwanted {
		w.removeReal(s.VirtualServerKey, have)
	}
}

func (w *write) addReal(key VirtualServerKey, rs netip.AddrPort, update bool) {
	k := w.p.cfg.Kernel
	real := RealServer{Addr: rs.Addr(), Port: rs.Port(), Weight: 1}
	delete(w.p.draining, drainKey{key, rs})
	var err error
	if update {
		err = k.UpdateRealServer(key, real)
	} else {
		err = k.AddRealServer(key, real)
	}
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("adding real server %s to %s: %w", rs, key, err))
	}
}

// removeReal deletes a real server at once (UDP, SCTP: expire_nodest_conn
// ends their flows), or sets a TCP one to weight 0 so its connections
// finish while new ones go elsewhere.
func (w *write) removeReal(key VirtualServerKey, rs RealServer) {
	k := w.p.cfg.Kernel
	d := drainKey{key, rs.AddrPort()}
	if _, draining := w.p.draining[d]; draining {
		return
	}
	if key.Protocol != v1.ProtocolTCP || rs.ActiveConns+rs.InactiveConns == 0 {
		if err := k.DeleteRealServer(key, rs.AddrPort()); err != nil {
			w.errs = append(w.errs, fmt.Errorf("deleting real server %s of %s: %w", rs.AddrPort(), key, err))
		}
		return
	}
	if rs.Weight != 0 {
		rs.Weight = 0
		if err := k.UpdateRealServer(key, rs); err != nil {
			w.errs = append(w.errs, fmt.Errorf("draining real server %s of %s: %w", rs.AddrPort(), key, err))
			return
		}
	}
	w.p.draining[d] = w.p.now().Add(w.p.cfg.MaxDrain)
}

func (w *write) bind(a netip.Addr) {
	w.entry(SetEntry{Set: w.p.cfg.Params.setName(setIPVSAddresses), Entry: a.String()}, false)
	if w.unbind[a] {
		// Another service port gave it up in this sync: it is bound.
		w.unbind[a] = false
		return
	}
	if w.kernel != nil && w.kernel.bound[a] {
		delete(w.kernel.bound, a)
		return
	}
	if err := w.p.cfg.Kernel.Bind(a); err != nil {
		w.errs = append(w.errs, fmt.Errorf("binding %s to %s: %w", a, DummyLink, err))
	}
}

// entry records a set change; a full sync skips what the kernel holds,
// and an entry given up and taken up again in one sync stays. An entry
// to add waits until finish, which knows how much room its set has.
func (w *write) entry(e SetEntry, remove bool) {
	o := &w.p.objects
	_, waiting := o.waiting[e]
	switch {
	case remove && waiting:
		o.unwait(e) // never written
	case remove:
		w.deletes = append(w.deletes, e)
		w.deleting[e] = true
		o.resize(e.Set, -1)
	case w.deleting[e]:
		w.deleting[e] = false
		o.resize(e.Set, 1)
	case w.kernel != nil && w.kernel.entries[e.Set][e.Entry]:
		delete(w.kernel.entries[e.Set], e.Entry)
		o.resize(e.Set, 1)
	default:
		// Never given up in the same sync: a sync replaces each service
		// port once, so an entry comes from no owner to one only once.
		w.queued = append(w.queued, e)
	}
}

// admit adds the waiting entries whose sets have room: all of them while
// a hash set stays within its maxelem, else the ones that came first (a
// full sync takes the service ports by name, after what the kernel holds
// already) up to it. The rest wait for a later sync whose deletions make
// room: ipset would refuse them, and with them every later line of the
// restore, other services' entries too.
func (w *write) admit() {
	o := &w.p.objects
	fits := func(set string) bool {
		limit, ok := w.p.limits[set]
		return !ok || o.setSizes[set] < limit
	}
	add := func(e SetEntry) {
		o.resize(e.Set, 1)
		w.adds = append(w.adds, e)
	}
	// What waited before this sync first, oldest first; then this sync's
	// entries in the order it found them.
	if len(o.waiting) > 0 {
		older := slices.SortedFunc(maps.Keys(o.waiting), func(a, b SetEntry) int { return cmp.Compare(o.waiting[a], o.waiting[b]) })
		for _, e := range older {
			if fits(e.Set) {
				o.unwait(e)
				add(e)
			}
		}
		if len(o.waiting) == 0 {
			o.waiting = map[SetEntry]uint64{} // a map keeps its largest size
		}
	}
	for _, e := range w.queued {
		if fits(e.Set) {
			add(e)
		} else {
			o.wait(e)
		}
	}
	w.queued = nil
}

// leftOut names, set by set, the entries waiting for room and the service
// ports that want them; nil when none wait. It reads every service
// port's objects, which it does only while some wait.
func (p *Syncer) leftOut() error {
	o := &p.objects
	if len(o.waiting) == 0 {
		return nil
	}
	ipvsIPs := p.cfg.Params.setName(setIPVSAddresses)
	wanting := map[string]map[state.ServicePortName]bool{}
	want := func(e SetEntry, name state.ServicePortName) {
		if _, ok := o.waiting[e]; !ok {
			return
		}
		if wanting[e.Set] == nil {
			wanting[e.Set] = map[state.ServicePortName]bool{}
		}
		wanting[e.Set][name] = true
	}
	for name, objects := range p.applied {
		for _, e := range objects.Entries {
			want(e, name)
		}
		if o.waitingIn[ipvsIPs] > 0 {
			for _, a := range objects.Bound {
				want(SetEntry{Set: ipvsIPs, Entry: a.String()}, name)
			}
		}
	}
	var errs []error
	for _, set := range slices.Sorted(maps.Keys(o.waitingIn)) {
		names := slices.SortedFunc(maps.Keys(wanting[set]), state.ServicePortName.Compare)
		var some []string
		for _, n := range names[:min(len(names), 3)] {
			some = append(some, n.String())
		}
		if len(names) > 3 {
			some = append(some, "...")
		}
		errs = append(errs, fmt.Errorf("ipset %s is full (maxelem %d): %s of %s not added (%s)", set, p.limits[set],
			count(o.waitingIn[set], "entry", "entries"), count(len(names), "service port", "service ports"), strings.Join(some, ", ")))
	}
	return errors.Join(errs...)
}

func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// LeftOut tells which set entries the last sync left out because their
// set was full (the service ports wanting them are only partly
// programmed), nil if none.
func (p *Syncer) LeftOut() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.left
}

// finish writes the set changes and the chains, then removes what no
// service port wants any more (after a full sync: whatever else the
// kernel held).
func (w *write) finish(full bool) error {
	p := w.p
	w.admit()
	// Deletions before additions, so that a full set has room for what
	// admit let in; an entry never is in both. After a full sync the
	// kernel's entries no service port wants go too.
	changes := make([]SetChange, 0, len(w.adds)+len(w.deletes))
	for _, e := range w.deletes {
		if w.deleting[e] {
			changes = append(changes, SetChange{Set: e.Set, Entry: e.Entry, Delete: true})
		}
	}
	if w.kernel != nil {
		for set, entries := range w.kernel.entries {
			for e := range entries {
				changes = append(changes, SetChange{Set: set, Entry: e, Delete: true})
			}
		}
	}
	for _, e := range w.adds {
		changes = append(changes, SetChange{Set: e.Set, Entry: e.Entry})
	}
	if len(changes) > 0 {
		if err := p.cfg.Kernel.ChangeSets(changes); err != nil {
			w.errs = append(w.errs, fmt.Errorf("changing ipset entries: %w", err))
		}
	}
	// Entries left out are not the sync's failure: the service ports that
	// fit are written, and a failed sync would hold back what follows a
	// sync (health-check servers, conntrack cleanup, the healthz update)
	// and retry a full sync, reading the whole kernel, for as long as the
	// set is full. They wait, and a later sync that frees room adds them.
	if p.left = p.leftOut(); p.left != nil {
		klog.ErrorS(p.left, "Set entries left out: the service ports named may not work until their set has room", "ipFamily", p.cfg.Family)
	}
	nonEmpty := func(set string) bool { return p.objects.setSizes[p.cfg.Params.setName(set)] > 0 }
	outFilter := slices.Sorted(maps.Keys(p.objects.outFilter))
	if err := p.chains.Sync(p.cfg.Params.Chains(nonEmpty, outFilter), Jumps(), full); err != nil {
		metrics.IPTablesRestoreFailuresTotal.WithLabelValues(string(p.cfg.Family)).Inc()
		w.errs = append(w.errs, fmt.Errorf("writing the iptables chains: %w", err))
	}
	if w.kernel != nil {
		// A bound address no service wants is one a previous run (ours
		// or upstream's) bound if KUBE-IPVS-IPS lists it; another
		// program's addresses on the link are left alone.
		previous := w.kernel.entries[p.cfg.Params.setName(setIPVSAddresses)]
		for a := range w.kernel.bound {
			if previous[a.String()] {
				w.unbind[a] = true
			}
		}
		for key := range w.kernel.servers {
			if !p.excluded(key.Addr) {
				w.deleteVSs = append(w.deleteVSs, key)
			}
		}
	}
	for _, a := range slices.SortedFunc(maps.Keys(w.unbind), netip.Addr.Compare) {
		if !w.unbind[a] {
			continue
		}
		if err := p.cfg.Kernel.Unbind(a); err != nil {
			w.errs = append(w.errs, fmt.Errorf("unbinding %s from %s: %w", a, DummyLink, err))
		}
	}
	for _, key := range w.deleteVSs {
		if err := p.cfg.Kernel.DeleteVirtualServer(key); err != nil {
			w.errs = append(w.errs, fmt.Errorf("deleting virtual server %s: %w", key, err))
		}
		for d := range p.draining {
			if d.server == key {
				delete(p.draining, d)
			}
		}
	}
	return errors.Join(w.errs...)
}

func (p *Syncer) excluded(a netip.Addr) bool {
	for _, c := range p.cfg.ExcludeCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// Watch deletes draining real servers once their connections have ended
// or their time is up, and every CheckInterval (or ten times the last
// check's duration without its listings, if longer) asks for a full sync
// when another program changed what the mode keeps in the kernel. The
// listings whose cost grows with the services (every real server, every
// bound address) are read again only once a hundred times their CPU time
// has passed, so that they cost at most 1% of a CPU; the rest of the check
// (each set's number of entries, the nat table's generation) costs the
// same at any size.
func (p *Syncer) Watch(ctx context.Context, resync func()) {
	drains := time.NewTicker(p.cfg.DrainCheckInterval)
	defer drains.Stop()
	checks := time.NewTimer(p.cfg.CheckInterval)
	defer checks.Stop()
	var listingsDue time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-drains.C:
			p.finishDrains()
		case <-checks.C:
			start := time.Now()
			listings := !start.Before(listingsDue)
			drift, cost := p.checkDrift(listings)
			took := time.Since(start)
			if drift != "" {
				klog.InfoS("Another program changed the IPVS mode's kernel state; resyncing", "ipFamily", p.cfg.Family, "found", drift, "checkTook", took)
				resync()
			}
			if listings {
				listingsDue = start.Add(max(p.cfg.CheckInterval, listingsCPUShare*cost.cpu))
				klog.V(4).InfoS("Checked the IPVS mode's kernel state with its listings", "ipFamily", p.cfg.Family, "took", took, "listingsCPU", cost.cpu, "nextListings", listingsDue.Sub(start))
			}
			checks.Reset(max(p.cfg.CheckInterval, 10*(took-cost.took)))
		}
	}
}

// listingsCPUShare is how many times the drift check's listings' CPU time
// passes before they are read again: they cost at most 1% of a CPU.
const listingsCPUShare = 100

// kernelView is what a drift check read, without the syncer's lock.
type kernelView struct {
	// serversDrift is what the listing of the virtual servers found
	// missing (if listedServers), and serversErr why it could not.
	serversDrift  string
	serversErr    error
	listedServers bool
	// The rest is read after that listing, quickly, when syncs was the
	// syncer's count: bound the addresses on kube-ipvs0 (if
	// listedAddresses), sizes each set's entries, jumpFound whether the
	// jump into KUBE-SERVICES was seen (true if the chain was not listed:
	// its generation had not moved).
	syncs           uint64
	bound           []netip.Addr
	listedAddresses bool
	sizes           map[string]int
	jumpFound       bool
	errs            []string
}

// listingsCost is what a drift check's listings took: CPU (in the kernel
// too, where most of it goes) and wall time.
type listingsCost struct {
	cpu, took time.Duration
}

// checkDrift reads the kernel without the syncer's lock, so that a sync
// never waits for a check, and compares what it read with what the syncs
// wrote under it. A full sync during the check voids all it read; a
// partial one voids the quick reads (the next check makes them again) but
// not the listing of the real servers, which leaves out only the service
// ports it changed: on a busy node a listing, seconds long at 10k
// services under emulation, would otherwise rarely see its end. It
// remembers what it found for the full sync that repairs it, and tells
// what the listings cost.
func (p *Syncer) checkDrift(listings bool) (string, listingsCost) {
	p.mu.Lock()
	written, fullSyncs := p.written, p.fullSyncs.Load()
	// A family that owns no virtual server (the IPv6 one on a node whose
	// services are all IPv4) has none to miss: the listing holds every
	// family's, and is not read.
	listServers := written && listings && len(p.objects.servers) > 0
	if listServers {
		p.touched = map[state.ServicePortName]bool{}
	}
	p.mu.Unlock()
	if !written {
		return "", listingsCost{}
	}
	view, cost := p.readView(fullSyncs, listServers, listings)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.touched = nil
	if p.fullSyncs.Load() != fullSyncs {
		return "", cost
	}
	drift := p.drift(view, p.syncs.Load() == view.syncs)
	if drift != "" {
		p.drifted = drift
	}
	return drift, cost
}

// readView reads what the drift check compares: the virtual and real
// servers (one read of the kernel's listing) and the addresses on
// kube-ipvs0 (one netlink dump) when asked, whose cost it tells; the
// number of entries in each set (one netlink dump of the sets' headers);
// and the jump into KUBE-SERVICES (gone with an iptables flush).
func (p *Syncer) readView(fullSyncs uint64, servers, addresses bool) (kernelView, listingsCost) {
	var v kernelView
	var cost listingsCost
	if servers || addresses {
		runtime.LockOSThread()
		start, startCPU := time.Now(), threadCPU()
		var err error
		if servers {
			v.listedServers = true
			v.serversDrift, v.serversErr = p.serversDrift(fullSyncs)
		}
		v.syncs = p.syncs.Load()
		if addresses {
			v.listedAddresses = true
			if v.bound, err = p.cfg.Kernel.BoundAddresses(); err != nil {
				v.errs = append(v.errs, "addresses unreadable: "+err.Error())
			}
		}
		cost = listingsCost{cpu: threadCPU() - startCPU, took: time.Since(start)}
		runtime.UnlockOSThread()
	} else {
		v.syncs = p.syncs.Load()
	}
	sizes, err := p.cfg.Kernel.SetSizes(p.setNames())
	if err != nil {
		v.errs = append(v.errs, "ipsets unreadable: "+err.Error())
	}
	v.sizes = sizes
	v.jumpFound = p.jumpPresent()
	return v, cost
}

// threadCPU is the CPU time the calling thread has used, in the kernel
// too (where most of a listing's time goes).
func threadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drift tells what of the mode's kernel state is not as the last sync
// left it, from what a check read: our virtual servers with their real
// servers (when listed), and, if the quick reads still hold (no sync ran
// since they began), our addresses on kube-ipvs0 (when listed), the
// number of entries in each set and the jump into KUBE-SERVICES. "" when
// all is in place. The caller holds mu.
//
// Another program's change that keeps a set's size (an entry deleted and
// another added) or a real server's presence (its weight changed) is not
// seen; the next full sync (a restart, a failure) undoes it.
func (p *Syncer) drift(v kernelView, quick bool) string {
	var errs []string
	// (errSynced never gets here: checkDrift drops a check a full sync
	// overlapped.)
	if v.serversErr != nil {
		errs = append(errs, "virtual servers unreadable: "+v.serversErr.Error())
	}
	if quick {
		errs = append(errs, v.errs...)
	}
	if len(errs) > 0 {
		return strings.Join(errs, "; ")
	}
	if v.listedServers && v.serversDrift != "" {
		return v.serversDrift
	}
	if !quick {
		return ""
	}
	if v.listedAddresses {
		ours := 0
		for _, a := range v.bound {
			if p.objects.bound[a] > 0 {
				ours++
			}
		}
		if ours != len(p.objects.bound) {
			return fmt.Sprintf("%d of %d addresses on %s", ours, len(p.objects.bound), DummyLink)
		}
	}
	if drift := p.setsDrift(v.sizes); drift != "" {
		return drift
	}
	if !v.jumpFound {
		return "the jump from nat PREROUTING to " + string(chainServices)
	}
	return ""
}

// jumpPresent tells whether the jump from nat PREROUTING into
// KUBE-SERVICES is there (an iptables flush removes it). The chain is
// listed, which starts a process, only when another program may have
// changed the table since the jump was last seen: its generation
// (iptables.Kernel.Generation, read without a process) moved. Only the
// drift check calls it.
func (p *Syncer) jumpPresent() bool {
	jump := Jumps()[1]
	generation, genErr := p.cfg.IPTables.Generation(string(jump.Table))
	if genErr == nil && p.jumpSeen && generation == p.jumpSeenAt {
		return true
	}
	rules, err := p.cfg.IPTables.ListRules(string(jump.Table), string(jump.From))
	if err != nil || !slices.ContainsFunc(rules, func(r string) bool { return strings.HasSuffix(r, "-j "+string(chainServices)) }) {
		p.jumpSeen = false
		return false
	}
	p.jumpSeen, p.jumpSeenAt = genErr == nil, generation
	return true
}

// errSynced ends a drift check's listing when a full sync ran meanwhile:
// what it read is dropped.
var errSynced = errors.New("a full sync ran during the check")

// serversDrift tells which of our virtual servers, or of their wanted
// real servers, the kernel lacks, leaving out the service ports partial
// syncs changed meanwhile (touched). It compares each virtual server as
// the kernel lists it, so the listing is never held whole (at 10k
// services x 5 endpoints it held 8.7 MB for seconds after each sync),
// only a hash of each key it compared (for those the listing lacks). The
// lock is taken for each, waiting out a partial sync or a drain check,
// which never read the listing, but not a full sync: holding the lock, it
// may be waiting for the listing's own lock, and the check gives up
// instead (errSynced), as it would after that sync anyway.
func (p *Syncer) serversDrift(fullSyncs uint64) (string, error) {
	seed := maphash.MakeSeed()
	seen := map[uint64]bool{}
	var realsDrift string
	err := p.cfg.Kernel.EachVirtualServer(func(key VirtualServerKey, have []RealServer) error {
		for !p.mu.TryLock() {
			if p.fullSyncs.Load() != fullSyncs {
				return errSynced
			}
			time.Sleep(time.Millisecond)
		}
		defer p.mu.Unlock()
		if p.fullSyncs.Load() != fullSyncs {
			return errSynced
		}
		name, ours := p.objects.servers[key]
		if !ours || p.touched[name] {
			return nil
		}
		seen[maphash.Comparable(seed, key)] = true
		if realsDrift == "" {
			realsDrift = p.realsDrift(name, key, have)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fullSyncs.Load() != fullSyncs {
		return "", errSynced
	}
	wanted, found := 0, 0
	for key, name := range p.objects.servers {
		if p.touched[name] {
			continue
		}
		wanted++
		if seen[maphash.Comparable(seed, key)] {
			found++
		}
	}
	if found < wanted {
		return fmt.Sprintf("%d of %d virtual servers", found, wanted), nil
	}
	return realsDrift, nil
}

// realsDrift tells which wanted real server of the virtual server key,
// owned by the service port name, the kernel's list have lacks. The
// caller holds mu.
func (p *Syncer) realsDrift(name state.ServicePortName, key VirtualServerKey, have []RealServer) string {
	s := findServer(p.applied[name].Servers, key)
	if s == nil {
		return ""
	}
	for _, rs := range s.Reals {
		if !slices.ContainsFunc(have, func(h RealServer) bool { return h.AddrPort() == rs }) {
			return fmt.Sprintf("real server %s of %s", rs, key)
		}
	}
	return ""
}

// setsDrift tells which set holds another number of entries than the
// syncs put there (or is gone).
func (p *Syncer) setsDrift(sizes map[string]int) string {
	for _, s := range p.cfg.Params.Sets() {
		have, ok := sizes[s.Name]
		if !ok {
			return "ipset " + s.Name
		}
		if have != p.objects.setSizes[s.Name] {
			return fmt.Sprintf("ipset %s with %d of %d entries", s.Name, have, p.objects.setSizes[s.Name])
		}
	}
	return ""
}

// finishDrains deletes the draining real servers that are done.
func (p *Syncer) finishDrains() {
	p.mu.Lock()
	defer p.mu.Unlock()
	byServer := map[VirtualServerKey][]drainKey{}
	for d := range p.draining {
		byServer[d.server] = append(byServer[d.server], d)
	}
	for key, drains := range byServer {
		list, err := p.cfg.Kernel.RealServers(key)
		if err != nil {
			klog.ErrorS(err, "Listing real servers to finish their draining", "virtualServer", key)
			continue
		}
		have := map[netip.AddrPort]RealServer{}
		for _, rs := range list {
			have[rs.AddrPort()] = rs
		}
		for _, d := range drains {
			rs, ok := have[d.real]
			switch {
			case !ok || rs.Weight != 0:
				delete(p.draining, d)
			case rs.ActiveConns+rs.InactiveConns == 0 || p.now().After(p.draining[d]):
				if err := p.cfg.Kernel.DeleteRealServer(key, d.real); err != nil {
					klog.ErrorS(err, "Deleting a drained real server", "virtualServer", key, "realServer", d.real)
					continue
				}
				delete(p.draining, d)
			}
		}
	}
}
