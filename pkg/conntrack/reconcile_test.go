package conntrack

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

func TestStaleFlowFilter(t *testing.T) {
	dns := state.ServicePortName{Port: "dns", Protocol: v1.ProtocolUDP}
	web := state.ServicePortName{Port: "web", Protocol: v1.ProtocolTCP}
	empty := state.ServicePortName{Port: "empty", Protocol: v1.ProtocolUDP}
	services := state.ServiceMap{
		dns: {Name: dns, Protocol: v1.ProtocolUDP, ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 53, NodePort: 30053,
			ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
		web:   {Name: web, Protocol: v1.ProtocolTCP, ClusterIP: netip.MustParseAddr("10.96.0.20"), Port: 80},
		empty: {Name: empty, Protocol: v1.ProtocolUDP, ClusterIP: netip.MustParseAddr("10.96.0.30"), Port: 53},
	}
	endpoints := state.EndpointsMap{
		dns: {
			{IP: netip.MustParseAddr("10.244.0.5"), Port: 5353, Ready: true, Serving: true},
			{IP: netip.MustParseAddr("10.244.0.6"), Port: 5353, Serving: true, Terminating: true},
			{IP: netip.MustParseAddr("10.244.0.7"), Port: 5353},
		},
		web: {{IP: netip.MustParseAddr("10.244.0.8"), Port: 8080, Ready: true, Serving: true}},
	}
	filter := newStaleFlowFilter(services, endpoints)

	for _, tc := range []struct {
		name  string
		flow  *netlink.ConntrackFlow
		stale bool
	}{
		{"to a ready endpoint", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.5:5353"), false},
		{"to a serving terminating endpoint", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.6:5353"), false},
		{"to an endpoint no longer serving", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.7:5353"), true},
		{"to an endpoint that is gone", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.50:5353"), true},
		{"to the right address, wrong port", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.244.0.5:53"), true},
		{"via an external IP to a gone endpoint", flow(unix.IPPROTO_UDP, "192.0.2.10:53", "10.244.0.50:5353"), true},
		{"untranslated while the service has endpoints", flow(unix.IPPROTO_UDP, "10.96.0.10:53", "10.96.0.10:53"), true},
		{"untranslated to a service without endpoints", flow(unix.IPPROTO_UDP, "10.96.0.30:53", "10.96.0.30:53"), false},
		{"via the node port to a gone endpoint", flow(unix.IPPROTO_UDP, "10.255.0.2:30053", "10.244.0.50:5353"), true},
		{"via the node port to a ready endpoint", flow(unix.IPPROTO_UDP, "10.255.0.2:30053", "10.244.0.5:5353"), false},
		{"a local socket on the node port", flow(unix.IPPROTO_UDP, "10.255.0.2:30053", "10.255.0.2:30053"), false},
		{"TCP is left alone", flow(unix.IPPROTO_TCP, "10.96.0.20:80", "10.244.0.50:8080"), false},
		{"not a service", flow(unix.IPPROTO_UDP, "10.1.2.3:53", "10.1.2.4:53"), false},
	} {
		if got := filter.MatchConntrackFlow(tc.flow); got != tc.stale {
			t.Errorf("%s: stale %v, want %v", tc.name, got, tc.stale)
		}
	}
}

// flow is a conntrack entry from a client pod to dst, answered by
// answeredBy (dst itself if no DNAT happened).
func flow(proto uint8, dst string, answeredBy string) *netlink.ConntrackFlow {
	d, a := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(answeredBy)
	f := &netlink.ConntrackFlow{}
	f.Forward.Protocol = proto
	f.Forward.SrcIP, f.Forward.SrcPort = net.ParseIP("10.244.0.99"), 40000
	f.Forward.DstIP, f.Forward.DstPort = net.IP(d.Addr().AsSlice()), d.Port()
	f.Reverse.SrcIP, f.Reverse.SrcPort = net.IP(a.Addr().AsSlice()), a.Port()
	f.Reverse.DstIP, f.Reverse.DstPort = f.Forward.SrcIP, 40000
	return f
}
