package iptables

import (
	"fmt"
	"strings"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Describe names the service port's chains and its rules in the shared
// chains, as ServiceRules decides them now, and returns a check of just
// those against the kernel.
func (p *Syncer) Describe(v state.View, name state.ServicePortName) ([]proxy.KernelObject, func() ([]string, error)) {
	svc, sel, ok := v.Select(name)
	if !ok {
		return nil, nil
	}
	rules := p.cfg.Params.ServiceRules(svc, sel)
	// The endpoint chains are named by a hash: say where each leads.
	endpoints := map[iptableskernel.Chain]string{}
	for _, ep := range sel.All {
		endpoints[chainsFor(name).endpointChain(ep)] = ep.String()
	}
	var objects []proxy.KernelObject
	for _, c := range rules.Chains {
		summary := fmt.Sprintf("%d rules", len(c.Rules))
		if len(c.Rules) == 1 {
			summary = "1 rule"
		}
		if ep, ok := endpoints[c.Name]; ok {
			summary += ", to " + ep
		}
		objects = append(objects, proxy.KernelObject{
			Kind: "chain", Name: string(iptableskernel.TableNAT) + " " + string(c.Name), Summary: summary, Content: ruleTexts(c.Rules),
		})
	}
	for _, r := range rules.Shared {
		objects = append(objects, proxy.KernelObject{
			Kind: "rule", Name: string(r.Table) + " " + string(r.Chain),
			Summary: withoutComment(r.Rule), Content: []string{string(r.Rule)},
		})
	}
	return objects, func() ([]string, error) { return p.verify(rules) }
}

// verify lists how the kernel differs from one service port's rules: each
// of its chains is listed whole, and each shared chain it has rules in
// once. Rules compare in canonical form, as a full sync compares them.
func (p *Syncer) verify(rules ServiceRules) ([]string, error) {
	var differences []string
	for _, c := range rules.Chains {
		have, err := p.cfg.Kernel.ListRules(string(iptableskernel.TableNAT), string(c.Name))
		if err != nil {
			differences = append(differences, fmt.Sprintf("nat chain %s is missing or unreadable: %v", c.Name, err))
			continue
		}
		differences = append(differences, chainDifferences(c, asRules(have))...)
	}
	shared := map[SharedRule][]iptableskernel.Rule{}
	for _, r := range rules.Shared {
		chain := SharedRule{Table: r.Table, Chain: r.Chain}
		have, listed := shared[chain]
		if !listed {
			list, err := p.cfg.Kernel.ListRules(string(r.Table), string(r.Chain))
			if err != nil {
				return differences, err
			}
			have = asRules(list)
			shared[chain] = have
		}
		if !iptableskernel.ContainsRule(have, r.Rule) {
			differences = append(differences, fmt.Sprintf("%s %s lacks: %s", r.Table, r.Chain, r.Rule))
		}
	}
	return differences, nil
}

// chainDifferences lists how the kernel's rules of a chain differ from
// the wanted ones, compared in canonical form.
func chainDifferences(want iptableskernel.OwnChain, have []iptableskernel.Rule) []string {
	return proxy.RuleDifferences(string(iptableskernel.TableNAT)+" "+string(want.Name), want.Rules, have, iptableskernel.CanonicalRule)
}

// asRules types the lines the kernel lists as rules.
func asRules(lines []string) []iptableskernel.Rule {
	out := make([]iptableskernel.Rule, len(lines))
	for i, l := range lines {
		out[i] = iptableskernel.Rule(l)
	}
	return out
}

func ruleTexts(rules []iptableskernel.Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = string(r)
	}
	return out
}

// withoutComment is a rule without its comment, short enough for a table.
func withoutComment(r iptableskernel.Rule) string {
	args := iptableskernel.Args(r)
	var out []string
	for i := 0; i < len(args); i++ {
		if i+3 < len(args) && args[i] == "-m" && args[i+1] == "comment" && args[i+2] == "--comment" {
			i += 3
			continue
		}
		out = append(out, args[i])
	}
	return strings.Join(out, " ")
}
