package nftables

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// samplePath is what upstream v1.36.3 wrote for sampleObjects.
const samplePath = "testdata/upstream-nftables-sample.txt"

var (
	http80   = []port{{name: "http", protocol: v1.ProtocolTCP, port: 80}}
	ep8080   = []port{{name: "http", protocol: v1.ProtocolTCP, port: 8080}}
	sampleV4 = Params{MasqueradeBit: 14, NodePortAddresses: []netip.Addr{netip.MustParseAddr("10.250.0.2")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}, NodeIP: netip.MustParseAddr("10.250.0.2")}
)

// sampleObjects is the API state of upstream's sample (its header says
// which): every kind of service.
func sampleObjects() []any {
	return []any{
		service("hx-conf", "fid-a", "10.96.10.30", []port{{"http", v1.ProtocolTCP, 80, 0}, {"dns", v1.ProtocolUDP, 53, 0}}, func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}),
		endpointSlice("hx-conf", "fid-a", []port{{"http", v1.ProtocolTCP, 8080, 0}, {"dns", v1.ProtocolUDP, 8080, 0}},
			ep("10.244.1.11"), ep("10.244.1.12"), ep("10.244.1.13")),
		service("hx-conf", "fid-b", "10.96.10.31", []port{{"http", v1.ProtocolTCP, 80, 31168}}, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalIPs = []string{"198.51.100.31"}
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.10/32"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.32"}}
		}),
		endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.11"), ep("10.244.1.12", "node=node-2")),
		service("hx-conf", "fid-c", "10.96.10.33", []port{{"http", v1.ProtocolTCP, 80, 31746}}, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
		}),
		endpointSlice("hx-conf", "fid-c", ep8080, ep("10.244.1.13", "node=node-2"), ep("10.244.1.14", "terminating")),
		service("hx-conf", "fid-d", "10.96.10.34", http80, nil),
		service("default", "kubernetes", "10.96.0.1", []port{{"https", v1.ProtocolTCP, 443, 0}}, nil),
		endpointSlice("default", "kubernetes", []port{{"https", v1.ProtocolTCP, 26443, 0}}, ep("10.251.0.1", "node=")),
	}
}

type goldenCase struct {
	name   string
	family v1.IPFamily
	params func(t *testing.T) Params
	objs   []any
}

// ipFamily is the case's family: IPv4 unless it names one.
func (tc goldenCase) ipFamily() v1.IPFamily {
	if tc.family == "" {
		return v1.IPv4Protocol
	}
	return tc.family
}

// firstSync puts the case's node and objects into the harness and runs
// its first full sync.
func (tc goldenCase) firstSync(h *harness) {
	if tc.name == "topology" {
		h.node.Zone = "zone-a"
	}
	h.apply(tc.objs...)
	h.full()
}

func v4(mutate func(*Params)) func(t *testing.T) Params {
	return func(t *testing.T) Params {
		p := sampleV4
		p.LocalDetector = detector(t, "ClusterCIDR", v1.IPv4Protocol, "10.244.0.0/16")
		if mutate != nil {
			mutate(&p)
		}
		return p
	}
}

