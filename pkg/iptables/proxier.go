package iptables

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/runner"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Kernel is what the proxier needs from the iptables tools of one family.
type Kernel interface {
	// Restore applies iptables-restore --noflush input, atomically per table.
	Restore(input io.Reader) error
	// Save returns iptables-save output of every table: one dump costs no
	// more than one table's on nft, which fetches the whole ruleset anyway.
	Save() ([]byte, error)
	// ListRules returns a chain's rules without "-A CHAIN"; an error
	// when the chain does not exist.
	ListRules(table, chain string) ([]string, error)
	// Generation changes whenever the rules of the table may have
	// changed; reading it is far cheaper than listing rules.
	Generation(table string) (uint64, error)
}

// Conntrack forgets flows that would keep going to a wrong place after a
// UDP service's endpoints change.
type Conntrack interface {
	// ClearStale deletes the flows one sync's changes made stale.
	ClearStale(family v1.IPFamily, services state.ServiceMap, ch state.Changes) error
	// Reconcile deletes every stale flow, whatever made it stale.
	Reconcile(family v1.IPFamily, services state.ServiceMap, endpoints state.EndpointsMap) error
}

// Config are a proxier's inputs besides the API objects.
type Config struct {
	Family        v1.IPFamily
	Kernel        Kernel
	Params        Params
	Node          state.Node
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	Health        *healthcheck.ProxyHealth
	// ServiceHealth and Conntrack are optional.
	ServiceHealth *healthcheck.ServiceHealth
	Conntrack     Conntrack
	// ChainRefsPerRestore splits a full sync's service chains into inputs
	// referring to about this many chain names; 0 writes them all in one.
	ChainRefsPerRestore int
}

// ChainRefsPerRestoreNFT bounds the chain names one restore input refers
// to on the nft backend, declared or jumped to: iptables-nft-restore (1.8.9)
// spends time in the square of that number, so a large first sync is split
// (10k names in one input take ~1 s, 20k ~10 s; 1k take ~25 ms). The legacy
// backend rewrites the whole table on every restore, so there one input is
// best.
const ChainRefsPerRestoreNFT = 1000

// Proxier programs iptables for one IP family.
type Proxier struct {
	cfg     Config
	tracker *state.Tracker
	runner  *runner.Runner

	mu             sync.Mutex
	state          *state.State
	node           state.Node
	servicesSynced bool
	slicesSynced   bool
	// ready is closed once both caches are complete: syncing starts then,
	// and not earlier, so the first sync is not held back by the minimum
	// interval after a run that had nothing to do.
	ready        chan struct{}
	needFullSync bool
	// applied is what each service port has in the kernel now.
	applied    map[state.ServicePortName]appliedService
	ruleCounts map[Table]int
	watch      *flushWatch
	// lastReconcile is when every conntrack flow was last checked.
	lastReconcile time.Time
}

// New returns a proxier; nothing is written before SyncLoop runs and both
// Services and EndpointSlices have synced.
func New(cfg Config) *Proxier {
	p := &Proxier{
		cfg:          cfg,
		tracker:      state.NewTracker(cfg.Family, cfg.Node.Name),
		state:        state.NewState(),
		node:         cfg.Node,
		needFullSync: true,
		ready:        make(chan struct{}),
		applied:      map[state.ServicePortName]appliedService{},
		ruleCounts:   map[Table]int{},
	}
	p.runner = runner.New(p.sync, cfg.MinSyncPeriod, cfg.SyncPeriod)
	p.watch = p.newFlushWatch()
	return p
}

// OnService records a Service change; deleted services are passed with deleted true.
func (p *Proxier) OnService(svc *v1.Service, deleted bool) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	if deleted {
		svc = nil
	}
	p.tracker.OnService(name, svc)
	p.queue()
}

// OnEndpointSlice records an EndpointSlice change.
func (p *Proxier) OnEndpointSlice(slice *discovery.EndpointSlice, deleted bool) {
	p.tracker.OnEndpointSlice(slice, deleted)
	p.queue()
}

// OnServicesSynced records that the Service cache is complete.
func (p *Proxier) OnServicesSynced() {
	p.mu.Lock()
	p.servicesSynced = true
	p.markReadyLocked()
	p.mu.Unlock()
}

