package iptables

import (
	"bufio"
	"bytes"
	"hash"
	"hash/fnv"
	"strings"
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

// readTables parses iptables-save output of every table; keepRules says
// which chains' rules to keep. A table missing from the output is empty.
func readTables(save []byte, keepRules func(Table, Chain) bool) map[Table]kernelTable {
	tables := map[Table]kernelTable{}
	var table Table
	var kt kernelTable
	hashes := map[Chain]hash.Hash64{}
	closeTable := func() {
		for c, h := range hashes {
			kt.fingerprints[c] = h.Sum64()
		}
		hashes = map[Chain]hash.Hash64{}
	}
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 1 && line[0] == '*':
			closeTable()
			table = Table(line[1:])
			kt = newKernelTable()
			tables[table] = kt
		case len(line) > 1 && line[0] == ':':
			if i := bytes.IndexByte(line, ' '); i > 1 {
				hashes[Chain(line[1:i])] = fnv.New64a()
			}
		case bytes.HasPrefix(line, []byte("-A ")):
			chain, rest, ok := strings.Cut(string(line[3:]), " ")
			h := hashes[Chain(chain)]
			if !ok || h == nil {
				continue
			}
			h.Write([]byte(canonicalRule(Rule(rest))))
			h.Write([]byte{'\n'})
			if keepRules(table, Chain(chain)) {
				kt.rules[Chain(chain)] = append(kt.rules[Chain(chain)], Rule(rest))
			}
		}
	}
	closeTable()
	for _, t := range kubeTables {
		if _, ok := tables[t]; !ok {
			tables[t] = newKernelTable()
		}
	}
	return tables
}

// has tells whether the table holds the chain.
func (kt kernelTable) has(c Chain) bool {
	_, ok := kt.fingerprints[c]
	return ok
}

// holds tells whether the table holds the chain with exactly these rules;
// the rules are put in canonical form only when the chain exists at all.
func (kt kernelTable) holds(c OwnChain) bool {
	fp, ok := kt.fingerprints[c.Name]
	return ok && fp == chainFingerprint(c.Rules)
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