var goldenCases = []goldenCase{
	{name: "sample-ipv4", params: v4(nil), objs: sampleObjects()},
	{name: "sample-ipv6", family: v1.IPv6Protocol, params: func(t *testing.T) Params { return Params{MasqueradeBit: 14} }},
	{name: "masquerade-all", params: v4(func(p *Params) { p.MasqueradeAll = true }), objs: sampleObjects()},
	{name: "nodeport-addresses-all", params: v4(func(p *Params) { p.NodePortAddresses = nil }), objs: nodePortObjects()},
	{name: "nodeport-addresses-cidr", params: v4(func(p *Params) {
		// A CIDR matching two addresses and localhost, which is skipped.
		p.NodePortAddresses = []netip.Addr{netip.MustParseAddr("10.250.0.2"), netip.MustParseAddr("10.250.0.3"), netip.MustParseAddr("127.0.0.1")}
	}), objs: nodePortObjects()},
	{name: "no-service-cidrs-no-detection", params: v4(func(p *Params) {
		p.ServiceCIDRs, p.LocalDetector = nil, detector(t0, "", v1.IPv4Protocol, "")
	}), objs: sampleObjects()},
	{name: "bridge-detection", params: v4(func(p *Params) { p.LocalDetector = detector(t0, "BridgeInterface", v1.IPv4Protocol, "") }), objs: sampleObjects()},
	{name: "ipv6", family: v1.IPv6Protocol, params: func(t *testing.T) Params {
		return Params{MasqueradeBit: 14, LocalDetector: detector(t, "ClusterCIDR", v1.IPv6Protocol, "fd00:244::/56"),
			ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:96::/112"), netip.MustParsePrefix("fd00:97::/112")}, NodeIP: netip.MustParseAddr("fd00:250::2")}
	}, objs: []any{
		service("ns", "web", "fd00:96::10", []port{{"http", v1.ProtocolTCP, 80, 30080}}, func(s *v1.Service) {
			s.Spec.Type, s.Spec.IPFamilies = v1.ServiceTypeNodePort, []v1.IPFamily{v1.IPv6Protocol}
		}),
		endpointSlice("ns", "web", ep8080, ep("fd00:244::5"), ep("fd00:244:1::7", "node=node-2")),
		service("ns", "sticky", "fd00:96::11", http80, func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(600))}}
		}),
		endpointSlice("ns", "sticky", ep8080, ep("fd00:244::5")),
	}},
	{name: "sctp", params: v4(nil), objs: []any{
		service("ns", "assoc", "10.96.0.12", []port{{"s", v1.ProtocolSCTP, 9999, 30999}}, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort }),
		endpointSlice("ns", "assoc", []port{{"s", v1.ProtocolSCTP, 9999, 0}}, ep("10.244.1.5")),
	}},
	{name: "no-local-endpoints-drop", params: v4(nil), objs: []any{
		// eTP and iTP Local with endpoints only elsewhere: drop, not reject.
		service("ns", "lb", "10.96.0.13", []port{{"http", v1.ProtocolTCP, 80, 30013}}, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalIPs = []string{"198.51.100.13"}
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.14"}}
		}),
		endpointSlice("ns", "lb", ep8080, ep("10.244.2.5", "node=node-2")),
		// No endpoints at all: reject, for every address.
		service("ns", "none", "10.96.0.14", []port{{"http", v1.ProtocolTCP, 80, 30014}}, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalIPs = []string{"198.51.100.15"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.16"}}
		}),
	}},
	{name: "source-ranges-with-node-ip", params: v4(nil), objs: []any{
		service("ns", "lb", "10.96.0.15", http80, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "10.250.0.0/24", "198.51.100.0/25", "198.51.100.128/25"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.10"}, {IP: "192.0.2.11"}}
		}),
		endpointSlice("ns", "lb", ep8080, ep("10.244.1.5"), ep("10.244.2.5", "node=node-2")),
	}},
	{name: "affinity-local", params: v4(nil), objs: []any{
		service("ns", "sticky", "10.96.0.16", []port{{"http", v1.ProtocolTCP, 80, 30016}}, func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}),
		endpointSlice("ns", "sticky", ep8080, ep("10.244.1.5"), ep("10.244.2.5", "node=node-2")),
	}},
	{name: "topology", params: v4(nil), objs: []any{
		service("ns", "zonal", "10.96.0.17", http80, nil),
		endpointSlice("ns", "zonal", ep8080, ep("10.244.1.5", "hint=zone-a"), ep("10.244.2.5", "node=node-2", "hint=zone-b"), ep("10.244.3.5", "node=node-3", "hint=zone-a")),
	}},
	// A family the node has no IP of (its ip table on an IPv6-only node,
	// its ip6 table on an IPv4-only one): NodePorts on every local address
	// but loopback, as upstream's default "primary" gives, and loopback as
	// the node IP, which source ranges holding it let through.
	{name: "no-node-ip-ipv4", params: v4(func(p *Params) {
		p.NodePortAddresses, p.NodeIP = nil, netip.MustParseAddr("127.0.0.1")
	}), objs: noNodeIPObjects("10.96.0.", "10.244.1.5", "192.0.2.20", "203.0.113.0/24", "127.0.0.0/8")},
	{name: "no-node-ip-ipv6", family: v1.IPv6Protocol, params: func(t *testing.T) Params {
		return Params{MasqueradeBit: 14, LocalDetector: detector(t, "ClusterCIDR", v1.IPv6Protocol, "fd00:244::/56"),
			ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:96::/112")}, NodeIP: netip.IPv6Loopback()}
	}, objs: noNodeIPObjects("fd00:96::", "fd00:244::5", "2001:db8::20", "2001:db8:1::/64", "::1/128")},
	// Gate KubeProxyNFTablesLocalhostNodePorts on: without loopback in
	// nodePortAddresses every localhost NodePort is rejected and counted;
	// with it, TCP is left to the userspace proxy.
	{name: "localhost-nodeports-reject", params: v4(func(p *Params) { p.LocalhostNodePorts = LocalhostNodePortsReject }), objs: localhostNodePortObjects()},
	{name: "localhost-nodeports-proxy", params: v4(func(p *Params) {
		p.NodePortAddresses, p.LocalhostNodePorts = nil, LocalhostNodePortsProxy
	}), objs: localhostNodePortObjects()},
	{name: "localhost-nodeports-proxy-ipv6", family: v1.IPv6Protocol, params: func(t *testing.T) Params {
		return Params{MasqueradeBit: 14, LocalhostNodePorts: LocalhostNodePortsProxy, NodePortAddresses: []netip.Addr{}}
	}, objs: []any{
		service("ns", "np", "fd00:96::20", []port{{"http", v1.ProtocolTCP, 80, 30020}, {"dns", v1.ProtocolUDP, 53, 30053}}, func(s *v1.Service) {
			s.Spec.Type, s.Spec.IPFamilies = v1.ServiceTypeNodePort, []v1.IPFamily{v1.IPv6Protocol}
		}),
		endpointSlice("ns", "np", []port{{"http", v1.ProtocolTCP, 8080, 0}, {"dns", v1.ProtocolUDP, 5353, 0}}, ep("fd00:244::5")),
	}},
}

