package state

import (
	"fmt"
	"net/netip"
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
		externalEntry          bool
	}{
		{"no endpoints", clusterSvc, nil,
			"cluster nil unserved", "cluster nil unserved", false, false, false},
		{"external access, no endpoints anywhere: no external entry", etpLocal, nil,
			"cluster nil unserved", "local nil unserved", false, false, false},
		{"Cluster policies", clusterSvc, []*Endpoint{local, remote},
			"cluster [10.0.0.1 10.0.0.2] served", "cluster [10.0.0.1 10.0.0.2] served", true, false, false},
		{"eTP=Local with a local endpoint", etpLocal, []*Endpoint{local, remote},
			"cluster [10.0.0.1 10.0.0.2] served", "local [10.0.0.1] served", true, true, true},
		{"eTP=Local without one: external traffic unserved", etpLocal, []*Endpoint{remote},
			"cluster [10.0.0.2] served", "local [] unserved", true, false, true},
		{"iTP=Local without a local endpoint: internal traffic unserved", itpLocal, []*Endpoint{remote},
			"local [] unserved", "cluster nil served", false, false, false},
		{"iTP=Local with one, no external access: only the local path", itpLocal, []*Endpoint{local, remote},
			"local [10.0.0.1] served", "cluster nil served", false, true, false},
		{"both Local: the cluster path stays for short-circuited traffic", bothLocal, []*Endpoint{local, remote},
			"local [10.0.0.1] served", "local [10.0.0.1] served", true, true, true},
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
			if p.ExternalEntry != tc.externalEntry {
				t.Errorf("external entry %v, want %v", p.ExternalEntry, tc.externalEntry)
			}
		})
	}
}

func TestRejectsUnserved(t *testing.T) {
	svc := &ServicePort{NodePort: 30000, ExternalPolicyLocal: true}
	node := Node{Name: "this-node"}
	cases := []struct {
		name   string
		eps    []*Endpoint
		reject bool
	}{
		{"no endpoints: rejected", nil, true},
		{"none usable: rejected", []*Endpoint{ep("10.0.0.1 local")}, true},
		{"endpoints elsewhere only: dropped", []*Endpoint{ep("10.0.0.2 ready")}, false},
		{"a local endpoint: dropped", []*Endpoint{ep("10.0.0.1 ready local")}, false},
		{"only serving terminating ones: dropped", []*Endpoint{ep("10.0.0.2 serving terminating")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Select(svc, tc.eps, node).RejectsUnserved(); got != tc.reject {
				t.Errorf("RejectsUnserved() = %v, want %v", got, tc.reject)
			}
		})
	}
}

func TestFiltersLoadBalancerSources(t *testing.T) {
	lbIP := netip.MustParseAddr("192.0.2.10")
	ranges := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	cases := []struct {
		name   string
		svc    *ServicePort
		filter bool
	}{
		{"neither", &ServicePort{}, false},
		{"LB IPs without source ranges", &ServicePort{LoadBalancerIPs: []netip.Addr{lbIP}}, false},
		{"source ranges without LB IPs", &ServicePort{LoadBalancerSourceRanges: ranges}, false},
		{"both", &ServicePort{LoadBalancerIPs: []netip.Addr{lbIP}, LoadBalancerSourceRanges: ranges}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.svc.FiltersLoadBalancerSources(); got != tc.filter {
				t.Errorf("FiltersLoadBalancerSources() = %v, want %v", got, tc.filter)
			}
		})
	}
}

func TestSourceRangesAllow(t *testing.T) {
	svc := &ServicePort{LoadBalancerSourceRanges: []netip.Prefix{
		netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.0.0.0/8")}}
	cases := []struct {
		name  string
		svc   *ServicePort
		ip    netip.Addr
		allow bool
	}{
		{"in the first range", svc, netip.MustParseAddr("203.0.113.7"), true},
		{"in the second range", svc, netip.MustParseAddr("10.1.2.3"), true},
		{"in none", svc, netip.MustParseAddr("192.0.2.1"), false},
		{"other family", svc, netip.MustParseAddr("2001:db8::1"), false},
		{"no address (node IP unknown)", svc, netip.Addr{}, false},
		{"no source ranges", &ServicePort{}, netip.MustParseAddr("10.1.2.3"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.svc.SourceRangesAllow(tc.ip); got != tc.allow {
				t.Errorf("SourceRangesAllow(%v) = %v, want %v", tc.ip, got, tc.allow)
			}
		})
	}
}
