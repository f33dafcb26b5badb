package iptables

import (
	"maps"
	"slices"
)

// fixedChains are the fixed chains either mode using iptables (ours or
// upstream's) creates.
var fixedChains = map[Chain]bool{
	"KUBE-SERVICES": true, "KUBE-EXTERNAL-SERVICES": true, "KUBE-NODEPORTS": true, "KUBE-POSTROUTING": true,
	"KUBE-MARK-MASQ": true, "KUBE-FORWARD": true, "KUBE-PROXY-FIREWALL": true, "KUBE-PROXY-CANARY": true, "KUBE-FIREWALL": true,
}

// ipvsOnlyChains are the IPVS mode's chains the iptables mode has none of.
var ipvsOnlyChains = map[Chain]bool{
	"KUBE-NODE-PORT": true, "KUBE-LOAD-BALANCER": true, "KUBE-SOURCE-RANGES-FIREWALL": true,
	"KUBE-IPVS-FILTER": true, "KUBE-IPVS-OUT-FILTER": true,
}

// Prefixes of the iptables mode's per-service chains, named as upstream's.
const (
	PrefixClusterPolicy = "KUBE-SVC-"
	PrefixLocalPolicy   = "KUBE-SVL-"
	PrefixExternal      = "KUBE-EXT-"
	PrefixFirewall      = "KUBE-FW-"
	PrefixEndpoint      = "KUBE-SEP-"
)

// IsServiceChain tells whether a chain is one of the per-service chains
// the iptables mode (or upstream's) creates, which may be deleted when
// unused.
func IsServiceChain(c Chain) bool { return isServiceChainName(c) }

func isServiceChainName[T Chain | []byte](c T) bool {
	for _, p := range []string{PrefixClusterPolicy, PrefixLocalPolicy, PrefixExternal, PrefixFirewall, PrefixEndpoint} {
		if len(c) >= len(p) && string(c[:len(p)]) == p {
			return true
		}
	}
	return false
}

// IsKubeProxyChain tells whether a chain is one kube-proxy (either mode
// using iptables, ours or upstream's) creates.
func IsKubeProxyChain(c Chain) bool {
	return fixedChains[c] || ipvsOnlyChains[c] || IsServiceChain(c)
}

// IsIPVSOnlyChain tells whether a chain is one only the IPVS mode creates.
func IsIPVSOnlyChain(c Chain) bool { return ipvsOnlyChains[c] }

// Cleanup removes every kube-proxy chain from the mangle, filter and nat
// tables, and the rules of other chains that jump to them, in one restore
// input per table. It returns how many chains it removed.
func Cleanup(k Kernel) (int, error) { return cleanup(k, IsKubeProxyChain) }

// CleanupIPVSModeChains removes the chains only the IPVS mode has, and the
// jumps into them, which the iptables mode's sync leaves: it rewrites the
// chains both modes name alike and so stops using these, but they still
// use the IPVS mode's ipsets. It returns how many chains it removed.
func CleanupIPVSModeChains(k Kernel) (int, error) { return cleanup(k, IsIPVSOnlyChain) }

// cleanup removes the chains of the mangle, filter and nat tables that
// remove names, and the rules of other chains that jump to them, in one
// restore input per table.
func cleanup(k Kernel, remove func(Chain) bool) (int, error) {
	tables, err := SaveTables(k, keepText(func(_ Table, c Chain) bool { return !IsKubeProxyChain(c) }))
	if err != nil {
		return 0, err
	}
	in := NewRestoreInput()
	removed := 0
	for _, t := range KubeTables {
		for chain, rules := range tables[t].rules {
			for _, r := range rules {
				if remove(JumpTarget(string(r))) {
					in.DeleteRule(t, chain, r)
				}
			}
		}
		services, err := tables[t].ServiceChainNames(k, t)
		if err != nil {
			return 0, err
		}
		for _, c := range slices.Concat(slices.Collect(maps.Keys(tables[t].fingerprints)), services) {
			if remove(c) {
				in.DeleteChain(t, c)
				removed++
			}
		}
	}
	if in.Empty() {
		return 0, nil
	}
	return removed, k.Restore(in.Reader())
}

// HoldsIPVSModeChains tells whether the kernel holds a chain only the IPVS
// mode makes.
func HoldsIPVSModeChains(kernel map[Table]KernelTable) bool {
	for _, t := range KubeTables {
		for c := range ipvsOnlyChains {
			if kernel[t].Has(c) {
				return true
			}
		}
	}
	return false
}