// localhostNodePortObjects are NodePorts of each protocol, one of them
// without endpoints, and a ClusterIP service.
func localhostNodePortObjects() []any {
	return append(nodePortObjects(),
		service("ns", "assoc", "10.96.0.12", []port{{"s", v1.ProtocolSCTP, 9999, 30999}}, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort }),
		endpointSlice("ns", "assoc", []port{{"s", v1.ProtocolSCTP, 9999, 0}}, ep("10.244.1.5")),
		service("ns", "empty", "10.96.0.21", []port{{"http", v1.ProtocolTCP, 80, 30021}}, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort }),
		service("ns", "plain", "10.96.0.22", http80, nil),
	)
}

// noNodeIPObjects are a NodePort service and a load balancer whose source
// ranges hold the family's loopback address, with ClusterIPs
// clusterIPPrefix+"20" and +"21".
func noNodeIPObjects(clusterIPPrefix, endpoint, lbIP string, sourceRanges ...string) []any {
	family := v1.IPv4Protocol
	if netip.MustParseAddr(endpoint).Is6() {
		family = v1.IPv6Protocol
	}
	return []any{
		service("ns", "np", clusterIPPrefix+"20", []port{{"http", v1.ProtocolTCP, 80, 30020}}, func(s *v1.Service) {
			s.Spec.Type, s.Spec.IPFamilies = v1.ServiceTypeNodePort, []v1.IPFamily{family}
		}),
		endpointSlice("ns", "np", ep8080, ep(endpoint)),
		service("ns", "lb", clusterIPPrefix+"21", []port{{"http", v1.ProtocolTCP, 80, 30021}}, func(s *v1.Service) {
			s.Spec.Type, s.Spec.IPFamilies = v1.ServiceTypeLoadBalancer, []v1.IPFamily{family}
			s.Spec.LoadBalancerSourceRanges = sourceRanges
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: lbIP}}
		}),
		endpointSlice("ns", "lb", ep8080, ep(endpoint)),
	}
}

// t0 stands in for a test where a detector cannot fail.
var t0 = &testing.T{}

func nodePortObjects() []any {
	return []any{
		service("ns", "np", "10.96.0.20", []port{{"http", v1.ProtocolTCP, 80, 30020}, {"dns", v1.ProtocolUDP, 53, 30053}}, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort }),
		endpointSlice("ns", "np", []port{{"http", v1.ProtocolTCP, 8080, 0}, {"dns", v1.ProtocolUDP, 5353, 0}}, ep("10.244.1.5")),
	}
}

// The first sync of each case into an empty table, compared with
// testdata/<name>.golden (go test -update rewrites them).
func TestGoldenTables(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.ipFamily(), tc.params(t))
			tc.firstSync(h)
			testutil.Golden(t, filepath.Join("testdata", tc.name+".golden"), dump(h.nft.Fake), *update)
		})
	}
}

// The golden files of the sample hold what upstream v1.36.3 wrote, its
// listing read by our parser and dumped the same way, but for the chains
// where ours spread connections with a cascade of rules: with those in
// upstream's form (Chain.Upstream), they are the same.
func TestGoldenIsUpstreamSample(t *testing.T) {
	sample, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range goldenCases[:2] {
		t.Run(tc.name, func(t *testing.T) {
			family, table := knftables.IPv4Family, "table ip kube-proxy {"
			if tc.family == v1.IPv6Protocol {
				family, table = knftables.IPv6Family, "table ip6 kube-proxy {"
			}
			parsed, err := parseTable(strings.NewReader(sampleTable(t, string(sample), table)))
			if err != nil {
				t.Fatal(err)
			}
			golden, err := os.ReadFile(filepath.Join("testdata", tc.name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, cmp.Or(tc.family, v1.IPv4Protocol), tc.params(t))
			h.apply(tc.objs...)
			h.full()
			want := string(golden)
			// The syncer keeps no rule text: the rules come from the pure
			// function, as applied.
			for name := range h.syncer.applied {
				for _, c := range h.syncer.objectsFor(h.view(), name).Chains {
					if c.Upstream != nil {
						want = strings.Replace(want, ruleLines(family, c.Name, c.Rules), ruleLines(family, c.Name, c.Upstream), 1)
					}
				}
			}
			if got := dump(replay(t, parsed, family)); got != want {
				t.Errorf("upstream's sample (-) and our golden file in upstream's form (+) differ:\n%s", testutil.LineDiff(got, want))
			}
		})
	}
}

// ruleLines are a chain's rules as dump prints them.
func ruleLines(family knftables.Family, chain string, rules []string) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "add rule %s %s %s %s\n", family, TableName, chain, r)
	}
	return b.String()
}

// sampleTable cuts one table out of the sample.
func sampleTable(t *testing.T, sample, header string) string {
	start := strings.Index(sample, header)
	if start < 0 {
		t.Fatalf("no %q in the sample", header)
	}
	end := strings.Index(sample[start:], "\n}\n")
	if end < 0 {
		end = len(sample) - start - 2
	}
	return sample[start : start+end+3]
}
