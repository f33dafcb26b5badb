package nftables

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// TestEvalSteps reads one rule of each expression and statement kind:
// whether it matches a TCP packet from a pod (10.244.1.9) to 10.96.0.10:80
// and what it does, or the error.
func TestEvalSteps(t *testing.T) {
	cases := []struct{ rule, want string }{
		{`ct state new jump firewall-check`, "match jump firewall-check"},
		{`ip daddr . meta l4proto . th dport vmap @service-ips`, "match goto service-x"},
		{`ip daddr . meta l4proto . th dport vmap @no-endpoint-services`, "no match"},
		{`meta l4proto . th dport vmap @service-nodeports`, "no match"},
		{`ip daddr @cluster-ips reject comment "x"`, "match reject"},
		{`ip daddr != { 10.96.0.0/16, 10.97.0.1-10.97.0.9 } drop`, "no match"},
		{`ip saddr 10.244.0.0/16 goto service-x`, "match goto service-x"},
		{`ip saddr @affinity-x goto endpoint-x`, "no match"},
		{`fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports`, "no match"},
		{`fib saddr type local goto service-x`, "no match"},
		{`iifname "veth*" goto service-x`, "match goto service-x"},
		{`iifname != "veth*" goto service-x`, "no match"},
		{`meta l4proto udp dnat to 10.244.1.5:8080`, "no match"},
		{`meta l4proto tcp numgen random mod 4 0 dnat to 10.244.1.5:8080`, "match dnat 10.244.1.5:8080 share 0.25"},
		{`meta mark set meta mark | 0x00004000 comment "masquerade"`, "match masquerade"},
		{`update @affinity-x { ip saddr }`, "match"},
		{`numgen random mod 2 vmap { 0 : goto endpoint-a, 1 : goto endpoint-b }`, "match fork [goto endpoint-a, goto endpoint-b]"},
		{`meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.5 . 8080 }`,
			"match fork [dnat 10.244.1.5:8080, dnat 10.244.2.5:8080]"},
		{`numgen random mod x 0 goto a`, `error numgen "numgen random mod x 0 goto a"`},
		{`counter packets 1`, `error the trace does not know "counter packets 1"`},
	}
	p := &Params{MasqueradeBit: 14}
	table := &traceTable{params: p, chains: map[string][]string{}, elements: map[string][]knftables.Element{},
		clusterIPs: map[netip.Addr]bool{netip.MustParseAddr("10.96.0.10"): true},
		packet: trace.Packet{Source: netip.MustParseAddr("10.244.1.9"), Destination: netip.MustParseAddr("10.96.0.10"), Port: 80,
			Protocol: v1.ProtocolTCP, From: trace.FromPod}}
	table.addElements([]knftables.Element{{Map: mapServiceIPs, Key: []string{"10.96.0.10", "tcp", "80"}, Value: []string{"goto service-x"}}})
	for _, tc := range cases {
		matched, e, err := table.Eval("chain", tc.rule)
		if got := describeEval(matched, e, err); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.rule, got, tc.want)
		}
	}
}

// describeEval is an outcome of Eval in a few words.
func describeEval(matched bool, e trace.Effect, err error) string {
	switch {
	case err != nil:
		return "error " + err.Error()
	case !matched:
		return "no match"
	}
	effect := func(e trace.Effect) string {
		s := string(e.Verdict)
		if e.Chain != "" {
			s += " " + e.Chain
		}
		if e.To.IsValid() {
			s += " " + e.To.String()
		}
		return s
	}
	out := "match"
	if e.Fork != nil {
		out += " fork ["
		for i, f := range e.Fork {
			if i > 0 {
				out += ", "
			}
			out += effect(f)
		}
		return out + "]"
	}
	if s := effect(e); s != "" {
		out += " " + s
	}
	if e.Share > 0 {
		out += fmt.Sprintf(" share %g", e.Share)
	}
	if e.Masquerade {
		out += " masquerade"
	}
	return out
}
