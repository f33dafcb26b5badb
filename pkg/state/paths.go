package state

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
	// anywhere (Selection.HasAny).
	Served bool
}

// PathsOf decides the paths of svc's traffic from the endpoints sel holds.
func PathsOf(svc *ServicePort, sel Selection) Paths {
	return Paths{
		Internal:    sel.path(svc.InternalPolicyLocal),
		External:    sel.path(svc.ExternalPolicyLocal),
		ClusterUsed: len(sel.Cluster) > 0 && svc.UsesClusterEndpoints(),
		LocalUsed:   len(sel.Local) > 0 && svc.UsesLocalEndpoints(),
	}
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
