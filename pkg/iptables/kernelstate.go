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
// built-in chains), so only their differences are. Service chains are known
// by a hash of their name (nameKey): a restart at 10k services reads some
// 70k of them, whose names would raise its peak memory above a cold
// start's; the names of those a sync must delete are read again
// (serviceChainNames).
type kernelTable struct {
	fingerprints map[Chain]uint64  // chains other than service chains
	services     map[uint64]uint64 // service chains, by nameKey
	rules        map[Chain][]Rule
}

func newKernelTable() kernelTable {
	return kernelTable{fingerprints: map[Chain]uint64{}, services: map[uint64]uint64{}, rules: map[Chain][]Rule{}}
}

// nameKey identifies a service chain by its name: 64 bits of FNV-1a over
// some 10^5 names of a table make a collision unlikely (about 1 in 10^9),
// and one would only keep a chain that should have gone.
func nameKey[T Chain | []byte](name T) uint64 { return fnvLine(fnvOffset, name) }

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
// which chains' rules to keep (never a service chain's). A table missing
// from the output is empty.
func readTables(save io.Reader, keepRules func(Table, Chain) bool) (map[Table]kernelTable, error) {
	tables := map[Table]kernelTable{}
	var table Table
	var kt kernelTable
	// The fingerprint of the chain whose rules are being read is stored
	// when another chain's rules start: iptables-save prints each chain's
	// rules together (a chain met again would resume where it was).
	var chain []byte
	var kept Chain // chain, when its rules are kept
	var fingerprint uint64
	declared, service, keep := false, false, false
	store := func() {
		switch {
		case !declared:
		case service:
			kt.services[nameKey(chain)] = fingerprint
		default:
			kt.fingerprints[Chain(chain)] = fingerprint
		}
		chain, declared = chain[:0], false
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
				if name := line[1:i]; isServiceChainName(name) {
					kt.services[nameKey(name)] = fnvOffset
				} else {
					kt.fingerprints[Chain(name)] = fnvOffset
				}
			}
		case bytes.HasPrefix(line, []byte("-A ")):
			name, rest, ok := bytes.Cut(line[3:], []byte(" "))
			if !ok {
				continue
			}
			if !bytes.Equal(name, chain) {
				store()
				chain = append(chain, name...)
				service, keep = isServiceChainName(name), false
				if service {
					fingerprint, declared = kt.services[nameKey(name)]
				} else if fingerprint, declared = kt.fingerprints[Chain(name)]; declared && keepRules(table, Chain(name)) {
					kept, keep = Chain(name), true
				}
			}
			if !declared {
				continue
			}
			r := Rule(rest)
			fingerprint = ruleFingerprint(fingerprint, r)
			if keep {
				kt.rules[kept] = append(kt.rules[kept], r)
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

// fingerprint is the chain's fingerprint, if the table holds it.
func (kt kernelTable) fingerprint(c Chain) (uint64, bool) {
	if IsServiceChain(c) {
		fp, ok := kt.services[nameKey(c)]
		return fp, ok
	}
	fp, ok := kt.fingerprints[c]
	return fp, ok
}

// has tells whether the table holds the chain.
func (kt kernelTable) has(c Chain) bool {
	_, ok := kt.fingerprint(c)
	return ok
}

// claim records that the service chain is a desired one; the service
// chains nobody claims are stale. A claimed chain is forgotten, rather than
// listed apart, so that a restart holds one index of the chains, not two.
func (kt kernelTable) claim(c Chain) {
	delete(kt.services, nameKey(c))
}

// serviceChainNames are the names of table t's service chains that no
// claim took, in order. The first read kept their hashes only, so this
// reads the table again, but only when there are such chains: a restart
// over rules in place has none.
func (kt kernelTable) serviceChainNames(k Kernel, t Table) ([]Chain, error) {
	if len(kt.services) == 0 {
		return nil, nil
	}
	var names []Chain
	err := k.Save(func(save io.Reader) error {
		sc := bufio.NewScanner(save)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		inTable := false
		for sc.Scan() {
			line := sc.Bytes()
			switch {
			case len(line) > 1 && line[0] == '*':
				inTable = string(line[1:]) == string(t)
			case inTable && len(line) > 1 && line[0] == ':':
				if i := bytes.IndexByte(line, ' '); i > 1 && isServiceChainName(line[1:i]) {
					if _, ok := kt.services[nameKey(line[1:i])]; ok {
						names = append(names, Chain(line[1:i]))
					}
				}
			}
		}
		return sc.Err()
	})
	slices.Sort(names)
	return names, err
}

// holds tells whether the table holds the chain with exactly these rules;
// the rules are put in canonical form only when the chain exists at all.
func (kt kernelTable) holds(c OwnChain) bool {
	fp, ok := kt.fingerprint(c.Name)
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
	// Rules are matched by the fingerprint of their canonical form, not
	// the form itself: at 10k services KUBE-SERVICES alone would hold
	// some 2 MB of canonical text through a restart's sync.
	unmatched := map[uint64]int{}
	for _, r := range head {
		unmatched[ruleFingerprint(fnvOffset, r)]++
	}
	for _, r := range current[:len(current)-tail] {
		key := ruleFingerprint(fnvOffset, r)
		if unmatched[key] > 0 {
			unmatched[key]--
			continue
		}
		in.removeShared(SharedRule{Table: t, Chain: want.Name, Rule: r})
	}
	added := make([]bool, len(head))
	lastKept := -1
	for i, r := range head {
		key := ruleFingerprint(fnvOffset, r)
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
