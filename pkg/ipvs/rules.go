package ipvs

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
)

// The iptables chains of the IPVS mode, named as upstream.
const (
	chainServices            iptables.Chain = "KUBE-SERVICES"
	chainPostrouting         iptables.Chain = "KUBE-POSTROUTING"
	chainNodePort            iptables.Chain = "KUBE-NODE-PORT"
	chainLoadBalancer        iptables.Chain = "KUBE-LOAD-BALANCER"
	chainMarkMasq            iptables.Chain = "KUBE-MARK-MASQ"
	chainForward             iptables.Chain = "KUBE-FORWARD"
	chainProxyFirewall       iptables.Chain = "KUBE-PROXY-FIREWALL"
	chainSourceRangeFirewall iptables.Chain = "KUBE-SOURCE-RANGES-FIREWALL"
	chainIPVSFilter          iptables.Chain = "KUBE-IPVS-FILTER"
	chainIPVSOutFilter       iptables.Chain = "KUBE-IPVS-OUT-FILTER"
)

// setJumps are the rules that send members of a set somewhere, written
// only while the set has members, in upstream's order (the -LOCAL sets
// ahead of their general ones).
var setJumps = []struct {
	set      string
	table    iptables.Table
	from     iptables.Chain
	to       string
	match    string
	protocol string
}{
	{setLoopBack, iptables.TableNAT, chainPostrouting, "MASQUERADE", "dst,dst,src", ""},
	{setLoadBalancer, iptables.TableNAT, chainServices, string(chainLoadBalancer), "dst,dst", ""},
	{setLoadBalancerLocal, iptables.TableNAT, chainLoadBalancer, "RETURN", "dst,dst", ""},
	{setNodePortLocalTCP, iptables.TableNAT, chainNodePort, "RETURN", "dst", "tcp"},
	{setNodePortTCP, iptables.TableNAT, chainNodePort, string(chainMarkMasq), "dst", "tcp"},
	{setNodePortLocalUDP, iptables.TableNAT, chainNodePort, "RETURN", "dst", "udp"},
	{setNodePortUDP, iptables.TableNAT, chainNodePort, string(chainMarkMasq), "dst", "udp"},
	{setNodePortLocalSCTP, iptables.TableNAT, chainNodePort, "RETURN", "dst,dst", "sctp"},
	{setNodePortSCTP, iptables.TableNAT, chainNodePort, string(chainMarkMasq), "dst,dst", "sctp"},
	{setLoadBalancerFW, iptables.TableFilter, chainProxyFirewall, string(chainSourceRangeFirewall), "dst,dst", ""},
	{setLoadBalancerSourceNet, iptables.TableFilter, chainSourceRangeFirewall, "RETURN", "dst,dst,src", ""},
	{setLoadBalancerSourceIP, iptables.TableFilter, chainSourceRangeFirewall, "RETURN", "dst,dst,src", ""},
}

// comments are the sets' comments, which the rules matching them carry.
var comments = func() map[string]string {
	m := map[string]string{}
	for _, s := range setTypes {
		m[s.name] = s.comment
	}
	return m
}()

