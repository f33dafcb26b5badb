package iptables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// SharedRule is a rule that one service adds to a chain all services share.
type SharedRule struct {
	Table iptableskernel.Table
	Chain iptableskernel.Chain
	Rule  iptableskernel.Rule
}

// ServiceRules is everything one service port puts into the kernel: its own
// nat chains, whole, and its rules in the shared chains. Services are
// independent of each other, which is what lets a sync touch only the
// services that changed.
type ServiceRules struct {
	Chains []iptableskernel.OwnChain
	Shared []SharedRule
}

// Params are the node-wide inputs of rule generation for one IP family.
type Params struct {
	IPv6 bool
	// MasqueradeBit is the fwmark bit that asks for SNAT.
	MasqueradeBit int
	MasqueradeAll bool
	// LocalhostNodePorts allows NodePorts on 127.0.0.0/8 (IPv4 only).
	LocalhostNodePorts bool
	LocalDetector      localdetect.Detector
	// NodeIP is the node's primary IP of the family: load-balancer source
	// ranges that contain it also admit the node's own hairpin traffic.
	NodeIP netip.Addr
	// NodePortAddresses are the addresses NodePorts answer on; nil means
	// every local address.
	NodePortAddresses []netip.Addr
	// TCPBeLiberal skips the drop of conntrack-INVALID packets.
	TCPBeLiberal bool
	// LargeCluster leaves the comments out of the endpoint chains and of
	// the jumps to them, as upstream does above LargeClusterEndpoints: it
	// makes the rule set markedly smaller, and keeps it equal to upstream's.
	LargeCluster bool
	// NFAcct is whether the nfacct objects the metrics read exist, so
	// that the rules can count packets in them (see EnsureNFAcctObjects).
	NFAcct bool
}

// LargeClusterEndpoints is the number of endpoints, over all services,
// above which the rules are written for a large cluster.
const LargeClusterEndpoints = 1000

// endpointComment is the comment of an endpoint chain's rules and of the
// jumps to it; none in a large cluster.
func (p *Params) endpointComment(text string) []string {
	if p.LargeCluster {
		return nil
	}
	return comment(text)
}

func (p *Params) masqueradeMark() string { return fmt.Sprintf("%#08x", 1<<p.MasqueradeBit) }

func (p *Params) localhostNodePorts() bool { return p.LocalhostNodePorts && !p.IPv6 }

// ServiceRules decides the rules of one service port from its definition
// and the endpoints selected for this node. It follows upstream's layout
// rule for rule, so both programs leave the same rule set behind: the
// shared rules path by path, then the service's own chains, from the
// external chain down to the endpoint chains.
func (p *Params) ServiceRules(svc *state.ServicePort, sel state.Selection) ServiceRules {
	b := newServiceBuilder(p, svc, sel)
	b.clusterIPRules()
	b.externalIPRules()
	b.loadBalancerRules()
	b.nodePortRules()
	b.healthCheckRule()
	b.externalChain()
	b.firewallChain()
	b.policyChains()
	b.endpointChains()
	return b.out
}

// serviceBuilder builds one service port's rules: what the traffic paths
// have in common, decided once, and the rules built so far.
type serviceBuilder struct {
	p     *Params
	svc   *state.ServicePort
	sel   state.Selection
	names serviceChains
	paths state.Paths
	name  string
	proto string
	port  string

	hasInternal, hasExternal           bool
	internalChain, externalPolicyChain iptableskernel.Chain
	usesFirewall                       bool
	// lbChain is where load-balancer traffic goes: the firewall chain
	// when source ranges restrict it.
	lbChain iptableskernel.Chain

	// Traffic that cannot be served: REJECT when the service has no
	// endpoint at all, DROP when it has some but none usable here.
	internalFilter, externalFilter   string
	internalComment, externalComment []string

	out ServiceRules
}

