package iptables

import (
	"maps"
	"slices"

	"github.com/rapidproxy/rapidproxy/internal/readahead"
)

// ChainSet keeps a fixed set of whole chains, and the jumps into them from
// the built-in chains, in the kernel: what a mode needs whose iptables
// rules match sets rather than each service (IPVS). It writes only the
// chains whose content changed, in one restore.
type ChainSet struct {
	kernel Kernel
	// written is the fingerprint of each chain as last written or found.
	written map[Table]map[Chain]uint64
	// prepared is the kernel as Prepare read it, for the next full Sync.
	prepared *PreparedKernel
}

// NewChainSet returns a chain set writing through kernel.
func NewChainSet(kernel Kernel) *ChainSet {
	return &ChainSet{kernel: kernel}
}

// Sync makes the kernel hold exactly these chains and jumps. Without full
// it trusts that the kernel still holds what it last wrote and writes the
// chains that changed since. With full it reads the kernel, writes what
// differs, and also removes every other kube-proxy chain with the jumps to
// it: what another mode (ours or upstream's) left behind.
func (s *ChainSet) Sync(chains map[Table][]OwnChain, jumps []Jump, full bool) error {
	in := NewRestoreInput()
	if full || s.written == nil {
		if err := s.diffKernel(in, chains, jumps); err != nil {
			return err
		}
	} else {
		for t, list := range chains {
			for _, c := range list {
				if s.written[t][c.Name] != chainFingerprint(c.Rules) {
					in.WriteChain(t, c)
				}
			}
		}
	}
	if !in.Empty() {
		if err := s.kernel.Restore(in.Reader()); err != nil {
			s.written = nil
			return err
		}
	}
	s.written = map[Table]map[Chain]uint64{}
	for t, list := range chains {
		s.written[t] = map[Chain]uint64{}
		for _, c := range list {
			s.written[t][c.Name] = chainFingerprint(c.Rules)
		}
	}
	return nil
}

// Prepare reads the kernel's tables ahead of the next full Sync (a mode's
// first, while the informers list), keeping what that sync keeps of
// chains like these, so that the sync starts no iptables-save. The sync
// takes the read only if no other program changed the tables since:
// their generations, read before and after it, have not moved.
func (s *ChainSet) Prepare(chains map[Table][]OwnChain) {
	s.prepared = readahead.Make(s.generations(), func() (map[Table]KernelTable, error) { return SaveTables(s.kernel, keptRules(chains)) })
}

func (s *ChainSet) generations() readahead.Version[[]TableGeneration] {
	return Generations(func() []TableGeneration { return ReadGenerations(s.kernel, KubeTables) })
}

// readKernel takes what Prepare read if the tables have not changed since,
// or reads them.
func (s *ChainSet) readKernel(chains map[Table][]OwnChain) (map[Table]KernelTable, error) {
	prepared := s.prepared
	s.prepared = nil
	if tables, ok := prepared.Take(s.generations(), ReadGenerations(s.kernel, KubeTables), 0); ok {
		return tables, nil
	}
	return SaveTables(s.kernel, keptRules(chains))
}

// keptRules keeps the text of the rules of the built-in chains, which
// hold the jumps, and of the chains whose rules may come in any order,
// for their comparison.
func keptRules(chains map[Table][]OwnChain) func(Table, Chain) RuleKeeping {
	unordered := map[Table]map[Chain]bool{}
	for t, list := range chains {
		unordered[t] = map[Chain]bool{}
		for _, c := range list {
			unordered[t][c.Name] = c.Unordered
		}
	}
	return keepText(func(t Table, c Chain) bool { return BuiltinChains[c] || unordered[t][c] })
}

// diffKernel adds to in what turns the kernel's kube-proxy chains into
// exactly the wanted ones.
func (s *ChainSet) diffKernel(in *RestoreInput, chains map[Table][]OwnChain, jumps []Jump) error {
	wanted := map[Table]map[Chain]bool{}
	for t, list := range chains {
		wanted[t] = map[Chain]bool{}
		for _, c := range list {
			wanted[t][c.Name] = true
		}
	}
	kernel, err := s.readKernel(chains)
	if err != nil {
		return err
	}
	unwanted := func(t Table, c Chain) bool { return IsKubeProxyChain(c) && !wanted[t][c] }
	// A jump into a kube-proxy chain stays only when it is one of ours:
	// the other mode jumps into some of the same chains differently.
	RemoveOtherJumps(in, kernel, jumps)
	for _, t := range KubeTables {
		for _, c := range chains[t] {
			if !kernel[t].Holds(c) && !(c.Unordered && kernel[t].holdsInAnyOrder(c)) {
				in.WriteChain(t, c)
			}
		}
		for _, c := range chains[t] {
			if IsServiceChain(c.Name) {
				kernel[t].Claim(c.Name)
			}
		}
		services, err := kernel[t].ServiceChainNames(s.kernel, t)
		if err != nil {
			return err
		}
		for _, c := range slices.Concat(slices.Sorted(maps.Keys(kernel[t].fingerprints)), services) {
			if unwanted(t, c) {
				in.DeleteChain(t, c)
			}
		}
	}
	for _, j := range jumps {
		if !ContainsRule(kernel[j.Table].rules[j.From], j.Rule) {
			in.InsertFirst(j.Table, j.From, j.Rule)
		}
	}
	return nil
}

// RemoveOtherJumps removes the built-in chains' jumps into kube-proxy
// chains other than wanted, in the commit that writes those chains: the
// other mode's jumps lead into some of the same chains for other packets
// (the IPVS mode jumps into KUBE-PROXY-FIREWALL for every packet, not
// just a connection's first, and the iptables mode's rules there drop
// what was not DNATed, as the connections IPVS forwards are not).
func RemoveOtherJumps(in *RestoreInput, kernel map[Table]KernelTable, wanted []Jump) {
	type jumpKey struct {
		table Table
		from  Chain
		rule  string
	}
	want := map[jumpKey]bool{}
	for _, j := range wanted {
		want[jumpKey{j.Table, j.From, CanonicalRule(j.Rule)}] = true
	}
	for _, t := range KubeTables {
		for _, from := range slices.Sorted(maps.Keys(kernel[t].rules)) {
			if !BuiltinChains[from] {
				continue // another chain's rules, kept for a comparison
			}
			for _, r := range kernel[t].rules[from] {
				if IsKubeProxyChain(JumpTarget(string(r))) && !want[jumpKey{t, from, CanonicalRule(r)}] {
					in.DeleteRule(t, from, r)
				}
			}
		}
	}
}
