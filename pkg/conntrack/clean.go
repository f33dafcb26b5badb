package conntrack

import (
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Cleaner deletes UDP conntrack flows over netlink. Without it, a UDP
// client (a DNS resolver, say) keeps its flow to an endpoint that is gone,
// or to a service that had no endpoints, and never recovers.
type Cleaner struct{}

// ClearStale deletes the flows made stale by one sync's changes: flows
// answered by a UDP endpoint that stopped serving, and the untranslated
// flows to a UDP service that has just gained its first endpoint (packets
// sent while it had none made entries without a DNAT, which would keep
// the flow away from the new endpoints). A translated flow to such a
// service stays: it can only exist because earlier rules, of another
// process or mode, sent it to an endpoint, and Reconcile deletes it if
// that endpoint is no longer one. That keeps a UDP flow on its endpoint
// across a restart or a switch of modes, where every service is newly
// active.
func (Cleaner) ClearStale(family v1.IPFamily, services state.ServiceMap, ch state.Changes) error {
	var filters []netlink.CustomConntrackFilter
	for _, stale := range ch.StaleEndpoints {
		filters = append(filters, flowFilter{replySource: stale.Endpoint})
	}
	for _, name := range ch.NewlyActiveUDP {
		if svc := services[name]; svc != nil {
			filters = append(filters, serviceFilter(svc))
		}
	}
	if len(filters) == 0 {
		return nil
	}
	return deleteFlows(family, filters...)
}

// DeleteUDPFlowsTo deletes the family's UDP flows sent to any of
// destinations, however they were translated. A node that stops
// forwarding such flows where their entries say (IPVS virtual servers
// removed while flows were open) needs this: the next packet of each flow
// then makes a new entry, which the rules in place take.
func DeleteUDPFlowsTo(family v1.IPFamily, destinations []netip.AddrPort) error {
	if len(destinations) == 0 {
		return nil
	}
	return deleteFlows(family, flowFilter{destinations: destinations})
}

// deleteFlows deletes the flows of one family that any filter matches, in
// one pass over the conntrack table.
func deleteFlows(family v1.IPFamily, filters ...netlink.CustomConntrackFilter) error {
	start := time.Now()
	nlFamily := netlink.InetFamily(unix.AF_INET)
	if family == v1.IPv6Protocol {
		nlFamily = unix.AF_INET6
	}
	deleted, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, nlFamily, filters...)
	metrics.ConntrackReconcilerSyncDuration.WithLabelValues(string(family)).Observe(time.Since(start).Seconds())
	metrics.ConntrackReconcilerDeleted.WithLabelValues(string(family)).Add(float64(deleted))
	return err
}

// serviceFilter matches untranslated UDP flows to any address of a
// service port.
func serviceFilter(svc *state.ServicePort) flowFilter {
	f := flowFilter{nodePort: uint16(svc.NodePort), untranslatedOnly: true}
	port := uint16(svc.Port)
	f.destinations = append(f.destinations, netip.AddrPortFrom(svc.ClusterIP, port))
	for _, ip := range append(append([]netip.Addr(nil), svc.ExternalIPs...), svc.LoadBalancerIPs...) {
		f.destinations = append(f.destinations, netip.AddrPortFrom(ip, port))
	}
	return f
}

// flowFilter matches UDP flows answered by replySource, or sent to one of
// destinations or to nodePort on any address (only those answered by the
// address they were sent to if untranslatedOnly).
type flowFilter struct {
	replySource      netip.AddrPort
	destinations     []netip.AddrPort
	nodePort         uint16
	untranslatedOnly bool
}

func (f flowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	if f.replySource.IsValid() && addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort) == f.replySource &&
		!flow.Forward.DstIP.Equal(flow.Reverse.SrcIP) {
		return true
	}
	dst := addrPort(flow.Forward.DstIP, flow.Forward.DstPort)
	if f.untranslatedOnly && addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort) != dst {
		return false
	}
	for _, d := range f.destinations {
		if d == dst {
			return true
		}
	}
	return f.nodePort != 0 && flow.Forward.DstPort == f.nodePort
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
