package nftables

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"
)

// layoutCase is parameters and the rules, sets or elements a part of the
// layout makes of them.
type layoutCase struct {
	name   string
	params func(*Params)
	want   []string
}

func runLayout(t *testing.T, part func(*Params) []string, cases []layoutCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := builderParams(t, false)
			if tc.params != nil {
				tc.params(p)
			}
			if got := part(p); !slices.Equal(got, tc.want) {
				t.Errorf("got\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(tc.want, "\n\t"))
			}
		})
	}
}

var (
	allNodePortAddrs  = func(p *Params) { p.NodePortAddresses = nil }
	someNodePortAddrs = func(p *Params) {
		p.NodePortAddresses = []netip.Addr{netip.MustParseAddr("10.250.0.2"), netip.MustParseAddr("127.0.0.1")}
	}
	withIPv6 = func(p *Params) { p.IPv6 = true }
)

func TestLayoutNodePortDestinations(t *testing.T) {
	forms := func(p *Params) []string { return []string{p.nodePortDestinations(true), p.nodePortDestinations(false)} }
	runLayout(t, forms, []layoutCase{
		{name: "every local address but localhost", params: allNodePortAddrs, want: []string{
			"fib daddr type local ip daddr != 127.0.0.0/8", "ip daddr != 127.0.0.0/8"}},
		{name: "IPv6", params: func(p *Params) { withIPv6(p); allNodePortAddrs(p) }, want: []string{
			"fib daddr type local ip6 daddr != ::1", "ip6 daddr != ::1"}},
		{name: "listed addresses", params: someNodePortAddrs, want: []string{"ip daddr @nodeport-ips", "ip daddr @nodeport-ips"}},
	})
}

func TestLayoutServicesRules(t *testing.T) {
	vmaps := []string{"ip daddr . meta l4proto . th dport vmap @service-ips",
		"fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"}
	runLayout(t, (*Params).servicesRules, []layoutCase{
		{name: "off-cluster ClusterIP traffic masqueraded", want: append([]string{
			`ip daddr @cluster-ips ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000 comment "masquerade clusterIP traffic from outside cluster"`}, vmaps...)},
		{name: "all ClusterIP traffic masqueraded", params: func(p *Params) { p.MasqueradeAll = true }, want: append([]string{
			`ip daddr @cluster-ips meta mark set meta mark | 0x00004000 comment "masquerade all clusterIP traffic"`}, vmaps...)},
		{name: "no local-traffic detection: none", params: func(p *Params) { p.LocalDetector = builderParams(t, true).LocalDetector }, want: vmaps},
	})
}

func TestLayoutClusterIPsCheckRules(t *testing.T) {
	reject := `ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`
	runLayout(t, (*Params).clusterIPsCheckRules, []layoutCase{
		{name: "no service CIDRs: reject only", want: []string{reject}},
		{name: "service CIDRs: their unallocated addresses dropped", params: func(p *Params) {
			p.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.97.0.0/16")}
		}, want: []string{reject, `ip daddr { 10.96.0.0/15 } drop comment "Drop traffic to unallocated ClusterIPs"`}},
	})
}

func TestLayoutNodePortEndpointsCheck(t *testing.T) {
	rules := func(p *Params) []string { return p.nodePortEndpointsCheck().Rules }
	noEndpoints := "ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports"
	runLayout(t, rules, []layoutCase{
		{name: "localhost NodePorts not rejected", params: allNodePortAddrs, want: []string{noEndpoints}},
		{name: "localhost NodePorts rejected", params: func(p *Params) {
			allNodePortAddrs(p)
			p.LocalhostNodePorts = LocalhostNodePortsReject
		}, want: []string{noEndpoints, "ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports"}},
	})
}

// layoutExtras are the sets, counters, chains and elements beyond the
// fixed ones.
func layoutExtras(p *Params) []string {
	var l Layout
	p.addLocalhostRejects(&l)
	p.addNodePortIPs(&l)
	var out []string
	for _, s := range l.Sets {
		out = append(out, "set "+s.Name+" "+s.Type)
	}
	for _, c := range l.Counters {
		out = append(out, "counter "+c)
	}
	for _, c := range l.Chains {
		out = append(out, "chain "+c.Name+": "+strings.Join(c.Rules, "; "))
	}
	for _, e := range l.Elements {
		out = append(out, "element "+e.Set+" "+strings.Join(e.Key, " . "))
	}
	return out
}

func TestLayoutExtras(t *testing.T) {
	runLayout(t, layoutExtras, []layoutCase{
		{name: "every local address, localhost NodePorts not rejected: none", params: allNodePortAddrs},
		{name: "listed addresses, localhost skipped", params: someNodePortAddrs, want: []string{
			"set nodeport-ips ipv4_addr", "element nodeport-ips 10.250.0.2"}},
		{name: "localhost NodePorts proxied: UDP and SCTP rejected", params: func(p *Params) {
			allNodePortAddrs(p)
			p.LocalhostNodePorts = LocalhostNodePortsProxy
		}, want: []string{
			"set localhost-nodeport-reject-ports inet_proto . inet_service : verdict",
			"counter localhost-nodeport-rejected-udp", "counter localhost-nodeport-rejected-sctp",
			`chain localhost-nodeport-reject-udp: counter name "localhost-nodeport-rejected-udp" reject`,
			`chain localhost-nodeport-reject-sctp: counter name "localhost-nodeport-rejected-sctp" reject`}},
	})
}

// The layout is its parts in order, and the same each time.
func TestLayoutParts(t *testing.T) {
	p := builderParams(t, false)
	p.LocalhostNodePorts = LocalhostNodePortsReject
	someNodePortAddrs(p)
	l := p.Layout()
	if !reflect.DeepEqual(l, p.Layout()) {
		t.Error("two layouts differ")
	}
	var names []string
	for _, c := range l.Chains {
		names = append(names, c.Name)
	}
	want := []string{chainFilterPreroutingPreDNAT, chainFilterOutputPreDNAT, chainFilterInput, chainFilterForward, chainFilterOutput,
		chainNATPrerouting, chainNATOutput, chainNATPostrouting,
		chainNodePortEndpointsCheck, chainServiceEndpointsCheck, chainFirewallCheck, chainServices, chainMasquerading, chainClusterIPsCheck, chainReject,
		localhostRejectChain(v1.ProtocolTCP), localhostRejectChain(v1.ProtocolUDP), localhostRejectChain(v1.ProtocolSCTP)}
	if !slices.Equal(names, want) {
		t.Errorf("chains %q, want %q", names, want)
	}
	if got := l.Sets[len(l.Sets)-1].Name; got != setNodePortIPs || len(l.Sets) != 9 {
		t.Errorf("%d sets, the last %s", len(l.Sets), got)
	}
	if !reflect.DeepEqual(l.Elements, []knftables.Element{{Set: setNodePortIPs, Key: []string{"10.250.0.2"}}}) {
		t.Errorf("elements %v", l.Elements)
	}
}