func newServiceBuilder(p *Params, svc *state.ServicePort, sel state.Selection) *serviceBuilder {
	b := &serviceBuilder{p: p, svc: svc, sel: sel, names: chainsFor(svc.Name), paths: state.PathsOf(svc, sel),
		name: svc.Name.String(), proto: protocolOf(svc.Protocol), port: strconv.Itoa(int(svc.Port))}
	b.internalChain, b.hasInternal = b.names.policyChain(b.paths.Internal), b.paths.Internal.Served
	b.externalPolicyChain, b.hasExternal = b.names.policyChain(b.paths.External), b.paths.External.Served
	// The firewall chain leads to the external chain, so it is there only
	// when that one is, with endpoints, as upstream's: without them,
	// KUBE-EXTERNAL-SERVICES rejects the traffic before
	// KUBE-PROXY-FIREWALL would see it.
	b.usesFirewall = b.paths.ExternalEntry && svc.FiltersLoadBalancerSources()
	b.lbChain = b.names.external
	if b.usesFirewall {
		b.lbChain = b.names.firewall
	}
	noEndpoints := comment(b.name + " has no endpoints")
	noLocal := comment(b.name + " has no local endpoints")
	b.internalComment, b.externalComment = noEndpoints, noEndpoints
	if sel.RejectsUnserved() {
		b.internalFilter, b.externalFilter = "REJECT", "REJECT"
	} else {
		if !b.hasInternal {
			b.internalFilter, b.internalComment = "DROP", noLocal
		}
		if !b.hasExternal {
			b.externalFilter, b.externalComment = "DROP", noLocal
		}
	}
	return b
}

// match is the match of the service's traffic to dst:dport.
func (b *serviceBuilder) match(dst, dport string) []string {
	return []string{"-m", b.proto, "-p", b.proto, "-d", dst, "--dport", dport}
}

func (b *serviceBuilder) shared(t iptableskernel.Table, c iptableskernel.Chain, parts ...[]string) {
	b.out.Shared = append(b.out.Shared, SharedRule{Table: t, Chain: c, Rule: rule(parts...)})
}

func (b *serviceBuilder) own(c iptableskernel.Chain, rules ...iptableskernel.Rule) {
	b.out.Chains = append(b.out.Chains, iptableskernel.OwnChain{Name: c, Rules: rules})
}

// clusterIPRules send cluster IP traffic to the internal policy chain, or
// filter it when the service cannot serve it.
func (b *serviceBuilder) clusterIPRules() {
	clusterIP := b.svc.ClusterIP.String()
	if b.hasInternal {
		b.shared(iptableskernel.TableNAT, chainServices, comment(b.name+" cluster IP"), b.match(clusterIP, b.port), jump(b.internalChain))
	} else {
		b.shared(iptableskernel.TableFilter, chainServices, b.internalComment, b.match(clusterIP, b.port), target(b.internalFilter))
	}
}

// externalIPRules send external IP traffic to the external chain, or
// filter it.
func (b *serviceBuilder) externalIPRules() {
	for _, ip := range b.svc.ExternalIPs {
		if b.paths.ExternalEntry {
			b.shared(iptableskernel.TableNAT, chainServices, comment(b.name+" external IP"), b.match(ip.String(), b.port), jump(b.names.external))
		}
		if !b.hasExternal {
			b.shared(iptableskernel.TableFilter, chainExternalServices, b.externalComment, b.match(ip.String(), b.port), target(b.externalFilter))
		}
	}
}

// loadBalancerRules send load-balancer traffic to the external chain, or
// through the firewall chain, whose traffic not accepted
// KUBE-PROXY-FIREWALL drops; or filter it.
func (b *serviceBuilder) loadBalancerRules() {
	for _, ip := range b.svc.LoadBalancerIPs {
		if b.paths.ExternalEntry {
			b.shared(iptableskernel.TableNAT, chainServices, comment(b.name+" loadbalancer IP"), b.match(ip.String(), b.port), jump(b.lbChain))
		}
		if b.usesFirewall {
			b.shared(iptableskernel.TableFilter, chainProxyFirewall, comment(b.name+" traffic not accepted by "+string(b.names.firewall)), b.match(ip.String(), b.port), target("DROP"))
		}
	}
	if !b.hasExternal {
		for _, ip := range b.svc.LoadBalancerIPs {
			b.shared(iptableskernel.TableFilter, chainExternalServices, b.externalComment, b.match(ip.String(), b.port), target(b.externalFilter))
		}
	}
}

