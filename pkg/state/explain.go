package state

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Reason says why a path leaves an endpoint out.
type Reason string

const (
	// NotReady: the endpoint is neither ready nor serving while terminating.
	NotReady Reason = "NotReady"
	// TerminatingNotServing: the endpoint is terminating and no longer serving.
	TerminatingNotServing Reason = "TerminatingNotServing"
	// TerminatingReadyExist: the endpoint is terminating but still
	// serving; such endpoints are used only while none is ready.
	TerminatingReadyExist Reason = "TerminatingWhileOthersReady"
	// HintedForOtherZone: the topology hints give the endpoint to other
	// zones than this node's.
	HintedForOtherZone Reason = "HintedForOtherZone"
	// HintedForOtherNode: the topology hints give it to other nodes.
	HintedForOtherNode Reason = "HintedForOtherNode"
	// NotOnThisNode: the path is a Local policy's, and the endpoint is
	// elsewhere.
	NotOnThisNode Reason = "NotOnThisNode"
)

// Use tells whether one path uses one endpoint, and if not, why, also in
// words.
type Use struct {
	Used    bool   `json:"used"`
	Reason  Reason `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Explanation is Select's answer with its reasons.
type Explanation struct {
	Selection
	// Topology is the hints the Cluster path follows: PreferSameZone,
	// PreferSameNode, or "" when it follows none.
	Topology string
	// ClusterFallback and LocalFallback tell that no endpoint (no local
	// endpoint) is ready, so the path uses the serving terminating ones.
	ClusterFallback, LocalFallback bool
	// Cluster and Local tell, for each endpoint in the order given,
	// whether the path uses it; nil when no traffic takes the path.
	Cluster, Local []Use
}

// Explain is Select with its reasons. Which endpoints each path uses is
// Select's own answer; why it leaves the others out comes from the
// predicates Select picks with. Select stays free of this work, since
// every sync runs it and only a person asking needs the reasons.
func Explain(svc *ServicePort, endpoints []*Endpoint, node Node) Explanation {
	sel := Select(svc, endpoints, node)
	e := Explanation{Selection: sel, Topology: topologyMode(endpoints, node)}
	if svc.UsesClusterEndpoints() {
		e.ClusterFallback = len(sel.Cluster) > 0 &&
			!slices.ContainsFunc(endpoints, func(ep *Endpoint) bool { return clusterReady(ep, e.Topology, node) })
		e.Cluster = uses(endpoints, sel.Cluster, func(ep *Endpoint) Use { return clusterReason(ep, e.Topology, node) })
	}
	if svc.UsesLocalEndpoints() {
		e.LocalFallback = len(sel.Local) > 0 && !slices.ContainsFunc(endpoints, localReady)
		e.Local = uses(endpoints, sel.Local, localReason)
	}
	return e
}

// uses marks the endpoints a path picked as used, and asks why for the
// others.
func uses(endpoints, picked []*Endpoint, why func(*Endpoint) Use) []Use {
	out := make([]Use, len(endpoints))
	for i, ep := range endpoints {
		if slices.Contains(picked, ep) {
			out[i] = Use{Used: true}
		} else {
			out[i] = why(ep)
		}
	}
	return out
}

// clusterReason is why the Cluster path leaves out an endpoint: a ready
// one can only have been left out by the topology hints.
func clusterReason(ep *Endpoint, mode string, node Node) Use {
	switch {
	case ep.Ready && mode == v1.ServiceTrafficDistributionPreferSameNode:
		return Use{Reason: HintedForOtherNode, Message: fmt.Sprintf("hinted for node %s, not this one", strings.Join(ep.NodeHints(), ","))}
	case ep.Ready:
		return Use{Reason: HintedForOtherZone, Message: fmt.Sprintf("hinted for zone %s; this node is in zone %s", strings.Join(ep.ZoneHints(), ","), node.Zone)}
	}
	return notReadyReason(ep, "endpoint")
}

// localReason is why the Local path leaves out an endpoint: every ready
// local one is used.
func localReason(ep *Endpoint) Use {
	if !ep.IsLocal {
		return Use{Reason: NotOnThisNode, Message: "not on this node, and the policy is Local"}
	}
	return notReadyReason(ep, "local endpoint")
}

// notReadyReason is why an endpoint that is not ready is left out; which
// names the endpoints whose readiness counts.
func notReadyReason(ep *Endpoint, which string) Use {
	switch {
	case servingTerminating(ep):
		return Use{Reason: TerminatingReadyExist, Message: "terminating; used only while no " + which + " is ready"}
	case ep.Terminating:
		return Use{Reason: TerminatingNotServing, Message: "terminating and no longer serving"}
	}
	return Use{Reason: NotReady, Message: "not ready"}
}

// Explain is one service port with Explain's answer for its endpoints;
// ok is false when the service port does not exist.
func (v View) Explain(name ServicePortName) (svc *ServicePort, e Explanation, ok bool) {
	svc, ok = v.Services[name]
	if !ok {
		return nil, Explanation{}, false
	}
	return svc, Explain(svc, v.Endpoints[name], v.Node), true
}

// PortsOf lists the service ports of one service, in no order; the slice
// is the state's own, not to be changed.
func (st *State) PortsOf(name types.NamespacedName) []*ServicePort {
	return st.servicePorts[name]
}

// Compare orders service ports by namespace, name, port name and protocol.
func (n ServicePortName) Compare(o ServicePortName) int {
	return cmp.Or(cmp.Compare(n.Namespace, o.Namespace), cmp.Compare(n.Name, o.Name),
		cmp.Compare(n.Port, o.Port), cmp.Compare(n.Protocol, o.Protocol))
}
