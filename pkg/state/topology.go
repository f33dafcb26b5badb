package state

import (
	"slices"

	v1 "k8s.io/api/core/v1"
)

// Node is what endpoint selection needs to know about this node.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label.
	Zone string
}

// Selection is which endpoints of a service port this node sends traffic to.
type Selection struct {
	// Cluster serves Cluster-policy traffic; nil when no policy is Cluster.
	Cluster []*Endpoint
	// Local serves Local-policy traffic; nil when no policy is Local.
	Local []*Endpoint
	// All is every endpoint in Cluster or Local: each needs its own rules.
	All []*Endpoint
	// HasAny tells whether the service has any usable endpoint anywhere, so
	// that traffic with no local endpoint is dropped rather than rejected
	// (RejectsUnserved).
	HasAny bool
}

// Select picks the endpoints of svc this node uses: ready ones, or else
// serving-and-terminating ones; only this node's for a Local policy; and,
// for Cluster traffic, those the topology hints give this node's zone or
// name when every ready endpoint carries such hints.
func Select(svc *ServicePort, endpoints []*Endpoint, node Node) Selection {
	var sel Selection
	if len(endpoints) == 0 {
		return sel
	}
	mode := topologyMode(endpoints, node)
	if svc.UsesClusterEndpoints() {
		sel.Cluster = filter(endpoints, func(ep *Endpoint) bool { return clusterReady(ep, mode, node) })
		if len(sel.Cluster) == 0 {
			sel.Cluster = filter(endpoints, servingTerminating)
		}
		sel.HasAny = len(sel.Cluster) > 0
	}
	if !svc.UsesLocalEndpoints() {
		sel.All = sel.Cluster
		return sel
	}
	for _, ep := range endpoints {
		if ep.Ready || servingTerminating(ep) {
			sel.HasAny = true
		}
	}
	sel.Local = filter(endpoints, localReady)
	if len(sel.Local) == 0 {
		sel.Local = filter(endpoints, localServingTerminating)
	}
	if !svc.UsesClusterEndpoints() {
		sel.All = sel.Local
		return sel
	}
	sel.All = union(sel.Cluster, sel.Local)
	return sel
}

// The predicates Select picks with; Explain words their answers.

func servingTerminating(ep *Endpoint) bool { return ep.Serving && ep.Terminating }

func clusterReady(ep *Endpoint, mode string, node Node) bool {
	return ep.Ready && availableForTopology(ep, mode, node)
}

func localReady(ep *Endpoint) bool { return ep.IsLocal && ep.Ready }

func localServingTerminating(ep *Endpoint) bool { return ep.IsLocal && servingTerminating(ep) }

// topologyMode says which hints apply: PreferSameNode when every ready
// endpoint has node hints and one names this node, else PreferSameZone
// likewise for zones, else "" (no topology filtering).
func topologyMode(endpoints []*Endpoint, node Node) string {
	anyReady := false
	allNodeHints, forThisNode := true, false
	allZoneHints, forThisZone := true, false
	for _, ep := range endpoints {
		if !ep.Ready {
			continue
		}
		anyReady = true
		if len(ep.NodeHints()) == 0 {
			allNodeHints = false
		} else if slices.Contains(ep.NodeHints(), node.Name) {
			forThisNode = true
		}
		if len(ep.ZoneHints()) == 0 {
			allZoneHints = false
		} else if node.Zone != "" && slices.Contains(ep.ZoneHints(), node.Zone) {
			forThisZone = true
		}
	}
	switch {
	case !anyReady:
		return ""
	case allNodeHints && forThisNode:
		return v1.ServiceTrafficDistributionPreferSameNode
	case allZoneHints && forThisZone:
		return v1.ServiceTrafficDistributionPreferSameZone
	}
	return ""
}

func availableForTopology(ep *Endpoint, mode string, node Node) bool {
	switch mode {
	case v1.ServiceTrafficDistributionPreferSameNode:
		return slices.Contains(ep.NodeHints(), node.Name)
	case v1.ServiceTrafficDistributionPreferSameZone:
		return slices.Contains(ep.ZoneHints(), node.Zone)
	}
	return true
}

func filter(endpoints []*Endpoint, keep func(*Endpoint) bool) []*Endpoint {
	out := make([]*Endpoint, 0, len(endpoints))
	for _, ep := range endpoints {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// union keeps the order of a, then adds what only b has.
func union(a, b []*Endpoint) []*Endpoint {
	out := slices.Clone(a)
	for _, ep := range b {
		if !slices.Contains(out, ep) {
			out = append(out, ep)
		}
	}
	return out
}

// View is what a sync reads: the desired state and the node it is for.
// Proxy modes read it and never change it.
type View struct {
	*State
	Node Node
}

// Select is one service port and the endpoints this node uses for it; ok
// is false when the service port no longer exists.
func (v View) Select(name ServicePortName) (svc *ServicePort, sel Selection, ok bool) {
	svc, ok = v.Services[name]
	if !ok {
		return nil, Selection{}, false
	}
	return svc, Select(svc, v.Endpoints[name], v.Node), true
}
