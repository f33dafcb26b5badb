package iptables

import (
	"io"
	"slices"
	"strings"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
)

// addShared writes a service's rule into a shared chain.
func addShared(in *iptableskernel.RestoreInput, r SharedRule) {
	if r.Table == iptableskernel.TableNAT && r.Chain == chainServices {
		// Ahead of the NodePort jump that must stay last.
		in.InsertFirst(r.Table, r.Chain, r.Rule)
		return
	}
	in.AddRule(r.Table, r.Chain, r.Rule)
}

func removeShared(in *iptableskernel.RestoreInput, r SharedRule) {
	in.DeleteRule(r.Table, r.Chain, r.Rule)
}

// appliedService is what one service port has in the kernel: its chains
// by fingerprint, not their rules, which at 10k services would be most of
// the proxier's memory, and its shared rules, which deleting them needs.
type appliedService struct {
	chains []appliedChain
	shared []SharedRule
}

type appliedChain struct {
	name iptableskernel.Chain
	// fingerprint is of the rules' text as generated: it is compared with
	// the next generation only, never with what the kernel prints.
	fingerprint uint64
	rules       int
}

// summarize records a service port's rules as applied.
func summarize(r ServiceRules) appliedService {
	a := appliedService{chains: make([]appliedChain, len(r.Chains)), shared: r.Shared}
	for i, c := range r.Chains {
		a.chains[i] = appliedChain{name: c.Name, fingerprint: iptableskernel.TextFingerprint(c.Rules), rules: len(c.Rules)}
	}
	return a
}

// ruleCounts counts the rules per table.
func (a appliedService) ruleCounts() map[iptableskernel.Table]int {
	counts := map[iptableskernel.Table]int{}
	for _, c := range a.chains {
		counts[iptableskernel.TableNAT] += c.rules
	}
	for _, s := range a.shared {
		counts[s.Table]++
	}
	return counts
}

// servicePlan is what turns one service port's applied rules into its
// wanted ones: only its changed chains are rewritten, and only its changed
// shared rules are deleted or added. Its parts are rendered in this order.
type servicePlan struct {
	write   []iptableskernel.OwnChain
	drop    []iptableskernel.Chain
	unshare []SharedRule
	share   []SharedRule
}

// planService plans what turns old into updated for one service port,
// whose wanted rules are rules (updated is their summary).
func planService(old, updated appliedService, rules ServiceRules) servicePlan {
	var sp servicePlan
	oldChains := make(map[iptableskernel.Chain]uint64, len(old.chains))
	for _, c := range old.chains {
		oldChains[c.name] = c.fingerprint
	}
	kept := make(map[iptableskernel.Chain]bool, len(updated.chains))
	for i, c := range updated.chains {
		kept[c.name] = true
		if fp, ok := oldChains[c.name]; !ok || fp != c.fingerprint {
			sp.write = append(sp.write, rules.Chains[i])
		}
	}
	for _, c := range old.chains {
		if !kept[c.name] {
			sp.drop = append(sp.drop, c.name)
		}
	}
	sp.unshare = sharedOnlyIn(old.shared, updated.shared)
	sp.share = sharedOnlyIn(updated.shared, old.shared)
	return sp
}

// sharedOnlyIn is the rules of from that other does not hold, counting
// repeats.
func sharedOnlyIn(from, other []SharedRule) []SharedRule {
	left := countRules(other)
	var out []SharedRule
	for _, r := range from {
		if left[r] > 0 {
			left[r]--
			continue
		}
		out = append(out, r)
	}
	return out
}

// empty tells whether the plan changes nothing.
func (sp servicePlan) empty() bool {
	return len(sp.write) == 0 && len(sp.drop) == 0 && len(sp.unshare) == 0 && len(sp.share) == 0
}

// render adds the plan's kernel operations to in.
func (sp servicePlan) render(in *iptableskernel.RestoreInput) {
	for _, c := range sp.write {
		in.WriteChain(iptableskernel.TableNAT, c)
	}
	for _, c := range sp.drop {
		in.DeleteChain(iptableskernel.TableNAT, c)
	}
	for _, r := range sp.unshare {
		removeShared(in, r)
	}
	for _, r := range sp.share {
		addShared(in, r)
	}
}

