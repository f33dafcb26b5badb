package iptables

import (
	"maps"
	"slices"
	"strings"
)

// cleanupChains are the fixed chains either mode (ours or upstream's) creates.
var cleanupChains = map[Chain]bool{
	chainServices: true, chainExternalServices: true, chainNodePorts: true, chainPostrouting: true,
	chainMarkMasq: true, chainForward: true, chainProxyFirewall: true, chainCanary: true, chainLocalnetGuard: true,
}

// ipvsOnlyChains are the IPVS mode's chains the iptables mode has none of.
var ipvsOnlyChains = map[Chain]bool{
	"KUBE-NODE-PORT": true, "KUBE-LOAD-BALANCER": true, "KUBE-SOURCE-RANGES-FIREWALL": true,
	"KUBE-IPVS-FILTER": true, "KUBE-IPVS-OUT-FILTER": true,
}

// IsKubeProxyChain tells whether a chain is one kube-proxy (either mode
// using iptables, ours or upstream's) creates.
func IsKubeProxyChain(c Chain) bool {
	return cleanupChains[c] || ipvsOnlyChains[c] || IsServiceChain(c)
}

func isIPVSOnlyChain(c Chain) bool { return ipvsOnlyChains[c] }

// Cleanup removes every kube-proxy chain from the mangle, filter and nat
// tables, and the rules of other chains that jump to them, in one restore
// input per table. It returns how many chains it removed.
func Cleanup(k Kernel) (int, error) { return cleanup(k, IsKubeProxyChain) }

// CleanupIPVSModeChains removes the chains only the IPVS mode has, and the
// jumps into them, which the iptables mode's sync leaves: it rewrites the
// chains both modes name alike and so stops using these, but they still
// use the IPVS mode's ipsets. It returns how many chains it removed.
func CleanupIPVSModeChains(k Kernel) (int, error) { return cleanup(k, isIPVSOnlyChain) }

// cleanup removes the chains of the mangle, filter and nat tables that
// remove names, and the rules of other chains that jump to them, in one
// restore input per table.
func cleanup(k Kernel, remove func(Chain) bool) (int, error) {
	tables, err := saveTables(k, keepText(func(_ Table, c Chain) bool { return !IsKubeProxyChain(c) }))
	if err != nil {
		return 0, err
	}
	in := newRestoreInput()
	removed := 0
	for _, t := range kubeTables {
		for chain, rules := range tables[t].rules {
			for _, r := range rules {
				if remove(JumpTarget(string(r))) {
					in.removeShared(SharedRule{Table: t, Chain: chain, Rule: r})
				}
			}
		}
		services, err := tables[t].serviceChainNames(k, t)
		if err != nil {
			return 0, err
		}
		for _, c := range slices.Concat(slices.Collect(maps.Keys(tables[t].fingerprints)), services) {
			if remove(c) {
				in.deleteChain(t, c)
				removed++
			}
		}
	}
	if in.empty() {
		return 0, nil
	}
	return removed, k.Restore(in.reader())
}

// JumpTarget is the chain a rule (its arguments after "-A CHAIN") jumps
// or goes to, "" if none.
func JumpTarget(rule string) Chain {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" {
			return Chain(f[i+1])
		}
	}
	return ""
}

// SameRule tells whether two rules mean the same, each as written or as
// iptables-save prints it.
func SameRule(a, b Rule) bool { return canonicalRule(a) == canonicalRule(b) }

// Args splits a rule as iptables-save prints it into its arguments,
// unquoted.
func Args(r Rule) []string { return appendArgs(nil, r) }
