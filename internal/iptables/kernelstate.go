package iptables

import (
	"bufio"
	"bytes"
	"cmp"
	"io"
	"slices"

	"github.com/rapidproxy/rapidproxy/internal/linehash"
	"github.com/rapidproxy/rapidproxy/internal/readahead"
)

// KernelTable is what a full sync needs to know of one table as the kernel
// holds it: a fingerprint of every chain, so unchanged chains are not
// rewritten, and the rules of the chains others add to (the shared and
// built-in chains), so only their differences are. Service chains are known
// by a hash of their name (nameKey): a restart at 10k services reads some
// 70k of them, whose names would raise its peak memory above a cold
// start's; the names of those a sync must delete are read again
// (ServiceChainNames).
type KernelTable struct {
	fingerprints map[Chain]uint64 // chains other than service chains
	services     *serviceIndex
	// rules and ruleFingerprints are the kept chains' rules, as text or
	// as the fingerprint of each rule's canonical form (RuleKeeping).
	rules            map[Chain][]Rule
	ruleFingerprints map[Chain][]uint64
}

func newKernelTable() KernelTable {
	return KernelTable{fingerprints: map[Chain]uint64{}, services: &serviceIndex{},
		rules: map[Chain][]Rule{}, ruleFingerprints: map[Chain][]uint64{}}
}

// RuleKeeping is what ReadTables keeps of a chain's rules besides the
// chain's fingerprint.
type RuleKeeping uint8

const (
	KeepNoRules RuleKeeping = iota
	// KeepRuleFingerprints keeps what tells which rules the chain holds,
	// 8 bytes a rule: at 10k services the text of KUBE-SERVICES alone is
	// 1.2 MB, held through a restart's sync. The text of rules to delete
	// is listed again (by the iptables mode, which keeps them).
	KeepRuleFingerprints
	KeepRuleText
)

// serviceIndex knows a table's service chains by nameKey, in a slice
// sorted by key: 16 bytes a chain, where a map took about 30 (a restart
// at 10k services x 5 reads some 70k). A claimed chain is forgotten, and
// the slice shrinks as claims come, so that a restart's sync does not
// hold the whole index along with all it has decided.
type serviceIndex struct {
	chains  []indexedChain
	claimed []bool
	claims  int
}

type indexedChain struct{ key, fingerprint uint64 }

// newServiceIndex indexes the service chains a table's parse found: a map
// while parsing (a chain's rules may resume after another's), this once
// the table is read.
func newServiceIndex(fingerprints map[uint64]uint64) *serviceIndex {
	s := &serviceIndex{chains: make([]indexedChain, 0, len(fingerprints)), claimed: make([]bool, len(fingerprints))}
	for key, fp := range fingerprints {
		s.chains = append(s.chains, indexedChain{key, fp})
	}
	slices.SortFunc(s.chains, func(a, b indexedChain) int { return cmp.Compare(a.key, b.key) })
	return s
}

// find is the position of the unclaimed chain of this key.
func (s *serviceIndex) find(key uint64) (int, bool) {
	i, ok := slices.BinarySearchFunc(s.chains, key, func(c indexedChain, key uint64) int { return cmp.Compare(c.key, key) })
	return i, ok && !s.claimed[i]
}

func (s *serviceIndex) fingerprint(key uint64) (uint64, bool) {
	if i, ok := s.find(key); ok {
		return s.chains[i].fingerprint, true
	}
	return 0, false
}

func (s *serviceIndex) claim(key uint64) {
	i, ok := s.find(key)
	if !ok {
		return
	}
	s.claimed[i] = true
	if s.claims++; s.claims > len(s.chains)/2 {
		s.shrink()
	}
}

// shrink keeps the unclaimed chains in a slice of their own size.
func (s *serviceIndex) shrink() {
	left := make([]indexedChain, 0, len(s.chains)-s.claims)
	for i, c := range s.chains {
		if !s.claimed[i] {
			left = append(left, c)
		}
	}
	s.chains, s.claimed, s.claims = left, make([]bool, len(left)), 0
}

// unclaimed are the keys of the chains no claim took.
func (s *serviceIndex) unclaimed() []uint64 {
	var keys []uint64
	for i, c := range s.chains {
		if !s.claimed[i] {
			keys = append(keys, c.key)
		}
	}
	return keys
}

// nameKey identifies a service chain by its name: 64 bits of FNV-1a over
// some 10^5 names of a table make a collision unlikely (about 1 in 10^9),
// and one would only keep a chain that should have gone.
func nameKey[T Chain | []byte](name T) uint64 { return linehash.Line(linehash.Start, name) }

// SaveTables reads every table from the kernel with ReadTables, as
// iptables-save prints them.
func SaveTables(k Kernel, keep func(Table, Chain) RuleKeeping) (map[Table]KernelTable, error) {
	var tables map[Table]KernelTable
	err := k.Save(func(save io.Reader) (err error) {
		tables, err = ReadTables(save, keep)
		return err
	})
	return tables, err
}

// keepText keeps the text of the rules of the chains keep names.
func keepText(keep func(Table, Chain) bool) func(Table, Chain) RuleKeeping {
	return func(t Table, c Chain) RuleKeeping {
		if keep(t, c) {
			return KeepRuleText
		}
		return KeepNoRules
	}
}

