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
	c := &chainRules{p: p, nonEmpty: nonEmpty, rules: map[iptables.Chain][]iptables.Rule{}, mark: fmt.Sprintf("%#08x", 1<<p.MasqueradeBit)}
	loopback := "127.0.0.0/8"
	if p.IPv6 {
		loopback = "::1/128"
	}
	c.add(chainServices, "-s", loopback, "-j RETURN")
	c.setJumps()
	c.clusterIPMasquerade()
	c.externalIPs()
	c.add(chainServices, "-m addrtype --dst-type LOCAL -j", string(chainNodePort))
	c.add(chainLoadBalancer, "-j", string(chainMarkMasq))
	c.add(chainSourceRangeFirewall, "-j DROP")
	c.rules[chainIPVSOutFilter] = append(c.rules[chainIPVSOutFilter], outFilter...)
	for _, set := range []string{setClusterIP, setLoadBalancer} {
		if nonEmpty(set) {
			c.add(chainServices, "-m set --match-set", p.setName(set), "dst,dst -j ACCEPT")
		}
	}
	c.filters()
	c.masquerade()
	return c.tables()
}

// chainRules collects the rules of the mode's chains, chain by chain.
type chainRules struct {
	p        *Params
	nonEmpty func(set string) bool
	rules    map[iptables.Chain][]iptables.Rule
	// Both tables have a KUBE-NODE-PORT chain: filterNodePort keeps the
	// filter one apart.
	filterNodePort []iptables.Rule
	// mark is the masquerade mark, as a mask too.
	mark string
}

func (c *chainRules) add(chain iptables.Chain, parts ...string) {
	c.rules[chain] = append(c.rules[chain], iptables.Rule(strings.Join(parts, " ")))
}

// matchSet matches set's members by match, with the set's comment.
func (c *chainRules) matchSet(set, match string) string {
	return "-m comment --comment " + strconv.Quote(comments[set]) + " -m set --match-set " + c.p.setName(set) + " " + match
}

// setJumps are the rules of setJumps whose sets have members.
func (c *chainRules) setJumps() {
	for _, j := range setJumps {
		if !c.nonEmpty(j.set) {
			continue
		}
		r := c.matchSet(j.set, j.match) + " -j " + j.to
		if j.protocol != "" {
			r = "-p " + j.protocol + " " + r
		}
		c.add(j.from, r)
	}
}

// clusterIPMasquerade marks for masquerade the cluster IP traffic from
// off the node (all of it with masqueradeAll).
func (c *chainRules) clusterIPMasquerade() {
	if !c.nonEmpty(setClusterIP) {
		return
	}
	p := c.p
	switch {
	case p.MasqueradeAll:
		c.add(chainServices, c.matchSet(setClusterIP, "dst,dst"), "-j", string(chainMarkMasq))
	case p.LocalDetector.Implemented():
		c.add(chainServices, c.matchSet(setClusterIP, "dst,dst"), strings.Join(p.LocalDetector.IfNotLocal(), " "), "-j", string(chainMarkMasq))
	default:
		c.add(chainServices, c.matchSet(setClusterIP, "src,dst"), "-j", string(chainMarkMasq))
	}
}

// externalIPs let traffic to external IPs from off the node (not from a
// bridge port nor a local process), or to one the node holds, go to IPVS;
// under the Cluster policy it is masqueraded.
func (c *chainRules) externalIPs() {
	accept := func(set string) {
		c.add(chainServices, c.matchSet(set, "dst,dst"), "-m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
		c.add(chainServices, c.matchSet(set, "dst,dst"), "-m addrtype --dst-type LOCAL -j ACCEPT")
	}
	if c.nonEmpty(setExternalIP) {
		c.add(chainServices, c.matchSet(setExternalIP, "dst,dst"), "-j", string(chainMarkMasq))
		accept(setExternalIP)
	}
	if c.nonEmpty(setExternalIPLocal) {
		accept(setExternalIPLocal)
	}
}

// filters are the filter table's forwarding, health-check and access
// rules.
func (c *chainRules) filters() {
	p := c.p
	c.add(chainForward, `-m comment --comment "kubernetes forwarding rules" -m mark --mark`, c.mark+"/"+c.mark, "-j ACCEPT")
	c.add(chainForward, `-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	c.filterNodePort = append(c.filterNodePort, iptables.Rule(c.matchSet(setHealthCheckNodePort, "dst")+" -j ACCEPT"))
	// Service addresses sit on kube-ipvs0, so any host process listening
	// on all addresses would answer on them too, on any port: as upstream,
	// only the service ports are open there, the rest is rejected.
	for _, set := range []string{setLoadBalancer, setClusterIP, setExternalIP, setExternalIPLocal} {
		c.add(chainIPVSFilter, "-m set --match-set", p.setName(set), "dst,dst -j RETURN")
	}
	c.add(chainIPVSFilter, "-m set --match-set", p.setName(setHealthCheckNodePort), "dst -j RETURN")
	c.add(chainIPVSFilter, "-m conntrack --ctstate NEW -m set --match-set", p.setName(setIPVSAddresses), "dst -j REJECT")
}

// masquerade masquerades what was marked, once.
func (c *chainRules) masquerade() {
	c.add(chainPostrouting, "-m mark ! --mark", c.mark+"/"+c.mark, "-j RETURN")
	c.add(chainPostrouting, "-j MARK --xor-mark", c.mark)
	c.add(chainPostrouting, `-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	c.add(chainMarkMasq, "-j MARK --or-mark", c.mark)
}

// tables are the chains by table, in upstream's order.
func (c *chainRules) tables() map[iptables.Table][]iptables.OwnChain {
	out := map[iptables.Table][]iptables.OwnChain{}
	for _, ch := range []iptables.Chain{chainServices, chainPostrouting, chainNodePort, chainLoadBalancer, chainMarkMasq} {
		out[iptables.TableNAT] = append(out[iptables.TableNAT], iptables.OwnChain{Name: ch, Rules: c.rules[ch]})
	}
	for _, ch := range []iptables.Chain{chainForward, chainNodePort, chainProxyFirewall, chainSourceRangeFirewall, chainIPVSFilter, chainIPVSOutFilter} {
		r := c.rules[ch]
		if ch == chainNodePort {
			r = c.filterNodePort
		}
		// Upstream writes the out-filter rules, one per load-balancer IP, in
		// its map's order: a takeover keeps them in whatever order they are.
		out[iptables.TableFilter] = append(out[iptables.TableFilter], iptables.OwnChain{Name: ch, Rules: r, Unordered: ch == chainIPVSOutFilter})
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
