package ipvs

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// The IPv6 family's sets (KUBE-6-) and chains trace as the IPv4 ones: a
// NodePort from outside is masqueraded; a load balancer drops a source
// out of its ranges.
func TestTraceIPv6(t *testing.T) {
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{"fd00:244::/56"}}, v1.IPv6Protocol)
	if err != nil {
		t.Fatal(err)
	}
	p := Params{IPv6: true, Scheduler: "rr", MasqueradeBit: 14, LocalDetector: detector, NodeIP: netip.MustParseAddr("fd00:255::2")}
	svc := &state.ServicePort{
		Name: state.ServicePortName{Port: "p", Protocol: v1.ProtocolTCP}, ClusterIP: netip.MustParseAddr("fd00:96::10"),
		Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30080,
		LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr("2001:db8:3::1")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/64")},
	}
	svc.Name.Namespace, svc.Name.Name = "ns", "web"
	eps := []*state.Endpoint{
		{IP: netip.MustParseAddr("fd00:244::5"), Port: 8080, NodeName: "node-1", IsLocal: true, Ready: true, Serving: true},
		{IP: netip.MustParseAddr("fd00:244:1::7"), Port: 8080, NodeName: "node-2", Ready: true, Serving: true},
	}
	node := netip.MustParseAddr("fd00:255::2")
	want := p.ServiceObjects(svc, eps, state.Select(svc, eps, state.Node{Name: "node-1"}), Addresses{Node: []netip.Addr{node}, NodePort: []netip.Addr{node}})
	for _, tc := range []struct {
		src, dst   string
		port       string
		verdict    trace.Verdict
		endpoints  int
		masquerade bool
	}{
		{"2001:db8::5", "fd00:255::2", "30080", trace.DNAT, 2, true},
		{"fd00:244::9", "fd00:96::10", "80", trace.DNAT, 2, false},
		{"2001:db8:1::9", "2001:db8:3::1", "80", trace.DNAT, 2, true},
		{"2001:db8:2::9", "2001:db8:3::1", "80", trace.Drop, 0, false},
	} {
		from := "external"
		if tc.src == "fd00:244::9" {
			from = "pod"
		}
		pkt, err := trace.ParsePacket(tc.src, tc.dst, tc.port, "TCP", from)
		if err != nil {
			t.Fatal(err)
		}
		pkt.LocalDestination = tc.dst == node.String()
		branches, err := p.trace(svc, want, pkt)
		if err != nil {
			t.Fatal(err)
		}
		var r trace.Result
		r.SetBranches(branches)
		if r.Outcome.Verdict != tc.verdict || len(r.Outcome.Endpoints) != tc.endpoints || r.Outcome.Masquerade != tc.masquerade {
			t.Errorf("%s: outcome %+v, want %s to %d endpoints, masquerade %v; steps %+v", pkt, r.Outcome, tc.verdict, tc.endpoints, tc.masquerade, r.Steps)
		}
	}
}
