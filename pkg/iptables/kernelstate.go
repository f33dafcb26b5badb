package iptables

import (
	"bufio"
	"bytes"
	"io"
	"slices"
)

// kernelTable is what a full sync needs to know of one table as the kernel
// holds it: a fingerprint of every chain, so unchanged chains are not
// rewritten, and the rules of the chains others add to (the shared and
// built-in chains), so only their differences are.
type kernelTable struct {
	fingerprints map[Chain]uint64
	rules        map[Chain][]Rule
}

func newKernelTable() kernelTable {
	return kernelTable{fingerprints: map[Chain]uint64{}, rules: map[Chain][]Rule{}}
}

// saveTables reads every table from the kernel with readTables, as
// iptables-save prints them.
func saveTables(k Kernel, keepRules func(Table, Chain) bool) (map[Table]kernelTable, error) {
	var tables map[Table]kernelTable
	err := k.Save(func(save io.Reader) (err error) {
		tables, err = readTables(save, keepRules)
		return err
	})
	return tables, err
}

// readTables parses iptables-save output of every table; keepRules says
// which chains' rules to keep. A table missing from the output is empty.
func readTables(save io.Reader, keepRules func(Table, Chain) bool) (map[Table]kernelTable, error) {
	tables := map[Table]kernelTable{}
	var table Table
	var kt kernelTable
	// The fingerprint of the chain whose rules are being read is stored
	// when another chain's rules start: iptables-save prints each chain's
	// rules together (a chain met again would resume where it was).
	var chain Chain
	var fingerprint uint64
	declared := false
	store := func() {
		if declared {
			kt.fingerprints[chain] = fingerprint
		}
		chain, declared = "", false
	}
	sc := bufio.NewScanner(save)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 1 && line[0] == '*':
			store()
			table = Table(line[1:])
			kt = newKernelTable()
			tables[table] = kt
		case kt.fingerprints == nil:
			// Before any table: not iptables-save's output, nothing to read.
		case len(line) > 1 && line[0] == ':':
			if i := bytes.IndexByte(line, ' '); i > 1 {
				kt.fingerprints[Chain(line[1:i])] = fnvOffset
			}
		case bytes.HasPrefix(line, []byte("-A ")):
			name, rest, ok := bytes.Cut(line[3:], []byte(" "))
			if !ok {
				continue
			}
			if string(name) != string(chain) {
				store()
				chain = Chain(name)
				fingerprint, declared = kt.fingerprints[chain]
			}
			if !declared {
				continue
			}
			r := Rule(rest)
			fingerprint = ruleFingerprint(fingerprint, r)
			if keepRules(table, chain) {
				kt.rules[chain] = append(kt.rules[chain], r)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	store()
	for _, t := range kubeTables {
		if _, ok := tables[t]; !ok {
			tables[t] = newKernelTable()
		}
	}
	return tables, nil
}

// has tells whether the table holds the chain.
func (kt kernelTable) has(c Chain) bool {
	_, ok := kt.fingerprints[c]
	return ok
}

// claim records that the chain is one of the desired service chains; the
// service chains nobody claims are stale. Claimed chains are forgotten,
// rather than listed apart, so that a restart at 10k services holds one
// set of some 60k chain names, not two.
func (kt kernelTable) claim(c Chain) {
	delete(kt.fingerprints, c)
}

// unclaimedServiceChains are the service chains the table holds that no
// claim took, in order.
func (kt kernelTable) unclaimedServiceChains() []Chain {
	var stale []Chain
	for c := range kt.fingerprints {
		if IsServiceChain(c) {
			stale = append(stale, c)
		}
	}
	slices.Sort(stale)
	return stale
}

// holds tells whether the table holds the chain with exactly these rules;
// the rules are put in canonical form only when the chain exists at all.
func (kt kernelTable) holds(c OwnChain) bool {
	fp, ok := kt.fingerprints[c.Name]
	return ok && fp == chainFingerprint(c.Rules)
}

// holdsInAnyOrder tells whether the table holds the chain with these
// rules in some order; the chain's rules must have been kept.
func (kt kernelTable) holdsInAnyOrder(c OwnChain) bool {
	current := kt.rules[c.Name]
	if !kt.has(c.Name) || len(current) != len(c.Rules) {
		return false
	}
	canonical := func(rules []Rule) []string {
		out := make([]string, len(rules))
		for i, r := range rules {
			out[i] = canonicalRule(r)
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(canonical(current), canonical(c.Rules))
}

// diffSharedChain adds to in what turns the kernel's content of a shared
// chain into want, whose last tail rules are fixed and must stay last:
// rule deletions and insertions when the tail is in place, else a
// rewrite. The order of most rules does not matter, each matching its own
// destination; where it does, a rule comes before the broader rule of its
// service that follows it in want (the counted localhost NodePort rule,
// added to rules written without nfacct, must match before the general
// one). So a rule that want has ahead of a rule kept goes to the top,
// those together in want's order, and the others are appended.
func diffSharedChain(in *restoreInput, t Table, current []Rule, want OwnChain, tail int) {
	if len(current) < tail || !sameRules(current[len(current)-tail:], want.Rules[len(want.Rules)-tail:]) {
		in.writeChain(t, want)
		return
	}
	head := want.Rules[:len(want.Rules)-tail]
	unmatched := map[string]int{}
	for _, r := range head {
		unmatched[canonicalRule(r)]++
	}
	for _, r := range current[:len(current)-tail] {
		key := canonicalRule(r)
		if unmatched[key] > 0 {
			unmatched[key]--
			continue
		}
		in.removeShared(SharedRule{Table: t, Chain: want.Name, Rule: r})
	}
	added := make([]bool, len(head))
	lastKept := -1
	for i, r := range head {
		key := canonicalRule(r)
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
			in.insertFirst(t, want.Name, head[i])
		}
	}
	for i := lastKept + 1; i < len(head); i++ {
		in.addShared(SharedRule{Table: t, Chain: want.Name, Rule: head[i]})
	}
}

func sameRules(a, b []Rule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if canonicalRule(a[i]) != canonicalRule(b[i]) {
			return false
		}
	}
	return true
}

// containsRule tells whether rules hold r.
func containsRule(rules []Rule, r Rule) bool {
	key := canonicalRule(r)
	for _, have := range rules {
		if canonicalRule(have) == key {
			return true
		}
	}
	return false
}