// ReadTables parses iptables-save output of every table; keep says what
// to keep of each chain's rules (never anything of a service chain's). A
// table missing from the output is empty.
func ReadTables(save io.Reader, keep func(Table, Chain) RuleKeeping) (map[Table]KernelTable, error) {
	tables := map[Table]KernelTable{}
	var table Table
	var kt KernelTable
	var services map[uint64]uint64 // the table's service chains, indexed when it ends
	// The fingerprint of the chain whose rules are being read is stored
	// when another chain's rules start: iptables-save prints each chain's
	// rules together (a chain met again would resume where it was).
	var chain []byte
	var kept Chain // chain, when its rules are kept
	var fingerprint uint64
	declared, service := false, false
	keeping := KeepNoRules
	store := func() {
		switch {
		case !declared:
		case service:
			services[nameKey(chain)] = fingerprint
		default:
			kt.fingerprints[Chain(chain)] = fingerprint
		}
		chain, declared = chain[:0], false
	}
	endTable := func() {
		store()
		if services != nil {
			*kt.services = *newServiceIndex(services)
		}
	}
	sc := bufio.NewScanner(save)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 1 && line[0] == '*':
			endTable()
			table = Table(line[1:])
			kt, services = newKernelTable(), map[uint64]uint64{}
			tables[table] = kt
		case kt.fingerprints == nil:
			// Before any table: not iptables-save's output, nothing to read.
		case len(line) > 1 && line[0] == ':':
			if i := bytes.IndexByte(line, ' '); i > 1 {
				if name := line[1:i]; isServiceChainName(name) {
					services[nameKey(name)] = linehash.Start
				} else {
					kt.fingerprints[Chain(name)] = linehash.Start
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
				service, keeping = isServiceChainName(name), KeepNoRules
				if service {
					fingerprint, declared = services[nameKey(name)]
				} else if fingerprint, declared = kt.fingerprints[Chain(name)]; declared {
					kept, keeping = Chain(name), keep(table, Chain(name))
				}
			}
			if !declared {
				continue
			}
			r := Rule(rest)
			fingerprint = ruleFingerprint(fingerprint, r)
			switch keeping {
			case KeepRuleText:
				kt.rules[kept] = append(kt.rules[kept], r)
			case KeepRuleFingerprints:
				kt.ruleFingerprints[kept] = append(kt.ruleFingerprints[kept], ruleFingerprint(linehash.Start, r))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	endTable()
	for _, t := range KubeTables {
		if _, ok := tables[t]; !ok {
			tables[t] = newKernelTable()
		}
	}
	return tables, nil
}

// Fingerprint is the chain's fingerprint, if the table holds it.
func (kt KernelTable) Fingerprint(c Chain) (uint64, bool) {
	if IsServiceChain(c) {
		return kt.services.fingerprint(nameKey(c))
	}
	fp, ok := kt.fingerprints[c]
	return fp, ok
}

// Rules are the kept rules of a chain whose text was kept.
func (kt KernelTable) Rules(c Chain) []Rule { return kt.rules[c] }

// RuleFingerprints are the fingerprints of the rules of a chain whose
// rule fingerprints were kept.
func (kt KernelTable) RuleFingerprints(c Chain) []uint64 { return kt.ruleFingerprints[c] }

// Has tells whether the table holds the chain.
func (kt KernelTable) Has(c Chain) bool {
	_, ok := kt.Fingerprint(c)
	return ok
}

// Claim records that the service chain is a desired one; the service
// chains nobody claims are stale. A claimed chain is forgotten, rather than
// listed apart, so that a restart holds one index of the chains, not two.
func (kt KernelTable) Claim(c Chain) { kt.services.claim(nameKey(c)) }

// ServiceChainNames are the names of table t's service chains that no
// claim took, in order. The first read kept their hashes only, so this
// reads the table again, but only when there are such chains: a restart
// over rules in place has none. The index is dropped: after this the
// table knows no service chain.
func (kt KernelTable) ServiceChainNames(k Kernel, t Table) ([]Chain, error) {
	stale := kt.services.unclaimed()
	*kt.services = serviceIndex{}
	if len(stale) == 0 {
		return nil, nil
	}
	slices.Sort(stale)
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
					if _, ok := slices.BinarySearch(stale, nameKey(line[1:i])); ok {
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

// Holds tells whether the table holds the chain with exactly these rules;
// the rules are put in canonical form only when the chain exists at all.
func (kt KernelTable) Holds(c OwnChain) bool {
	fp, ok := kt.Fingerprint(c.Name)
	return ok && fp == chainFingerprint(c.Rules)
}

// holdsInAnyOrder tells whether the table holds the chain with these
// rules in some order; the chain's rules must have been kept.
func (kt KernelTable) holdsInAnyOrder(c OwnChain) bool {
	current := kt.rules[c.Name]
	if !kt.Has(c.Name) || len(current) != len(c.Rules) {
		return false
	}
	canonical := func(rules []Rule) []string {
		out := make([]string, len(rules))
		for i, r := range rules {
			out[i] = CanonicalRule(r)
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(canonical(current), canonical(c.Rules))
}

// ContainsRule tells whether rules hold r.
func ContainsRule(rules []Rule, r Rule) bool {
	key := CanonicalRule(r)
	for _, have := range rules {
		if CanonicalRule(have) == key {
			return true
		}
	}
	return false
}

// PreparedKernel is the kernel's tables read ahead of a full sync, with
// the tables' generations while they were read: the sync takes the read
// only if the generations have not moved since.
type PreparedKernel = readahead.Read[map[Table]KernelTable, []TableGeneration]

// Generations is the version a read of the tables holds for: the
// generations read, all of them readable and unmoved.
func Generations(read func() []TableGeneration) readahead.Version[[]TableGeneration] {
	return readahead.Version[[]TableGeneration]{Read: read, Same: SameGenerations}
}