// Chains decides the mode's iptables chains. They match sets rather than
// services, so they change only when a set becomes empty or not, or a
// load-balancer IP's source ranges leave the node out (outFilter, sorted).
func (p *Params) Chains(nonEmpty func(set string) bool, outFilter []iptables.Rule) map[iptables.Table][]iptables.OwnChain {
	rules := map[iptables.Chain][]iptables.Rule{}
	// Both tables have a KUBE-NODE-PORT chain: keep the filter one apart.
	var filterNodePort []iptables.Rule
	add := func(c iptables.Chain, parts ...string) {
		rules[c] = append(rules[c], iptables.Rule(strings.Join(parts, " ")))
	}
	mark := fmt.Sprintf("%#08x", 1<<p.MasqueradeBit)
	matchSet := func(set, match string) string {
		return "-m comment --comment " + strconv.Quote(comments[set]) + " -m set --match-set " + p.setName(set) + " " + match
	}

	loopback := "127.0.0.0/8"
	if p.IPv6 {
		loopback = "::1/128"
	}
	add(chainServices, "-s", loopback, "-j RETURN")
	for _, j := range setJumps {
		if !nonEmpty(j.set) {
			continue
		}
		r := matchSet(j.set, j.match) + " -j " + j.to
		if j.protocol != "" {
			r = "-p " + j.protocol + " " + r
		}
		add(j.from, r)
	}
	if nonEmpty(setClusterIP) {
		switch {
		case p.MasqueradeAll:
			add(chainServices, matchSet(setClusterIP, "dst,dst"), "-j", string(chainMarkMasq))
		case p.LocalDetector.Implemented():
			add(chainServices, matchSet(setClusterIP, "dst,dst"), strings.Join(p.LocalDetector.IfNotLocal(), " "), "-j", string(chainMarkMasq))
		default:
			add(chainServices, matchSet(setClusterIP, "src,dst"), "-j", string(chainMarkMasq))
		}
	}
	// Traffic to external IPs from off the node (not from a bridge port
	// nor a local process), or to one the node holds, goes to IPVS.
	externalAccept := func(set string) {
		add(chainServices, matchSet(set, "dst,dst"), "-m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
		add(chainServices, matchSet(set, "dst,dst"), "-m addrtype --dst-type LOCAL -j ACCEPT")
	}
	if nonEmpty(setExternalIP) {
		add(chainServices, matchSet(setExternalIP, "dst,dst"), "-j", string(chainMarkMasq))
		externalAccept(setExternalIP)
	}
	if nonEmpty(setExternalIPLocal) {
		externalAccept(setExternalIPLocal)
	}
	add(chainServices, "-m addrtype --dst-type LOCAL -j", string(chainNodePort))
	add(chainLoadBalancer, "-j", string(chainMarkMasq))
	add(chainSourceRangeFirewall, "-j DROP")
	rules[chainIPVSOutFilter] = append(rules[chainIPVSOutFilter], outFilter...)
	for _, set := range []string{setClusterIP, setLoadBalancer} {
		if nonEmpty(set) {
			add(chainServices, "-m set --match-set", p.setName(set), "dst,dst -j ACCEPT")
		}
	}

	add(chainForward, `-m comment --comment "kubernetes forwarding rules" -m mark --mark`, mark+"/"+mark, "-j ACCEPT")
	add(chainForward, `-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	filterNodePort = append(filterNodePort, iptables.Rule(matchSet(setHealthCheckNodePort, "dst")+" -j ACCEPT"))
	// Service addresses sit on kube-ipvs0, so any host process listening
	// on all addresses would answer on them too, on any port: as upstream,
	// only the service ports are open there, the rest is rejected.
	for _, set := range []string{setLoadBalancer, setClusterIP, setExternalIP, setExternalIPLocal} {
		add(chainIPVSFilter, "-m set --match-set", p.setName(set), "dst,dst -j RETURN")
	}
	add(chainIPVSFilter, "-m set --match-set", p.setName(setHealthCheckNodePort), "dst -j RETURN")
	add(chainIPVSFilter, "-m conntrack --ctstate NEW -m set --match-set", p.setName(setIPVSAddresses), "dst -j REJECT")

	add(chainPostrouting, "-m mark ! --mark", mark+"/"+mark, "-j RETURN")
	add(chainPostrouting, "-j MARK --xor-mark", mark)
	add(chainPostrouting, `-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	add(chainMarkMasq, "-j MARK --or-mark", mark)

	out := map[iptables.Table][]iptables.OwnChain{}
	for _, c := range []iptables.Chain{chainServices, chainPostrouting, chainNodePort, chainLoadBalancer, chainMarkMasq} {
		out[iptables.TableNAT] = append(out[iptables.TableNAT], iptables.OwnChain{Name: c, Rules: rules[c]})
	}
	for _, c := range []iptables.Chain{chainForward, chainNodePort, chainProxyFirewall, chainSourceRangeFirewall, chainIPVSFilter, chainIPVSOutFilter} {
		r := rules[c]
		if c == chainNodePort {
			r = filterNodePort
		}
		// Upstream writes the out-filter rules, one per load-balancer IP, in
		// its map's order: a takeover keeps them in whatever order they are.
		out[iptables.TableFilter] = append(out[iptables.TableFilter], iptables.OwnChain{Name: c, Rules: r, Unordered: c == chainIPVSOutFilter})
	}
	return out
}

// Jumps are the rules leading from the built-in chains into the mode's.
func Jumps() []iptables.Jump {
	jump := func(t iptables.Table, from string, to iptables.Chain, comment string) iptables.Jump {
		return iptables.Jump{Table: t, From: iptables.Chain(from), Rule: iptables.Rule("-m comment --comment " + strconv.Quote(comment) + " -j " + string(to))}
	}
	return []iptables.Jump{
		jump(iptables.TableNAT, "OUTPUT", chainServices, "kubernetes service portals"),
		jump(iptables.TableNAT, "PREROUTING", chainServices, "kubernetes service portals"),
		jump(iptables.TableNAT, "POSTROUTING", chainPostrouting, "kubernetes postrouting rules"),
		jump(iptables.TableFilter, "FORWARD", chainForward, "kubernetes forwarding rules"),
		jump(iptables.TableFilter, "INPUT", chainNodePort, "kubernetes health check rules"),
		jump(iptables.TableFilter, "INPUT", chainProxyFirewall, "kube-proxy firewall rules"),
		jump(iptables.TableFilter, "FORWARD", chainProxyFirewall, "kube-proxy firewall rules"),
		jump(iptables.TableFilter, "INPUT", chainIPVSFilter, "kubernetes ipvs access filter"),
		jump(iptables.TableFilter, "OUTPUT", chainIPVSOutFilter, "kubernetes ipvs access filter"),
	}
}
