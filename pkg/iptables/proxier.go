// Over 600 lines: the full and partial syncs, the flush probes and the
// kernel state they read, which share the syncer's lock and the tables'
// generations; the watch's pacing is the core's (pkg/proxy/watch.go).

package iptables

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Config are the iptables mode's inputs.
type Config struct {
	Family v1.IPFamily
	Kernel Kernel
	Params Params
	// SyncPeriod paces the slower flush probes.
	SyncPeriod time.Duration
	// ChainRefsPerRestore splits a full sync's service chains into inputs
	// referring to about this many chain names; 0 writes them all in one.
	ChainRefsPerRestore int
	// EnsureNFAcct, with Params.NFAcct, re-creates the nfacct objects
	// before each full sync (EnsureNFAcctObjects).
	EnsureNFAcct func() error
}

// ChainRefsPerRestoreNFT bounds the chain names one restore input refers
// to on the nft backend, declared or jumped to: iptables-nft-restore (1.8.9)
// spends time in the square of that number, so a large first sync is split
// (10k names in one input take ~1 s, 20k ~10 s; 1k take ~25 ms). The legacy
// backend rewrites the whole table on every restore, so there one input is
// best.
const ChainRefsPerRestoreNFT = 1000

// The core finds a mode's optional capabilities by type assertion: these
// make a renamed method a compile error instead of a capability silently
// switched off.
var (
	_ proxy.Describer = (*Syncer)(nil)
	_ proxy.Preparer  = (*Syncer)(nil)
	_ proxy.Prober    = (*Syncer)(nil)
)

// Syncer is the iptables mode for one IP family: the proxy core hands it
// the state to write, and it writes only what differs from what it wrote.
type Syncer struct {
	cfg Config
	// state is what the sync in progress reads.
	state state.View
	// applied is what each service port has in the kernel now.
	applied    map[state.ServicePortName]appliedService
	ruleCounts map[Table]int
	watch      *flushWatch

	// written is true once a full sync has written everything and no
	// flush was seen since: before that there is nothing to lose.
	// verifying is set when the watch asked for a full sync because
	// another program changed a table we write to. probeTick counts the
	// core's calls of Probe (from one goroutine).
	writtenMu sync.Mutex
	written   bool
	verifying bool
	probeTick int

	// prepared is the kernel as Prepare read it, for the first full sync.
	prepared *iptableskernel.PreparedKernel

	// rewritten names (the first few) the chains a full sync found
	// differing in the kernel; repairs counts those it had written
	// before, as they are: another program changed them.
	rewritten []Chain
	repairs   int
}

// New returns the iptables mode; proxy.NewCore runs it.
func New(cfg Config) *Syncer {
	p := &Syncer{
		cfg:        cfg,
		applied:    map[state.ServicePortName]appliedService{},
		ruleCounts: map[Table]int{},
	}
	p.watch = p.newFlushWatch()
	// Served from the start, at zero: a counter that first appears at 1
	// hides that first failure or recovery from increase() in alerts.
	for _, c := range []*prometheus.CounterVec{metrics.IPTablesRestoreFailuresTotal, metrics.IPTablesPartialRestoreFailuresTotal, metrics.IPTablesFlushRecoveriesTotal} {
		c.WithLabelValues(string(cfg.Family))
	}
	return p
}

// PartialSync rewrites only what the changed service ports own.
func (p *Syncer) PartialSync(v state.View, changed map[state.ServicePortName]bool) error {
	p.state = v
	// Crossing the large-cluster line changes every endpoint chain's
	// rules. Counting walks every service, so an idle periodic sync
	// skips it.
	if len(changed) > 0 && p.largeCluster() != p.cfg.Params.LargeCluster {
		return proxy.ErrFullSyncNeeded
	}
	if err := p.partialSync(changed); err != nil {
		metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues(string(p.cfg.Family)).Inc()
		return err
	}
	return nil
}

