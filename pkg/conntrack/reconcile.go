package conntrack

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Reconcile deletes every UDP flow to a service that no longer leads where
// the service sends traffic now. ClearStale handles the flows one sync's
// changes make stale; this catches what it could not see: a change that
// happened while kube-proxy was down, or a deletion that failed.
func (Cleaner) Reconcile(family v1.IPFamily, services state.ServiceMap, endpoints state.EndpointsMap) error {
	filter := newStaleFlowFilter(services, endpoints)
	if filter.empty() {
		return nil
	}
	return deleteFlows(family, filter)
}

// serviceTarget is where flows to one UDP service port may go.
type serviceTarget struct {
	endpoints map[netip.AddrPort]bool
}

// staleFlowFilter matches UDP flows to a service address (cluster IP,
// external or load-balancer IP, or node port) that were sent to an
// address that is no longer one of its endpoints, or that reached no
// endpoint at all while the service has some now.
type staleFlowFilter struct {
	byDestination map[netip.AddrPort]*serviceTarget
	byNodePort    map[uint16]*serviceTarget
}

func newStaleFlowFilter(services state.ServiceMap, endpoints state.EndpointsMap) staleFlowFilter {
	f := staleFlowFilter{byDestination: map[netip.AddrPort]*serviceTarget{}, byNodePort: map[uint16]*serviceTarget{}}
	for name, svc := range services {
		if svc.Protocol != v1.ProtocolUDP {
			continue
		}
		target := &serviceTarget{endpoints: map[netip.AddrPort]bool{}}
		for _, ep := range endpoints[name] {
			// Terminating endpoints still serving keep their flows.
			if ep.Ready || ep.Serving {
				target.endpoints[ep.AddrPort()] = true
			}
		}
		port := uint16(svc.Port)
		for _, ip := range append(append([]netip.Addr{svc.ClusterIP}, svc.ExternalIPs...), svc.LoadBalancerIPs...) {
			f.byDestination[netip.AddrPortFrom(ip, port)] = target
		}
		if svc.NodePort != 0 {
			f.byNodePort[uint16(svc.NodePort)] = target
		}
	}
	return f
}

func (f staleFlowFilter) empty() bool { return len(f.byDestination) == 0 && len(f.byNodePort) == 0 }

func (f staleFlowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst := addrPort(flow.Forward.DstIP, flow.Forward.DstPort)
	answeredBy := addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort)
	translated := answeredBy != dst
	if target, ok := f.byDestination[dst]; ok {
		if !translated {
			return len(target.endpoints) > 0
		}
		return !target.endpoints[answeredBy]
	}
	// A node port flow on any address; untranslated ones belong to
	// whatever else listens on that port.
	if target, ok := f.byNodePort[flow.Forward.DstPort]; ok && translated {
		return !target.endpoints[answeredBy]
	}
	return false
}
