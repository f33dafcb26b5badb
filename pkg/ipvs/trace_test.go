package ipvs_test

import (
	"math"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Packets into the golden state (feedServices, testdata/sync-full.golden):
// each ends where the virtual servers and set entries send it.
func TestTrace(t *testing.T) {
	_, core, _ := fedNode(t)
	cases := []struct {
		name, src, dst, port, protocol, from string
		local                                bool
		verdict                              trace.Verdict
		endpoints                            map[string]float64
		masquerade                           bool
		reason, affinity                     string
		// hairpin is the one endpoint masqueraded, the source's own.
		hairpin string
	}{
		{name: "cluster IP from a pod", src: "10.244.0.9", dst: "10.96.0.10", port: "80", protocol: "TCP", from: "pod",
			verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.5:8080": 0.5}},
		{name: "cluster IP from outside is masqueraded", src: "192.0.2.1", dst: "10.96.0.10", port: "80", protocol: "TCP", from: "external",
			verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.5:8080": 0.5}, masquerade: true},
		{name: "session affinity", src: "10.244.0.9", dst: "10.96.0.11", port: "80", protocol: "UDP", from: "pod",
			verdict: trace.DNAT, endpoints: map[string]float64{"10.244.1.6:8080": 1}, affinity: "ClientIP, 600 s"},
		{name: "NodePort with policy Local keeps the source", src: "192.0.2.1", dst: "10.255.0.2", port: "30080", protocol: "TCP", from: "external", local: true,
			verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.7:8080": 1}},
		{name: "NodePort from outside is masqueraded", src: "192.0.2.1", dst: "10.255.0.2", port: "30999", protocol: "TCP", from: "external", local: true,
			verdict: trace.DNAT, endpoints: map[string]float64{"10.244.1.8:8080": 1}, masquerade: true},
		{name: "a pod reaching itself is masqueraded", src: "10.244.0.5", dst: "10.96.0.10", port: "80", protocol: "TCP", from: "pod",
			verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.5:8080": 0.5}, hairpin: "10.244.0.5:8080"},
		{name: "load balancer from an allowed source", src: "10.255.1.9", dst: "10.255.3.1", port: "80", protocol: "TCP", from: "external",
			verdict: trace.DNAT, endpoints: map[string]float64{"10.244.1.8:8080": 1}, masquerade: true},
		{name: "load balancer from a source out of range", src: "192.0.2.1", dst: "10.255.3.1", port: "80", protocol: "TCP", from: "external",
			verdict: trace.Drop, reason: "source range not allowed"},
		{name: "no endpoints", src: "10.244.0.9", dst: "10.96.0.14", port: "80", protocol: "TCP", from: "pod",
			verdict: trace.Reject, reason: "no endpoints"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pkt, err := trace.ParsePacket(tc.src, tc.dst, tc.port, tc.protocol, tc.from)
			if err != nil {
				t.Fatal(err)
			}
			pkt.LocalDestination = tc.local
			r, err := core.Trace(pkt, false)
			if err != nil {
				t.Fatal(err)
			}
			var text strings.Builder
			trace.WriteText(&text, r)
			if r.Outcome.Verdict != tc.verdict || r.Outcome.Masquerade != tc.masquerade || !strings.Contains(r.Outcome.Reason, tc.reason) ||
				!strings.Contains(r.Outcome.Affinity, tc.affinity) || (tc.affinity == "") != (r.Outcome.Affinity == "") {
				t.Errorf("outcome %+v, want %s, masquerade %v, reason %q, affinity %q\n%s", r.Outcome, tc.verdict, tc.masquerade, tc.reason, tc.affinity, text.String())
			}
			got := map[string]float64{}
			for _, c := range r.Outcome.Endpoints {
				got[c.Endpoint] += c.Probability
				if c.Masquerade != (c.Endpoint == tc.hairpin || tc.masquerade) {
					t.Errorf("endpoint %s masqueraded: %v\n%s", c.Endpoint, c.Masquerade, text.String())
				}
			}
			for ep, want := range tc.endpoints {
				if math.Abs(got[ep]-want) > 1e-6 || len(got) != len(tc.endpoints) {
					t.Errorf("endpoints %v, want %v\n%s", got, tc.endpoints, text.String())
					break
				}
			}
			if testing.Verbose() {
				t.Log("\n" + text.String())
			}
		})
	}
	// The fake kernel holds what the sync wrote: verify finds nothing.
	pkt, _ := trace.ParsePacket("10.244.0.9", "10.96.0.10", "80", "TCP", "pod")
	if r, err := core.Trace(pkt, true); err != nil || r.Verify == nil || r.Verify.Error != "" || len(r.Verify.Differences) > 0 {
		t.Errorf("verify in the IPVS mode: %v %+v", err, r.Verify)
	}
}
