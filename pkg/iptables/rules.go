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
// rule for rule, so both programs leave the same rule set behind.
func (p *Params) ServiceRules(svc *state.ServicePort, sel state.Selection) ServiceRules {
	var out ServiceRules
	names := chainsFor(svc.Name)
	name := svc.Name.String()
	proto := protocolOf(svc.Protocol)
	port := strconv.Itoa(int(svc.Port))
	match := func(dst string, dport string) []string {
		return []string{"-m", proto, "-p", proto, "-d", dst, "--dport", dport}
	}
	shared := func(t iptableskernel.Table, c iptableskernel.Chain, parts ...[]string) {
		out.Shared = append(out.Shared, SharedRule{Table: t, Chain: c, Rule: rule(parts...)})
	}
	own := func(c iptableskernel.Chain, rules ...iptableskernel.Rule) {
		out.Chains = append(out.Chains, iptableskernel.OwnChain{Name: c, Rules: rules})
	}

	hasEndpoints := sel.HasAny
	paths := state.PathsOf(svc, sel)
	internalChain, hasInternal := names.policyChain(paths.Internal), paths.Internal.Served
	externalPolicyChain, hasExternal := names.policyChain(paths.External), paths.External.Served
	usesExternalChain := hasEndpoints && svc.HasExternal()
	usesFirewall := hasEndpoints && len(svc.LoadBalancerIPs) > 0 && len(svc.LoadBalancerSourceRanges) > 0
	lbChain := names.external
	if usesFirewall {
		lbChain = names.firewall
	}

	// Traffic that cannot be served: REJECT when the service has no
	// endpoint at all, DROP when it has some but none usable here.
	internalFilter, externalFilter := "", ""
	noEndpoints := comment(name + " has no endpoints")
	noLocal := comment(name + " has no local endpoints")
	internalComment, externalComment := noEndpoints, noEndpoints
	if !hasEndpoints {
		internalFilter, externalFilter = "REJECT", "REJECT"
	} else {
		if !hasInternal {
			internalFilter, internalComment = "DROP", noLocal
		}
		if !hasExternal {
			externalFilter, externalComment = "DROP", noLocal
		}
	}

	clusterIP := svc.ClusterIP.String()
	if hasInternal {
		shared(iptableskernel.TableNAT, chainServices, comment(name+" cluster IP"), match(clusterIP, port), jump(internalChain))
	} else {
		shared(iptableskernel.TableFilter, chainServices, internalComment, match(clusterIP, port), target(internalFilter))
	}
	for _, ip := range svc.ExternalIPs {
		if hasEndpoints {
			shared(iptableskernel.TableNAT, chainServices, comment(name+" external IP"), match(ip.String(), port), jump(names.external))
		}
		if !hasExternal {
			shared(iptableskernel.TableFilter, chainExternalServices, externalComment, match(ip.String(), port), target(externalFilter))
		}
	}
	for _, ip := range svc.LoadBalancerIPs {
		if hasEndpoints {
			shared(iptableskernel.TableNAT, chainServices, comment(name+" loadbalancer IP"), match(ip.String(), port), jump(lbChain))
		}
		if usesFirewall {
			shared(iptableskernel.TableFilter, chainProxyFirewall, comment(name+" traffic not accepted by "+string(names.firewall)), match(ip.String(), port), target("DROP"))
		}
	}
	if !hasExternal {
		for _, ip := range svc.LoadBalancerIPs {
			shared(iptableskernel.TableFilter, chainExternalServices, externalComment, match(ip.String(), port), target(externalFilter))
		}
	}
	if svc.NodePort != 0 {
		nodePort := strconv.Itoa(int(svc.NodePort))
		if hasEndpoints {
			if p.localhostNodePorts() && p.NFAcct {
				// The same jump for localhost only, counting the packets:
				// it must come first, or the general rule takes them all.
				shared(iptableskernel.TableNAT, chainNodePorts, comment(name), []string{"-m", proto, "-p", proto, "-d", "127.0.0.0/8", "--dport", nodePort},
					nfacctMatch(metrics.NFAcctLocalhostNodePortsAccepted), jump(names.external))
			}
			shared(iptableskernel.TableNAT, chainNodePorts, comment(name), []string{"-m", proto, "-p", proto, "--dport", nodePort}, jump(names.external))
		}
		if !hasExternal {
			shared(iptableskernel.TableFilter, chainExternalServices, externalComment,
				[]string{"-m", "addrtype", "--dst-type", "LOCAL", "-m", proto, "-p", proto, "--dport", nodePort}, target(externalFilter))
		}
	}
	if svc.HealthCheckNodePort != 0 {
		shared(iptableskernel.TableFilter, chainNodePorts, comment(name+" health check node port"),
			[]string{"-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(svc.HealthCheckNodePort))}, target("ACCEPT"))
	}

	// The service's own chains. The internal chain's masquerade rule lives
	// in the cluster or local policy chain, ahead of its endpoint jumps.
	var masqueradeInternal []iptableskernel.Rule
	if hasInternal && (p.MasqueradeAll || p.LocalDetector.Implemented()) {
		var notLocal []string
		if !p.MasqueradeAll {
			notLocal = p.LocalDetector.IfNotLocal()
		}
		masqueradeInternal = []iptableskernel.Rule{rule(comment(name+" cluster IP"), match(clusterIP, port), notLocal, jump(chainMarkMasq))}
	}
	if usesExternalChain {
		var rules []iptableskernel.Rule
		if !svc.ExternalPolicyLocal {
			rules = append(rules, rule(comment("masquerade traffic for "+name+" external destinations"), jump(chainMarkMasq)))
		} else {
			if p.LocalDetector.Implemented() {
				rules = append(rules, rule(comment("pod traffic for "+name+" external destinations"), p.LocalDetector.IfLocal(), jump(names.cluster)))
			}
			rules = append(rules,
				rule(comment("masquerade LOCAL traffic for "+name+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL"}, jump(chainMarkMasq)),
				rule(comment("route LOCAL traffic for "+name+" external destinations"), []string{"-m", "addrtype", "--src-type", "LOCAL"}, jump(names.cluster)))
		}
		if hasExternal {
			rules = append(rules, rule(jump(externalPolicyChain)))
		}
		own(names.external, rules...)
	}
	if usesFirewall {
		lbComment := comment(name + " loadbalancer IP")
		var rules []iptableskernel.Rule
		allowFromNode := false
		for _, cidr := range svc.LoadBalancerSourceRanges {
			rules = append(rules, rule(lbComment, []string{"-s", cidr.String()}, jump(names.external)))
			allowFromNode = allowFromNode || (p.NodeIP.IsValid() && cidr.Contains(p.NodeIP))
		}
		if allowFromNode {
			for _, ip := range svc.LoadBalancerIPs {
				rules = append(rules, rule(lbComment, []string{"-s", ip.String()}, jump(names.external)))
			}
		}
		// Traffic not accepted above falls through; KUBE-PROXY-FIREWALL drops it.
		rules = append(rules, rule(comment("other traffic to "+name+" will be dropped by KUBE-PROXY-FIREWALL")))
		own(names.firewall, rules...)
	}
	if paths.ClusterUsed {
		rules := masqueradeIfInternal(internalChain, names.cluster, masqueradeInternal)
		own(names.cluster, append(rules, p.spreadRules(svc, names, sel.Cluster)...)...)
	}
	if paths.LocalUsed {
		rules := masqueradeIfInternal(internalChain, names.local, masqueradeInternal)
		own(names.local, append(rules, p.spreadRules(svc, names, sel.Local)...)...)
	}
	for _, ep := range sel.All {
		chain := names.endpointChain(ep)
		svcComment := p.endpointComment(name)
		dnat := []string{"-m", proto, "-p", proto, "-j", "DNAT", "--to-destination", ep.String()}
		var affinity []string
		if svc.AffinityTimeoutSeconds > 0 {
			affinity = []string{"-m", "recent", "--name", string(chain), "--set"}
		}
		own(chain,
			rule(svcComment, []string{"-s", ep.IP.String()}, jump(chainMarkMasq)),
			rule(svcComment, affinity, dnat))
	}
	return out
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
	mark := p.masqueradeMark()
	// Always with --random-fully, as upstream (iptables has had it since
	// 1.6.2).
	masquerade := []string{"-j", "MASQUERADE", "--random-fully"}
	nat := []iptableskernel.OwnChain{
		{Name: chainPostrouting, Rules: []iptableskernel.Rule{
			rule([]string{"-m", "mark", "!", "--mark", mark + "/" + mark, "-j", "RETURN"}),
			rule([]string{"-j", "MARK", "--xor-mark", mark}),
			rule(comment("kubernetes service traffic requiring SNAT"), masquerade),
		}},
		{Name: chainMarkMasq, Rules: []iptableskernel.Rule{rule([]string{"-j", "MARK", "--or-mark", mark})}},
	}
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

	nodePortsComment := comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")
	var servicesTail []iptableskernel.Rule
	if p.NodePortAddresses == nil {
		dst := []string{"-m", "addrtype", "--dst-type", "LOCAL"}
		if p.IPv6 {
			dst = append(dst, "!", "-d", "::1/128")
		} else if !p.LocalhostNodePorts {
			dst = append(dst, "!", "-d", "127.0.0.0/8")
		}
		servicesTail = append(servicesTail, rule(nodePortsComment, dst, jump(chainNodePorts)))
	} else {
		for _, ip := range p.NodePortAddresses {
			if ip.IsLoopback() && !p.localhostNodePorts() {
				continue
			}
			servicesTail = append(servicesTail, rule(nodePortsComment, []string{"-d", ip.String()}, jump(chainNodePorts)))
		}
	}
	shared := map[iptableskernel.Table][]iptableskernel.OwnChain{}
	for table, chains := range SharedChains {
		for _, c := range chains {
			oc := iptableskernel.OwnChain{Name: c}
			if table == iptableskernel.TableNAT && c == chainServices {
				oc.Rules = servicesTail
			}
			shared[table] = append(shared[table], oc)
		}
	}

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
	return StaticRules{Chains: map[iptableskernel.Table][]iptableskernel.OwnChain{iptableskernel.TableNAT: nat, iptableskernel.TableFilter: filter}, Shared: shared, Jumps: jumps}
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
