package iptables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// builderCase is one service port for a rule builder: the service, its
// endpoints (local unless named remote) and the node's parameters.
type builderCase struct {
	name   string
	params Params
	svc    func(*state.ServicePort)
	// eps are endpoint IPs; "remote:" before one puts it on another node.
	eps []string
	// want are the rules built, shared as "table chain rule", own as
	// "chain: rule", with SVC, SVL, EXT, FW and SEP<n> for the service's
	// chains.
	want []string
}

// buildRules runs one builder on the case's service port.
func buildRules(t *testing.T, tc builderCase, build func(*serviceBuilder)) []string {
	t.Helper()
	svc := &state.ServicePort{Name: state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "p", Protocol: v1.ProtocolTCP},
		Protocol: v1.ProtocolTCP, Port: 80, ClusterIP: netip.MustParseAddr("10.96.0.10")}
	if tc.svc != nil {
		tc.svc(svc)
	}
	var eps []*state.Endpoint
	for _, ip := range tc.eps {
		node := "node-1"
		if remote, ok := strings.CutPrefix(ip, "remote:"); ok {
			ip, node = remote, "node-2"
		}
		eps = append(eps, &state.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true, NodeName: node, IsLocal: node == "node-1"})
	}
	params := tc.params
	if params.MasqueradeBit == 0 {
		params.MasqueradeBit = 14
	}
	b := newServiceBuilder(&params, svc, state.Select(svc, eps, state.Node{Name: "node-1"}))
	build(b)

	replace := func(s string) string {
		s = strings.NewReplacer(string(b.names.cluster), "SVC", string(b.names.local), "SVL", string(b.names.external), "EXT", string(b.names.firewall), "FW").Replace(s)
		for i, ep := range eps {
			s = strings.ReplaceAll(s, string(b.names.endpointChain(ep)), "SEP"+string(rune('1'+i)))
		}
		return s
	}
	var got []string
	for _, r := range b.out.Shared {
		got = append(got, replace(string(r.Table)+" "+string(r.Chain)+" "+string(r.Rule)))
	}
	for _, c := range b.out.Chains {
		for _, r := range c.Rules {
			got = append(got, replace(string(c.Name)+": "+string(r)))
		}
	}
	return got
}

