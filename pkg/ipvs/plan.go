package ipvs

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Params are the node-wide inputs of the IPVS mode for one IP family.
type Params struct {
	IPv6 bool
	// Scheduler is the IPVS scheduler of every virtual server (rr, wrr,
	// sh, mh, ...).
	Scheduler     string
	MasqueradeBit int
	MasqueradeAll bool
	LocalDetector localdetect.Detector
	// NodeIP is the node's primary IP: load-balancer source ranges that
	// contain it let the node reach the load-balancer IP itself.
	NodeIP netip.Addr
	// MaxSetEntries is the maxelem the hash sets are created with, and
	// so how many entries the mode puts into one; 0 means MaxSetEntries
	// (upstream's). Tests lower it.
	MaxSetEntries int
}

// Addresses are the node's own addresses, read from the kernel: they
// change at run time.
type Addresses struct {
	// Node are the family's addresses on every link but kube-ipvs0: a
	// service address among them is not bound to kube-ipvs0.
	Node []netip.Addr
	// NodePort are the addresses NodePorts answer on.
	NodePort []netip.Addr
}

// Server is a virtual server with the real servers it should have, each
// at weight 1.
type Server struct {
	ipvskernel.VirtualServer
	Reals []netip.AddrPort
}

// SetEntry is one entry of one ipset, as ipset prints it.
type SetEntry struct {
	Set   string
	Entry string
}

// ServiceObjects is everything one service port puts into the kernel.
type ServiceObjects struct {
	Servers []Server
	// Bound are the addresses it needs on kube-ipvs0.
	Bound   []netip.Addr
	Entries []SetEntry
	// OutFilter are KUBE-IPVS-OUT-FILTER rules: the node may not reach a
	// load-balancer IP whose source ranges leave it out.
	OutFilter []iptables.Rule
}

// The ipsets of the IPVS mode, named as upstream (KUBE-6- for IPv6).
const (
	setLoopBack              = "KUBE-LOOP-BACK"
	setClusterIP             = "KUBE-CLUSTER-IP"
	setExternalIP            = "KUBE-EXTERNAL-IP"
	setExternalIPLocal       = "KUBE-EXTERNAL-IP-LOCAL"
	setLoadBalancer          = "KUBE-LOAD-BALANCER"
	setLoadBalancerLocal     = "KUBE-LOAD-BALANCER-LOCAL"
	setLoadBalancerFW        = "KUBE-LOAD-BALANCER-FW"
	setLoadBalancerSourceIP  = "KUBE-LOAD-BALANCER-SOURCE-IP"
	setLoadBalancerSourceNet = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
	setNodePortTCP           = "KUBE-NODE-PORT-TCP"
	setNodePortLocalTCP      = "KUBE-NODE-PORT-LOCAL-TCP"
	setNodePortUDP           = "KUBE-NODE-PORT-UDP"
	setNodePortLocalUDP      = "KUBE-NODE-PORT-LOCAL-UDP"
	setNodePortSCTP          = "KUBE-NODE-PORT-SCTP-HASH"
	setNodePortLocalSCTP     = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
	setHealthCheckNodePort   = "KUBE-HEALTH-CHECK-NODE-PORT"
	setIPVSAddresses         = "KUBE-IPVS-IPS"
)

var protocolNumbers = map[v1.Protocol]string{v1.ProtocolTCP: "6", v1.ProtocolUDP: "17", v1.ProtocolSCTP: "132"}

