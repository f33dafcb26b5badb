package iptables

import (
	"slices"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// fullSyncPlan is a full sync's plan over the kernel as read: its restore
// inputs come out one at a time (inputs), as fullSyncWriter orders them,
// so that only a batch's text is held; what the sync decided (applied,
// rewrites) is complete once they have all come out.
type fullSyncPlan struct {
	params    *Params
	static    StaticRules
	view      state.View
	kernel    map[iptableskernel.Table]iptableskernel.KernelTable
	rereads   kernelRereads
	batchRefs int
	// previous is what was applied before, and verifying whether the
	// watch saw another program change our tables: both tell repairs.
	previous  map[state.ServicePortName]appliedService
	verifying bool

	// Complete once inputs is drained.
	applied  map[state.ServicePortName]appliedService
	rewrites rewriteTally
	// err is a read of the kernel that failed while planning.
	err error
}

// kernelRereads are the reads a full sync's plan makes after the first,
// which keeps only hashes of what the plan may need (see KernelTable): the
// names of the stale service chains, and the text of shared rules to
// delete, are read again when there are any.
type kernelRereads struct {
	staleChains func(iptableskernel.KernelTable) ([]iptableskernel.Chain, error)
	listRules   func(iptableskernel.Table, iptableskernel.Chain) ([]string, error)
}

// rewriteTally names the first chains a full sync rewrites and counts
// those that repair another program's change.
type rewriteTally struct {
	names   []iptableskernel.Chain
	repairs int
}

func (r *rewriteTally) note(c iptableskernel.Chain, repair bool) {
	if len(r.names) < 10 {
		r.names = append(r.names, c)
	}
	if repair {
		r.repairs++
	}
}

// inputs plans the sync and hands on its restore inputs in order,
// stopping when yield returns false or a read fails (err).
func (pl *fullSyncPlan) inputs(yield func(restoreStep) bool) {
	w := newFullSyncWriter(yield, pl.batchRefs, pl.fixedChains())
	if !w.start() {
		return
	}
	shared, ok := pl.serviceChains(w)
	if !ok {
		return
	}
	final := iptableskernel.NewRestoreInput()
	if !pl.sharedChains(w, final, shared) {
		return
	}
	pl.builtinJumps(final)
	w.finish(final)
}

// fixedChains are the canary and static chains the kernel does not hold
// as wanted.
func (pl *fullSyncPlan) fixedChains() *iptableskernel.RestoreInput {
	fixed := iptableskernel.NewRestoreInput()
	for _, t := range iptableskernel.KubeTables {
		if !pl.kernel[t].Has(chainCanary) {
			fixed.WriteChain(t, iptableskernel.OwnChain{Name: chainCanary})
			pl.rewrites.note(chainCanary, pl.verifying)
		}
	}
	// In table order, not the map's, so that the rewrites are named alike
	// each time.
	for _, t := range iptableskernel.KubeTables {
		for _, c := range pl.static.Chains[t] {
			if !pl.kernel[t].Holds(c) {
				fixed.WriteChain(t, c)
				pl.rewrites.note(c.Name, pl.verifying)
			}
		}
	}
	return fixed
}

// serviceChains decides each service's rules in turn, writes its chains
// that the kernel does not hold as wanted, and keeps its shared rules
// and summary only. A chain rewritten as it was applied is a repair.
func (pl *fullSyncPlan) serviceChains(w *fullSyncWriter) (shared [][]SharedRule, ok bool) {
	pl.applied = make(map[state.ServicePortName]appliedService, len(pl.view.Services))
	shared = make([][]SharedRule, 0, len(pl.view.Services))
	nat := pl.kernel[iptableskernel.TableNAT]
	for _, svc := range serviceOrder(pl.view) {
		rules := rulesIn(pl.params, pl.view, svc.Name)
		desired := summarize(rules)
		pl.applied[svc.Name] = desired
		shared = append(shared, rules.Shared)
		var differ []iptableskernel.OwnChain
		for i, c := range rules.Chains {
			if !nat.Holds(c) {
				differ = append(differ, c)
				pl.rewrites.note(c.Name, slices.Contains(pl.previous[svc.Name].chains, desired.chains[i]))
			}
			nat.Claim(c.Name)
		}
		if !w.addService(differ) {
			return nil, false
		}
	}
	return shared, true
}

// sharedChains writes the shared chains the kernel lacks and the
// differences in those it holds. The stale service chains are read
// first, before the shared chains are gathered (the sync's peak), since
// that read drops the index of service chains.
func (pl *fullSyncPlan) sharedChains(w *fullSyncWriter, final *iptableskernel.RestoreInput, services [][]SharedRule) bool {
	stale, err := pl.rereads.staleChains(pl.kernel[iptableskernel.TableNAT])
	if err != nil {
		pl.err = err
		return false
	}
	contents := sharedChainContents(pl.static, services)
	for _, t := range iptableskernel.KubeTables {
		for i, want := range contents[t] {
			tail := len(pl.static.Shared[t][i].Rules)
			if !pl.kernel[t].Has(want.Name) {
				if !w.addNewSharedChain(t, want, tail, final) {
					return false
				}
				continue
			}
			lines := final.Lines(t)
			remove := diffSharedChain(final, t, pl.kernel[t].RuleFingerprints(want.Name), want, tail)
			if err := pl.deleteKernelRules(final, t, want.Name, remove); err != nil {
				pl.err = err
				return false
			}
			if final.Lines(t) > lines {
				pl.rewrites.note(want.Name, false)
			}
		}
	}
	for _, c := range stale {
		final.DeleteChain(iptableskernel.TableNAT, c)
	}
	return true
}

// builtinJumps adds to the final input the jumps from the built-in chains
// the kernel lacks and, over the IPVS mode's rules (a switch), the
// removal of its jumps. Those go in this commit, and nat goes first:
// until nat DNATs, IPVS takes new connections at INPUT, where this mode's
// firewall would drop those to a load balancer's IP. Otherwise (a restart,
// upstream's rules) the jumps of other kube-proxies stay as they are.
func (pl *fullSyncPlan) builtinJumps(final *iptableskernel.RestoreInput) {
	for _, j := range pl.static.Jumps {
		if !iptableskernel.ContainsRule(pl.kernel[j.Table].Rules(j.From), j.Rule) {
			final.InsertFirst(j.Table, j.From, j.Rule)
			pl.rewrites.note(j.From, pl.verifying)
		}
	}
	if iptableskernel.HoldsIPVSModeChains(pl.kernel) {
		iptableskernel.RemoveOtherJumps(final, pl.kernel, pl.static.Jumps)
		final.NATFirst = true
	}
}

// deleteKernelRules deletes from a shared chain the kernel's rules of
// these fingerprints: a full sync keeps only fingerprints of those chains'
// rules, so the chain is listed again for the text of the rules to
// delete (none on a restart over rules in place).
func (pl *fullSyncPlan) deleteKernelRules(in *iptableskernel.RestoreInput, t iptableskernel.Table, c iptableskernel.Chain, remove []uint64) error {
	if len(remove) == 0 {
		return nil
	}
	rules, err := pl.rereads.listRules(t, c)
	if err != nil {
		return err
	}
	left := map[uint64]int{}
	for _, fp := range remove {
		left[fp]++
	}
	for _, r := range rules {
		if fp := iptableskernel.RuleFingerprint(iptableskernel.Rule(r)); left[fp] > 0 {
			left[fp]--
			in.DeleteRule(t, c, iptableskernel.Rule(r))
		}
	}
	return nil
}