// OnEndpointSlicesSynced records that the EndpointSlice cache is complete.
func (p *Proxier) OnEndpointSlicesSynced() {
	p.mu.Lock()
	p.slicesSynced = true
	p.markReadyLocked()
	p.mu.Unlock()
}

func (p *Proxier) markReadyLocked() {
	if p.servicesSynced && p.slicesSynced {
		select {
		case <-p.ready:
		default:
			close(p.ready)
		}
	}
}

// OnNode records the node's topology; a zone change re-selects every
// service's endpoints.
func (p *Proxier) OnNode(node *v1.Node) {
	if node == nil {
		return
	}
	zone := node.Labels[v1.LabelTopologyZone]
	p.mu.Lock()
	changed := zone != p.node.Zone
	p.node.Zone = zone
	if changed {
		p.needFullSync = true
	}
	p.mu.Unlock()
	if changed {
		p.queue()
	}
}

// SyncLoop syncs until the context ends, and watches for other programs
// flushing our rules.
func (p *Proxier) SyncLoop(ctx context.Context) {
	go p.watchForFlush(ctx)
	select {
	case <-ctx.Done():
		return
	case <-p.ready:
	}
	p.runner.Loop(ctx)
}

// Sync asks for a sync soon.
func (p *Proxier) Sync() { p.queue() }

func (p *Proxier) queue() {
	if p.cfg.Health != nil {
		p.cfg.Health.QueuedUpdate(p.cfg.Family)
	}
	p.runner.Run()
}

// sync brings the kernel in line with the desired state: the changed
// services only, or everything after a start, a failure or a flush.
func (p *Proxier) sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	family := string(p.cfg.Family)
	start := time.Now()
	pendingServices, pendingEndpoints := p.tracker.Pending()
	changes := p.tracker.Apply(p.state)
	metrics.ServiceChangesTotal.Add(float64(pendingServices))
	metrics.EndpointChangesTotal.Add(float64(pendingEndpoints))

	// Crossing the large-cluster line changes every endpoint chain's
	// rules: a full sync rewrites them all at once. Counting walks every
	// service, so an idle periodic sync skips it.
	if len(changes.ServicePorts) > 0 {
		if large := p.largeCluster(); large != p.cfg.Params.LargeCluster {
			p.cfg.Params.LargeCluster = large
			p.needFullSync = true
		}
	}
	full := p.needFullSync
	var err error
	if !full {
		if err = p.partialSync(changes); err != nil {
			metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues(family).Inc()
			klog.ErrorS(err, "Partial sync failed; doing a full sync", "ipFamily", family)
			full = true
		}
	}
	if full {
		if err = p.fullSync(); err != nil {
			metrics.IPTablesRestoreFailuresTotal.WithLabelValues(family).Inc()
			p.needFullSync = true
			return fmt.Errorf("iptables %s sync: %w", family, err)
		}
		p.needFullSync = false
	}
	elapsed := time.Since(start).Seconds()
	metrics.SyncProxyRulesLatency.WithLabelValues(family).Observe(elapsed)
	if full {
		metrics.SyncFullProxyRulesLatency.WithLabelValues(family).Observe(elapsed)
	} else {
		metrics.SyncPartialProxyRulesLatency.WithLabelValues(family).Observe(elapsed)
	}
	metrics.SyncProxyRulesLastTimestamp.WithLabelValues(family).SetToCurrentTime()
	for _, at := range changes.TriggerTimes {
		metrics.NetworkProgrammingLatency.WithLabelValues(family).Observe(metrics.SinceInSeconds(at))
	}
	svcs, eps := p.tracker.Pending()
	metrics.ServiceChangesPending.Set(float64(svcs))
	metrics.EndpointChangesPending.Set(float64(eps))
	if p.cfg.Health != nil && svcs == 0 && eps == 0 {
		p.cfg.Health.Updated(p.cfg.Family)
	}
	p.afterSync(changes)
	klog.V(2).InfoS("Synced iptables rules", "ipFamily", family, "full", full, "changedServicePorts", len(changes.ServicePorts), "elapsed", time.Since(start))
	if full {
		// A full sync's restore text (tens of MB at 10k services) is
		// garbage now; hand it back to the node at once instead of
		// holding it until the runtime's background scavenger gets there.
		debug.FreeOSMemory()
	}
	return nil
}