// nodePortRules send NodePort traffic to the external chain, or filter it.
func (b *serviceBuilder) nodePortRules() {
	if b.svc.NodePort == 0 {
		return
	}
	nodePort := strconv.Itoa(int(b.svc.NodePort))
	if b.paths.ExternalEntry {
		if b.p.localhostNodePorts() && b.p.NFAcct {
			// The same jump for localhost only, counting the packets:
			// it must come first, or the general rule takes them all.
			b.shared(iptableskernel.TableNAT, chainNodePorts, comment(b.name), []string{"-m", b.proto, "-p", b.proto, "-d", "127.0.0.0/8", "--dport", nodePort},
				nfacctMatch(metrics.NFAcctLocalhostNodePortsAccepted), jump(b.names.external))
		}
		b.shared(iptableskernel.TableNAT, chainNodePorts, comment(b.name), []string{"-m", b.proto, "-p", b.proto, "--dport", nodePort}, jump(b.names.external))
	}
	if !b.hasExternal {
		b.shared(iptableskernel.TableFilter, chainExternalServices, b.externalComment,
			[]string{"-m", "addrtype", "--dst-type", "LOCAL", "-m", b.proto, "-p", b.proto, "--dport", nodePort}, target(b.externalFilter))
	}
}

// healthCheckRule accepts the health-check node port.
func (b *serviceBuilder) healthCheckRule() {
	if b.svc.HealthCheckNodePort != 0 {
		b.shared(iptableskernel.TableFilter, chainNodePorts, comment(b.name+" health check node port"),
			[]string{"-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(b.svc.HealthCheckNodePort))}, target("ACCEPT"))
	}
}

// externalChain is the external traffic's entry, as Paths.ExternalEntry
// decides: it masquerades external traffic, or with a Local policy
// routes the node's and its pods' own traffic through the cluster chain,
// then jumps to the external policy chain.
func (b *serviceBuilder) externalChain() {
	if !b.paths.ExternalEntry {
		return
	}
	var rules []iptableskernel.Rule
	if !b.paths.External.Local {
		rules = append(rules, rule(comment("masquerade traffic for "+b.name+" external destinations"), jump(chainMarkMasq)))
	} else {
		if b.p.LocalDetector.Implemented() {
			rules = append(rules, rule(comment("pod traffic for "+b.name+" external destinations"), b.p.LocalDetector.IfLocal(), jump(b.names.cluster)))
		}
		rules = append(rules,
			rule(comment("masquerade LOCAL traffic for "+b.name+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL"}, jump(chainMarkMasq)),
			rule(comment("route LOCAL traffic for "+b.name+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL"}, jump(b.names.cluster)))
	}
	if b.hasExternal {
		rules = append(rules, rule(jump(b.externalPolicyChain)))
	}
	b.own(b.names.external, rules...)
}

// firewallChain lets load-balancer traffic from the source ranges (and
// the node's hairpin traffic, when a range holds the node's IP) on to the
// external chain.
func (b *serviceBuilder) firewallChain() {
	if !b.usesFirewall {
		return
	}
	lbComment := comment(b.name + " loadbalancer IP")
	var rules []iptableskernel.Rule
	for _, cidr := range b.svc.LoadBalancerSourceRanges {
		rules = append(rules, rule(lbComment, []string{"-s", cidr.String()}, jump(b.names.external)))
	}
	if b.svc.SourceRangesAllow(b.p.NodeIP) {
		for _, ip := range b.svc.LoadBalancerIPs {
			rules = append(rules, rule(lbComment, []string{"-s", ip.String()}, jump(b.names.external)))
		}
	}
	// Traffic not accepted above falls through; KUBE-PROXY-FIREWALL drops it.
	rules = append(rules, rule(comment("other traffic to "+b.name+" will be dropped by KUBE-PROXY-FIREWALL")))
	b.own(b.names.firewall, rules...)
}

// policyChains spread traffic over the endpoints of the cluster and local
// policies. The internal chain's masquerade rule lives in the cluster or
// local policy chain, ahead of its endpoint jumps.
func (b *serviceBuilder) policyChains() {
	var masqueradeInternal []iptableskernel.Rule
	if b.hasInternal && (b.p.MasqueradeAll || b.p.LocalDetector.Implemented()) {
		var notLocal []string
		if !b.p.MasqueradeAll {
			notLocal = b.p.LocalDetector.IfNotLocal()
		}
		masqueradeInternal = []iptableskernel.Rule{rule(comment(b.name+" cluster IP"), b.match(b.svc.ClusterIP.String(), b.port), notLocal, jump(chainMarkMasq))}
	}
	if b.paths.ClusterUsed {
		rules := masqueradeIfInternal(b.internalChain, b.names.cluster, masqueradeInternal)
		b.own(b.names.cluster, append(rules, b.p.spreadRules(b.svc, b.names, b.sel.Cluster)...)...)
	}
	if b.paths.LocalUsed {
		rules := masqueradeIfInternal(b.internalChain, b.names.local, masqueradeInternal)
		b.own(b.names.local, append(rules, b.p.spreadRules(b.svc, b.names, b.sel.Local)...)...)
	}
}

// endpointChains masquerade an endpoint's traffic to itself (hairpin) and
// DNAT to it.
func (b *serviceBuilder) endpointChains() {
	for _, ep := range b.sel.All {
		chain := b.names.endpointChain(ep)
		svcComment := b.p.endpointComment(b.name)
		dnat := []string{"-m", b.proto, "-p", b.proto, "-j", "DNAT", "--to-destination", ep.String()}
		var affinity []string
		if b.svc.AffinityTimeoutSeconds > 0 {
			affinity = []string{"-m", "recent", "--name", string(chain), "--set"}
		}
		b.own(chain,
			rule(svcComment, []string{"-s", ep.IP.String()}, jump(chainMarkMasq)),
			rule(svcComment, affinity, dnat))
	}
}

// policyChain is the chain traffic on the path jumps to.
func (n serviceChains) policyChain(p state.Path) iptableskernel.Chain {
	if p.Local {
		return n.local
	}
	return n.cluster
}

func masqueradeIfInternal(internal, chain iptableskernel.Chain, masquerade []iptableskernel.Rule) []iptableskernel.Rule {
	if internal == chain {
		return append([]iptableskernel.Rule(nil), masquerade...)
	}
	return nil
}

// spreadRules send each connection to one endpoint: first the affinity
// matches, then random picks with probability 1/(n-i) for endpoint i.
func (p *Params) spreadRules(svc *state.ServicePort, names serviceChains, eps []*state.Endpoint) []iptableskernel.Rule {
	name := svc.Name.String()
	var rules []iptableskernel.Rule
	if svc.AffinityTimeoutSeconds > 0 {
		for _, ep := range eps {
			chain := names.endpointChain(ep)
			rules = append(rules, rule(p.endpointComment(name+" -> "+ep.String()),
				[]string{"-m", "recent", "--name", string(chain), "--rcheck", "--seconds", strconv.Itoa(int(svc.AffinityTimeoutSeconds)), "--reap"},
				jump(chain)))
		}
	}
	for i, ep := range eps {
		var random []string
		if left := len(eps) - i; left > 1 {
			random = []string{"-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%0.10f", 1/float64(left))}
		}
		rules = append(rules, rule(p.endpointComment(name+" -> "+ep.String()), random, jump(names.endpointChain(ep))))
	}
	return rules
}

// StaticRules are the rules that depend only on the node's configuration.
type StaticRules struct {
	// Chains are chains whose content is entirely fixed.
	Chains map[iptableskernel.Table][]iptableskernel.OwnChain
	// Shared are the chains that services add rules to, with the fixed
	// rules that end them (the NodePort jump must end KUBE-SERVICES).
	Shared map[iptableskernel.Table][]iptableskernel.OwnChain
	// Jumps lead from the built-in chains into ours.
	Jumps []iptableskernel.Jump
}

// SharedChains lists the chains services add rules to, per table.
var SharedChains = map[iptableskernel.Table][]iptableskernel.Chain{
	iptableskernel.TableFilter: {chainServices, chainExternalServices, chainNodePorts, chainProxyFirewall},
	iptableskernel.TableNAT:    {chainServices, chainNodePorts},
}

// StaticRules decides the fixed part of the rule set.
func (p *Params) StaticRules() StaticRules {
	return StaticRules{
		Chains: map[iptableskernel.Table][]iptableskernel.OwnChain{iptableskernel.TableNAT: p.natChains(), iptableskernel.TableFilter: p.filterChains()},
		Shared: p.sharedChains(),
		Jumps:  p.builtinJumps(),
	}
}

// natChains mark traffic for SNAT and masquerade it on the way out.
func (p *Params) natChains() []iptableskernel.OwnChain {
	mark := p.masqueradeMark()
	// Always with --random-fully, as upstream (iptables has had it since
	// 1.6.2).
	masquerade := []string{"-j", "MASQUERADE", "--random-fully"}
	return []iptableskernel.OwnChain{
		{Name: chainPostrouting, Rules: []iptableskernel.Rule{
			rule([]string{"-m", "mark", "!", "--mark", mark + "/" + mark, "-j", "RETURN"}),
			rule([]string{"-j", "MARK", "--xor-mark", mark}),
			rule(comment("kubernetes service traffic requiring SNAT"), masquerade),
		}},
		{Name: chainMarkMasq, Rules: []iptableskernel.Rule{rule([]string{"-j", "MARK", "--or-mark", mark})}},
	}
}

// filterChains accept forwarded service traffic and, with localhost
// NodePorts, guard the loopback addresses.
func (p *Params) filterChains() []iptableskernel.OwnChain {
	mark := p.masqueradeMark()
	var forward []iptableskernel.Rule
	if !p.TCPBeLiberal {
		var count []string
		if p.NFAcct {
			count = nfacctMatch(metrics.NFAcctCTStateInvalidDropped)
		}
		forward = append(forward, rule([]string{"-m", "conntrack", "--ctstate", "INVALID"}, count, target("DROP")))
	}
	forward = append(forward,
		rule(comment("kubernetes forwarding rules"), []string{"-m", "mark", "--mark", mark + "/" + mark, "-j", "ACCEPT"}),
		rule(comment("kubernetes forwarding conntrack rule"), []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"}))
	filter := []iptableskernel.OwnChain{{Name: chainForward, Rules: forward}}
	if p.localhostNodePorts() {
		filter = append(filter, iptableskernel.OwnChain{Name: chainLocalnetGuard, Rules: []iptableskernel.Rule{rule(comment("block incoming localnet connections"),
			[]string{"-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8", "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP"})}})
	}
	return filter
}

// sharedChains are the chains services add rules to, with their fixed
// tails: only nat KUBE-SERVICES has one, its jumps to KUBE-NODEPORTS.
func (p *Params) sharedChains() map[iptableskernel.Table][]iptableskernel.OwnChain {
	shared := map[iptableskernel.Table][]iptableskernel.OwnChain{}
	for table, chains := range SharedChains {
		for _, c := range chains {
			oc := iptableskernel.OwnChain{Name: c}
			if table == iptableskernel.TableNAT && c == chainServices {
				oc.Rules = p.nodePortJumps()
			}
			shared[table] = append(shared[table], oc)
		}
	}
	return shared
}

// nodePortJumps lead the node's NodePort addresses to KUBE-NODEPORTS.
func (p *Params) nodePortJumps() []iptableskernel.Rule {
	nodePortsComment := comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")
	if p.NodePortAddresses == nil {
		dst := []string{"-m", "addrtype", "--dst-type", "LOCAL"}
		if p.IPv6 {
			dst = append(dst, "!", "-d", "::1/128")
		} else if !p.LocalhostNodePorts {
			dst = append(dst, "!", "-d", "127.0.0.0/8")
		}
		return []iptableskernel.Rule{rule(nodePortsComment, dst, jump(chainNodePorts))}
	}
	var jumps []iptableskernel.Rule
	for _, ip := range p.NodePortAddresses {
		if ip.IsLoopback() && !p.localhostNodePorts() {
			continue
		}
		jumps = append(jumps, rule(nodePortsComment, []string{"-d", ip.String()}, jump(chainNodePorts)))
	}
	return jumps
}

// builtinJumps lead from the built-in chains into ours.
func (p *Params) builtinJumps() []iptableskernel.Jump {
	newConn := []string{"-m", "conntrack", "--ctstate", "NEW"}
	jumps := []iptableskernel.Jump{
		{Table: iptableskernel.TableFilter, From: "INPUT", Rule: rule(newConn, comment("kubernetes externally-visible service portals"), jump(chainExternalServices))},
		{Table: iptableskernel.TableFilter, From: "FORWARD", Rule: rule(newConn, comment("kubernetes externally-visible service portals"), jump(chainExternalServices))},
		{Table: iptableskernel.TableFilter, From: "INPUT", Rule: rule(comment("kubernetes health check service ports"), jump(chainNodePorts))},
		{Table: iptableskernel.TableFilter, From: "FORWARD", Rule: rule(newConn, comment("kubernetes service portals"), jump(chainServices))},
		{Table: iptableskernel.TableFilter, From: "OUTPUT", Rule: rule(newConn, comment("kubernetes service portals"), jump(chainServices))},
		{Table: iptableskernel.TableFilter, From: "FORWARD", Rule: rule(comment("kubernetes forwarding rules"), jump(chainForward))},
		{Table: iptableskernel.TableFilter, From: "INPUT", Rule: rule(newConn, comment("kubernetes load balancer firewall"), jump(chainProxyFirewall))},
		{Table: iptableskernel.TableFilter, From: "OUTPUT", Rule: rule(newConn, comment("kubernetes load balancer firewall"), jump(chainProxyFirewall))},
		{Table: iptableskernel.TableFilter, From: "FORWARD", Rule: rule(newConn, comment("kubernetes load balancer firewall"), jump(chainProxyFirewall))},
		{Table: iptableskernel.TableNAT, From: "OUTPUT", Rule: rule(comment("kubernetes service portals"), jump(chainServices))},
		{Table: iptableskernel.TableNAT, From: "PREROUTING", Rule: rule(comment("kubernetes service portals"), jump(chainServices))},
		{Table: iptableskernel.TableNAT, From: "POSTROUTING", Rule: rule(comment("kubernetes postrouting rules"), jump(chainPostrouting))},
	}
	if p.localhostNodePorts() {
		jumps = append(jumps,
			iptableskernel.Jump{Table: iptableskernel.TableFilter, From: "INPUT", Rule: rule(jump(chainLocalnetGuard))},
			iptableskernel.Jump{Table: iptableskernel.TableFilter, From: "OUTPUT", Rule: rule(jump(chainLocalnetGuard))})
	}
	return jumps
}

// rule joins argument groups into one rule, in one allocation (a full
// sync makes every rule of every service port).
func rule(parts ...[]string) iptableskernel.Rule {
	size := 0
	for _, part := range parts {
		for _, a := range part {
			size += len(a) + 1
		}
	}
	var b strings.Builder
	b.Grow(size)
	for _, part := range parts {
		for _, a := range part {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(a)
		}
	}
	return iptableskernel.Rule(b.String())
}

func comment(text string) []string {
	return []string{"-m", "comment", "--comment", strconv.Quote(text)}
}

func jump(c iptableskernel.Chain) []string { return []string{"-j", string(c)} }

// nfacctMatch counts the packets the rule matches in an nfacct object.
func nfacctMatch(object string) []string { return []string{"-m", "nfacct", "--nfacct-name", object} }

func target(t string) []string { return []string{"-j", t} }

// protocolOf is the lowercase protocol name iptables expects.
func protocolOf(p v1.Protocol) string {
	switch p {
	case v1.ProtocolTCP:
		return "tcp"
	case v1.ProtocolUDP:
		return "udp"
	case v1.ProtocolSCTP:
		return "sctp"
	}
	return strings.ToLower(string(p))
}
