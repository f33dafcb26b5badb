package state

import (
	"cmp"
	"net/netip"
	"strings"
	"testing"
)

// ep builds an endpoint from a compact description: "10.0.0.1 local ready
// zone=a hintZones=a,b hintNodes=n1 serving terminating".
func ep(desc string) *Endpoint {
	f := strings.Fields(desc)
	e := &Endpoint{IP: netip.MustParseAddr(f[0]), Port: 80}
	for _, w := range f[1:] {
		key, value, _ := strings.Cut(w, "=")
		switch key {
		case "local":
			e.IsLocal, e.NodeName = true, "this-node"
		case "ready":
			e.Ready, e.Serving = true, true
		case "serving":
			e.Serving = true
		case "terminating":
			e.Terminating = true
		case "zone":
			e.Zone = value
		case "hintZones":
			e.Hints = cmp.Or(e.Hints, &Hints{})
			e.Hints.Zones = strings.Split(value, ",")
		case "hintNodes":
			e.Hints = cmp.Or(e.Hints, &Hints{})
			e.Hints.Nodes = strings.Split(value, ",")
		default:
			panic("unknown endpoint word " + w)
		}
	}
	return e
}

func ips(eps []*Endpoint) string {
	if eps == nil {
		return "nil"
	}
	var s []string
	for _, e := range eps {
		s = append(s, e.IP.String())
	}
	return "[" + strings.Join(s, " ") + "]"
}