// diffSharedChain adds to in what turns the kernel's content of a shared
// chain (current, the fingerprints of its rules) into want, whose last
// tail rules are fixed and must stay last: rule insertions when the tail
// is in place, with the fingerprints of the kernel's rules to delete
// returned, else a rewrite. The order of most rules does not matter, each
// matching its own destination; where it does, a rule comes before the
// broader rule of its service that follows it in want (the counted
// localhost NodePort rule, added to rules written without nfacct, must
// match before the general one). So a rule that want has ahead of a rule
// kept goes to the top, those together in want's order, and the others
// are appended.
func diffSharedChain(in *iptableskernel.RestoreInput, t iptableskernel.Table, current []uint64, want iptableskernel.OwnChain, tail int) (remove []uint64) {
	if len(current) < tail || !sameRules(current[len(current)-tail:], want.Rules[len(want.Rules)-tail:]) {
		in.WriteChain(t, want)
		return nil
	}
	head := want.Rules[:len(want.Rules)-tail]
	unmatched := map[uint64]int{}
	for _, r := range head {
		unmatched[iptableskernel.RuleFingerprint(r)]++
	}
	for _, key := range current[:len(current)-tail] {
		if unmatched[key] > 0 {
			unmatched[key]--
			continue
		}
		remove = append(remove, key)
	}
	added := make([]bool, len(head))
	lastKept := -1
	for i, r := range head {
		key := iptableskernel.RuleFingerprint(r)
		if unmatched[key] > 0 {
			unmatched[key]--
			added[i] = true
		} else {
			lastKept = i
		}
	}
	// Each insertion goes to the top: the last one first.
	for i := lastKept - 1; i >= 0; i-- {
		if added[i] {
			in.InsertFirst(t, want.Name, head[i])
		}
	}
	for i := lastKept + 1; i < len(head); i++ {
		addShared(in, SharedRule{Table: t, Chain: want.Name, Rule: head[i]})
	}
	return remove
}

// sameRules tells whether the rules of these fingerprints are rules.
func sameRules(fingerprints []uint64, rules []iptableskernel.Rule) bool {
	if len(fingerprints) != len(rules) {
		return false
	}
	for i, r := range rules {
		if fingerprints[i] != iptableskernel.RuleFingerprint(r) {
			return false
		}
	}
	return true
}

func countRules(rules []SharedRule) map[SharedRule]int {
	m := make(map[SharedRule]int, len(rules))
	for _, r := range rules {
		m[r]++
	}
	return m
}

// chainRefs is how many chain names a chain brings into a restore input:
// its own and, for all but endpoint chains (whose rules only jump to
// KUBE-MARK-MASQ), about one per rule, since those rules jump to the
// service's other chains. iptables-nft-restore's cost grows with the square
// of the distinct chain names in one input, jump targets included.
func chainRefs(c iptableskernel.OwnChain) int {
	if chainLevel(c.Name) == 0 {
		return 1
	}
	return 1 + len(c.Rules)
}

// chainLevel orders chains for a full sync split over several inputs:
// each level only jumps to chains of lower levels, so writing level by
// level never leaves a jump to a chain that is not complete yet. Above
// them all, sharedLevel holds the service rules of new shared chains.
func chainLevel(c iptableskernel.Chain) int {
	switch {
	case strings.HasPrefix(string(c), iptableskernel.PrefixEndpoint):
		return 0
	case strings.HasPrefix(string(c), iptableskernel.PrefixClusterPolicy), strings.HasPrefix(string(c), iptableskernel.PrefixLocalPolicy):
		return 1
	case strings.HasPrefix(string(c), iptableskernel.PrefixExternal):
		return 2
	default: // KUBE-FW-
		return 3
	}
}

const sharedLevel = 4

// fullSyncWriter writes a full sync's inputs so that each holds on its
// own and no rule ever jumps to a chain not complete yet: the fixed
// chains, then the service chains (which nothing jumps to yet), then the
// final input (the shared chains' differences, unused chains' removal, the
// built-in jumps).
//
// Split (nft, where a --noflush restore is quadratic in the chain names it
// refers to), the fixed chains are one input, each chain level (see
// chainLevel) collects its own chains and, once a service's chains are in,
// a level referring to a batch's worth of names (see chainRefs) is
// restored after every lower level. Then come the service rules of the
// shared chains the kernel does not hold yet, a batch's worth of rules
// (one jump target each) at a time: nothing jumps to such a chain before
// the final input, and one input jumping to every KUBE-SVC chain would
// take 16 s at 30k services (2 s at 10k) instead of about 0.1 s a batch.
// The final input comes last. Only a batch's text is kept at a time.
//
// Unsplit (legacy, where every restore rewrites the whole table), all of
// it is one restore, each table with the fixed chains, then every service
// chain declared, then their rules, then the final lines. libiptc keeps a
// table's chains in a sorted list and finds where a new one goes by
// walking from the nearest index entry, so the declarations go in
// descending order, each at the list's head: at 1k services x 100
// endpoints that restore takes 4.1 s instead of 6.8 s in random order,
// and the chains' rules after all declarations take 2.2 s instead of
// 2.65 s at 10k x 5.
type fullSyncWriter struct {
	// emit hands one restore on; false stops the sync (its restore failed).
	emit   func(restoreStep) bool
	size   int
	fixed  *iptableskernel.RestoreInput
	levels [sharedLevel + 1]*iptableskernel.RestoreInput
	refs   [sharedLevel + 1]int

	// Unsplit: the service chains to declare and their rules.
	declared []iptableskernel.Chain
	held     *iptableskernel.RestoreInput
}

