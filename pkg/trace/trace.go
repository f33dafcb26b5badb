// Package trace follows one packet through what this node's kube-proxy
// programs: the chains and rules, sets, maps or virtual servers it meets
// in the mode's own terms, and where it ends (which endpoints, with what
// chance, masqueraded or not; or dropped or rejected, and why).
//
// A trace is computed, not observed: each mode walks the very objects its
// pure "what does this service port put into the kernel" function
// decides (the ones a sync writes), with the endpoints pkg/state selects,
// so the trace cannot disagree with the rules. This package holds what
// the modes share: the packet, the answer, a walker over chains of rules
// whose matching each mode supplies, and the matching of iptables rules,
// which the iptables and IPVS modes both write.
package trace

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Origin is where a packet comes from, as the rules tell traffic apart.
type Origin string

const (
	// FromPod is a pod on this node: forwarded, and local to the
	// cluster for the detect-local rules.
	FromPod Origin = "pod"
	// FromNode is this node itself (a host-network process).
	FromNode Origin = "node"
	// FromExternal is anything else: another node or host.
	FromExternal Origin = "external"
)

// Packet is the first packet of a new connection.
type Packet struct {
	Source      netip.Addr  `json:"source"`
	Destination netip.Addr  `json:"destination"`
	Port        uint16      `json:"port"`
	Protocol    v1.Protocol `json:"protocol"`
	From        Origin      `json:"from"`
	// LocalDestination says the destination is an address of this node,
	// as the kernel's routing tells (addrtype/fib "local"): NodePorts
	// answer there.
	LocalDestination bool `json:"localDestination"`
}

// ParsePacket reads a packet from its text fields; each error names the
// field that is wrong and what it should be.
func ParsePacket(source, destination, port, protocol, from string) (Packet, error) {
	var p Packet
	var err error
	if p.Source, err = parseAddr("source", source); err != nil {
		return p, err
	}
	if p.Destination, err = parseAddr("destination", destination); err != nil {
		return p, err
	}
	if p.Source.Is4() != p.Destination.Is4() {
		return p, fmt.Errorf("source %s and destination %s are of different IP families", p.Source, p.Destination)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(port), 10, 16)
	if err != nil || n == 0 {
		return p, fmt.Errorf("port %q is not a port number (1-65535)", port)
	}
	p.Port = uint16(n)
	switch strings.ToUpper(strings.TrimSpace(protocol)) {
	case "TCP", "":
		p.Protocol = v1.ProtocolTCP
	case "UDP":
		p.Protocol = v1.ProtocolUDP
	case "SCTP":
		p.Protocol = v1.ProtocolSCTP
	default:
		return p, fmt.Errorf("protocol %q is not TCP, UDP or SCTP", protocol)
	}
	switch o := Origin(strings.ToLower(strings.TrimSpace(from))); o {
	case FromPod, FromNode, FromExternal:
		p.From = o
	case "":
		return p, fmt.Errorf("from is missing: say pod (a pod on this node), node (this node itself) or external (another node or host)")
	default:
		return p, fmt.Errorf("from %q is not pod (a pod on this node), node (this node itself) or external (another node or host)", from)
	}
	return p, nil
}

func parseAddr(field, s string) (netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return netip.Addr{}, fmt.Errorf("%s address is missing", field)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s %q is not an IP address", field, s)
	}
	return a.Unmap(), nil
}

// Family is the packet's IP family.
func (p Packet) Family() v1.IPFamily {
	if p.Destination.Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// String is "10.0.0.1 -> 10.96.0.10:80/TCP from a pod".
func (p Packet) String() string {
	from := map[Origin]string{FromPod: "a pod on this node", FromNode: "this node", FromExternal: "outside this node"}[p.From]
	return fmt.Sprintf("%s -> %s/%s from %s", p.Source, netip.AddrPortFrom(p.Destination, p.Port), p.Protocol, from)
}

// Entry is how the packet reaches the service port: its cluster IP, an
// external IP, a load-balancer IP or its NodePort.
type Entry string

const (
	EntryClusterIP    Entry = "cluster IP"
	EntryExternalIP   Entry = "external IP"
	EntryLoadBalancer Entry = "load-balancer IP"
	EntryNodePort     Entry = "node port"
)

// Match is the service port a packet is for, and how it reaches it.
type Match struct {
	Name  state.ServicePortName
	Entry Entry
}

// Find is the service port the packet is addressed to; ok is false when
// it is addressed to none this node programs. A NodePort counts only on
// a local destination.
func Find(services state.ServiceMap, p Packet) (Match, bool) {
	var found Match
	ok := false
	for name, svc := range services {
		if svc.Protocol != p.Protocol {
			continue
		}
		entry := Entry("")
		if int(svc.Port) == int(p.Port) {
			switch {
			case svc.ClusterIP == p.Destination:
				entry = EntryClusterIP
			case contains(svc.ExternalIPs, p.Destination):
				entry = EntryExternalIP
			case contains(svc.LoadBalancerIPs, p.Destination):
				entry = EntryLoadBalancer
			}
		}
		if entry == "" && svc.NodePort != 0 && int(svc.NodePort) == int(p.Port) && p.LocalDestination {
			entry = EntryNodePort
		}
		// The API keeps two services from sharing an address and port;
		// should it happen, the answer must not depend on map order.
		if entry != "" && (!ok || name.Compare(found.Name) < 0) {
			found, ok = Match{Name: name, Entry: entry}, true
		}
	}
	return found, ok
}

// IsClusterIP tells whether the address is any service's cluster IP.
func IsClusterIP(services state.ServiceMap, a netip.Addr) bool {
	for _, svc := range services {
		if svc.ClusterIP == a {
			return true
		}
	}
	return false
}

func contains(addrs []netip.Addr, a netip.Addr) bool {
	for _, x := range addrs {
		if x == a {
			return true
		}
	}
	return false
}
