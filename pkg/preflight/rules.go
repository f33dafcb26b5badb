package preflight

import (
	"fmt"
	"strings"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
)

// ownJumps are the rules by which kube-proxy (either mode using iptables,
// ours or upstream's) leads from the built-in chains into its own.
var ownJumps = func() []iptableskernel.Jump {
	p := iptables.Params{LocalhostNodePorts: true}
	return append(p.StaticRules().Jumps, ipvs.Jumps()...)
}()

// isOwnJump tells whether rule, in a built-in chain, is one of kube-proxy's.
func isOwnJump(table, chain, rule string) bool {
	for _, j := range ownJumps {
		if string(j.Table) == table && string(j.From) == chain && iptableskernel.SameRule(j.Rule, iptableskernel.Rule(rule)) {
			return true
		}
	}
	return false
}

// foreignReferences lists the rules of chains that are not kube-proxy's
// which jump into kube-proxy's chains (but kube-proxy's own jumps from
// the built-in chains) or match on the IPVS mode's ipsets, each as
// "TABLE: -A CHAIN RULE".
func foreignReferences(saved string) []string {
	var found []string
	table := ""
	for line := range strings.Lines(saved) {
		line = strings.TrimRight(line, "\n")
		if t, ok := strings.CutPrefix(line, "*"); ok {
			table = t
			continue
		}
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		chain, rule, _ := strings.Cut(rest, " ")
		if iptableskernel.IsKubeProxyChain(iptableskernel.Chain(chain)) {
			continue
		}
		if iptableskernel.IsKubeProxyChain(iptableskernel.JumpTarget(rule)) && !isOwnJump(table, chain, rule) || usesKubeProxySet(rule) {
			found = append(found, table+": "+line)
		}
	}
	return found
}

// usesKubeProxySet tells whether a rule matches on one of the IPVS mode's
// ipsets.
func usesKubeProxySet(rule string) bool {
	args := iptableskernel.Args(iptableskernel.Rule(rule))
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--match-set" && ipvs.IsKubeProxySet(args[i+1]) {
			return true
		}
	}
	return false
}

// holdsKubeProxyChains tells whether saved rules declare a chain of
// kube-proxy's.
func holdsKubeProxyChains(saved string) bool {
	for line := range strings.Lines(saved) {
		if name, ok := strings.CutPrefix(line, ":"); ok {
			name, _, _ = strings.Cut(name, " ")
			if iptableskernel.IsKubeProxyChain(iptableskernel.Chain(name)) {
				return true
			}
		}
	}
	return false
}

// keepSavedLine tells whether the gatherer keeps a line of iptables-save
// output: all but the rules of kube-proxy's own chains, which the checks
// do not look at and which are most of the output on a large node.
func keepSavedLine(line string) bool {
	rest, ok := strings.CutPrefix(line, "-A ")
	if !ok {
		return true
	}
	chain, _, _ := strings.Cut(rest, " ")
	return !iptableskernel.IsKubeProxyChain(iptableskernel.Chain(chain))
}

// checkForeignReferences: other programs' rules that lead into what the
// move removes or changes.
func checkForeignReferences(m move) []Finding {
	var found, unread []string
	for _, s := range m.Saved {
		if s.Err != nil {
			unread = append(unread, fmt.Sprintf("%s: %v", s.Source(), s.Err))
			continue
		}
		for _, r := range foreignReferences(s.Text) {
			found = append(found, s.Source()+" "+r)
		}
	}
	var out []Finding
	if len(found) > 0 {
		f := Finding{
			Check: checkNameForeign, Level: Blocker,
			Summary: "other programs use kube-proxy's chains or ipsets",
			Action: "Find the program that wrote each rule (a CNI plugin, a firewall, a node agent: its chain and comment " +
				"tell) and configure it not to depend on kube-proxy's chains and sets, or remove the rules, before " +
				"switching; then run this again.",
			Details: found,
		}
		if m.to == nftablesMode {
			f.Reason = "The nftables mode uses no iptables chain and no ipset: at start it deletes kube-proxy's chains in " +
				"both backends, every rule that jumps to them included, and the IPVS mode's ipsets (a set a rule still " +
				"uses cannot be deleted, and is no longer updated). What these rules do stops working."
		} else {
			f.Reason = "The " + m.to + " mode removes the chains and ipsets it does not use and fills those it keeps " +
				"with rules of its own: these rules would jump to a chain that is gone or does something else, or match " +
				"on a set that is no longer updated."
		}
		out = append(out, f)
	}
	if len(unread) > 0 {
		out = append(out, Finding{
			Check: checkNameForeign, Level: Warning,
			Summary: "some iptables rules could not be read",
			Reason:  "Other programs' rules there that use kube-proxy's chains or ipsets would go unnoticed.",
			Action:  "Run this where the iptables tools work (in the kube-proxy pod, which has them and the privileges).",
			Details: unread,
		})
	}
	return out
}