// largeCluster tells whether the services have more endpoints in all than
// LargeClusterEndpoints, counted as upstream does.
func (p *Proxier) largeCluster() bool {
	total := 0
	for name := range p.state.Services {
		total += len(p.state.Endpoints[name])
	}
	return total > LargeClusterEndpoints
}

// rulesFor decides one service port's rules from the current state.
func (p *Proxier) rulesFor(name state.ServicePortName) (ServiceRules, bool) {
	svc, ok := p.state.Services[name]
	if !ok {
		return ServiceRules{}, false
	}
	sel := state.Select(svc, p.state.Endpoints[name], p.node)
	return p.cfg.Params.ServiceRules(svc, sel), true
}

// partialSync rewrites only what the changed service ports own, in one
// restore input, atomic per table.
func (p *Proxier) partialSync(changes state.Changes) error {
	if len(changes.ServicePorts) == 0 {
		return nil
	}
	in := newRestoreInput()
	updated := make(map[state.ServicePortName]appliedService, len(changes.ServicePorts))
	for name := range changes.ServicePorts {
		rules, _ := p.rulesFor(name)
		updated[name] = summarize(rules)
		diffService(in, p.applied[name], updated[name], rules)
	}
	if !in.empty() {
		if err := p.restore(in.reader()); err != nil {
			return err
		}
	}
	for name, rules := range updated {
		p.setApplied(name, rules)
	}
	p.reportRuleCounts(in)
	return nil
}

