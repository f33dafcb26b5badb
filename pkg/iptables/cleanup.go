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
	// IPVS mode's chains.
	"KUBE-NODE-PORT": true, "KUBE-LOAD-BALANCER": true, "KUBE-SOURCE-RANGES-FIREWALL": true,
	"KUBE-IPVS-FILTER": true, "KUBE-IPVS-OUT-FILTER": true,
}

// IsKubeProxyChain tells whether a chain is one kube-proxy (either mode
// using iptables, ours or upstream's) creates.
func IsKubeProxyChain(c Chain) bool { return cleanupChains[c] || IsServiceChain(c) }

// Cleanup removes every kube-proxy chain from the mangle, filter and nat
// tables, and the rules of other chains that jump to them, in one restore
// input per table. It returns how many chains it removed.
func Cleanup(k Kernel) (int, error) {
	tables, err := saveTables(k, keepText(func(_ Table, c Chain) bool { return !IsKubeProxyChain(c) }))
	if err != nil {
		return 0, err
	}
	in := newRestoreInput()
	removed := 0
	for _, t := range kubeTables {
		for chain, rules := range tables[t].rules {
			for _, r := range rules {
				if IsKubeProxyChain(JumpTarget(string(r))) {
					in.removeShared(SharedRule{Table: t, Chain: chain, Rule: r})
				}
			}
		}
		services, err := tables[t].serviceChainNames(k, t)
		if err != nil {
			return 0, err
		}
		for _, c := range slices.Concat(slices.Collect(maps.Keys(tables[t].fingerprints)), services) {
			if IsKubeProxyChain(c) {
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