// FullSync brings every rule in line, whatever the kernel holds.
func (p *Syncer) FullSync(v state.View) error {
	p.state = v
	p.cfg.Params.LargeCluster = p.largeCluster()
	// As upstream: another program may have deleted the nfacct objects,
	// and a restore of the rules that count in them would fail.
	if p.cfg.Params.NFAcct && p.cfg.EnsureNFAcct != nil {
		if err := p.cfg.EnsureNFAcct(); err != nil {
			return fmt.Errorf("nfacct objects: %w", err)
		}
	}
	p.writtenMu.Lock()
	verifying := p.verifying
	p.verifying = false
	p.writtenMu.Unlock()
	p.rewritten, p.repairs = p.rewritten[:0], 0
	err := p.fullSync(verifying)
	p.writtenMu.Lock()
	p.written = err == nil
	p.writtenMu.Unlock()
	if err != nil {
		metrics.IPTablesRestoreFailuresTotal.WithLabelValues(string(p.cfg.Family)).Inc()
		return err
	}
	if p.repairs > 0 {
		klog.InfoS("Restored our iptables rules that another program had changed", "ipFamily", p.cfg.Family, "repairedChains", p.repairs, "rewritten", p.rewritten)
		metrics.IPTablesFlushRecoveriesTotal.WithLabelValues(string(p.cfg.Family)).Inc()
	}
	return nil
}

// noteRewritten records that a full sync rewrites a chain, and whether
// that repairs another program's change.
func (p *Syncer) noteRewritten(c Chain, repair bool) {
	if len(p.rewritten) < 10 {
		p.rewritten = append(p.rewritten, c)
	}
	if repair {
		p.repairs++
	}
}

// largeCluster tells whether the services have more endpoints in all than
// LargeClusterEndpoints, counted as upstream does.
func (p *Syncer) largeCluster() bool {
	total := 0
	for name := range p.state.Services {
		total += len(p.state.Endpoints[name])
	}
	return total > LargeClusterEndpoints
}

// rulesFor decides one service port's rules from the current state.
func (p *Syncer) rulesFor(name state.ServicePortName) (ServiceRules, bool) {
	svc, sel, ok := p.state.Select(name)
	if !ok {
		return ServiceRules{}, false
	}
	return p.cfg.Params.ServiceRules(svc, sel), true
}