func TestSelect(t *testing.T) {
	clusterSvc := &ServicePort{}
	nodePortSvc := &ServicePort{NodePort: 30000}
	etpLocal := &ServicePort{NodePort: 30000, ExternalPolicyLocal: true}
	itpLocal := &ServicePort{InternalPolicyLocal: true}
	itpLocalWithNodePort := &ServicePort{InternalPolicyLocal: true, NodePort: 30000}
	bothLocal := &ServicePort{InternalPolicyLocal: true, ExternalPolicyLocal: true, NodePort: 30000}
	node := Node{Name: "this-node", Zone: "a"}

	cases := []struct {
		name                string
		svc                 *ServicePort
		node                Node
		eps                 []*Endpoint
		cluster, local, all string
		hasAny              bool
	}{
		{"no endpoints", clusterSvc, node, nil, "nil", "nil", "nil", false},
		{"ready endpoints are used", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready"), ep("10.0.0.2"), ep("10.0.0.3 ready")},
			"[10.0.0.1 10.0.0.3]", "nil", "[10.0.0.1 10.0.0.3]", true},
		{"serving-terminating only when none is ready", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 serving terminating"), ep("10.0.0.2 terminating"), ep("10.0.0.3")},
			"[10.0.0.1]", "nil", "[10.0.0.1]", true},
		{"serving-terminating ignored when one is ready", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 serving terminating"), ep("10.0.0.2 ready")},
			"[10.0.0.2]", "nil", "[10.0.0.2]", true},
		{"nothing usable", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1"), ep("10.0.0.2 terminating")},
			"[]", "nil", "[]", false},
		{"eTP=Local: cluster set for internal traffic, local set for external", etpLocal, node,
			[]*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")},
			"[10.0.0.1 10.0.0.2]", "[10.0.0.1]", "[10.0.0.1 10.0.0.2]", true},
		{"eTP=Local without local endpoints still has endpoints", etpLocal, node,
			[]*Endpoint{ep("10.0.0.2 ready")},
			"[10.0.0.2]", "[]", "[10.0.0.2]", true},
		{"eTP=Local on a service without external access is Cluster", &ServicePort{ExternalPolicyLocal: true}, node,
			[]*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")},
			"[10.0.0.1 10.0.0.2]", "nil", "[10.0.0.1 10.0.0.2]", true},
		{"iTP=Local: only local endpoints", itpLocal, node,
			[]*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")},
			"nil", "[10.0.0.1]", "[10.0.0.1]", true},
		{"iTP=Local with none local: no endpoints but HasAny", itpLocal, node,
			[]*Endpoint{ep("10.0.0.2 ready")},
			"nil", "[]", "[]", true},
		{"iTP=Local falls back to local serving-terminating", itpLocal, node,
			[]*Endpoint{ep("10.0.0.1 serving terminating local"), ep("10.0.0.2 ready")},
			"nil", "[10.0.0.1]", "[10.0.0.1]", true},
		{"iTP=Local with a NodePort: external traffic is Cluster", itpLocalWithNodePort, node,
			[]*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")},
			"[10.0.0.1 10.0.0.2]", "[10.0.0.1]", "[10.0.0.1 10.0.0.2]", true},
		{"both Local on an external service still keeps cluster endpoints for short-circuited traffic", bothLocal, node,
			[]*Endpoint{ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")},
			"[10.0.0.1 10.0.0.2]", "[10.0.0.1]", "[10.0.0.1 10.0.0.2]", true},
		{"local ready and cluster serving-terminating are unioned", etpLocal, node,
			[]*Endpoint{ep("10.0.0.1 serving terminating local"), ep("10.0.0.2 serving terminating")},
			"[10.0.0.1 10.0.0.2]", "[10.0.0.1]", "[10.0.0.1 10.0.0.2]", true},
		{"zone hints: only this zone's", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready hintZones=a"), ep("10.0.0.2 ready hintZones=b"), ep("10.0.0.3 ready hintZones=a,b")},
			"[10.0.0.1 10.0.0.3]", "nil", "[10.0.0.1 10.0.0.3]", true},
		{"zone hints ignored when one ready endpoint lacks them", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready hintZones=a"), ep("10.0.0.2 ready")},
			"[10.0.0.1 10.0.0.2]", "nil", "[10.0.0.1 10.0.0.2]", true},
		{"zone hints ignored when none is for this zone", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready hintZones=b"), ep("10.0.0.2 ready hintZones=c")},
			"[10.0.0.1 10.0.0.2]", "nil", "[10.0.0.1 10.0.0.2]", true},
		{"zone hints ignored when the node has no zone", clusterSvc, Node{Name: "this-node"},
			[]*Endpoint{ep("10.0.0.1 ready hintZones=a"), ep("10.0.0.2 ready hintZones=b")},
			"[10.0.0.1 10.0.0.2]", "nil", "[10.0.0.1 10.0.0.2]", true},
		{"non-ready endpoints do not count for hints", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready hintZones=a"), ep("10.0.0.2"), ep("10.0.0.3 ready hintZones=b")},
			"[10.0.0.1]", "nil", "[10.0.0.1]", true},
		{"node hints win over zone hints", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready hintZones=a hintNodes=this-node"), ep("10.0.0.2 ready hintZones=a hintNodes=other")},
			"[10.0.0.1]", "nil", "[10.0.0.1]", true},
		{"node hints for other nodes fall back to zone hints", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready hintZones=a hintNodes=x"), ep("10.0.0.2 ready hintZones=b hintNodes=y")},
			"[10.0.0.1]", "nil", "[10.0.0.1]", true},
		{"a Local policy overrides hints", itpLocal, node,
			[]*Endpoint{ep("10.0.0.1 ready local hintZones=b"), ep("10.0.0.2 ready hintZones=a")},
			"nil", "[10.0.0.1]", "[10.0.0.1]", true},
		{"serving-terminating fallback ignores hints", clusterSvc, node,
			[]*Endpoint{ep("10.0.0.1 serving terminating hintZones=b")},
			"[10.0.0.1]", "nil", "[10.0.0.1]", true},
		{"NodePort service with Cluster policy", nodePortSvc, node,
			[]*Endpoint{ep("10.0.0.1 ready local")},
			"[10.0.0.1]", "nil", "[10.0.0.1]", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sel := Select(tc.svc, tc.eps, tc.node)
			if got := ips(sel.Cluster); got != tc.cluster {
				t.Errorf("Cluster = %s, want %s", got, tc.cluster)
			}
			if got := ips(sel.Local); got != tc.local {
				t.Errorf("Local = %s, want %s", got, tc.local)
			}
			if got := ips(sel.All); got != tc.all {
				t.Errorf("All = %s, want %s", got, tc.all)
			}
			if sel.HasAny != tc.hasAny {
				t.Errorf("HasAny = %v, want %v", sel.HasAny, tc.hasAny)
			}
		})
	}
}
