package nftables

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// builderParams are node settings for the builder tests, with a
// ClusterCIDR local-traffic detector unless noDetector.
func builderParams(t *testing.T, noDetector bool) *Params {
	t.Helper()
	p := &Params{MasqueradeBit: 14, NodeIP: netip.MustParseAddr("10.250.0.2")}
	if !noDetector {
		d, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16"}}, v1.IPv4Protocol)
		if err != nil {
			t.Fatal(err)
		}
		p.LocalDetector = d
	}
	return p
}

// builderService is ns/web:http, TCP port 80 at 10.96.0.10, changed by
// mutate.
func builderService(mutate func(*state.ServicePort)) *state.ServicePort {
	svc := &state.ServicePort{Name: state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP},
		ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	if mutate != nil {
		mutate(svc)
	}
	return svc
}

// Endpoints on port 8080: one on this node, one elsewhere.
var (
	localEP  = &state.Endpoint{IP: netip.MustParseAddr("10.244.1.5"), Port: 8080, NodeName: "node-1", IsLocal: true, Ready: true, Serving: true}
	remoteEP = &state.Endpoint{IP: netip.MustParseAddr("10.244.2.5"), Port: 8080, NodeName: "node-2", Ready: true, Serving: true}
)

// builderLines are the objects one step of the builder added, one a
// line, hashed names replaced by their prefix and what they stand for:
// "map service-ips 10.96.0.10 . tcp . 80 : goto service-ns/web:http",
// "chain external-ns/web:http: <rule>", "set affinity-10.244.1.5:8080 ...".
func builderLines(svc *state.ServicePort, sel state.Selection, out ServiceObjects) []string {
	n, name := namesFor(svc.Name), svc.Name.String()
	pairs := []string{n.cluster, prefixService + name, n.local, prefixLocal + name, n.external, prefixExternal + name, n.firewall, prefixFirewall + name}
	for _, ep := range sel.All {
		base := endpointBase(svc.Name, ep)
		pairs = append(pairs, prefixEndpoint+base, prefixEndpoint+ep.String(), prefixAffinity+base, prefixAffinity+ep.String())
	}
	r := strings.NewReplacer(pairs...)
	var lines []string
	for _, e := range out.Elements {
		line := "set " + e.Set + " " + strings.Join(e.Key, " . ")
		if e.Map != "" {
			line = "map " + e.Map + " " + strings.Join(e.Key, " . ") + " : " + strings.Join(e.Value, " ")
		}
		if e.Comment != nil {
			line += ` comment "` + *e.Comment + `"`
		}
		lines = append(lines, r.Replace(line))
	}
	for _, c := range out.Chains {
		for _, rule := range c.Rules {
			lines = append(lines, r.Replace("chain "+c.Name+": "+rule))
		}
		for _, rule := range c.Upstream {
			lines = append(lines, r.Replace("upstream "+c.Name+": "+rule))
		}
	}
	for _, s := range out.Sets {
		lines = append(lines, r.Replace("set "+s.Name+" "+s.Type+" timeout "+s.Timeout.String()))
	}
	return lines
}

type builderCase struct {
	name       string
	svc        func(*state.ServicePort)
	eps        []*state.Endpoint
	noDetector bool
	want       []string
}

// runBuilder runs one step of the builder (step) for each case.
func runBuilder(t *testing.T, step func(*svcBuilder), cases []builderCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := builderService(tc.svc)
			sel := state.Select(svc, tc.eps, state.Node{Name: "node-1"})
			b := newSvcBuilder(builderParams(t, tc.noDetector), svc, sel)
			step(b)
			if got := builderLines(svc, sel, b.out); !slices.Equal(got, tc.want) {
				t.Errorf("got\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(tc.want, "\n\t"))
			}
		})
	}
}

