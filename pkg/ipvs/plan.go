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
// node's addresses.
func (p *Params) ServiceObjects(svc *state.ServicePort, endpoints []*state.Endpoint, sel state.Selection, addrs Addresses) ServiceObjects {
	var out ServiceObjects
	proto := strings.ToLower(string(svc.Protocol))
	ipPort := func(ip netip.Addr, port int32) string {
		return ip.String() + "," + proto + ":" + strconv.Itoa(int(port))
	}
	add := func(set, entry string) {
		out.Entries = append(out.Entries, SetEntry{Set: p.setName(set), Entry: entry})
	}
	for _, ep := range endpoints {
		if ep.IsLocal {
			add(setLoopBack, ipPort(ep.IP, ep.Port)+","+ep.IP.String())
		}
	}

	// A Local path with no local endpoint falls back, as upstream's does,
	// to the cluster endpoints (empty for iTP=Local) so that pods on the
	// node still reach the service.
	reals := func(path state.Path) []netip.AddrPort {
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
	paths := state.PathsOf(svc, sel)
	internal, external := reals(paths.Internal), reals(paths.External)
	server := func(ip netip.Addr, port int32, to []netip.AddrPort) {
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
		out.Servers = append(out.Servers, Server{VirtualServer: vs, Reals: to})
	}
	bind := func(ip netip.Addr) {
		if !slices.Contains(addrs.Node, ip) {
			out.Bound = append(out.Bound, ip)
		}
	}

	add(setClusterIP, ipPort(svc.ClusterIP, svc.Port))
	server(svc.ClusterIP, svc.Port, internal)
	out.Bound = append(out.Bound, svc.ClusterIP)

	for _, ip := range svc.ExternalIPs {
		if svc.ExternalPolicyLocal {
			add(setExternalIPLocal, ipPort(ip, svc.Port))
		} else {
			add(setExternalIP, ipPort(ip, svc.Port))
		}
		server(ip, svc.Port, external)
		bind(ip)
	}

	for _, ip := range svc.LoadBalancerIPs {
		entry := ipPort(ip, svc.Port)
		add(setLoadBalancer, entry)
		if svc.ExternalPolicyLocal {
			add(setLoadBalancerLocal, entry)
		}
		if len(svc.LoadBalancerSourceRanges) > 0 {
			add(setLoadBalancerFW, entry)
			nodeAllowed := false
			for _, cidr := range svc.LoadBalancerSourceRanges {
				add(setLoadBalancerSourceNet, entry+","+cidr.String())
				nodeAllowed = nodeAllowed || cidr.Contains(p.NodeIP)
			}
			if nodeAllowed {
				add(setLoadBalancerSourceIP, entry+","+ip.String())
			} else {
				// Written as iptables-save prints it (the protocol by
				// number, --vproto first), so that it compares equal.
				out.OutFilter = append(out.OutFilter, iptables.Rule("-s "+netip.PrefixFrom(ip, ip.BitLen()).String()+
					" -m ipvs --vproto "+protocolNumbers[svc.Protocol]+" --vaddr "+ip.String()+" --vport "+strconv.Itoa(int(svc.Port))+" -j DROP"))
			}
		}
		server(ip, svc.Port, external)
		bind(ip)
	}

	if svc.NodePort != 0 && len(addrs.NodePort) > 0 {
		set, local := setNodePortTCP, setNodePortLocalTCP
		entries := []string{strconv.Itoa(int(svc.NodePort))}
		switch svc.Protocol {
		case v1.ProtocolUDP:
			set, local = setNodePortUDP, setNodePortLocalUDP
		case v1.ProtocolSCTP:
			// The SCTP sets are hash:ip,port: one entry per address.
			set, local = setNodePortSCTP, setNodePortLocalSCTP
			entries = entries[:0]
			for _, ip := range addrs.NodePort {
				entries = append(entries, ipPort(ip, svc.NodePort))
			}
		}
		for _, e := range entries {
			add(set, e)
			if svc.ExternalPolicyLocal {
				add(local, e)
			}
		}
		for _, ip := range addrs.NodePort {
			server(ip, svc.NodePort, external)
		}
	}
	if svc.HealthCheckNodePort != 0 {
		add(setHealthCheckNodePort, strconv.Itoa(int(svc.HealthCheckNodePort)))
	}
	return out
}