// restoreStep is one restore input: its parts joined table by table (see
// JoinInputs), so that the unsplit restore need not copy them into one.
type restoreStep []*iptableskernel.RestoreInput

// reader renders the step, or is nil when it holds nothing.
func (s restoreStep) reader() io.Reader { return iptableskernel.JoinInputs(s...) }

// newFullSyncWriter writes service chains in inputs referring to about size
// chain names, or, with size 0, all in one input at the end.
func newFullSyncWriter(emit func(restoreStep) bool, size int, fixed *iptableskernel.RestoreInput) *fullSyncWriter {
	return &fullSyncWriter{emit: emit, size: size, fixed: fixed, held: iptableskernel.NewRestoreInput()}
}

// start writes the fixed chains, in an input of their own when split.
func (w *fullSyncWriter) start() bool {
	if w.size > 0 && !w.fixed.Empty() {
		return w.emit(restoreStep{w.fixed})
	}
	return true
}

// addService takes the chains of one service that need writing.
func (w *fullSyncWriter) addService(chains []iptableskernel.OwnChain) bool {
	if w.size <= 0 {
		for _, c := range chains {
			w.declared = append(w.declared, c.Name)
			w.held.AppendChainRules(iptableskernel.TableNAT, c)
		}
		return true
	}
	full := -1
	for _, c := range chains {
		level := chainLevel(c.Name)
		w.level(level).WriteChain(iptableskernel.TableNAT, c)
		w.refs[level] += chainRefs(c)
		if w.refs[level] >= w.size {
			full = max(full, level)
		}
	}
	return w.emitUpTo(full)
}

// addNewSharedChain takes a shared chain the kernel does not hold, whose
// last tail rules are fixed. Split, its service rules go to sharedLevel,
// after every service chain, and the tail to the final input, where the
// chain it jumps to (KUBE-NODEPORTS) is written; unsplit, all of it goes
// to the final input.
func (w *fullSyncWriter) addNewSharedChain(t iptableskernel.Table, c iptableskernel.OwnChain, tail int, final *iptableskernel.RestoreInput) bool {
	head := c.Rules[:len(c.Rules)-tail]
	if w.size <= 0 || len(head) == 0 {
		final.WriteChain(t, c)
		return true
	}
	for i := 0; i < len(head); {
		n := min(len(head)-i, w.size-w.refs[sharedLevel])
		part := iptableskernel.OwnChain{Name: c.Name, Rules: head[i : i+n]}
		if i == 0 {
			w.level(sharedLevel).WriteChain(t, part)
		} else {
			w.level(sharedLevel).AppendChainRules(t, part)
		}
		i += n
		if w.refs[sharedLevel] += n; w.refs[sharedLevel] >= w.size && !w.emitUpTo(sharedLevel) {
			return false
		}
	}
	final.AppendChainRules(t, iptableskernel.OwnChain{Name: c.Name, Rules: c.Rules[len(head):]})
	return true
}

func (w *fullSyncWriter) level(l int) *iptableskernel.RestoreInput {
	if w.levels[l] == nil {
		w.levels[l] = iptableskernel.NewRestoreInput()
	}
	return w.levels[l]
}

// emitUpTo hands on the inputs of every level up to level, lowest first,
// and forgets them.
func (w *fullSyncWriter) emitUpTo(level int) bool {
	for l := 0; l <= level; l++ {
		if w.refs[l] == 0 {
			continue
		}
		if !w.emit(restoreStep{w.levels[l]}) {
			return false
		}
		w.levels[l], w.refs[l] = nil, 0
	}
	return true
}

// finish writes the final input after every service chain.
func (w *fullSyncWriter) finish(final *iptableskernel.RestoreInput) bool {
	if w.size > 0 {
		if !w.emitUpTo(len(w.levels) - 1) {
			return false
		}
		return final.Empty() || w.emit(restoreStep{final})
	}
	slices.SortFunc(w.declared, func(a, b iptableskernel.Chain) int { return strings.Compare(string(b), string(a)) })
	for _, c := range w.declared {
		w.held.DeclareChain(iptableskernel.TableNAT, c)
	}
	w.declared = nil
	step := restoreStep{w.fixed, w.held, final}
	return step.reader() == nil || w.emit(step)
}