var (
	withInternalLocal = func(s *state.ServicePort) { s.InternalPolicyLocal = true }
	withExternalIP    = func(s *state.ServicePort) { s.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1")} }
	withExternalLocal = func(s *state.ServicePort) {
		withExternalIP(s)
		s.ExternalPolicyLocal = true
	}
	withLoadBalancer = func(s *state.ServicePort) {
		s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")}
	}
	withSourceRanges = func(ranges ...string) func(*state.ServicePort) {
		return func(s *state.ServicePort) {
			withLoadBalancer(s)
			for _, r := range ranges {
				s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
		}
	}
	withNodePort = func(s *state.ServicePort) { s.NodePort = 30080 }
	withAffinity = func(s *state.ServicePort) { s.AffinityTimeoutSeconds = 600 }
	bothEPs      = []*state.Endpoint{localEP, remoteEP}
)

func TestServiceObjectsClusterIP(t *testing.T) {
	runBuilder(t, (*svcBuilder).clusterIP, []builderCase{
		{name: "served: to the cluster policy chain", eps: bothEPs, want: []string{
			"set cluster-ips 10.96.0.10",
			"map service-ips 10.96.0.10 . tcp . 80 : goto service-ns/web:http"}},
		{name: "internal policy Local: to the local policy chain", svc: withInternalLocal, eps: bothEPs, want: []string{
			"set cluster-ips 10.96.0.10",
			"map service-ips 10.96.0.10 . tcp . 80 : goto local-ns/web:http"}},
		{name: "internal policy Local, endpoints elsewhere only: dropped", svc: withInternalLocal, eps: []*state.Endpoint{remoteEP}, want: []string{
			"set cluster-ips 10.96.0.10",
			`map no-endpoint-services 10.96.0.10 . tcp . 80 : drop comment "ns/web:http"`}},
		{name: "no endpoints: rejected", want: []string{
			"set cluster-ips 10.96.0.10",
			`map no-endpoint-services 10.96.0.10 . tcp . 80 : goto reject-chain comment "ns/web:http"`}},
	})
}

func TestServiceObjectsExternalIPs(t *testing.T) {
	runBuilder(t, (*svcBuilder).externalIPs, []builderCase{
		{name: "none", eps: bothEPs},
		{name: "to the external chain", svc: withExternalIP, eps: bothEPs, want: []string{
			"map service-ips 198.51.100.1 . tcp . 80 : goto external-ns/web:http"}},
		{name: "policy Local, no local endpoint: the external chain for pods and the node, dropped otherwise",
			svc: withExternalLocal, eps: []*state.Endpoint{remoteEP}, want: []string{
				"map service-ips 198.51.100.1 . tcp . 80 : goto external-ns/web:http",
				`map no-endpoint-services 198.51.100.1 . tcp . 80 : drop comment "ns/web:http"`}},
		{name: "no endpoints: rejected", svc: withExternalIP, want: []string{
			`map no-endpoint-services 198.51.100.1 . tcp . 80 : goto reject-chain comment "ns/web:http"`}},
	})
}

func TestServiceObjectsLoadBalancerIPs(t *testing.T) {
	runBuilder(t, (*svcBuilder).loadBalancerIPs, []builderCase{
		{name: "to the external chain", svc: withLoadBalancer, eps: bothEPs, want: []string{
			"map service-ips 192.0.2.10 . tcp . 80 : goto external-ns/web:http",
			"map service-ips 192.0.2.11 . tcp . 80 : goto external-ns/web:http"}},
		{name: "source ranges: through the firewall chain", svc: withSourceRanges("203.0.113.0/24"), eps: bothEPs, want: []string{
			"map service-ips 192.0.2.10 . tcp . 80 : goto external-ns/web:http",
			"map firewall-ips 192.0.2.10 . tcp . 80 : goto firewall-ns/web:http",
			"map service-ips 192.0.2.11 . tcp . 80 : goto external-ns/web:http",
			"map firewall-ips 192.0.2.11 . tcp . 80 : goto firewall-ns/web:http"}},
		{name: "no endpoints: the firewall still, the unserved after every address", svc: withSourceRanges("203.0.113.0/24"), want: []string{
			"map firewall-ips 192.0.2.10 . tcp . 80 : goto firewall-ns/web:http",
			"map firewall-ips 192.0.2.11 . tcp . 80 : goto firewall-ns/web:http",
			`map no-endpoint-services 192.0.2.10 . tcp . 80 : goto reject-chain comment "ns/web:http"`,
			`map no-endpoint-services 192.0.2.11 . tcp . 80 : goto reject-chain comment "ns/web:http"`}},
	})
}

func TestServiceObjectsNodePort(t *testing.T) {
	runBuilder(t, (*svcBuilder).nodePort, []builderCase{
		{name: "none", eps: bothEPs},
		{name: "to the external chain", svc: withNodePort, eps: bothEPs, want: []string{
			"map service-nodeports tcp . 30080 : goto external-ns/web:http"}},
		{name: "policy Local, no local endpoint", svc: func(s *state.ServicePort) {
			withNodePort(s)
			s.ExternalPolicyLocal = true
		}, eps: []*state.Endpoint{remoteEP}, want: []string{
			"map service-nodeports tcp . 30080 : goto external-ns/web:http",
			`map no-endpoint-nodeports tcp . 30080 : drop comment "ns/web:http"`}},
	})
	t.Run("localhost NodePorts rejected", func(t *testing.T) {
		svc := builderService(withNodePort)
		sel := state.Select(svc, bothEPs, state.Node{Name: "node-1"})
		p := builderParams(t, false)
		p.LocalhostNodePorts = LocalhostNodePortsReject
		b := newSvcBuilder(p, svc, sel)
		b.nodePort()
		want := []string{"map service-nodeports tcp . 30080 : goto external-ns/web:http",
			"map localhost-nodeport-reject-ports tcp . 30080 : goto localhost-nodeport-reject-tcp"}
		if got := builderLines(svc, sel, b.out); !slices.Equal(got, want) {
			t.Errorf("got %q, want %q", got, want)
		}
	})
}

func TestServiceObjectsHairpin(t *testing.T) {
	runBuilder(t, (*svcBuilder).hairpin, []builderCase{
		{name: "local endpoints only", eps: bothEPs, want: []string{"set hairpin-connections 10.244.1.5 . 10.244.1.5 . tcp . 8080"}},
	})
}

func TestServiceObjectsExternalChain(t *testing.T) {
	localTraffic := []string{
		"chain external-ns/web:http: fib saddr type local meta mark set meta mark | 0x00004000 comment \"masquerade local traffic\"",
		"chain external-ns/web:http: fib saddr type local goto service-ns/web:http comment \"short-circuit local traffic\""}
	podTraffic := "chain external-ns/web:http: ip saddr 10.244.0.0/16 goto service-ns/web:http comment \"short-circuit pod traffic\""
	runBuilder(t, (*svcBuilder).externalChain, []builderCase{
		{name: "no external address: none", eps: bothEPs},
		{name: "no endpoints: none", svc: withExternalIP},
		{name: "policy Cluster: masquerade", svc: withExternalIP, eps: bothEPs, want: []string{
			"chain external-ns/web:http: meta mark set meta mark | 0x00004000 comment \"masquerade\"",
			"chain external-ns/web:http: goto service-ns/web:http"}},
		{name: "policy Local: pods and the node short-circuited", svc: withExternalLocal, eps: bothEPs,
			want: append([]string{podTraffic}, append(localTraffic, "chain external-ns/web:http: goto local-ns/web:http")...)},
		{name: "policy Local without local-traffic detection", svc: withExternalLocal, eps: bothEPs, noDetector: true,
			want: append(slices.Clone(localTraffic), "chain external-ns/web:http: goto local-ns/web:http")},
		{name: "policy Local, no local endpoint: short-circuits only", svc: withExternalLocal, eps: []*state.Endpoint{remoteEP},
			want: append([]string{podTraffic}, localTraffic...)},
	})
}

func TestServiceObjectsFirewallChain(t *testing.T) {
	runBuilder(t, (*svcBuilder).firewallChain, []builderCase{
		{name: "no source ranges: none", svc: withLoadBalancer, eps: bothEPs},
		{name: "source ranges", svc: withSourceRanges("203.0.113.0/24", "198.51.100.0/25", "198.51.100.128/25"), eps: bothEPs, want: []string{
			"chain firewall-ns/web:http: ip saddr != { 198.51.100.0/24, 203.0.113.0/24 } drop"}},
		{name: "a range with the node IP: the load-balancer IPs too", svc: withSourceRanges("10.250.0.0/24"), eps: bothEPs, want: []string{
			"chain firewall-ns/web:http: ip saddr != { 10.250.0.0/24, 192.0.2.10/31 } drop"}},
	})
}

func TestServiceObjectsPolicyChains(t *testing.T) {
	runBuilder(t, (*svcBuilder).policyChains, []builderCase{
		{name: "no endpoints: none"},
		{name: "policy Cluster: a cascade over every endpoint", eps: bothEPs, want: []string{
			"chain service-ns/web:http: meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.5:8080",
			"chain service-ns/web:http: meta l4proto tcp dnat to 10.244.2.5:8080",
			"upstream service-ns/web:http: meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.5 . 8080 }"}},
		{name: "internal policy Local: the local chain only", svc: withInternalLocal, eps: bothEPs, want: []string{
			"chain local-ns/web:http: meta l4proto tcp dnat to 10.244.1.5:8080",
			"upstream local-ns/web:http: meta l4proto tcp dnat ip to numgen random mod 1 map { 0 : 10.244.1.5 . 8080 }"}},
		{name: "external policy Local: both", svc: withExternalLocal, eps: bothEPs, want: []string{
			"chain service-ns/web:http: meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.5:8080",
			"chain service-ns/web:http: meta l4proto tcp dnat to 10.244.2.5:8080",
			"upstream service-ns/web:http: meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.5 . 8080 }",
			"chain local-ns/web:http: meta l4proto tcp dnat to 10.244.1.5:8080",
			"upstream local-ns/web:http: meta l4proto tcp dnat ip to numgen random mod 1 map { 0 : 10.244.1.5 . 8080 }"}},
		{name: "affinity: a client seen before to its endpoint, a new one at random", svc: withAffinity, eps: bothEPs, want: []string{
			"chain service-ns/web:http: ip saddr @affinity-10.244.1.5:8080 goto endpoint-10.244.1.5:8080",
			"chain service-ns/web:http: ip saddr @affinity-10.244.2.5:8080 goto endpoint-10.244.2.5:8080",
			"chain service-ns/web:http: numgen random mod 2 0 goto endpoint-10.244.1.5:8080",
			"chain service-ns/web:http: goto endpoint-10.244.2.5:8080",
			"upstream service-ns/web:http: ip saddr @affinity-10.244.1.5:8080 goto endpoint-10.244.1.5:8080",
			"upstream service-ns/web:http: ip saddr @affinity-10.244.2.5:8080 goto endpoint-10.244.2.5:8080",
			"upstream service-ns/web:http: numgen random mod 2 vmap { 0 : goto endpoint-10.244.1.5:8080, 1 : goto endpoint-10.244.2.5:8080 }"}},
	})
}

func TestServiceObjectsAffinityChains(t *testing.T) {
	runBuilder(t, (*svcBuilder).affinityChains, []builderCase{
		{name: "no affinity: none", eps: bothEPs},
		{name: "each endpoint's set and chain", svc: withAffinity, eps: bothEPs, want: []string{
			"chain endpoint-10.244.1.5:8080: update @affinity-10.244.1.5:8080 { ip saddr }",
			"chain endpoint-10.244.1.5:8080: meta l4proto tcp dnat to 10.244.1.5:8080",
			"chain endpoint-10.244.2.5:8080: update @affinity-10.244.2.5:8080 { ip saddr }",
			"chain endpoint-10.244.2.5:8080: meta l4proto tcp dnat to 10.244.2.5:8080",
			"set affinity-10.244.1.5:8080 ipv4_addr timeout 10m0s",
			"set affinity-10.244.2.5:8080 ipv4_addr timeout 10m0s"}},
	})
}

// Planning twice gives the same objects and leaves the service as it was
// (the firewall chain adds to a copy of the source ranges), and the
// elements never outgrow the room made for them.
func TestServiceObjectsPure(t *testing.T) {
	svc := builderService(func(s *state.ServicePort) {
		withExternalLocal(s)
		withSourceRanges("10.250.0.0/24")(s)
		withNodePort(s)
		withAffinity(s)
		// Room to append into: a copy must be made.
		s.LoadBalancerSourceRanges = slices.Grow(s.LoadBalancerSourceRanges, 4)
	})
	before := *svc
	before.LoadBalancerSourceRanges = slices.Clone(svc.LoadBalancerSourceRanges)
	sel := state.Select(svc, bothEPs, state.Node{Name: "node-1"})
	p := builderParams(t, false)
	p.LocalhostNodePorts = LocalhostNodePortsReject
	first, second := p.ServiceObjects(svc, sel), p.ServiceObjects(svc, sel)
	if !reflect.DeepEqual(first, second) {
		t.Errorf("planned twice, different objects:\n%v\n%v", first, second)
	}
	spare := svc.LoadBalancerSourceRanges[len(svc.LoadBalancerSourceRanges):cap(svc.LoadBalancerSourceRanges)]
	if !reflect.DeepEqual(*svc, before) || slices.ContainsFunc(spare, netip.Prefix.IsValid) {
		t.Errorf("the service changed: %+v, was %+v", *svc, before)
	}
	if len(first.Elements) > mostElements(svc, sel) {
		t.Errorf("%d elements, room for %d", len(first.Elements), mostElements(svc, sel))
	}
}
