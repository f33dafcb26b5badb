package nftables

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

func TestNames(t *testing.T) {
	spn := func(ns, name, port string, proto v1.Protocol) state.ServicePortName {
		return state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
	}
	ep := func(s string) *state.Endpoint {
		ap := netip.MustParseAddrPort(s)
		return &state.Endpoint{IP: ap.Addr(), Port: int32(ap.Port())}
	}
	fidA := spn("hx-conf", "fid-a", "http", v1.ProtocolTCP)
	fidAdns := spn("hx-conf", "fid-a", "dns", v1.ProtocolUDP)
	cases := []struct{ got, want string }{
		{namesFor(spn("ns1", "svc1", "p80", v1.ProtocolTCP)).cluster, "service-ULMVA6XW-ns1/svc1/tcp/p80"},
		// Every name of upstream's sample.
		{namesFor(fidA).cluster, "service-DMA2WJPR-hx-conf/fid-a/tcp/http"},
		{namesFor(fidAdns).cluster, "service-44W2ODS7-hx-conf/fid-a/udp/dns"},
		{namesFor(spn("hx-conf", "fid-b", "http", v1.ProtocolTCP)).cluster, "service-JVAD2WNX-hx-conf/fid-b/tcp/http"},
		{namesFor(spn("hx-conf", "fid-b", "http", v1.ProtocolTCP)).local, "local-JVAD2WNX-hx-conf/fid-b/tcp/http"},
		{namesFor(spn("hx-conf", "fid-b", "http", v1.ProtocolTCP)).external, "external-JVAD2WNX-hx-conf/fid-b/tcp/http"},
		{namesFor(spn("hx-conf", "fid-b", "http", v1.ProtocolTCP)).firewall, "firewall-JVAD2WNX-hx-conf/fid-b/tcp/http"},
		{namesFor(spn("hx-conf", "fid-c", "http", v1.ProtocolTCP)).local, "local-G6LKXF7T-hx-conf/fid-c/tcp/http"},
		{namesFor(spn("default", "kubernetes", "https", v1.ProtocolTCP)).cluster, "service-2QRHZV4L-default/kubernetes/tcp/https"},
		{prefixEndpoint + endpointBase(fidA, ep("10.244.1.11:8080")), "endpoint-J3ASCV4X-hx-conf/fid-a/tcp/http__10.244.1.11/8080"},
		{prefixAffinity + endpointBase(fidA, ep("10.244.1.12:8080")), "affinity-H7PJVR2E-hx-conf/fid-a/tcp/http__10.244.1.12/8080"},
		{prefixEndpoint + endpointBase(fidA, ep("10.244.1.13:8080")), "endpoint-L2VNDSQX-hx-conf/fid-a/tcp/http__10.244.1.13/8080"},
		{prefixEndpoint + endpointBase(fidAdns, ep("10.244.1.11:8080")), "endpoint-CGTYD4X7-hx-conf/fid-a/udp/dns__10.244.1.11/8080"},
		{prefixEndpoint + endpointBase(fidAdns, ep("10.244.1.12:8080")), "endpoint-OYNJVBAX-hx-conf/fid-a/udp/dns__10.244.1.12/8080"},
		{prefixEndpoint + endpointBase(fidAdns, ep("10.244.1.13:8080")), "endpoint-EBUNLWQ7-hx-conf/fid-a/udp/dns__10.244.1.13/8080"},
		// IPv6 colons become dots; an unnamed port leaves the last part empty.
		{endpointBase(spn("ns", "s", "", v1.ProtocolSCTP), ep("[fd00::1]:80"))[9:], "ns/s/sctp/__fd00..1/80"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	// A base too long for nft is cut to 237 characters and "...".
	long := spn(strings.Repeat("n", 63), strings.Repeat("s", 63), strings.Repeat("p", 63), v1.ProtocolTCP)
	e := endpointBase(long, ep("[fd00:1111:2222:3333:4444:5555:6666:7777]:65535"))
	if len(e) != 240 || !strings.HasSuffix(e, "...") || !strings.HasPrefix(e[9:], long.Namespace+"/") {
		t.Errorf("long name %q (%d characters)", e, len(e))
	}
	if n := namesFor(long).cluster; len(n) != len("service-")+9+63*3+len("tcp")+3 {
		t.Errorf("a service base is never cut: %q", n)
	}
}
