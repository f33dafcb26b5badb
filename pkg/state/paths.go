package state

import (
	"net/netip"
	"slices"
)

// Paths is where each kind of a service port's traffic goes on this node,
// as its traffic policies and the endpoints selected decide: decided here
// once, so that every proxy mode programs the same decision.
type Paths struct {
	// Internal is traffic to the cluster IP; External is traffic to the
	// node ports, external IPs and load-balancer IPs.
	Internal, External Path
	// ClusterUsed and LocalUsed tell whether the cluster-wide and the
	// node-local endpoints serve some traffic and there are any: each
	// then needs rules of its own.
	ClusterUsed, LocalUsed bool
	// ExternalEntry tells whether external traffic has an entry of its
	// own (the modes' external chain). Under a Cluster External path the
	// entry masquerades all of it: the endpoint may be on another node,
	// and the reply must come back through this one. Under a Local one it
	// keeps the client's address, and sends pod traffic (where the mode
	// can tell it apart) and the node's own, masqueraded, to the cluster
	// endpoints instead (see UsesClusterEndpoints). Then, when served,
	// the traffic goes on to the External path.
	ExternalEntry bool
}

// Path is where one kind of traffic goes.
type Path struct {
	// Local is set under a Local traffic policy: the traffic goes to this
	// node's endpoints only.
	Local bool
	// Endpoints are those it goes to: the selection's Local or Cluster.
	Endpoints []*Endpoint
	// Served tells whether it has an endpoint to reach. Traffic that has
	// none is dropped, or rejected when the service has no endpoint
	// anywhere (Selection.RejectsUnserved).
	Served bool
}

// PathsOf decides the paths of svc's traffic from the endpoints sel holds.
func PathsOf(svc *ServicePort, sel Selection) Paths {
	return Paths{
		Internal:    sel.path(svc.InternalPolicyLocal),
		External:    sel.path(svc.ExternalPolicyLocal),
		ClusterUsed: len(sel.Cluster) > 0 && svc.UsesClusterEndpoints(),
		LocalUsed:   len(sel.Local) > 0 && svc.UsesLocalEndpoints(),
		// Its short-circuits for pod and node traffic need endpoints
		// anywhere, not local ones.
		ExternalEntry: sel.HasAny && svc.HasExternal(),
	}
}

// RejectsUnserved tells whether traffic with no endpoint to reach is
// rejected, so that clients fail fast: only when the service has no
// endpoint anywhere. Otherwise it is dropped, as a Local policy leaves
// it with none on this node while others serve.
func (s Selection) RejectsUnserved() bool { return !s.HasAny }

// FiltersLoadBalancerSources tells whether load-balancer traffic is
// checked against the source ranges.
func (s *ServicePort) FiltersLoadBalancerSources() bool {
	return len(s.LoadBalancerIPs) > 0 && len(s.LoadBalancerSourceRanges) > 0
}

// SourceRangesAllow tells whether a source range holds ip. When one holds
// the node's IP, the node also reaches its own load-balancer IPs: that
// traffic, the IP being bound locally, comes from the load-balancer IP.
func (s *ServicePort) SourceRangesAllow(ip netip.Addr) bool {
	return ip.IsValid() && slices.ContainsFunc(s.LoadBalancerSourceRanges, func(r netip.Prefix) bool { return r.Contains(ip) })
}

// path is the path of traffic under a Local policy (local) or a Cluster
// one. A local endpoint always counts for HasAny, so a Local path with
// endpoints is served.
func (s Selection) path(local bool) Path {
	if local {
		return Path{Local: true, Endpoints: s.Local, Served: len(s.Local) > 0}
	}
	return Path{Endpoints: s.Cluster, Served: s.HasAny}
}
