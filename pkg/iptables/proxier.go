package iptables

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/readahead"

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
	Kernel iptableskernel.Kernel
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

// The optional capabilities of the mode contract (pkg/proxy/mode.go) this
// mode has.
var (
	_ proxy.Describer      = (*Syncer)(nil)
	_ proxy.Preparer       = (*Syncer)(nil)
	_ proxy.Prober         = (*Syncer)(nil)
	_ proxy.Tracer         = (*Syncer)(nil)
	_ proxy.FailureCounter = (*Syncer)(nil)
)

// Syncer is the iptables mode for one IP family: the proxy core hands it
// the state to write, and it writes only what differs from what it wrote.
type Syncer struct {
	cfg Config
	// state is what the sync in progress reads.
	state state.View
	// applied is what each service port has in the kernel now.
	applied    map[state.ServicePortName]appliedService
	ruleCounts map[iptableskernel.Table]int
	watch      *flushWatch

	// ruleState is what the full syncs and the watch know of our rules.
	ruleState ruleState
	// probeTick counts the core's calls of Probe (from one goroutine).
	probeTick int

	// prepared is the kernel as Prepare read it, for the first full sync.
	prepared *iptableskernel.PreparedKernel

	// rewritten names (the first few) the chains a full sync found
	// differing in the kernel; repairs counts those it had written
	// before, as they are: another program changed them.
	rewritten []iptableskernel.Chain
	repairs   int
}