// partialSync rewrites only what the changed service ports own, in one
// restore input, atomic per table.
func (p *Syncer) partialSync(changed map[state.ServicePortName]bool) error {
	if len(changed) == 0 {
		return nil
	}
	in := iptableskernel.NewRestoreInput()
	updated := make(map[state.ServicePortName]appliedService, len(changed))
	for name := range changed {
		rules, _ := p.rulesFor(name)
		updated[name] = summarize(rules)
		diffService(in, p.applied[name], updated[name], rules)
	}
	if !in.Empty() {
		if err := p.restore(in.Reader()); err != nil {
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
// and the jumps from the built-in chains. A service chain rewritten as it
// was applied is a repair, and so are the fixed chains and jumps when the
// watch saw another program's change (verifying); the shared chains also
// change with the services, and are only named.
func (p *Syncer) fullSync(verifying bool) error {
	kernel, err := p.readKernel()
	if err != nil {
		return err
	}
	static := p.cfg.Params.StaticRules()

	fixed := iptableskernel.NewRestoreInput()
	for _, t := range iptableskernel.KubeTables {
		if !kernel[t].Has(chainCanary) {
			fixed.WriteChain(t, OwnChain{Name: chainCanary})
			p.noteRewritten(chainCanary, verifying)
		}
	}
	for t, chains := range static.Chains {
		for _, c := range chains {
			if !kernel[t].Holds(c) {
				fixed.WriteChain(t, c)
				p.noteRewritten(c.Name, verifying)
			}
		}
	}
	writer, err := newFullSyncWriter(p.restore, p.cfg.ChainRefsPerRestore, fixed)
	if err != nil {
		return err
	}
	desired := make(map[state.ServicePortName]appliedService, len(p.state.Services))
	shared := make([][]SharedRule, 0, len(p.state.Services))
	for _, svc := range p.serviceOrder() {
		name := svc.Name
		rules, _ := p.rulesFor(name)
		desired[name] = summarize(rules)
		shared = append(shared, rules.Shared)
		var differ []OwnChain
		for i, c := range rules.Chains {
			if !kernel[TableNAT].Holds(c) {
				differ = append(differ, c)
				p.noteRewritten(c.Name, slices.Contains(p.applied[name].chains, desired[name].chains[i]))
			}
			kernel[TableNAT].Claim(c.Name)
		}
		if err := writer.addService(differ); err != nil {
			return err
		}
	}

	// Read before the shared chains are gathered, the sync's peak, since
	// it drops the index of service chains.
	stale, err := kernel[TableNAT].ServiceChainNames(p.cfg.Kernel, TableNAT)
	if err != nil {
		return err
	}
	final := iptableskernel.NewRestoreInput()
	contents := sharedChainContents(static, shared)
	for _, t := range iptableskernel.KubeTables {
		for i, want := range contents[t] {
			tail := len(static.Shared[t][i].Rules)
			if !kernel[t].Has(want.Name) {
				if err := writer.addNewSharedChain(t, want, tail, final); err != nil {
					return err
				}
				continue
			}
			lines := final.Lines(t)
			remove := diffSharedChain(final, t, kernel[t].RuleFingerprints(want.Name), want, tail)
			if err := p.removeKernelRules(final, t, want.Name, remove); err != nil {
				return err
			}
			if final.Lines(t) > lines {
				p.noteRewritten(want.Name, false)
			}
		}
	}
	for _, c := range stale {
		final.DeleteChain(TableNAT, c)
	}
	for _, j := range static.Jumps {
		if !iptableskernel.ContainsRule(kernel[j.Table].Rules(j.From), j.Rule) {
			final.InsertFirst(j.Table, j.From, j.Rule)
			p.noteRewritten(j.From, verifying)
		}
	}
	// Over the IPVS mode's rules (a switch), its jumps go in this commit,
	// and nat goes first: until nat DNATs, IPVS takes new connections at
	// INPUT, where this mode's firewall would drop those to a load
	// balancer's IP. Otherwise (a restart, upstream's rules) the jumps
	// of other kube-proxies stay as they are.
	if iptableskernel.HoldsIPVSModeChains(kernel) {
		iptableskernel.RemoveOtherJumps(final, kernel, static.Jumps)
		final.NATFirst = true
	}
	if err := writer.finish(final); err != nil {
		return err
	}
	p.applied = desired
	p.countAllRules(static)
	family := string(p.cfg.Family)
	for _, t := range []Table{TableFilter, TableNAT} {
		metrics.IPTablesRulesTotal.WithLabelValues(string(t), family).Set(float64(p.ruleCounts[t]))
		metrics.IPTablesRulesLastSync.WithLabelValues(string(t), family).Set(float64(p.ruleCounts[t]))
	}
	return nil
}

// serviceOrder is every service port in a stable order, so that the same
// state always gives the same rule set: pointers, which at 10k services
// hold 0.6 MB less than the names through the sync.
func (p *Syncer) serviceOrder() []*state.ServicePort {
	return slices.SortedFunc(maps.Values(p.state.Services), func(x, y *state.ServicePort) int {
		a, b := x.Name, y.Name
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

// Prepare reads the kernel while the informers list, before the first
// sync: a restart reads some 18 MB of iptables-save text at 10k services,
// and its garbage would otherwise come on top of the sync's peak, the
// process's. The first full sync takes this read only if no other program
// changed the tables since (their generations, as the flush probes read
// them); else it reads them again.
func (p *Syncer) Prepare() {
	before := p.watch.generations()
	tables, err := p.saveKernel()
	if after := p.watch.generations(); err == nil && iptableskernel.SameGenerations(before, after) {
		p.prepared = &iptableskernel.PreparedKernel{Tables: tables, Generations: after}
	}
}

// readKernel reads the three tables kube-proxy writes to, keeping the
// rules of the shared and built-in chains, or takes what Prepare read if
// the tables have not changed since.
func (p *Syncer) readKernel() (map[Table]iptableskernel.KernelTable, error) {
	before := p.watch.generations()
	if prepared := p.prepared; prepared != nil {
		p.prepared = nil
		if iptableskernel.SameGenerations(prepared.Generations, before) {
			p.watch.fullSyncRead(before, before)
			return prepared.Tables, nil
		}
	}
	tables, err := p.saveKernel()
	if err != nil {
		return nil, err
	}
	p.watch.fullSyncRead(before, p.watch.generations())
	return tables, nil
}

// saveKernel reads every table with what a full sync keeps of its chains.
func (p *Syncer) saveKernel() (map[Table]iptableskernel.KernelTable, error) {
	return iptableskernel.SaveTables(p.cfg.Kernel, func(t Table, c Chain) iptableskernel.RuleKeeping {
		switch {
		case iptableskernel.BuiltinChains[c]:
			return iptableskernel.KeepRuleText
		case slices.Contains(SharedChains[t], c):
			return iptableskernel.KeepRuleFingerprints
		}
		return iptableskernel.KeepNoRules
	})
}

// removeKernelRules deletes from a shared chain the kernel's rules of
// these fingerprints: a full sync keeps only fingerprints of those chains'
// rules, so the chain is listed again for the text of the rules to
// delete (none on a restart over rules in place).
func (p *Syncer) removeKernelRules(in *iptableskernel.RestoreInput, t Table, c Chain, remove []uint64) error {
	if len(remove) == 0 {
		return nil
	}
	rules, err := p.cfg.Kernel.ListRules(string(t), string(c))
	if err != nil {
		return err
	}
	left := map[uint64]int{}
	for _, fp := range remove {
		left[fp]++
	}
	for _, r := range rules {
		if fp := iptableskernel.RuleFingerprint(Rule(r)); left[fp] > 0 {
			left[fp]--
			in.DeleteRule(t, c, Rule(r))
		}
	}
	return nil
}

func (p *Syncer) setApplied(name state.ServicePortName, applied appliedService) {
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

func (p *Syncer) countAllRules(static StaticRules) {
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

func (p *Syncer) reportRuleCounts(in *iptableskernel.RestoreInput) {
	family := string(p.cfg.Family)
	written := in.Counts()
	for _, t := range []Table{TableFilter, TableNAT} {
		metrics.IPTablesRulesTotal.WithLabelValues(string(t), family).Set(float64(p.ruleCounts[t]))
		metrics.IPTablesRulesLastSync.WithLabelValues(string(t), family).Set(float64(written[t]))
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
	// verify: when another program changed the table, whatever the
	// probe finds, have a full sync compare our chains with the kernel.
	verify bool
}

// flushProbes: the filter FORWARD jump is checked every second (gone with
// `iptables -F`, a firewall reload or a reset of the whole ruleset), and
// so is the nat table's generation: when another program changed the nat
// table (where the service chains are), a full sync compares every chain
// with the kernel (a service chain deleted, a rule inserted into one);
// the nat PREROUTING jump is listed at the sync period, as is the mangle
// canary (gone when a program deletes the tables' chains, what upstream
// checks): reading even one nat chain costs iptables-legacy a copy of the
// whole table.
func (p *Syncer) flushProbes() []flushProbe {
	slow := max(1, int(p.cfg.SyncPeriod/flushCheckInterval))
	probes := []flushProbe{{table: TableMangle, chain: chainCanary, every: slow}}
	for _, j := range p.cfg.Params.StaticRules().Jumps {
		switch {
		case j.Table == TableFilter && j.From == "FORWARD" && iptableskernel.JumpTarget(string(j.Rule)) == chainForward:
			probes = append(probes, flushProbe{table: j.Table, chain: j.From, rule: j.Rule, every: 1})
		case j.Table == TableNAT && j.From == "PREROUTING":
			probes = append(probes, flushProbe{table: j.Table, chain: j.From, rule: j.Rule, every: slow},
				flushProbe{table: j.Table, every: 1, verify: true})
		}
	}
	return probes
}

// flushed tells whether the probe finds its rule or chain gone; a
// verifying probe lists nothing.
func (p *Syncer) flushed(probe flushProbe) bool {
	if probe.verify {
		return false
	}
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
	return !iptableskernel.ContainsRule(have, probe.rule)
}

// ProbeInterval is how often the core runs Probe.
func (p *Syncer) ProbeInterval() time.Duration { return flushCheckInterval }

// Probe runs the flush probes due at this tick: gone names the chain of
// ours a probe found flushed, changed says another program changed the
// nat table (on nft, every change to any table moves the generation the
// probes read). Nothing is probed until a full sync has written
// everything, and again after each repair.
func (p *Syncer) Probe(context.Context) (gone string, changed bool) {
	tick := p.probeTick
	p.probeTick++
	p.writtenMu.Lock()
	written := p.written
	p.writtenMu.Unlock()
	if !written {
		return "", false
	}
	probe, flushed, changed := p.watch.check(tick)
	if !flushed {
		return "", changed
	}
	klog.InfoS("Our iptables rules were flushed by another program; restoring them", "ipFamily", p.cfg.Family, "table", probe.table, "chain", probe.chain)
	return string(probe.table) + " " + string(probe.chain), changed
}

// RepairNext has the next full sync count what it rewrites as repairs,
// and stops the probes until it has written everything.
func (p *Syncer) RepairNext() {
	p.writtenMu.Lock()
	p.written, p.verifying = false, true
	p.writtenMu.Unlock()
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
	p       *Syncer
	probes  []flushProbe
	recheck int

	mu sync.Mutex
	// seen is, per probe, the generation at which it last found its rule,
	// moved on by our own writes from there; listed is the tick it last
	// listed its chain.
	seen   []uint64
	listed []int
}

func (p *Syncer) newFlushWatch() *flushWatch {
	probes := p.flushProbes()
	return &flushWatch{
		p: p, probes: probes, recheck: int(flushRecheckPeriod / flushCheckInterval),
		seen: make([]uint64, len(probes)), listed: make([]int, len(probes)),
	}
}

// check runs the probes due at this tick and returns the first that finds
// our rules gone; changed tells whether another program changed a table a
// verifying probe watches.
func (w *flushWatch) check(tick int) (_ flushProbe, flushed, changed bool) {
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
		switch {
		case unchanged:
		case probe.verify:
			changed = true
		case w.p.flushed(probe):
			return probe, true, changed
		}
	}
	return flushProbe{}, false, changed
}

// generations reads each probe's table generation.
func (w *flushWatch) generations() []iptableskernel.TableGeneration {
	tables := make([]Table, len(w.probes))
	for i, probe := range w.probes {
		tables[i] = probe.table
	}
	return iptableskernel.ReadGenerations(w.p.cfg.Kernel, tables)
}

// ownWrite records that a restore of ours moved the tables from the
// generations before to those after: a probe that had found its rule at
// before still has it at after.
func (w *flushWatch) ownWrite(before, after []iptableskernel.TableGeneration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.probes {
		if before[i].OK && after[i].OK && before[i].Value == w.seen[i] {
			w.seen[i] = after[i].Value
		}
	}
}

// fullSyncRead records that a full sync read the tables, which did not
// change while it read them: what the probes look for is either there or
// written by that sync (and if the sync fails, the next full one writes
// it, while the watch waits), so the probes need not list their chains
// after the first sync or the recovery from a flush.
func (w *flushWatch) fullSyncRead(before, after []iptableskernel.TableGeneration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.probes {
		if before[i].OK && after[i].OK && before[i].Value == after[i].Value {
			w.seen[i] = before[i].Value
		}
	}
}

// restore writes one input and tells the flush watch the generation
// change was ours.
func (p *Syncer) restore(in io.Reader) error {
	before := p.watch.generations()
	if err := p.cfg.Kernel.Restore(in); err != nil {
		return err
	}
	p.watch.ownWrite(before, p.watch.generations())
	return nil
}
