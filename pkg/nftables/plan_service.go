package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// ServiceObjects decides what one service port puts into the table, from
// its definition and the endpoints this node uses for it, as upstream
// v1.36 does: no endpoint chains but with affinity, one numgen DNAT rule
// per policy chain, hairpin traffic masqueraded through a set.
func (p *Params) ServiceObjects(svc *state.ServicePort, sel state.Selection) ServiceObjects {
	b := newSvcBuilder(p, svc, sel)
	b.clusterIP()
	b.externalIPs()
	b.loadBalancerIPs()
	b.nodePort()
	b.hairpin()
	b.externalChain()
	b.firewallChain()
	b.policyChains()
	b.affinityChains()
	return b.out
}

// svcBuilder builds one service port's objects, one traffic path at a
// time; ServiceObjects runs the steps in the order their objects come
// out (Describe lists them so).
type svcBuilder struct {
	p     *Params
	svc   *state.ServicePort
	sel   state.Selection
	names serviceNames
	paths state.Paths
	// proto and port are the service's, as nft prints them.
	proto, port string
	out         ServiceObjects
}

func newSvcBuilder(p *Params, svc *state.ServicePort, sel state.Selection) *svcBuilder {
	b := &svcBuilder{p: p, svc: svc, sel: sel, names: namesFor(svc.Name), paths: state.PathsOf(svc, sel),
		proto: strings.ToLower(string(svc.Protocol)), port: itoa(svc.Port)}
	// Sized for the most it may hold, so that no append copies it.
	b.out.Elements = make([]knftables.Element, 0, mostElements(svc, sel))
	return b
}

// mostElements is the most elements a service port may put into the
// shared sets and maps.
func mostElements(svc *state.ServicePort, sel state.Selection) int {
	most := 2 + 2*len(svc.ExternalIPs) + 3*len(svc.LoadBalancerIPs)
	for _, ep := range sel.All {
		if ep.IsLocal {
			most++
		}
	}
	if svc.NodePort != 0 {
		most += 3
	}
	return most
}

func (b *svcBuilder) setElement(set string, key ...string) {
	b.out.Elements = append(b.out.Elements, knftables.Element{Set: set, Key: key})
}

// mapElement maps key to value; cmt, when not empty, names the service.
func (b *svcBuilder) mapElement(m string, key []string, value, cmt string) {
	e := knftables.Element{Map: m, Key: key, Value: []string{value}}
	if cmt != "" {
		// nft refuses a longer comment, failing the whole transaction:
		// "ns/name:port" of valid names may reach 143 bytes.
		cmt = cmt[:min(len(cmt), knftables.CommentLengthMax)]
		e.Comment = &cmt
	}
	b.out.Elements = append(b.out.Elements, e)
}

// addrKey is the key of traffic to the service port at a.
func (b *svcBuilder) addrKey(a netip.Addr) []string { return []string{a.String(), b.proto, b.port} }

// unservedVerdict is what becomes of traffic with no endpoint to reach:
// dropped, or rejected when the service has no endpoint anywhere.
func (b *svcBuilder) unservedVerdict() string {
	if b.sel.RejectsUnserved() {
		return "goto " + chainReject
	}
	return "drop"
}

// unserved sends traffic with no endpoint to reach to unservedVerdict.
func (b *svcBuilder) unserved(m string, key []string) {
	b.mapElement(m, key, b.unservedVerdict(), b.svc.Name.String())
}

// toExternalChain sends external traffic to the external chain, when
// there is one.
func (b *svcBuilder) toExternalChain(m string, key []string) {
	if b.paths.ExternalEntry {
		b.mapElement(m, key, b.names.gotoExternal, "")
	}
}

// unservedExternal sends external traffic to unservedVerdict when the
// external policy leaves it no endpoint to reach.
func (b *svcBuilder) unservedExternal(m string, key []string) {
	if !b.paths.External.Served {
		b.unserved(m, key)
	}
}

// clusterIP is the service's cluster IP, in the cluster-ips set, and its
// traffic, to the internal policy chain or unserved.
func (b *svcBuilder) clusterIP() {
	b.setElement(setClusterIPs, b.svc.ClusterIP.String())
	if b.paths.Internal.Served {
		b.mapElement(mapServiceIPs, b.addrKey(b.svc.ClusterIP), b.names.gotoPolicyChain(b.paths.Internal), "")
		return
	}
	b.unserved(mapNoEndpointServices, b.addrKey(b.svc.ClusterIP))
}

// externalIPs go to the external chain.
func (b *svcBuilder) externalIPs() {
	for _, a := range b.svc.ExternalIPs {
		key := b.addrKey(a)
		b.toExternalChain(mapServiceIPs, key)
		b.unservedExternal(mapNoEndpointServices, key)
	}
}

// loadBalancerIPs go to the external chain and, with source ranges, to
// the firewall chain first (firewall-check comes before the DNAT); those
// unserved come after all of them.
func (b *svcBuilder) loadBalancerIPs() {
	for _, a := range b.svc.LoadBalancerIPs {
		b.toExternalChain(mapServiceIPs, b.addrKey(a))
		if b.svc.FiltersLoadBalancerSources() {
			b.mapElement(mapFirewallIPs, b.addrKey(a), b.names.gotoFirewall, "")
		}
	}
	for _, a := range b.svc.LoadBalancerIPs {
		b.unservedExternal(mapNoEndpointServices, b.addrKey(a))
	}
}

