package ipvs

import (
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

var update = flag.Bool("update", false, "rewrite the golden files of pkg/ipvs/testdata")

func golden(t *testing.T, name, got string) {
	t.Helper()
	testutil.Golden(t, filepath.Join("testdata", name+".golden"), got, *update)
}

func testParams(t *testing.T, ipv6 bool) Params {
	t.Helper()
	family, cidr, nodeIP := v1.IPv4Protocol, "10.244.0.0/16", "10.255.0.2"
	if ipv6 {
		family, cidr, nodeIP = v1.IPv6Protocol, "fd00:244::/56", "fd00:255::2"
	}
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{cidr}}, family)
	if err != nil {
		t.Fatal(err)
	}
	return Params{IPv6: ipv6, Scheduler: "rr", MasqueradeBit: 14, LocalDetector: detector,
		NodeIP: netip.MustParseAddr(nodeIP)}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func endpoint(ip string, port int32, local, ready bool) *state.Endpoint {
	return &state.Endpoint{IP: netip.MustParseAddr(ip), Port: port, IsLocal: local, Ready: ready, Serving: ready}
}

func render(o ServiceObjects) string {
	var b strings.Builder
	for _, s := range o.Servers {
		fmt.Fprintf(&b, "server %s %s flags=%#x timeout=%d ->", s.VirtualServerKey, s.Scheduler, s.Flags, s.Timeout)
		for _, r := range s.Reals {
			fmt.Fprintf(&b, " %s", r)
		}
		b.WriteString("\n")
	}
	for _, a := range o.Bound {
		fmt.Fprintf(&b, "bind %s\n", a)
	}
	for _, e := range o.Entries {
		fmt.Fprintf(&b, "set %s %s\n", e.Set, e.Entry)
	}
	for _, r := range o.OutFilter {
		fmt.Fprintf(&b, "out-filter %s\n", r)
	}
	return b.String()
}

// Every kind of service port, as the IPVS mode programs it.
func TestServiceObjects(t *testing.T) {
	name := func(n string) state.ServicePortName {
		return state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: n}, Port: "p", Protocol: v1.ProtocolTCP}
	}
	ready := []*state.Endpoint{endpoint("10.244.0.5", 8080, true, true), endpoint("10.244.1.5", 8080, false, true)}
	cases := []struct {
		name string
		svc  state.ServicePort
		eps  []*state.Endpoint
	}{
		{"clusterip", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}, ready},
		{"affinity-udp", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.11"), Port: 53, Protocol: v1.ProtocolUDP, AffinityTimeoutSeconds: 600}, ready},
		{"no-endpoints", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.12"), Port: 80, Protocol: v1.ProtocolTCP}, nil},
		{"internal-local", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.13"), Port: 80, Protocol: v1.ProtocolTCP, InternalPolicyLocal: true}, ready},
		{"nodeport-local", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.14"), Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30080,
			ExternalPolicyLocal: true, HealthCheckNodePort: 31000}, ready},
		{"nodeport-local-none-here", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.15"), Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30081,
			ExternalPolicyLocal: true}, ready[1:]},
		{"nodeport-sctp", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.16"), Port: 80, Protocol: v1.ProtocolSCTP, NodePort: 30082}, ready},
		{"loadbalancer", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.17"), Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30083,
			// The second external IP is a node address: not bound.
			ExternalIPs: addrs("10.255.2.1", "10.255.0.2"), LoadBalancerIPs: addrs("10.255.3.1"),
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("10.255.1.0/24")}}, ready},
		{"loadbalancer-node-allowed", state.ServicePort{ClusterIP: netip.MustParseAddr("10.96.0.18"), Port: 80, Protocol: v1.ProtocolTCP,
			LoadBalancerIPs: addrs("10.255.3.2"), ExternalPolicyLocal: true,
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("10.255.0.0/24")}}, ready},
	}
	p := testParams(t, false)
	node := state.Node{Name: "node-1"}
	a := Addresses{Node: addrs("10.255.0.2", "10.255.1.1"), NodePort: addrs("10.255.0.2", "10.255.1.1")}
	var out strings.Builder
	for _, tc := range cases {
		svc := tc.svc
		svc.Name = name(tc.name)
		sel := state.Select(&svc, tc.eps, node)
		fmt.Fprintf(&out, "# %s\n%s\n", tc.name, render(p.ServiceObjects(&svc, tc.eps, sel, a)))
	}
	golden(t, "service-objects", out.String())
}

// The iptables chains around the sets: the rules of an empty set are left
// out, as upstream does.
func TestChains(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ipv6     bool
		nonEmpty []string
		masqAll  bool
	}{
		{"chains-empty", false, nil, false},
		{"chains-all-sets", false, []string{setLoopBack, setClusterIP, setExternalIP, setExternalIPLocal, setLoadBalancer,
			setLoadBalancerLocal, setLoadBalancerFW, setLoadBalancerSourceIP, setLoadBalancerSourceNet, setNodePortTCP,
			setNodePortLocalTCP, setNodePortUDP, setNodePortLocalUDP, setNodePortSCTP, setNodePortLocalSCTP}, false},
		{"chains-masquerade-all-ipv6", true, []string{setClusterIP}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testParams(t, tc.ipv6)
			p.MasqueradeAll = tc.masqAll
			chains := p.Chains(func(set string) bool { return slices.Contains(tc.nonEmpty, set) },
				[]iptables.Rule{"-s 10.255.3.1/32 -m ipvs --vproto 6 --vaddr 10.255.3.1 --vport 80 -j DROP"})
			var b strings.Builder
			for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
				fmt.Fprintf(&b, "*%s\n", table)
				for _, c := range chains[table] {
					fmt.Fprintf(&b, ":%s\n", c.Name)
				}
				for _, c := range chains[table] {
					for _, r := range c.Rules {
						fmt.Fprintf(&b, "-A %s %s\n", c.Name, r)
					}
				}
			}
			for _, j := range Jumps() {
				fmt.Fprintf(&b, "jump %s %s %s\n", j.Table, j.From, j.Rule)
			}
			golden(t, tc.name, b.String())
		})
	}
}