// fullSync brings the whole rule set in line, whatever the kernel holds:
// our rules from before, upstream's, or none. It reads the kernel once and
// writes only the chains whose content differs, so a restart over rules
// already in place writes next to nothing. Each service's rules are
// decided, written out as restore text and dropped, so the rules of every
// service are never held at once. What is written, in this order (see
// fullSyncWriter: several inputs on nft, one input on legacy):
// the fixed chains; the per-service chains, which nothing jumps to yet;
// then the differences in the shared chains, which switch traffic over
// atomically per table, with the removal of chains nothing uses any more
// and the jumps from the built-in chains.
func (p *Proxier) fullSync() error {
	kernel, err := p.readKernel()
	if err != nil {
		return err
	}
	static := p.cfg.Params.StaticRules()

	fixed := newRestoreInput()
	for _, t := range kubeTables {
		if !kernel[t].has(chainCanary) {
			fixed.writeChain(t, OwnChain{Name: chainCanary})
		}
	}
	for t, chains := range static.Chains {
		for _, c := range chains {
			if !kernel[t].holds(c) {
				fixed.writeChain(t, c)
			}
		}
	}
	writer, err := newFullSyncWriter(p.restore, p.cfg.ChainRefsPerRestore, fixed)
	if err != nil {
		return err
	}
	desired := make(map[state.ServicePortName]appliedService, len(p.state.Services))
	wanted := map[Chain]bool{}
	var shared [][]SharedRule
	for _, name := range p.serviceOrder() {
		rules, _ := p.rulesFor(name)
		desired[name] = summarize(rules)
		shared = append(shared, rules.Shared)
		var differ []OwnChain
		for _, c := range rules.Chains {
			wanted[c.Name] = true
			if !kernel[TableNAT].holds(c) {
				differ = append(differ, c)
			}
		}
		if err := writer.addService(differ); err != nil {
			return err
		}
	}

	final := newRestoreInput()
	contents := sharedChainContents(static, shared)
	for _, t := range kubeTables {
		for i, want := range contents[t] {
			tail := len(static.Shared[t][i].Rules)
			if !kernel[t].has(want.Name) {
				if err := writer.addNewSharedChain(t, want, tail, final); err != nil {
					return err
				}
				continue
			}
			diffSharedChain(final, t, kernel[t].rules[want.Name], want, tail)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(kernel[TableNAT].fingerprints)) {
		if IsServiceChain(c) && !wanted[c] {
			final.deleteChain(TableNAT, c)
		}
	}
	for _, j := range static.Jumps {
		if !containsRule(kernel[j.Table].rules[j.From], j.Rule) {
			final.insertFirst(j.Table, j.From, j.Rule)
		}
	}
	if err := writer.finish(final); err != nil {
		return err
	}
	p.applied = desired
	p.countAllRules(static)
	metrics.IPTablesRulesLastSync.WithLabelValues(string(TableNAT), string(p.cfg.Family)).Set(float64(p.ruleCounts[TableNAT]))
	metrics.IPTablesRulesLastSync.WithLabelValues(string(TableFilter), string(p.cfg.Family)).Set(float64(p.ruleCounts[TableFilter]))
	return nil
}

// serviceOrder is every service port in a stable order, so that the same
// state always gives the same rule set.
func (p *Proxier) serviceOrder() []state.ServicePortName {
	return slices.SortedFunc(maps.Keys(p.state.Services), func(a, b state.ServicePortName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
}

// sharedChainContents gathers the services' rules into the shared chains,
// ahead of each chain's fixed tail (the NodePort jump must stay last).
func sharedChainContents(static StaticRules, services [][]SharedRule) map[Table][]OwnChain {
	gathered := map[Table]map[Chain][]Rule{}
	for _, rules := range services {
		for _, r := range rules {
			if gathered[r.Table] == nil {
				gathered[r.Table] = map[Chain][]Rule{}
			}
			gathered[r.Table][r.Chain] = append(gathered[r.Table][r.Chain], r.Rule)
		}
	}
	out := map[Table][]OwnChain{}
	for t, chains := range static.Shared {
		for _, c := range chains {
			out[t] = append(out[t], OwnChain{Name: c.Name, Rules: append(gathered[t][c.Name], c.Rules...)})
		}
	}
	return out
}

// readKernel reads the three tables kube-proxy writes to, keeping the
// rules of the shared and built-in chains.
func (p *Proxier) readKernel() (map[Table]kernelTable, error) {
	before := p.watch.generations()
	data, err := p.cfg.Kernel.Save()
	if err != nil {
		return nil, err
	}
	p.watch.fullSyncRead(before, p.watch.generations())
	return readTables(data, func(t Table, c Chain) bool { return builtinChains[c] || slices.Contains(SharedChains[t], c) }), nil
}

// builtinChains are the kernel's own chains, which hold our jumps.
var builtinChains = map[Chain]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

func (p *Proxier) setApplied(name state.ServicePortName, applied appliedService) {
	for t, n := range applied.ruleCounts() {
		p.ruleCounts[t] += n
	}
	for t, n := range p.applied[name].ruleCounts() {
		p.ruleCounts[t] -= n
	}
	if len(applied.chains) == 0 && len(applied.shared) == 0 {
		delete(p.applied, name)
		return
	}
	p.applied[name] = applied
}

func (p *Proxier) countAllRules(static StaticRules) {
	p.ruleCounts = map[Table]int{}
	for _, applied := range p.applied {
		for t, n := range applied.ruleCounts() {
			p.ruleCounts[t] += n
		}
	}
	for _, group := range []map[Table][]OwnChain{static.Chains, static.Shared} {
		for t, chains := range group {
			for _, c := range chains {
				p.ruleCounts[t] += len(c.Rules)
			}
		}
	}
}

func (p *Proxier) reportRuleCounts(in *restoreInput) {
	family := string(p.cfg.Family)
	written := in.counts()
	for _, t := range []Table{TableFilter, TableNAT} {
		metrics.IPTablesRulesTotal.WithLabelValues(string(t), family).Set(float64(p.ruleCounts[t]))
		metrics.IPTablesRulesLastSync.WithLabelValues(string(t), family).Set(float64(written[t]))
	}
}

// afterSync updates what depends on a successful sync: health-check
// servers, the no-local-endpoints metric and conntrack.
func (p *Proxier) afterSync(changes state.Changes) {
	family := string(p.cfg.Family)
	for _, t := range []Table{TableFilter, TableNAT} {
		metrics.IPTablesRulesTotal.WithLabelValues(string(t), family).Set(float64(p.ruleCounts[t]))
	}
	if p.cfg.ServiceHealth != nil {
		ports := map[types.NamespacedName]int32{}
		local := map[types.NamespacedName]int{}
		for name, svc := range p.state.Services {
			if svc.HealthCheckNodePort == 0 {
				continue
			}
			ports[name.NamespacedName] = svc.HealthCheckNodePort
			for _, ep := range p.state.Endpoints[name] {
				if ep.IsLocal && ep.Ready {
					local[name.NamespacedName]++
				}
			}
		}
		if err := p.cfg.ServiceHealth.SyncServices(ports); err != nil {
			klog.ErrorS(err, "Health check node ports")
		}
		p.cfg.ServiceHealth.SyncEndpoints(local)
	}
	if p.cfg.Conntrack == nil {
		return
	}
	if len(changes.StaleEndpoints) > 0 || len(changes.NewlyActiveUDP) > 0 {
		if err := p.cfg.Conntrack.ClearStale(p.cfg.Family, p.state.Services, changes); err != nil {
			klog.ErrorS(err, "Clearing stale conntrack entries", "ipFamily", family)
		}
	}
	// A full pass reads the whole conntrack table: once per sync period,
	// starting with the first sync, which catches what changed while
	// kube-proxy was not running.
	if time.Since(p.lastReconcile) >= p.cfg.SyncPeriod {
		if err := p.cfg.Conntrack.Reconcile(p.cfg.Family, p.state.Services, p.state.Endpoints); err != nil {
			klog.ErrorS(err, "Reconciling conntrack entries", "ipFamily", family)
		}
		p.lastReconcile = time.Now()
	}
}

// flushCheckInterval is how often the proxier checks that no other program
// flushed its rules (a firewalld reload, iptables -F).
const flushCheckInterval = time.Second

// flushProbe is one thing a flush would remove: a rule in a chain, or,
// with no rule, the chain itself.
type flushProbe struct {
	table Table
	chain Chain
	rule  Rule
	// every is how many check intervals apart the probe runs.
	every int
}

// flushProbes: the filter FORWARD jump is checked every second (gone with
// `iptables -F`, a firewall reload or a reset of the whole ruleset); the
// others once per sync period: the mangle canary (gone when a program
// deletes the tables' chains, what upstream checks) and the nat PREROUTING
// jump (the nat table can be large, and reading even one of its chains
// costs iptables-legacy a copy of the whole table).
func (p *Proxier) flushProbes() []flushProbe {
	slow := max(1, int(p.cfg.SyncPeriod/flushCheckInterval))
	probes := []flushProbe{{table: TableMangle, chain: chainCanary, every: slow}}
	for _, j := range p.cfg.Params.StaticRules().Jumps {
		switch {
		case j.Table == TableFilter && j.From == "FORWARD" && jumpTarget(string(j.Rule)) == chainForward:
			probes = append(probes, flushProbe{table: j.Table, chain: j.From, rule: j.Rule, every: 1})
		case j.Table == TableNAT && j.From == "PREROUTING":
			probes = append(probes, flushProbe{table: j.Table, chain: j.From, rule: j.Rule, every: slow})
		}
	}
	return probes
}

// flushed tells whether the probe finds its rule or chain gone.
func (p *Proxier) flushed(probe flushProbe) bool {
	rules, err := p.cfg.Kernel.ListRules(string(probe.table), string(probe.chain))
	if err != nil {
		return true
	}
	if probe.rule == "" {
		return false
	}
	have := make([]Rule, len(rules))
	for i, r := range rules {
		have[i] = Rule(r)
	}
	return !containsRule(have, probe.rule)
}

// watchForFlush runs the flush probes and forces a full sync, which
// restores everything, when one finds our rules gone.
func (p *Proxier) watchForFlush(ctx context.Context) {
	ticker := time.NewTicker(flushCheckInterval)
	defer ticker.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		p.mu.Lock()
		// Before the first full sync there is nothing of ours to lose.
		written := !p.needFullSync
		p.mu.Unlock()
		if !written {
			continue
		}
		probe, flushed := p.watch.check(tick)
		if !flushed {
			continue
		}
		klog.InfoS("Our iptables rules were flushed by another program; restoring them", "ipFamily", p.cfg.Family, "table", probe.table, "chain", probe.chain)
		metrics.IPTablesFlushRecoveriesTotal.WithLabelValues(string(p.cfg.Family)).Inc()
		p.mu.Lock()
		p.needFullSync = true
		p.mu.Unlock()
		p.queue()
	}
}

// flushRecheckPeriod bounds how long a probe trusts that the generation
// changes since it last looked were all our own writes: a foreign write in
// the moments between reading a generation and our restore starting or
// ending would otherwise go unseen until the table changes again.
const flushRecheckPeriod = time.Hour

// flushWatch runs each flush probe (a process start, and on legacy a copy
// of the table: 1.6 s for the nat table at 30k services) only when its
// table's generation moved since the probe last looked, and not by our
// own writes alone: nothing can have been flushed from a table that did
// not change, and a restore of ours leaves the jumps it found in place.
type flushWatch struct {
	p       *Proxier
	probes  []flushProbe
	recheck int

	mu sync.Mutex
	// seen is, per probe, the generation at which it last found its rule,
	// moved on by our own writes from there; listed is the tick it last
	// listed its chain.
	seen   []uint64
	listed []int
}

func (p *Proxier) newFlushWatch() *flushWatch {
	probes := p.flushProbes()
	return &flushWatch{
		p: p, probes: probes, recheck: int(flushRecheckPeriod / flushCheckInterval),
		seen: make([]uint64, len(probes)), listed: make([]int, len(probes)),
	}
}

// check runs the probes due at this tick and returns the first that finds
// our rules gone.
func (w *flushWatch) check(tick int) (flushProbe, bool) {
	for i, probe := range w.probes {
		if tick%probe.every != 0 {
			continue
		}
		generation, err := w.p.cfg.Kernel.Generation(string(probe.table))
		w.mu.Lock()
		unchanged := err == nil && generation == w.seen[i] && tick-w.listed[i] < w.recheck
		if !unchanged {
			w.seen[i], w.listed[i] = generation, tick
		}
		w.mu.Unlock()
		if !unchanged && w.p.flushed(probe) {
			return probe, true
		}
	}
	return flushProbe{}, false
}

// tableGeneration is one probe's table generation, if it could be read.
type tableGeneration struct {
	value uint64
	ok    bool
}

// generations reads each probe's table generation.
func (w *flushWatch) generations() []tableGeneration {
	out := make([]tableGeneration, len(w.probes))
	for i, probe := range w.probes {
		value, err := w.p.cfg.Kernel.Generation(string(probe.table))
		out[i] = tableGeneration{value: value, ok: err == nil}
	}
	return out
}

// ownWrite records that a restore of ours moved the tables from the
// generations before to those after: a probe that had found its rule at
// before still has it at after.
func (w *flushWatch) ownWrite(before, after []tableGeneration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.probes {
		if before[i].ok && after[i].ok && before[i].value == w.seen[i] {
			w.seen[i] = after[i].value
		}
	}
}

// fullSyncRead records that a full sync read the tables, which did not
// change while it read them: what the probes look for is either there or
// written by that sync (and if the sync fails, the next full one writes
// it, while the watch waits), so the probes need not list their chains
// after the first sync or the recovery from a flush.
func (w *flushWatch) fullSyncRead(before, after []tableGeneration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.probes {
		if before[i].ok && after[i].ok && before[i].value == after[i].value {
			w.seen[i] = before[i].value
		}
	}
}

// restore writes one input and tells the flush watch the generation
// change was ours.
func (p *Proxier) restore(in io.Reader) error {
	before := p.watch.generations()
	if err := p.cfg.Kernel.Restore(in); err != nil {
		return err
	}
	p.watch.ownWrite(before, p.watch.generations())
	return nil
}

// splitArgs splits a rule into arguments, unquoting the quoted comments.
func splitArgs(r Rule) []string {
	var args []string
	s := string(r)
	for len(s) > 0 {
		s = strings.TrimLeft(s, " ")
		if s == "" {
			break
		}
		if s[0] == '"' {
			prefix, err := strconv.QuotedPrefix(s)
			if err == nil {
				unq, _ := strconv.Unquote(prefix)
				args = append(args, unq)
				s = s[len(prefix):]
				continue
			}
		}
		end := strings.IndexByte(s, ' ')
		if end < 0 {
			end = len(s)
		}
		args = append(args, s[:end])
		s = s[end:]
	}
	return args
}