func runBuilderCases(t *testing.T, build func(*serviceBuilder), cases []builderCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := buildRules(t, tc, build); !slices.Equal(got, tc.want) {
				t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

const webMatch = `-m tcp -p tcp -d 10.96.0.10 --dport 80`

func TestClusterIPRules(t *testing.T) {
	runBuilderCases(t, (*serviceBuilder).clusterIPRules, []builderCase{
		{name: "served", eps: []string{"10.244.0.5"},
			want: []string{`nat KUBE-SERVICES -m comment --comment "ns/web:p cluster IP" ` + webMatch + ` -j SVC`}},
		{name: "no endpoints",
			want: []string{`filter KUBE-SERVICES -m comment --comment "ns/web:p has no endpoints" ` + webMatch + ` -j REJECT`}},
		{name: "local policy, no local endpoint", svc: func(s *state.ServicePort) { s.InternalPolicyLocal = true }, eps: []string{"remote:10.244.1.5"},
			want: []string{`filter KUBE-SERVICES -m comment --comment "ns/web:p has no local endpoints" ` + webMatch + ` -j DROP`}},
		{name: "local policy", svc: func(s *state.ServicePort) { s.InternalPolicyLocal = true }, eps: []string{"10.244.0.5"},
			want: []string{`nat KUBE-SERVICES -m comment --comment "ns/web:p cluster IP" ` + webMatch + ` -j SVL`}},
	})
}

func withExternalIP(s *state.ServicePort) {
	s.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
}

func TestExternalIPRules(t *testing.T) {
	runBuilderCases(t, (*serviceBuilder).externalIPRules, []builderCase{
		{name: "none", eps: []string{"10.244.0.5"}},
		{name: "served", svc: withExternalIP, eps: []string{"10.244.0.5"},
			want: []string{`nat KUBE-SERVICES -m comment --comment "ns/web:p external IP" -m tcp -p tcp -d 192.0.2.1 --dport 80 -j EXT`}},
		{name: "no endpoints", svc: withExternalIP,
			want: []string{`filter KUBE-EXTERNAL-SERVICES -m comment --comment "ns/web:p has no endpoints" -m tcp -p tcp -d 192.0.2.1 --dport 80 -j REJECT`}},
		{name: "local policy, no local endpoint", svc: func(s *state.ServicePort) { withExternalIP(s); s.ExternalPolicyLocal = true }, eps: []string{"remote:10.244.1.5"},
			want: []string{
				`nat KUBE-SERVICES -m comment --comment "ns/web:p external IP" -m tcp -p tcp -d 192.0.2.1 --dport 80 -j EXT`,
				`filter KUBE-EXTERNAL-SERVICES -m comment --comment "ns/web:p has no local endpoints" -m tcp -p tcp -d 192.0.2.1 --dport 80 -j DROP`}},
	})
}

func withLoadBalancer(s *state.ServicePort) {
	s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1")}
}

func withSourceRange(s *state.ServicePort) {
	withLoadBalancer(s)
	s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
}

func TestLoadBalancerRules(t *testing.T) {
	runBuilderCases(t, (*serviceBuilder).loadBalancerRules, []builderCase{
		{name: "served", svc: withLoadBalancer, eps: []string{"10.244.0.5"},
			want: []string{`nat KUBE-SERVICES -m comment --comment "ns/web:p loadbalancer IP" -m tcp -p tcp -d 198.51.100.1 --dport 80 -j EXT`}},
		{name: "source ranges", svc: withSourceRange, eps: []string{"10.244.0.5"},
			want: []string{
				`nat KUBE-SERVICES -m comment --comment "ns/web:p loadbalancer IP" -m tcp -p tcp -d 198.51.100.1 --dport 80 -j FW`,
				`filter KUBE-PROXY-FIREWALL -m comment --comment "ns/web:p traffic not accepted by FW" -m tcp -p tcp -d 198.51.100.1 --dport 80 -j DROP`}},
		{name: "source ranges, no endpoints", svc: withSourceRange,
			want: []string{`filter KUBE-EXTERNAL-SERVICES -m comment --comment "ns/web:p has no endpoints" -m tcp -p tcp -d 198.51.100.1 --dport 80 -j REJECT`}},
	})
}

func TestFirewallChain(t *testing.T) {
	fromRange := `FW: -m comment --comment "ns/web:p loadbalancer IP" -s 203.0.113.0/24 -j EXT`
	dropped := `FW: -m comment --comment "other traffic to ns/web:p will be dropped by KUBE-PROXY-FIREWALL"`
	runBuilderCases(t, (*serviceBuilder).firewallChain, []builderCase{
		{name: "no source ranges", svc: withLoadBalancer, eps: []string{"10.244.0.5"}},
		{name: "source ranges, no endpoints", svc: withSourceRange},
		{name: "source ranges", svc: withSourceRange, eps: []string{"10.244.0.5"}, want: []string{fromRange, dropped}},
		{name: "node in a range", params: Params{NodeIP: netip.MustParseAddr("203.0.113.7")}, svc: withSourceRange, eps: []string{"10.244.0.5"},
			want: []string{fromRange, `FW: -m comment --comment "ns/web:p loadbalancer IP" -s 198.51.100.1 -j EXT`, dropped}},
	})
}

func withNodePort(s *state.ServicePort) { s.NodePort = 30080 }

func TestNodePortRules(t *testing.T) {
	general := `nat KUBE-NODEPORTS -m comment --comment "ns/web:p" -m tcp -p tcp --dport 30080 -j EXT`
	runBuilderCases(t, (*serviceBuilder).nodePortRules, []builderCase{
		{name: "none", eps: []string{"10.244.0.5"}},
		{name: "served", svc: withNodePort, eps: []string{"10.244.0.5"}, want: []string{general}},
		{name: "counted localhost", params: Params{LocalhostNodePorts: true, NFAcct: true}, svc: withNodePort, eps: []string{"10.244.0.5"},
			want: []string{`nat KUBE-NODEPORTS -m comment --comment "ns/web:p" -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j EXT`, general}},
		{name: "no endpoints", svc: withNodePort,
			want: []string{`filter KUBE-EXTERNAL-SERVICES -m comment --comment "ns/web:p has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j REJECT`}},
	})
}

func TestHealthCheckRule(t *testing.T) {
	runBuilderCases(t, (*serviceBuilder).healthCheckRule, []builderCase{
		{name: "none", svc: withNodePort, eps: []string{"10.244.0.5"}},
		{name: "health check", svc: func(s *state.ServicePort) {
			withNodePort(s)
			s.ExternalPolicyLocal, s.HealthCheckNodePort = true, 31000
		},
			want: []string{`filter KUBE-NODEPORTS -m comment --comment "ns/web:p health check node port" -m tcp -p tcp --dport 31000 -j ACCEPT`}},
	})
}

func TestExternalChain(t *testing.T) {
	local := func(s *state.ServicePort) { withNodePort(s); s.ExternalPolicyLocal = true }
	runBuilderCases(t, (*serviceBuilder).externalChain, []builderCase{
		{name: "cluster IP only", eps: []string{"10.244.0.5"}},
		{name: "no endpoints", svc: withNodePort},
		{name: "cluster policy", svc: withNodePort, eps: []string{"10.244.0.5"}, want: []string{
			`EXT: -m comment --comment "masquerade traffic for ns/web:p external destinations" -j KUBE-MARK-MASQ`,
			`EXT: -j SVC`}},
		{name: "local policy", svc: local, eps: []string{"10.244.0.5"}, want: []string{
			`EXT: -m comment --comment "masquerade LOCAL traffic for ns/web:p external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
			`EXT: -m comment --comment "route LOCAL traffic for ns/web:p external destinations" -m addrtype --src-type LOCAL -j SVC`,
			`EXT: -j SVL`}},
		{name: "local policy, no local endpoint", svc: local, eps: []string{"remote:10.244.1.5"}, want: []string{
			`EXT: -m comment --comment "masquerade LOCAL traffic for ns/web:p external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
			`EXT: -m comment --comment "route LOCAL traffic for ns/web:p external destinations" -m addrtype --src-type LOCAL -j SVC`}},
	})
}

func TestPolicyChains(t *testing.T) {
	runBuilderCases(t, (*serviceBuilder).policyChains, []builderCase{
		{name: "no endpoints"},
		{name: "one endpoint", eps: []string{"10.244.0.5"},
			want: []string{`SVC: -m comment --comment "ns/web:p -> 10.244.0.5:8080" -j SEP1`}},
		{name: "masquerade all", params: Params{MasqueradeAll: true}, eps: []string{"10.244.0.5", "10.244.0.6"}, want: []string{
			`SVC: -m comment --comment "ns/web:p cluster IP" ` + webMatch + ` -j KUBE-MARK-MASQ`,
			`SVC: -m comment --comment "ns/web:p -> 10.244.0.5:8080" -m statistic --mode random --probability 0.5000000000 -j SEP1`,
			`SVC: -m comment --comment "ns/web:p -> 10.244.0.6:8080" -j SEP2`}},
		{name: "local policy", svc: func(s *state.ServicePort) { withNodePort(s); s.ExternalPolicyLocal = true }, eps: []string{"10.244.0.5", "remote:10.244.1.5"}, want: []string{
			`SVC: -m comment --comment "ns/web:p -> 10.244.0.5:8080" -m statistic --mode random --probability 0.5000000000 -j SEP1`,
			`SVC: -m comment --comment "ns/web:p -> 10.244.1.5:8080" -j SEP2`,
			`SVL: -m comment --comment "ns/web:p -> 10.244.0.5:8080" -j SEP1`}},
		{name: "affinity", svc: func(s *state.ServicePort) { s.AffinityTimeoutSeconds = 10800 }, eps: []string{"10.244.0.5"}, want: []string{
			`SVC: -m comment --comment "ns/web:p -> 10.244.0.5:8080" -m recent --name SEP1 --rcheck --seconds 10800 --reap -j SEP1`,
			`SVC: -m comment --comment "ns/web:p -> 10.244.0.5:8080" -j SEP1`}},
	})
}

func TestEndpointChains(t *testing.T) {
	runBuilderCases(t, (*serviceBuilder).endpointChains, []builderCase{
		{name: "no endpoints"},
		{name: "one endpoint", eps: []string{"10.244.0.5"}, want: []string{
			`SEP1: -m comment --comment "ns/web:p" -s 10.244.0.5 -j KUBE-MARK-MASQ`,
			`SEP1: -m comment --comment "ns/web:p" -m tcp -p tcp -j DNAT --to-destination 10.244.0.5:8080`}},
		{name: "affinity", svc: func(s *state.ServicePort) { s.AffinityTimeoutSeconds = 10800 }, eps: []string{"10.244.0.5"}, want: []string{
			`SEP1: -m comment --comment "ns/web:p" -s 10.244.0.5 -j KUBE-MARK-MASQ`,
			`SEP1: -m comment --comment "ns/web:p" -m recent --name SEP1 --set -m tcp -p tcp -j DNAT --to-destination 10.244.0.5:8080`}},
		{name: "large cluster", params: Params{LargeCluster: true}, eps: []string{"10.244.0.5"}, want: []string{
			`SEP1: -s 10.244.0.5 -j KUBE-MARK-MASQ`,
			`SEP1: -m tcp -p tcp -j DNAT --to-destination 10.244.0.5:8080`}},
	})
}

// The static rules' parts: the NodePort jumps end nat KUBE-SERVICES, per
// NodePort address when there are some.
func TestNodePortJumps(t *testing.T) {
	comment := `-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" `
	for _, tc := range []struct {
		name   string
		params Params
		want   []string
	}{
		{name: "every local address", want: []string{comment + "-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS"}},
		{name: "localhost", params: Params{LocalhostNodePorts: true}, want: []string{comment + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"}},
		{name: "ipv6", params: Params{IPv6: true, LocalhostNodePorts: true}, want: []string{comment + "-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS"}},
		{name: "addresses", params: Params{NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.0.2.5"), netip.MustParseAddr("127.0.0.1")}},
			want: []string{comment + "-d 192.0.2.5 -j KUBE-NODEPORTS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range tc.params.nodePortJumps() {
				got = append(got, string(r))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("jumps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