// setTypes are the sets' types, in the order upstream creates them.
var setTypes = []struct {
	name    string
	typ     ipvskernel.SetType
	comment string
}{
	{setLoopBack, ipvskernel.HashIPPortIP, "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
	{setClusterIP, ipvskernel.HashIPPort, "Kubernetes service cluster ip + port for masquerade purpose"},
	{setExternalIP, ipvskernel.HashIPPort, "Kubernetes service external ip + port for masquerade and filter purpose"},
	{setExternalIPLocal, ipvskernel.HashIPPort, "Kubernetes service external ip + port with externalTrafficPolicy=local"},
	{setLoadBalancer, ipvskernel.HashIPPort, "Kubernetes service lb portal"},
	{setLoadBalancerFW, ipvskernel.HashIPPort, "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
	{setLoadBalancerLocal, ipvskernel.HashIPPort, "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
	{setLoadBalancerSourceIP, ipvskernel.HashIPPortIP, "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
	{setLoadBalancerSourceNet, ipvskernel.HashIPPortNet, "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
	{setNodePortTCP, ipvskernel.BitmapPort, "Kubernetes nodeport TCP port for masquerade purpose"},
	{setNodePortLocalTCP, ipvskernel.BitmapPort, "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
	{setNodePortUDP, ipvskernel.BitmapPort, "Kubernetes nodeport UDP port for masquerade purpose"},
	{setNodePortLocalUDP, ipvskernel.BitmapPort, "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
	{setNodePortSCTP, ipvskernel.HashIPPort, "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
	{setNodePortLocalSCTP, ipvskernel.HashIPPort, "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
	{setHealthCheckNodePort, ipvskernel.BitmapPort, "Kubernetes health check node port"},
	{setIPVSAddresses, ipvskernel.HashIP, "Addresses on the ipvs interface"},
}

// maxSetName is the longest name the kernel gives a set.
const maxSetName = 31

// setName is a set's name in the family: "KUBE-6-" for IPv6, cut to what
// the kernel keeps, as upstream's are ("KUBE-6-LOAD-BALANCER-SOURCE-CID").
func (p *Params) setName(base string) string {
	if p.IPv6 {
		base = strings.Replace(base, "KUBE-", "KUBE-6-", 1)
	}
	return base[:min(len(base), maxSetName)]
}

// Sets are the ipsets the mode creates.
func (p *Params) Sets() []ipvskernel.SetSpec {
	out := make([]ipvskernel.SetSpec, len(setTypes))
	for i, s := range setTypes {
		out[i] = ipvskernel.SetSpec{Name: p.setName(s.name), Type: s.typ, IPv6: p.IPv6}
		if s.typ != ipvskernel.BitmapPort {
			out[i].MaxElem = p.MaxSetEntries
		}
	}
	return out
}

// ServiceObjects decides what one service port puts into the kernel, from
// its definition, all its endpoints (the local ones need hairpin SNAT
// whether used or not, as upstream), the endpoints this node uses, and the
// node's addresses: path by path, each adding its entries, virtual
// servers and addresses.
func (p *Params) ServiceObjects(svc *state.ServicePort, endpoints []*state.Endpoint, sel state.Selection, addrs Addresses) ServiceObjects {
	b := &objectsBuilder{p: p, svc: svc, addrs: addrs, proto: strings.ToLower(string(svc.Protocol))}
	b.hairpin(endpoints)
	paths := state.PathsOf(svc, sel)
	internal, external := pathReals(paths.Internal, sel), pathReals(paths.External, sel)
	b.clusterIP(internal)
	for _, ip := range svc.ExternalIPs {
		b.externalIP(ip, external)
	}
	for _, ip := range svc.LoadBalancerIPs {
		b.loadBalancer(ip, external)
	}
	if svc.NodePort != 0 && len(addrs.NodePort) > 0 {
		b.nodePorts(external)
	}
	if svc.HealthCheckNodePort != 0 {
		b.add(setHealthCheckNodePort, strconv.Itoa(int(svc.HealthCheckNodePort)))
	}
	return b.out
}

// objectsBuilder collects one service port's objects in out.
type objectsBuilder struct {
	p     *Params
	svc   *state.ServicePort
	addrs Addresses
	// proto is the protocol as set entries spell it.
	proto string
	out   ServiceObjects
}

// pathReals are the real servers of a traffic path. A Local path with no
// local endpoint falls back, as upstream's does, to the cluster endpoints
// (empty for iTP=Local) so that pods on the node still reach the service.
func pathReals(path state.Path, sel state.Selection) []netip.AddrPort {
	eps := path.Endpoints
	if len(eps) == 0 {
		eps = sel.Cluster
	}
	out := make([]netip.AddrPort, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ep.AddrPort())
	}
	return out
}

// ipPort is a hash:ip,port entry of the service's protocol.
func (b *objectsBuilder) ipPort(ip netip.Addr, port int32) string {
	return ip.String() + "," + b.proto + ":" + strconv.Itoa(int(port))
}

func (b *objectsBuilder) add(set, entry string) {
	b.out.Entries = append(b.out.Entries, SetEntry{Set: b.p.setName(set), Entry: entry})
}

// hairpin lets a local endpoint reach itself through the service.
func (b *objectsBuilder) hairpin(endpoints []*state.Endpoint) {
	for _, ep := range endpoints {
		if ep.IsLocal {
			b.add(setLoopBack, b.ipPort(ep.IP, ep.Port)+","+ep.IP.String())
		}
	}
}

// server adds a virtual server on ip:port to the real servers to.
func (b *objectsBuilder) server(ip netip.Addr, port int32, to []netip.AddrPort) {
	b.out.Servers = append(b.out.Servers, Server{VirtualServer: b.p.virtualServer(b.svc, ip, port), Reals: to})
}

// virtualServer is a virtual server of svc on ip:port, with its session
// affinity and scheduler.
func (p *Params) virtualServer(svc *state.ServicePort, ip netip.Addr, port int32) ipvskernel.VirtualServer {
	vs := ipvskernel.VirtualServer{
		VirtualServerKey: ipvskernel.VirtualServerKey{Addr: ip, Port: uint16(port), Protocol: svc.Protocol},
		Scheduler:        p.Scheduler,
	}
	if svc.AffinityTimeoutSeconds > 0 {
		vs.Flags |= ipvskernel.FlagPersistent
		vs.Timeout = uint32(svc.AffinityTimeoutSeconds)
	}
	if p.Scheduler == "mh" {
		vs.Flags |= ipvskernel.FlagSourceHash
	}
	return vs
}

// bind binds ip to kube-ipvs0 unless the node has it on another link.
func (b *objectsBuilder) bind(ip netip.Addr) {
	if !slices.Contains(b.addrs.Node, ip) {
		b.out.Bound = append(b.out.Bound, ip)
	}
}

// clusterIP is the path inside the cluster; its address is always bound.
func (b *objectsBuilder) clusterIP(internal []netip.AddrPort) {
	svc := b.svc
	b.add(setClusterIP, b.ipPort(svc.ClusterIP, svc.Port))
	b.server(svc.ClusterIP, svc.Port, internal)
	b.out.Bound = append(b.out.Bound, svc.ClusterIP)
}

func (b *objectsBuilder) externalIP(ip netip.Addr, external []netip.AddrPort) {
	if b.svc.ExternalPolicyLocal {
		b.add(setExternalIPLocal, b.ipPort(ip, b.svc.Port))
	} else {
		b.add(setExternalIP, b.ipPort(ip, b.svc.Port))
	}
	b.server(ip, b.svc.Port, external)
	b.bind(ip)
}

func (b *objectsBuilder) loadBalancer(ip netip.Addr, external []netip.AddrPort) {
	entry := b.ipPort(ip, b.svc.Port)
	b.add(setLoadBalancer, entry)
	if b.svc.ExternalPolicyLocal {
		b.add(setLoadBalancerLocal, entry)
	}
	if len(b.svc.LoadBalancerSourceRanges) > 0 {
		b.sourceRanges(ip, entry)
	}
	b.server(ip, b.svc.Port, external)
	b.bind(ip)
}

// sourceRanges let only the load balancer's source ranges through to ip
// (entry); the node itself, if they leave it out, is dropped on output.
func (b *objectsBuilder) sourceRanges(ip netip.Addr, entry string) {
	b.add(setLoadBalancerFW, entry)
	for _, cidr := range b.svc.LoadBalancerSourceRanges {
		b.add(setLoadBalancerSourceNet, entry+","+cidr.String())
	}
	if b.svc.SourceRangesAllow(b.p.NodeIP) {
		b.add(setLoadBalancerSourceIP, entry+","+ip.String())
		return
	}
	// Written as iptables-save prints it (the protocol by number,
	// --vproto first), so that it compares equal.
	b.out.OutFilter = append(b.out.OutFilter, iptables.Rule("-s "+netip.PrefixFrom(ip, ip.BitLen()).String()+
		" -m ipvs --vproto "+protocolNumbers[b.svc.Protocol]+" --vaddr "+ip.String()+" --vport "+strconv.Itoa(int(b.svc.Port))+" -j DROP"))
}

// nodePorts are the NodePort's entries and a virtual server on each
// NodePort address.
func (b *objectsBuilder) nodePorts(external []netip.AddrPort) {
	set, local, entries := b.nodePortEntries()
	for _, e := range entries {
		b.add(set, e)
		if b.svc.ExternalPolicyLocal {
			b.add(local, e)
		}
	}
	for _, ip := range b.addrs.NodePort {
		b.server(ip, b.svc.NodePort, external)
	}
}

// nodePortEntries are the NodePort's sets (all, and Local) by protocol,
// and its entries in them.
func (b *objectsBuilder) nodePortEntries() (set, local string, entries []string) {
	switch b.svc.Protocol {
	case v1.ProtocolUDP:
		return setNodePortUDP, setNodePortLocalUDP, []string{strconv.Itoa(int(b.svc.NodePort))}
	case v1.ProtocolSCTP:
		// The SCTP sets are hash:ip,port: one entry per address.
		for _, ip := range b.addrs.NodePort {
			entries = append(entries, b.ipPort(ip, b.svc.NodePort))
		}
		return setNodePortSCTP, setNodePortLocalSCTP, entries
	}
	return setNodePortTCP, setNodePortLocalTCP, []string{strconv.Itoa(int(b.svc.NodePort))}
}
