package state

import (
	"fmt"
	"testing"
)

func TestPathsOf(t *testing.T) {
	clusterSvc := &ServicePort{}
	etpLocal := &ServicePort{NodePort: 30000, ExternalPolicyLocal: true}
	itpLocal := &ServicePort{InternalPolicyLocal: true}
	bothLocal := &ServicePort{InternalPolicyLocal: true, ExternalPolicyLocal: true, NodePort: 30000}
	node := Node{Name: "this-node"}
	local, remote := ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")

	// A path reads "cluster|local endpoints served|unserved".
	cases := []struct {
		name                   string
		svc                    *ServicePort
		eps                    []*Endpoint
		internal, external     string
		clusterUsed, localUsed bool
	}{
		{"no endpoints", clusterSvc, nil,
			"cluster nil unserved", "cluster nil unserved", false, false},
		{"Cluster policies", clusterSvc, []*Endpoint{local, remote},
			"cluster [10.0.0.1 10.0.0.2] served", "cluster [10.0.0.1 10.0.0.2] served", true, false},
		{"eTP=Local with a local endpoint", etpLocal, []*Endpoint{local, remote},
			"cluster [10.0.0.1 10.0.0.2] served", "local [10.0.0.1] served", true, true},
		{"eTP=Local without one: external traffic unserved", etpLocal, []*Endpoint{remote},
			"cluster [10.0.0.2] served", "local [] unserved", true, false},
		{"iTP=Local without a local endpoint: internal traffic unserved", itpLocal, []*Endpoint{remote},
			"local [] unserved", "cluster nil served", false, false},
		{"iTP=Local with one, no external access: only the local path", itpLocal, []*Endpoint{local, remote},
			"local [10.0.0.1] served", "cluster nil served", false, true},
		{"both Local: the cluster path stays for short-circuited traffic", bothLocal, []*Endpoint{local, remote},
			"local [10.0.0.1] served", "local [10.0.0.1] served", true, true},
	}
	describe := func(p Path) string {
		kind, served := "cluster", "unserved"
		if p.Local {
			kind = "local"
		}
		if p.Served {
			served = "served"
		}
		return fmt.Sprintf("%s %s %s", kind, ips(p.Endpoints), served)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := PathsOf(tc.svc, Select(tc.svc, tc.eps, node))
			if got := describe(p.Internal); got != tc.internal {
				t.Errorf("internal path %q, want %q", got, tc.internal)
			}
			if got := describe(p.External); got != tc.external {
				t.Errorf("external path %q, want %q", got, tc.external)
			}
			if p.ClusterUsed != tc.clusterUsed || p.LocalUsed != tc.localUsed {
				t.Errorf("cluster path used %v, local %v; want %v, %v", p.ClusterUsed, p.LocalUsed, tc.clusterUsed, tc.localUsed)
			}
		})
	}
}