// nodePort goes to the external chain, and, when localhost NodePorts of
// the protocol are rejected, to the chain that counts and rejects them.
func (b *svcBuilder) nodePort() {
	if b.svc.NodePort == 0 {
		return
	}
	np := []string{b.proto, itoa(b.svc.NodePort)}
	b.toExternalChain(mapServiceNodePorts, np)
	b.unservedExternal(mapNoEndpointNodePorts, np)
	if b.p.rejectsLocalhost(b.svc.Protocol) {
		b.mapElement(mapLocalhostRejects, np, "goto "+localhostRejectChain(b.svc.Protocol), "")
	}
}

// hairpin lists each local endpoint sending to itself, to be masqueraded.
func (b *svcBuilder) hairpin() {
	for _, ep := range b.sel.All {
		if ep.IsLocal {
			a := ep.IP.String()
			b.setElement(setHairpinConnections, a, a, b.proto, itoa(ep.Port))
		}
	}
}

// externalChain is the external traffic's entry, doing what
// Paths.ExternalEntry says.
func (b *svcBuilder) externalChain() {
	if !b.paths.ExternalEntry {
		return
	}
	ext := chain(b.names.external)
	if b.paths.External.Local {
		ext.Rules = b.shortCircuits()
	} else {
		// Cluster endpoints may be on other nodes: masquerade.
		ext.Rules = []string{comment(b.p.masquerade(), "masquerade")}
	}
	if b.paths.External.Served {
		ext.Rules = append(ext.Rules, b.names.gotoPolicyChain(b.paths.External))
	}
	b.out.Chains = append(b.out.Chains, ext)
}

// shortCircuits send pods and the node itself, under an external Local
// policy, to every endpoint: they reach external addresses as if from
// outside and back in. The node's traffic is masqueraded, its source
// being local.
func (b *svcBuilder) shortCircuits() []string {
	var rules []string
	if b.p.LocalDetector.Implemented() {
		rules = append(rules, comment(b.p.LocalDetector.IfLocalNFT()+" goto "+b.names.cluster, "short-circuit pod traffic"))
	}
	return append(rules,
		comment("fib saddr type local "+b.p.masquerade(), "masquerade local traffic"),
		comment("fib saddr type local goto "+b.names.cluster, "short-circuit local traffic"))
}

// firewallChain drops load-balancer traffic from outside the source
// ranges (and lets the node's own traffic through when a range holds the
// node's IP). As upstream's, it is there whether or not the service has
// endpoints: firewall-check runs before the no-endpoint checks.
func (b *svcBuilder) firewallChain() {
	if !b.svc.FiltersLoadBalancerSources() {
		return
	}
	allowed := slices.Clone(b.svc.LoadBalancerSourceRanges)
	if b.svc.SourceRangesAllow(b.p.NodeIP) {
		for _, a := range b.svc.LoadBalancerIPs {
			allowed = append(allowed, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	b.out.Chains = append(b.out.Chains, chain(b.names.firewall, b.p.ipX()+" saddr != "+addressSet(allowed)+" drop"))
}

// policyChains spread each used policy's traffic over its endpoints.
func (b *svcBuilder) policyChains() {
	if b.paths.ClusterUsed {
		b.policyChain(b.names.cluster, b.sel.Cluster)
	}
	if b.paths.LocalUsed {
		b.policyChain(b.names.local, b.sel.Local)
	}
}

func (b *svcBuilder) policyChain(name string, eps []*state.Endpoint) {
	c := chain(name)
	if b.svc.AffinityTimeoutSeconds > 0 {
		c.Rules, c.Upstream = b.affinityRules(eps)
	} else {
		c.Rules, c.Upstream = b.dnatRules(eps)
	}
	b.out.Chains = append(b.out.Chains, c)
}

// dnatRules DNAT to one of the endpoints at random.
func (b *svcBuilder) dnatRules(eps []*state.Endpoint) (rules, upstream []string) {
	dnats, mapped := make([]string, len(eps)), make([]string, len(eps))
	for i, ep := range eps {
		dnats[i] = "dnat to " + ep.String()
		mapped[i] = ep.IP.String() + " . " + itoa(ep.Port)
	}
	return spread("meta l4proto "+b.proto+" ", dnats,
		"meta l4proto "+b.proto+" dnat "+b.p.ipX()+" to numgen random mod %d map { %s }", mapped)
}

// affinityRules send a client seen before to its endpoint's chain, and a
// new one to one of them at random.
func (b *svcBuilder) affinityRules(eps []*state.Endpoint) (rules, upstream []string) {
	var checks []string
	gotos := make([]string, len(eps))
	for i, ep := range eps {
		base := endpointBase(b.svc.Name, ep)
		checks = append(checks, b.p.ipX()+" saddr @"+prefixAffinity+base+" goto "+prefixEndpoint+base)
		gotos[i] = "goto " + prefixEndpoint + base
	}
	spreadRules, spreadUpstream := spread("", gotos, "numgen random mod %d vmap { %s }", gotos)
	rules = append(slices.Clip(checks), spreadRules...)
	if spreadUpstream != nil {
		upstream = append(checks, spreadUpstream...)
	}
	return rules, upstream
}

// affinityChains are, with affinity, each endpoint's set of the clients
// it has seen and its chain, which adds the client and DNATs to it.
func (b *svcBuilder) affinityChains() {
	if b.svc.AffinityTimeoutSeconds <= 0 {
		return
	}
	ip := b.p.ipX()
	for _, ep := range b.sel.All {
		base := endpointBase(b.svc.Name, ep)
		b.out.Sets = append(b.out.Sets, Set{Name: prefixAffinity + base, Type: b.p.addrType(),
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: time.Duration(b.svc.AffinityTimeoutSeconds) * time.Second})
		b.out.Chains = append(b.out.Chains, chain(prefixEndpoint+base,
			"update @"+prefixAffinity+base+" { "+ip+" saddr }",
			"meta l4proto "+b.proto+" dnat to "+ep.String()))
	}
}
