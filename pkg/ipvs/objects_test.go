package ipvs

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// A virtual server's flags carry the session affinity and the scheduler.
func TestVirtualServerFlags(t *testing.T) {
	ip := netip.MustParseAddr("10.96.0.10")
	for _, tc := range []struct {
		name      string
		scheduler string
		affinity  int32
		flags     uint32
		timeout   uint32
	}{
		{"round robin", "rr", 0, 0, 0},
		{"client IP affinity: persistent for its timeout", "rr", 600, ipvskernel.FlagPersistent, 600},
		{"maglev hashes the source", "mh", 0, ipvskernel.FlagSourceHash, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Params{Scheduler: tc.scheduler}
			svc := &state.ServicePort{Protocol: v1.ProtocolUDP, AffinityTimeoutSeconds: tc.affinity}
			vs := p.virtualServer(svc, ip, 53)
			want := ipvskernel.VirtualServer{VirtualServerKey: ipvskernel.VirtualServerKey{Addr: ip, Port: 53, Protocol: v1.ProtocolUDP},
				Scheduler: tc.scheduler, Flags: tc.flags, Timeout: tc.timeout}
			if vs != want {
				t.Errorf("%+v, want %+v", vs, want)
			}
		})
	}
}

// A NodePort's entries: its port in the bitmap sets of TCP and UDP, an
// address and port per NodePort address in the SCTP hash sets.
func TestNodePortEntries(t *testing.T) {
	a := Addresses{NodePort: addrs("10.255.0.2", "10.255.1.1")}
	for _, tc := range []struct {
		proto          v1.Protocol
		set, local     string
		entries        []string
		nodePortServer int
	}{
		{v1.ProtocolTCP, setNodePortTCP, setNodePortLocalTCP, []string{"30080"}, 2},
		{v1.ProtocolUDP, setNodePortUDP, setNodePortLocalUDP, []string{"30080"}, 2},
		{v1.ProtocolSCTP, setNodePortSCTP, setNodePortLocalSCTP, []string{"10.255.0.2,sctp:30080", "10.255.1.1,sctp:30080"}, 2},
	} {
		t.Run(string(tc.proto), func(t *testing.T) {
			b := &objectsBuilder{p: &Params{}, svc: &state.ServicePort{Protocol: tc.proto, NodePort: 30080}, addrs: a, proto: strings.ToLower(string(tc.proto))}
			set, local, entries := b.nodePortEntries()
			if set != tc.set || local != tc.local || !reflect.DeepEqual(entries, tc.entries) {
				t.Errorf("%s, %s, %q; want %s, %s, %q", set, local, entries, tc.set, tc.local, tc.entries)
			}
			b.nodePorts(nil)
			if len(b.out.Servers) != tc.nodePortServer {
				t.Errorf("%d virtual servers, want one per NodePort address", len(b.out.Servers))
			}
		})
	}
}

// A load balancer's source ranges: the node, if they hold it, may reach
// the load-balancer IP; else its own packets to it are dropped.
func TestSourceRanges(t *testing.T) {
	lb := netip.MustParseAddr("10.255.3.1")
	for _, tc := range []struct {
		name      string
		ranges    []netip.Prefix
		entries   []SetEntry
		outFilter []iptables.Rule
	}{{
		name:   "the node in a range",
		ranges: []netip.Prefix{netip.MustParsePrefix("10.255.0.0/24")},
		entries: []SetEntry{{setLoadBalancerFW, "10.255.3.1,tcp:80"}, {setLoadBalancerSourceNet, "10.255.3.1,tcp:80,10.255.0.0/24"},
			{setLoadBalancerSourceIP, "10.255.3.1,tcp:80,10.255.3.1"}},
	}, {
		name:      "the node out of them",
		ranges:    []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		entries:   []SetEntry{{setLoadBalancerFW, "10.255.3.1,tcp:80"}, {setLoadBalancerSourceNet, "10.255.3.1,tcp:80,192.0.2.0/24"}},
		outFilter: []iptables.Rule{"-s 10.255.3.1/32 -m ipvs --vproto 6 --vaddr 10.255.3.1 --vport 80 -j DROP"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &state.ServicePort{Protocol: v1.ProtocolTCP, Port: 80, LoadBalancerSourceRanges: tc.ranges}
			b := &objectsBuilder{p: &Params{NodeIP: netip.MustParseAddr("10.255.0.2")}, svc: svc, proto: "tcp"}
			b.sourceRanges(lb, b.ipPort(lb, 80))
			if !reflect.DeepEqual(b.out.Entries, tc.entries) || !reflect.DeepEqual(b.out.OutFilter, tc.outFilter) {
				t.Errorf("entries %v, out-filter %v; want %v, %v", b.out.Entries, b.out.OutFilter, tc.entries, tc.outFilter)
			}
		})
	}
}

// A path's real servers: its endpoints, or with none (a Local path with
// no local endpoint) the cluster's.
func TestPathReals(t *testing.T) {
	here, there := endpoint("10.244.0.5", 8080, true, true), endpoint("10.244.1.5", 8080, false, true)
	sel := state.Selection{Cluster: []*state.Endpoint{here, there}, Local: []*state.Endpoint{here}}
	for _, tc := range []struct {
		name string
		path state.Path
		want []netip.AddrPort
	}{
		{"its endpoints", state.Path{Local: true, Endpoints: sel.Local}, []netip.AddrPort{here.AddrPort()}},
		{"none: the cluster's", state.Path{Local: true}, []netip.AddrPort{here.AddrPort(), there.AddrPort()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pathReals(tc.path, sel); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%v, want %v", got, tc.want)
			}
		})
	}
}
