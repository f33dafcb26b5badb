package state

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// reasons is each Use as "used" or its reason; "-" for a path no traffic takes.
func reasons(uses []Use) string {
	if uses == nil {
		return "-"
	}
	var s []string
	for _, u := range uses {
		if u.Used {
			s = append(s, "used")
		} else {
			s = append(s, string(u.Reason))
		}
	}
	return strings.Join(s, " ")
}

func TestExplainGivesEveryReason(t *testing.T) {
	clusterSvc := &ServicePort{}
	etpLocal := &ServicePort{NodePort: 30000, ExternalPolicyLocal: true}
	itpLocal := &ServicePort{InternalPolicyLocal: true}
	node := Node{Name: "this-node", Zone: "a"}

	cases := []struct {
		name           string
		svc            *ServicePort
		eps            []*Endpoint
		cluster, local string
		topology       string
		fallback       string // "cluster", "local" or ""
	}{
		{"not ready", clusterSvc,
			[]*Endpoint{ep("10.0.0.1 ready"), ep("10.0.0.2")},
			"used NotReady", "-", "", ""},
		{"serving terminating while one is ready", clusterSvc,
			[]*Endpoint{ep("10.0.0.1 ready"), ep("10.0.0.2 serving terminating")},
			"used TerminatingWhileOthersReady", "-", "", ""},
		{"terminating and no longer serving", clusterSvc,
			[]*Endpoint{ep("10.0.0.1 ready"), ep("10.0.0.2 terminating")},
			"used TerminatingNotServing", "-", "", ""},
		{"no endpoint ready: the serving terminating ones are used", clusterSvc,
			[]*Endpoint{ep("10.0.0.1 serving terminating"), ep("10.0.0.2"), ep("10.0.0.3 terminating")},
			"used NotReady TerminatingNotServing", "-", "", "cluster"},
		{"hinted for another zone", clusterSvc,
			[]*Endpoint{ep("10.0.0.1 ready hintZones=a"), ep("10.0.0.2 ready hintZones=b"), ep("10.0.0.3 hintZones=b")},
			"used HintedForOtherZone NotReady", "-", v1.ServiceTrafficDistributionPreferSameZone, ""},
		{"hinted for another node", clusterSvc,
			[]*Endpoint{ep("10.0.0.1 ready hintNodes=this-node"), ep("10.0.0.2 ready hintNodes=other")},
			"used HintedForOtherNode", "-", v1.ServiceTrafficDistributionPreferSameNode, ""},
		{"eTP=Local: both paths, each with its reasons", etpLocal,
			[]*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 ready"), ep("10.0.0.3 serving terminating local"), ep("10.0.0.4 local")},
			"used used TerminatingWhileOthersReady NotReady", "used NotOnThisNode TerminatingWhileOthersReady NotReady", "", ""},
		{"iTP=Local with no local endpoint ready: local serving terminating ones", itpLocal,
			[]*Endpoint{ep("10.0.0.1 serving terminating local"), ep("10.0.0.2 ready"), ep("10.0.0.3 terminating local")},
			"-", "used NotOnThisNode TerminatingNotServing", "", "local"},
		{"no endpoints", clusterSvc, nil, "", "-", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := Explain(tc.svc, tc.eps, node)
			if got := reasons(e.Cluster); got != tc.cluster {
				t.Errorf("Cluster = %s, want %s", got, tc.cluster)
			}
			if got := reasons(e.Local); got != tc.local {
				t.Errorf("Local = %s, want %s", got, tc.local)
			}
			if e.Topology != tc.topology {
				t.Errorf("Topology = %q, want %q", e.Topology, tc.topology)
			}
			if e.ClusterFallback != (tc.fallback == "cluster") || e.LocalFallback != (tc.fallback == "local") {
				t.Errorf("fallback cluster %v, local %v; want %q", e.ClusterFallback, e.LocalFallback, tc.fallback)
			}
		})
	}
}

