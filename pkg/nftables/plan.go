package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// TableName is the table of each family, as upstream names it.
const TableName = "kube-proxy"

// The fixed chains, sets and maps, named as upstream.
const (
	chainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	chainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	chainFilterInput             = "filter-input"
	chainFilterForward           = "filter-forward"
	chainFilterOutput            = "filter-output"
	chainNATPrerouting           = "nat-prerouting"
	chainNATOutput               = "nat-output"
	chainNATPostrouting          = "nat-postrouting"

	chainServices               = "services"
	chainServiceEndpointsCheck  = "service-endpoints-check"
	chainNodePortEndpointsCheck = "nodeport-endpoints-check"
	chainFirewallCheck          = "firewall-check"
	chainClusterIPsCheck        = "cluster-ips-check"
	chainMasquerading           = "masquerading"
	chainReject                 = "reject-chain"

	setClusterIPs          = "cluster-ips"
	setNodePortIPs         = "nodeport-ips"
	setHairpinConnections  = "hairpin-connections"
	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	mapFirewallIPs         = "firewall-ips"
	mapLocalhostRejects    = "localhost-nodeport-reject-ports"
)

// Chain is a chain with its rules, each as `nft list` prints it (a
// trailing comment included), so that what is written compares equal to
// what is read back.
type Chain struct {
	knftables.Chain
	Rules []string
	// Upstream are the rules upstream writes for the same thing where
	// ours differ (see spread): a chain the kernel holds with them is left
	// as it is, so that taking over from upstream rewrites nothing.
	Upstream []string
}

// Layout is what every sync keeps in place whatever the services: the
// table, base chains, fixed chains with their rules, sets and maps.
type Layout struct {
	Table  knftables.Table
	Chains []Chain
	// Sets holds the sets and maps (a map is a set with a value type,
	// "key : value", as nft lists it).
	Sets     []Set
	Elements []knftables.Element
	// Counters are the named counters, which the chains' rules may use.
	Counters []string
}

// Set is a set or map, as far as a sync compares them.
type Set struct {
	Name string
	// Map is true for a map; Type is its "key : value" type then.
	Map     bool
	Type    string
	Flags   []knftables.SetFlag
	Timeout time.Duration
	Comment string
}

// ServiceObjects is everything one service port puts into the table: its
// chains and affinity sets, which it alone owns, and its elements in the
// shared sets and maps (a cluster-ips or hairpin-connections element may
// be wanted by several).
type ServiceObjects struct {
	Chains   []Chain
	Sets     []Set
	Elements []knftables.Element
}

func (p *Params) ipX() string {
	if p.IPv6 {
		return "ip6"
	}
	return "ip"
}