// New returns the iptables mode; proxy.NewCore runs it.
func New(cfg Config) *Syncer {
	p := &Syncer{
		cfg:        cfg,
		applied:    map[state.ServicePortName]appliedService{},
		ruleCounts: map[iptableskernel.Table]int{},
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
	return p.partialSync(changed)
}

// FullSync brings every rule in line, whatever the kernel holds.
func (p *Syncer) FullSync(v state.View) error {
	p.state = v
	p.cfg.Params.LargeCluster = p.largeCluster()
	// As upstream: another program may have deleted the nfacct objects,
	// and a restore of the rules that count in them would fail.
	if p.cfg.Params.NFAcct && p.cfg.EnsureNFAcct != nil {
		if err := p.cfg.EnsureNFAcct(); err != nil {
			return fmt.Errorf("%w: %w", errNFAcct, err)
		}
	}
	verifying := p.ruleState.takeRepair()
	p.rewritten, p.repairs = p.rewritten[:0], 0
	if err := p.fullSync(verifying); err != nil {
		p.ruleState.lost(verifying)
		return err
	}
	p.ruleState.wrote()
	if p.repairs > 0 {
		klog.InfoS("Restored our iptables rules that another program had changed", "ipFamily", p.cfg.Family, "repairedChains", p.repairs, "rewritten", p.rewritten)
		metrics.IPTablesFlushRecoveriesTotal.WithLabelValues(string(p.cfg.Family)).Inc()
	}
	return nil
}

// errNFAcct is a full sync stopped before its restore: the nfacct
// objects could not be made.
var errNFAcct = errors.New("nfacct objects")

// CountFailure counts a failed sync as upstream's iptables mode does: a
// failed restore, partial or full; a full sync the nfacct objects stopped
// wrote nothing.
func (p *Syncer) CountFailure(full bool, err error) {
	family := string(p.cfg.Family)
	switch {
	case !full:
		metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues(family).Inc()
	case !errors.Is(err, errNFAcct):
		metrics.IPTablesRestoreFailuresTotal.WithLabelValues(family).Inc()
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

// rulesIn decides one service port's rules from the state v: none when
// the service port is gone.
func rulesIn(params *Params, v state.View, name state.ServicePortName) ServiceRules {
	svc, sel, ok := v.Select(name)
	if !ok {
		return ServiceRules{}
	}
	return params.ServiceRules(svc, sel)
}

// partialPlan is a partial sync's plan: each changed service port's
// change, and what each will have applied once it is written.
type partialPlan struct {
	services []servicePlan
	applied  map[state.ServicePortName]appliedService
}

// planPartial plans the partial sync of the changed service ports from
// the current state, changing nothing.
func (p *Syncer) planPartial(changed map[state.ServicePortName]bool) partialPlan {
	plan := partialPlan{applied: make(map[state.ServicePortName]appliedService, len(changed))}
	for name := range changed {
		rules := rulesIn(&p.cfg.Params, p.state, name)
		updated := summarize(rules)
		plan.applied[name] = updated
		if sp := planService(p.applied[name], updated, rules); !sp.empty() {
			plan.services = append(plan.services, sp)
		}
	}
	return plan
}

// render is the plan's one restore input.
func (pp partialPlan) render() *iptableskernel.RestoreInput {
	in := iptableskernel.NewRestoreInput()
	for _, sp := range pp.services {
		sp.render(in)
	}
	return in
}

// partialSync rewrites only what the changed service ports own, in one
// restore input, atomic per table.
func (p *Syncer) partialSync(changed map[state.ServicePortName]bool) error {
	if len(changed) == 0 {
		return nil
	}
	plan := p.planPartial(changed)
	in := plan.render()
	if !in.Empty() {
		if err := p.restore(in.Reader()); err != nil {
			return err
		}
	}
	for name, applied := range plan.applied {
		p.setApplied(name, applied)
	}
	p.reportRuleCounts(in.Counts())
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
	plan := p.planFullSync(kernel, verifying)
	if err := p.applyFullSync(plan); err != nil {
		return err
	}
	p.accountFullSync(plan)
	return nil
}

// planFullSync plans a full sync over the kernel as read; the plan reads
// the kernel again only for what the first read left out (kernelRereads).
func (p *Syncer) planFullSync(kernel map[iptableskernel.Table]iptableskernel.KernelTable, verifying bool) *fullSyncPlan {
	return &fullSyncPlan{
		params: &p.cfg.Params, static: p.cfg.Params.StaticRules(), view: p.state, kernel: kernel,
		rereads: kernelRereads{
			staleChains: func(nat iptableskernel.KernelTable) ([]iptableskernel.Chain, error) {
				return nat.ServiceChainNames(p.cfg.Kernel, iptableskernel.TableNAT)
			},
			listRules: func(t iptableskernel.Table, c iptableskernel.Chain) ([]string, error) {
				return p.cfg.Kernel.ListRules(string(t), string(c))
			},
		},
		batchRefs: p.cfg.ChainRefsPerRestore, previous: p.applied, verifying: verifying,
	}
}

// applyFullSync restores the plan's inputs in turn, as the plan makes
// them, and stops at the first that fails.
func (p *Syncer) applyFullSync(plan *fullSyncPlan) error {
	for step := range plan.inputs {
		in := step.reader()
		if in == nil {
			continue
		}
		if err := p.restore(in); err != nil {
			return err
		}
	}
	return plan.err
}

// accountFullSync records what a written full sync applied, and counts
// its rules: a full sync counts all of them as written.
func (p *Syncer) accountFullSync(plan *fullSyncPlan) {
	p.applied = plan.applied
	p.rewritten, p.repairs = plan.rewrites.names, plan.rewrites.repairs
	p.countAllRules(plan.static)
	p.reportRuleCounts(p.ruleCounts)
}

// serviceOrder is every service port in a stable order, so that the same
// state always gives the same rule set: pointers, which at 10k services
// hold 0.6 MB less than the names through the sync.
func serviceOrder(v state.View) []*state.ServicePort {
	return slices.SortedFunc(maps.Values(v.Services), func(x, y *state.ServicePort) int {
		a, b := x.Name, y.Name
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
}

// sharedChainContents gathers the services' rules into the shared chains,
// ahead of each chain's fixed tail (the NodePort jump must stay last).
func sharedChainContents(static StaticRules, services [][]SharedRule) map[iptableskernel.Table][]iptableskernel.OwnChain {
	gathered := map[iptableskernel.Table]map[iptableskernel.Chain][]iptableskernel.Rule{}
	for _, rules := range services {
		for _, r := range rules {
			if gathered[r.Table] == nil {
				gathered[r.Table] = map[iptableskernel.Chain][]iptableskernel.Rule{}
			}
			gathered[r.Table][r.Chain] = append(gathered[r.Table][r.Chain], r.Rule)
		}
	}
	out := map[iptableskernel.Table][]iptableskernel.OwnChain{}
	for t, chains := range static.Shared {
		for _, c := range chains {
			out[t] = append(out[t], iptableskernel.OwnChain{Name: c.Name, Rules: append(gathered[t][c.Name], c.Rules...)})
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
	p.prepared = readahead.Make(iptableskernel.Generations(p.watch.generations), p.saveKernel)
}

// readKernel reads the three tables kube-proxy writes to, keeping the
// rules of the shared and built-in chains, or takes what Prepare read if
// the tables have not changed since.
func (p *Syncer) readKernel() (map[iptableskernel.Table]iptableskernel.KernelTable, error) {
	before := p.watch.generations()
	prepared := p.prepared
	p.prepared = nil
	if tables, ok := prepared.Take(iptableskernel.Generations(p.watch.generations), before, 0); ok {
		p.watch.fullSyncRead(before, before)
		return tables, nil
	}
	tables, err := p.saveKernel()
	if err != nil {
		return nil, err
	}
	p.watch.fullSyncRead(before, p.watch.generations())
	return tables, nil
}

// saveKernel reads every table with what a full sync keeps of its chains.
func (p *Syncer) saveKernel() (map[iptableskernel.Table]iptableskernel.KernelTable, error) {
	return iptableskernel.SaveTables(p.cfg.Kernel, func(t iptableskernel.Table, c iptableskernel.Chain) iptableskernel.RuleKeeping {
		switch {
		case iptableskernel.BuiltinChains[c]:
			return iptableskernel.KeepRuleText
		case slices.Contains(SharedChains[t], c):
			return iptableskernel.KeepRuleFingerprints
		}
		return iptableskernel.KeepNoRules
	})
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
	p.ruleCounts = map[iptableskernel.Table]int{}
	for _, applied := range p.applied {
		for t, n := range applied.ruleCounts() {
			p.ruleCounts[t] += n
		}
	}
	for _, group := range []map[iptableskernel.Table][]iptableskernel.OwnChain{static.Chains, static.Shared} {
		for t, chains := range group {
			for _, c := range chains {
				p.ruleCounts[t] += len(c.Rules)
			}
		}
	}
}

// reportRuleCounts sets the rule metrics: our rules in all, and those
// the last sync wrote.
func (p *Syncer) reportRuleCounts(written map[iptableskernel.Table]int) {
	family := string(p.cfg.Family)
	for _, t := range []iptableskernel.Table{iptableskernel.TableFilter, iptableskernel.TableNAT} {
		metrics.IPTablesRulesTotal.WithLabelValues(string(t), family).Set(float64(p.ruleCounts[t]))
		metrics.IPTablesRulesLastSync.WithLabelValues(string(t), family).Set(float64(written[t]))
	}
}