func TestExplainWords(t *testing.T) {
	node := Node{Name: "this-node", Zone: "a"}
	cases := []struct {
		svc  *ServicePort
		eps  []*Endpoint
		path func(Explanation) []Use
		want string
	}{
		{&ServicePort{}, []*Endpoint{ep("10.0.0.1 ready hintZones=a"), ep("10.0.0.2 ready hintZones=b,c")},
			func(e Explanation) []Use { return e.Cluster }, "hinted for zone b,c; this node is in zone a"},
		{&ServicePort{}, []*Endpoint{ep("10.0.0.1 ready hintNodes=this-node"), ep("10.0.0.2 ready hintNodes=n2")},
			func(e Explanation) []Use { return e.Cluster }, "hinted for node n2, not this one"},
		{&ServicePort{}, []*Endpoint{ep("10.0.0.1 ready"), ep("10.0.0.2 serving terminating")},
			func(e Explanation) []Use { return e.Cluster }, "terminating; used only while no endpoint is ready"},
		{&ServicePort{InternalPolicyLocal: true}, []*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 serving terminating local")},
			func(e Explanation) []Use { return e.Local }, "terminating; used only while no local endpoint is ready"},
		{&ServicePort{InternalPolicyLocal: true}, []*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")},
			func(e Explanation) []Use { return e.Local }, "not on this node, and the policy is Local"},
		{&ServicePort{}, []*Endpoint{ep("10.0.0.1 ready"), ep("10.0.0.2 terminating")},
			func(e Explanation) []Use { return e.Cluster }, "terminating and no longer serving"},
		{&ServicePort{}, []*Endpoint{ep("10.0.0.1 ready"), ep("10.0.0.2")},
			func(e Explanation) []Use { return e.Cluster }, "not ready"},
	}
	for _, tc := range cases {
		if got := tc.path(Explain(tc.svc, tc.eps, node))[1].Message; got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
}

// Over many random services and endpoints, Explain uses exactly what
// Select picks, and each reason holds for the endpoint it is given for.
func TestExplainAgreesWithSelect(t *testing.T) {
	services := []*ServicePort{
		{}, {InternalPolicyLocal: true}, {NodePort: 30000, ExternalPolicyLocal: true},
		{NodePort: 30000, InternalPolicyLocal: true}, {NodePort: 30000, InternalPolicyLocal: true, ExternalPolicyLocal: true},
	}
	conditions := []string{"ready", "serving terminating", "terminating", ""}
	hints := []string{"", "hintZones=a", "hintZones=b", "hintNodes=this-node", "hintNodes=other hintZones=a"}
	// Every reason must come up, or the check proves little.
	seen := map[Reason]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		svc := services[rng.IntN(len(services))]
		node := Node{Name: "this-node", Zone: []string{"a", ""}[rng.IntN(2)]}
		var eps []*Endpoint
		for j := range 1 + rng.IntN(5) {
			desc := fmt.Sprintf("10.0.0.%d %s %s", j, conditions[rng.IntN(len(conditions))], hints[rng.IntN(len(hints))])
			if rng.IntN(2) == 0 {
				desc += " local"
			}
			eps = append(eps, ep(desc))
		}
		sel := Select(svc, eps, node)
		e := Explain(svc, eps, node)
		context := func() string { return fmt.Sprintf("case %d: %+v on %+v", i, svc, node) }
		check := func(path string, uses []Use, picked []*Endpoint, scopeReady func(*Endpoint) bool, taken bool) {
			if (uses != nil) != taken {
				t.Fatalf("%s: %s path explained: %v, taken: %v", context(), path, uses != nil, taken)
			}
			for k, u := range uses {
				ep := eps[k]
				if u.Used != slices.Contains(picked, ep) {
					t.Fatalf("%s: %s %s used %v, Select picked %v", context(), path, ep, u.Used, picked)
				}
				if !u.Used && !reasonHolds(u.Reason, ep, node, e.Topology, slices.ContainsFunc(eps, scopeReady)) {
					t.Fatalf("%s: %s %+v left out for %q", context(), path, *ep, u.Reason)
				}
				if !u.Used && u.Message == "" {
					t.Fatalf("%s: no words for %q", context(), u.Reason)
				}
			}
		}
		for _, u := range append(slices.Clone(e.Cluster), e.Local...) {
			seen[u.Reason] = true
		}
		check("cluster", e.Cluster, sel.Cluster, func(ep *Endpoint) bool { return ep.Ready }, svc.UsesClusterEndpoints())
		check("local", e.Local, sel.Local, localReady, svc.UsesLocalEndpoints())
	}
	for _, r := range []Reason{NotReady, TerminatingNotServing, TerminatingReadyExist, HintedForOtherZone, HintedForOtherNode, NotOnThisNode} {
		if !seen[r] {
			t.Errorf("no case left an endpoint out for %s", r)
		}
	}
}

// reasonHolds tells whether reason is true of ep; readyExist is whether a
// ready endpoint exists where the path looks.
func reasonHolds(reason Reason, ep *Endpoint, node Node, topology string, readyExist bool) bool {
	switch reason {
	case NotReady:
		return !ep.Ready && !ep.Terminating
	case TerminatingNotServing:
		return !ep.Ready && ep.Terminating && !ep.Serving
	case TerminatingReadyExist:
		return !ep.Ready && ep.Terminating && ep.Serving && readyExist
	case HintedForOtherZone:
		return ep.Ready && topology == v1.ServiceTrafficDistributionPreferSameZone && !slices.Contains(ep.ZoneHints(), node.Zone)
	case HintedForOtherNode:
		return ep.Ready && topology == v1.ServiceTrafficDistributionPreferSameNode && !slices.Contains(ep.NodeHints(), node.Name)
	case NotOnThisNode:
		return !ep.IsLocal
	}
	return false
}

// BenchmarkSelect measures the selection a sync runs per changed service
// port (10 endpoints, half on this node, zone hints, a Cluster and a Local
// path): Explain must not make it slower.
func BenchmarkSelect(b *testing.B) {
	svc := &ServicePort{NodePort: 30000, ExternalPolicyLocal: true}
	node := Node{Name: "this-node", Zone: "a"}
	var eps []*Endpoint
	for i := range 10 {
		desc := fmt.Sprintf("10.0.0.%d ready hintZones=%c", i, 'a'+i%2)
		if i%2 == 0 {
			desc += " local"
		}
		eps = append(eps, ep(desc))
	}
	b.ReportAllocs()
	for b.Loop() {
		Select(svc, eps, node)
	}
}