func (p *Params) addrType() string {
	if p.IPv6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// mark is the masquerade mark as nft prints it.
func (p *Params) mark() string { return fmt.Sprintf("0x%08x", uint32(1)<<p.MasqueradeBit) }

// masquerade marks a packet for masquerading in the masquerading chain.
func (p *Params) masquerade() string { return "meta mark set meta mark | " + p.mark() }

// matchAllNodePorts is true when every local address takes NodePorts.
func (p *Params) matchAllNodePorts() bool { return p.NodePortAddresses == nil }

func baseChain(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority, rules ...string) Chain {
	return Chain{Chain: knftables.Chain{Name: name, Type: &typ, Hook: &hook, Priority: &prio}, Rules: rules}
}

func chain(name string, rules ...string) Chain {
	return Chain{Chain: knftables.Chain{Name: name}, Rules: rules}
}

func comment(rule, c string) string { return rule + " comment " + strconv.Quote(c) }

// Layout is the fixed part of the table for these parameters; base chain
// priorities are written as nft prints them.
func (p *Params) Layout() Layout {
	l := Layout{Table: knftables.Table{Comment: knftables.PtrTo("rules for kube-proxy")}}
	l.Chains = append(p.baseChains(), p.fixedChains()...)
	l.Sets = p.fixedSets()
	p.addLocalhostRejects(&l)
	p.addNodePortIPs(&l)
	return l
}

// baseChains hook the fixed chains into netfilter.
func (p *Params) baseChains() []Chain {
	const newConn = "ct state new "
	return []Chain{
		baseChain(chainFilterPreroutingPreDNAT, knftables.FilterType, knftables.PreroutingHook, "dstnat - 10", newConn+"jump "+chainFirewallCheck),
		baseChain(chainFilterOutputPreDNAT, knftables.FilterType, knftables.OutputHook, "-110", newConn+"jump "+chainFirewallCheck),
		baseChain(chainFilterInput, knftables.FilterType, knftables.InputHook, knftables.FilterPriority,
			newConn+"jump "+chainNodePortEndpointsCheck, newConn+"jump "+chainServiceEndpointsCheck),
		baseChain(chainFilterForward, knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority,
			newConn+"jump "+chainServiceEndpointsCheck, newConn+"jump "+chainClusterIPsCheck),
		baseChain(chainFilterOutput, knftables.FilterType, knftables.OutputHook, knftables.FilterPriority,
			newConn+"jump "+chainServiceEndpointsCheck, newConn+"jump "+chainClusterIPsCheck),
		baseChain(chainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, "jump "+chainServices),
		baseChain(chainNATOutput, knftables.NATType, knftables.OutputHook, "-100", "jump "+chainServices),
		baseChain(chainNATPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, "jump "+chainMasquerading),
	}
}

// fixedChains are the chains the base chains lead to, in upstream's order.
func (p *Params) fixedChains() []Chain {
	reject := chain(chainReject, "reject")
	reject.Comment = knftables.PtrTo("helper for @no-endpoint-services / @no-endpoint-nodeports")
	return []Chain{
		p.nodePortEndpointsCheck(),
		chain(chainServiceEndpointsCheck, p.destinationVmap(mapNoEndpointServices)),
		chain(chainFirewallCheck, p.destinationVmap(mapFirewallIPs)),
		chain(chainServices, p.servicesRules()...),
		chain(chainMasquerading,
			"meta mark & "+p.mark()+" != 0x00000000 meta mark set meta mark ^ "+p.mark()+" masquerade fully-random",
			"ct status dnat "+p.ipX()+" saddr . "+p.ipX()+" daddr . meta l4proto . th dport @"+setHairpinConnections+" masquerade fully-random"),
		chain(chainClusterIPsCheck, p.clusterIPsCheckRules()...),
		reject,
	}
}

// destinationVmap sends traffic to the verdict its destination address,
// protocol and port have in the map m.
func (p *Params) destinationVmap(m string) string {
	return p.ipX() + " daddr . meta l4proto . th dport vmap @" + m
}

// loopback is localhost as nft prints it.
func (p *Params) loopback() string {
	if p.IPv6 {
		return "::1"
	}
	return "127.0.0.0/8"
}

// nodePortDestinations matches traffic to an address NodePorts answer
// on: one of nodeport-ips, or any local address but localhost, on which
// upstream writes no NodePort. Only the services chain needs to check
// that the address is local: the filter chains that check NodePorts run
// on input.
func (p *Params) nodePortDestinations(checkLocal bool) string {
	if !p.matchAllNodePorts() {
		return p.ipX() + " daddr @" + setNodePortIPs
	}
	noLocalhost := p.ipX() + " daddr != " + p.loopback()
	if checkLocal {
		return "fib daddr type local " + noLocalhost
	}
	return noLocalhost
}

// servicesRules DNAT traffic to a service address or a NodePort, through
// the service-ips and service-nodeports maps; ClusterIP traffic that may
// leave the node again is marked for masquerading first.
func (p *Params) servicesRules() []string {
	clusterIPs := p.ipX() + " daddr @" + setClusterIPs + " "
	var rules []string
	switch {
	case p.MasqueradeAll:
		rules = append(rules, comment(clusterIPs+p.masquerade(), "masquerade all clusterIP traffic"))
	case p.LocalDetector.Implemented():
		// Off-cluster traffic to a ClusterIP (through a static route to
		// a node) may leave the node again: masquerade it.
		rules = append(rules, comment(clusterIPs+p.LocalDetector.IfNotLocalNFT()+" "+p.masquerade(), "masquerade clusterIP traffic from outside cluster"))
	}
	return append(rules, p.destinationVmap(mapServiceIPs),
		p.nodePortDestinations(true)+" meta l4proto . th dport vmap @"+mapServiceNodePorts)
}

// clusterIPsCheckRules reject traffic to a ClusterIP's other ports and
// drop it to the service CIDRs' unallocated addresses.
func (p *Params) clusterIPsCheckRules() []string {
	ip := p.ipX()
	rules := []string{comment(ip+" daddr @"+setClusterIPs+" reject", "Reject traffic to invalid ports of ClusterIPs")}
	if len(p.ServiceCIDRs) > 0 {
		rules = append(rules, comment(ip+" daddr "+addressSet(p.ServiceCIDRs)+" drop", "Drop traffic to unallocated ClusterIPs"))
	}
	return rules
}

// nodePortEndpointsCheck drops or rejects NodePort traffic with no
// endpoint, and sends localhost NodePort traffic to be rejected when it
// is.
func (p *Params) nodePortEndpointsCheck() Chain {
	c := chain(chainNodePortEndpointsCheck, p.nodePortDestinations(false)+" meta l4proto . th dport vmap @"+mapNoEndpointNodePorts)
	if len(p.rejectedLocalhostProtocols()) > 0 {
		c.Rules = append(c.Rules, p.ipX()+" daddr "+p.loopback()+" meta l4proto . th dport vmap @"+mapLocalhostRejects)
	}
	return c
}

// fixedSets are the sets and maps every table has.
func (p *Params) fixedSets() []Set {
	addr := p.addrType()
	return []Set{
		{Name: setHairpinConnections, Type: addr + " . " + addr + " . inet_proto . inet_service", Comment: "service hairpin connections"},
		{Name: setClusterIPs, Type: addr, Comment: "Active ClusterIPs"},
		{Name: mapNoEndpointServices, Map: true, Type: addr + " . inet_proto . inet_service : verdict", Comment: "vmap to drop or reject packets to services with no endpoints"},
		{Name: mapNoEndpointNodePorts, Map: true, Type: "inet_proto . inet_service : verdict", Comment: "vmap to drop or reject packets to service nodeports with no endpoints"},
		{Name: mapFirewallIPs, Map: true, Type: addr + " . inet_proto . inet_service : verdict", Comment: "destinations that are subject to LoadBalancerSourceRanges"},
		{Name: mapServiceIPs, Map: true, Type: addr + " . inet_proto . inet_service : verdict", Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
		{Name: mapServiceNodePorts, Map: true, Type: "inet_proto . inet_service : verdict", Comment: "NodePort traffic"},
	}
}

// addLocalhostRejects adds, when localhost NodePorts of some protocol
// are rejected, the map of those NodePorts and each protocol's counter
// and the chain that counts and rejects.
func (p *Params) addLocalhostRejects(l *Layout) {
	rejected := p.rejectedLocalhostProtocols()
	if len(rejected) == 0 {
		return
	}
	l.Sets = append(l.Sets, Set{Name: mapLocalhostRejects, Map: true, Type: "inet_proto . inet_service : verdict", Comment: "localhost NodePorts rejected by kube-proxy"})
	for _, proto := range rejected {
		counter := LocalhostRejectedCounter(proto)
		l.Counters = append(l.Counters, counter)
		l.Chains = append(l.Chains, chain(localhostRejectChain(proto), "counter name "+strconv.Quote(counter)+" reject"))
	}
}

// addNodePortIPs adds, unless every local address takes NodePorts, the
// set of those that do.
func (p *Params) addNodePortIPs(l *Layout) {
	if p.matchAllNodePorts() {
		return
	}
	l.Sets = append(l.Sets, Set{Name: setNodePortIPs, Type: p.addrType(), Comment: "IPs that accept NodePort traffic"})
	for _, a := range p.NodePortAddresses {
		// Upstream does not do localhost NodePorts; the wiring logs it.
		if a.IsLoopback() {
			continue
		}
		l.Elements = append(l.Elements, knftables.Element{Set: setNodePortIPs, Key: []string{a.String()}})
	}
}

// cascadeLimit is the most endpoints spread spreads over with a cascade
// of rules.
const cascadeLimit = 32

// spread sends each new connection to one of the actions, each as likely:
// up to cascadeLimit actions, with a cascade of rules, each taking its
// share of what is left ("numgen random mod 3 0" a third, the next rule
// half of the rest, the last all of it), as the iptables mode does. Above
// it, and always in upstream's rules (returned as upstream, or nil when
// the same), one rule maps a random number to the action through an
// anonymous map (mapRule, with the count and the "0 : x, 1 : y" entries
// of mapped). Each anonymous map costs the kernel a scan of every set in
// the table to name it: 10k services made upstream's first sync
// quadratic, 18 s of kernel time where the cascade takes about 1 s.
func spread(prefix string, actions []string, mapRule string, mapped []string) (rules, upstream []string) {
	entries := make([]string, len(mapped))
	for i, m := range mapped {
		entries[i] = itoa(int32(i)) + " : " + m
	}
	viaMap := []string{fmt.Sprintf(mapRule, len(mapped), strings.Join(entries, ", "))}
	if len(actions) > cascadeLimit {
		return viaMap, nil
	}
	rules = make([]string, len(actions))
	for i, a := range actions {
		if left := len(actions) - i; left > 1 {
			a = "numgen random mod " + itoa(int32(left)) + " 0 " + a
		}
		rules[i] = prefix + a
	}
	return rules, viaMap
}

// addressSet writes prefixes as nft lists them back: one address or
// prefix bare; only whole addresses as a plain set; otherwise an interval
// set, sorted, overlapping and adjacent ranges merged, each an address, a
// prefix or a range.
func addressSet(prefixes []netip.Prefix) string {
	type span struct{ from, to netip.Addr }
	var spans []span
	single := true
	for _, p := range prefixes {
		p = p.Masked()
		spans = append(spans, span{p.Addr(), lastAddr(p)})
		single = single && p.IsSingleIP()
	}
	slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
	spans = slices.Compact(spans)
	if len(spans) == 1 && len(prefixes) == 1 {
		return prefixString(spans[0].from, spans[0].to)
	}
	if !single {
		merged := spans[:1]
		for _, s := range spans[1:] {
			last := &merged[len(merged)-1]
			if next := last.to.Next(); s.from.Compare(last.to) <= 0 || (next.IsValid() && s.from == next) {
				if s.to.Compare(last.to) > 0 {
					last.to = s.to
				}
				continue
			}
			merged = append(merged, s)
		}
		spans = merged
	}
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = prefixString(s.from, s.to)
	}
	return "{ " + strings.Join(out, ", ") + " }"
}

// prefixString is from..to as an address, a prefix or a range.
func prefixString(from, to netip.Addr) string {
	if from == to {
		return from.String()
	}
	for bits := from.BitLen() - 1; bits >= 0; bits-- {
		p := netip.PrefixFrom(from, bits)
		if p.Masked().Addr() != from {
			break
		}
		if lastAddr(p) == to {
			return p.String()
		}
	}
	return from.String() + "-" + to.String()
}

// lastAddr is the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }
