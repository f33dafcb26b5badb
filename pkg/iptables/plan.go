package iptables

import (
	"bytes"
	"strings"
)

// restoreInput builds iptables-restore --noflush input, one section per
// table, each applied atomically by the kernel. Within a table the order
// is what keeps every intermediate step valid: chains are declared (which
// creates or flushes them) first, then rules are deleted, written and
// inserted, and unused chains are deleted last, once nothing jumps to them.
type restoreInput struct {
	tables map[Table]*tableInput
}

type tableInput struct {
	declare, deleteRules, appendRules, insertRules, deleteChains []string
}

func newRestoreInput() *restoreInput { return &restoreInput{tables: map[Table]*tableInput{}} }

func (in *restoreInput) table(t Table) *tableInput {
	ti := in.tables[t]
	if ti == nil {
		ti = &tableInput{}
		in.tables[t] = ti
	}
	return ti
}

// writeChain declares a chain and gives it exactly these rules.
func (in *restoreInput) writeChain(t Table, c OwnChain) {
	ti := in.table(t)
	ti.declare = append(ti.declare, ":"+string(c.Name)+" - [0:0]")
	for _, r := range c.Rules {
		ti.appendRules = append(ti.appendRules, "-A "+string(c.Name)+" "+string(r))
	}
}

// deleteChain flushes a chain and deletes it.
func (in *restoreInput) deleteChain(t Table, c Chain) {
	ti := in.table(t)
	ti.declare = append(ti.declare, ":"+string(c)+" - [0:0]")
	ti.deleteChains = append(ti.deleteChains, "-X "+string(c))
}

func (in *restoreInput) addShared(r SharedRule) {
	if r.Table == TableNAT && r.Chain == chainServices {
		// Ahead of the NodePort jump that must stay last.
		in.insertFirst(r.Table, r.Chain, r.Rule)
		return
	}
	ti := in.table(r.Table)
	ti.insertRules = append(ti.insertRules, "-A "+string(r.Chain)+" "+string(r.Rule))
}

// insertFirst puts a rule at the top of a chain, where the jumps from the
// built-in chains go, ahead of other programs' rules.
func (in *restoreInput) insertFirst(t Table, c Chain, r Rule) {
	ti := in.table(t)
	ti.insertRules = append(ti.insertRules, "-I "+string(c)+" 1 "+string(r))
}

func (in *restoreInput) removeShared(r SharedRule) {
	ti := in.table(r.Table)
	ti.deleteRules = append(ti.deleteRules, "-D "+string(r.Chain)+" "+string(r.Rule))
}

// empty tells whether there is nothing to restore.
func (in *restoreInput) empty() bool {
	for _, ti := range in.tables {
		if ti.lines() > 0 {
			return false
		}
	}
	return true
}

func (ti *tableInput) lines() int {
	return len(ti.declare) + len(ti.deleteRules) + len(ti.appendRules) + len(ti.insertRules) + len(ti.deleteChains)
}

// bytes renders the input; filter goes before nat so that a service losing
// its endpoints is rejected before its nat rules disappear.
func (in *restoreInput) bytes() []byte {
	var b bytes.Buffer
	for _, t := range []Table{TableMangle, TableFilter, TableNAT} {
		ti := in.tables[t]
		if ti == nil || ti.lines() == 0 {
			continue
		}
		b.WriteString("*" + string(t) + "\n")
		for _, part := range [][]string{ti.declare, ti.deleteRules, ti.appendRules, ti.insertRules, ti.deleteChains} {
			for _, line := range part {
				b.WriteString(line)
				b.WriteByte('\n')
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}

// counts returns the rules written per table, for the metrics.
func (in *restoreInput) counts() map[Table]int {
	out := map[Table]int{}
	for t, ti := range in.tables {
		out[t] = len(ti.appendRules) + len(ti.insertRules)
	}
	return out
}

// appliedService is what one service port has in the kernel: its chains
// by fingerprint, not their rules, which at 10k services would be most of
// the proxier's memory, and its shared rules, which deleting them needs.
type appliedService struct {
	chains []appliedChain
	shared []SharedRule
}

type appliedChain struct {
	name        Chain
	fingerprint uint64
	rules       int
}

// summarize records a service port's rules as applied.
func summarize(r ServiceRules) appliedService {
	a := appliedService{chains: make([]appliedChain, len(r.Chains)), shared: r.Shared}
	for i, c := range r.Chains {
		a.chains[i] = appliedChain{name: c.Name, fingerprint: chainFingerprint(c.Rules), rules: len(c.Rules)}
	}
	return a
}

// ruleCounts counts the rules per table.
func (a appliedService) ruleCounts() map[Table]int {
	counts := map[Table]int{}
	for _, c := range a.chains {
		counts[TableNAT] += c.rules
	}
	for _, s := range a.shared {
		counts[s.Table]++
	}
	return counts
}

// diffService adds to in what turns old into updated for one service port:
// only its changed chains are rewritten, and only its changed shared rules
// are deleted or inserted.
func diffService(in *restoreInput, old, updated appliedService, rules ServiceRules) {
	oldChains := make(map[Chain]uint64, len(old.chains))
	for _, c := range old.chains {
		oldChains[c.name] = c.fingerprint
	}
	kept := make(map[Chain]bool, len(updated.chains))
	for i, c := range updated.chains {
		kept[c.name] = true
		if fp, ok := oldChains[c.name]; !ok || fp != c.fingerprint {
			in.writeChain(TableNAT, rules.Chains[i])
		}
	}
	for _, c := range old.chains {
		if !kept[c.name] {
			in.deleteChain(TableNAT, c.name)
		}
	}
	oldShared := countRules(old.shared)
	newShared := countRules(updated.shared)
	for _, r := range old.shared {
		if newShared[r] > 0 {
			newShared[r]--
			continue
		}
		in.removeShared(r)
	}
	for _, r := range updated.shared {
		if oldShared[r] > 0 {
			oldShared[r]--
			continue
		}
		in.addShared(r)
	}
}

func countRules(rules []SharedRule) map[SharedRule]int {
	m := make(map[SharedRule]int, len(rules))
	for _, r := range rules {
		m[r]++
	}
	return m
}

// chainLevel orders chains for a full sync split over several inputs:
// each level only jumps to chains of lower levels, so writing level by
// level never leaves a jump to a chain that is not complete yet.
func chainLevel(c Chain) int {
	switch {
	case strings.HasPrefix(string(c), prefixEndpoint):
		return 0
	case strings.HasPrefix(string(c), prefixClusterPolicy), strings.HasPrefix(string(c), prefixLocalPolicy):
		return 1
	case strings.HasPrefix(string(c), prefixExternal):
		return 2
	default: // KUBE-FW-
		return 3
	}
}
