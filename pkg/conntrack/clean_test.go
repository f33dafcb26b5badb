package conntrack

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

func TestFlowFilters(t *testing.T) {
	dns := &state.ServicePort{Protocol: v1.ProtocolUDP, ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 53, NodePort: 30053,
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
	newlyActive := serviceFilter(dns)
	staleEndpoint := flowFilter{replySource: netip.MustParseAddrPort("10.244.0.5:5353")}
	forwardedTo := flowFilter{destinations: []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53")}} // DeleteUDPFlowsTo's
	for _, tc := range []struct {
		name   string
		filter flowFilter
		flow   string
		dst    string
		answer string
		match  bool
	}{
		// Packets sent while the service had no endpoint were not DNATed.
		{"newly active: untranslated to the cluster IP", newlyActive, "udp", "10.96.0.10:53", "10.96.0.10:53", true},
		{"newly active: untranslated to a load-balancer IP", newlyActive, "udp", "192.0.2.10:53", "192.0.2.10:53", true},
		{"newly active: untranslated to the node port", newlyActive, "udp", "10.255.0.2:30053", "10.255.0.2:30053", true},
		// Flows an earlier process or mode DNATed keep their endpoint.
		{"newly active: DNATed to an endpoint", newlyActive, "udp", "10.96.0.10:53", "10.244.0.5:5353", false},
		{"newly active: DNATed via the node port", newlyActive, "udp", "10.255.0.2:30053", "10.244.0.5:5353", false},
		{"newly active: another service", newlyActive, "udp", "10.96.0.11:53", "10.96.0.11:53", false},
		{"newly active: TCP", newlyActive, "tcp", "10.96.0.10:53", "10.96.0.10:53", false},
		{"stale endpoint: answered by it", staleEndpoint, "udp", "10.96.0.10:53", "10.244.0.5:5353", true},
		{"stale endpoint: sent to it directly", staleEndpoint, "udp", "10.244.0.5:5353", "10.244.0.5:5353", false},
		{"sent to a destination, translated", forwardedTo, "udp", "10.96.0.10:53", "10.244.0.5:5353", true},
		{"sent to a destination, untranslated", forwardedTo, "udp", "10.96.0.10:53", "10.96.0.10:53", true},
		{"sent elsewhere", forwardedTo, "udp", "10.96.0.11:53", "10.244.0.5:5353", false},
		{"stale endpoint: answered by another", staleEndpoint, "udp", "10.96.0.10:53", "10.244.0.6:5353", false},
	} {
		proto := uint8(unix.IPPROTO_UDP)
		if tc.flow == "tcp" {
			proto = unix.IPPROTO_TCP
		}
		if got := tc.filter.MatchConntrackFlow(flow(proto, tc.dst, tc.answer)); got != tc.match {
			t.Errorf("%s: match %v, want %v", tc.name, got, tc.match)
		}
	}
}
