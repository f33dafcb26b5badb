package iptables

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// traceCase is a packet sent into one of the golden cases' rule sets,
// and where it must end.
type traceCase struct {
	name, golden                   string
	src, dst, port, protocol, from string
	local                          bool
	verdict                        trace.Verdict
	endpoints                      map[string]float64
	masquerade                     bool
	reason, affinity               string
}

// traceCases cover each outcome a person asks about; the rule sets are
// the golden cases', so a trace walks what those tests pin down.
var traceCases = []traceCase{
	{name: "cluster IP from a pod", golden: "clusterip", src: "10.244.0.9", dst: "10.96.0.10", port: "80", protocol: "tcp", from: "pod",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 1.0 / 3, "10.244.0.6:8080": 1.0 / 3, "10.244.1.7:8080": 1.0 / 3}},
	{name: "cluster IP from outside is masqueraded", golden: "clusterip", src: "192.0.2.99", dst: "10.96.0.11", port: "53", protocol: "udp", from: "external",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 1}, masquerade: true},
	{name: "NodePort from outside", golden: "nodeport", src: "203.0.113.5", dst: "10.255.0.2", port: "30080", protocol: "TCP", from: "external", local: true,
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.7:8080": 0.5}, masquerade: true},
	{name: "localhost NodePort from the node", golden: "nodeport", src: "127.0.0.1", dst: "127.0.0.1", port: "30080", protocol: "TCP", from: "node", local: true,
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.7:8080": 0.5}, masquerade: true},
	{name: "load balancer from an allowed source", golden: "loadbalancer-source-ranges", src: "203.0.113.7", dst: "192.0.2.20", port: "80", protocol: "TCP", from: "external",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 1}, masquerade: true},
	{name: "load balancer from a source out of range", golden: "loadbalancer-source-ranges", src: "198.51.100.1", dst: "192.0.2.20", port: "80", protocol: "TCP", from: "external",
		verdict: trace.Drop, reason: "source range not allowed"},
	{name: "external policy Local without local endpoints", golden: "external-policy-local", src: "203.0.113.5", dst: "10.255.0.2", port: "30081", protocol: "TCP", from: "external", local: true,
		verdict: trace.Drop, reason: "externalTrafficPolicy Local: no usable endpoint on this node"},
	{name: "external policy Local from a pod goes to every endpoint", golden: "external-policy-local", src: "10.244.0.9", dst: "192.0.2.20", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.7:8080": 0.5}},
	{name: "internal policy Local without local endpoints", golden: "internal-policy-local", src: "10.244.0.9", dst: "10.96.0.11", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.Drop, reason: "internalTrafficPolicy Local"},
	{name: "no endpoints", golden: "no-endpoints", src: "10.244.0.9", dst: "10.96.0.10", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.Reject, reason: "no endpoints"},
	{name: "no endpoints at a NodePort", golden: "no-endpoints", src: "203.0.113.5", dst: "10.255.0.2", port: "30080", protocol: "TCP", from: "external", local: true,
		verdict: trace.Reject, reason: "no endpoints"},
	{name: "session affinity", golden: "session-affinity", src: "10.244.0.9", dst: "10.96.0.10", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.0.6:8080": 0.5}, affinity: "ClientIP, 600 s"},
	{name: "hairpin: an endpoint reaching itself is masqueraded", golden: "masquerade-all-bit-5", src: "10.244.0.5", dst: "10.96.0.10", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.0.5:8080": 1}, masquerade: true},
	{name: "IPv6 NodePort", golden: "ipv6", src: "2001:db8::1", dst: "fd00:255::2", port: "30080", protocol: "TCP", from: "external", local: true,
		verdict: trace.DNAT, endpoints: map[string]float64{"[fd00:244::5]:8080": 0.5, "[fd00:244:1::7]:8080": 0.5}, masquerade: true},
	{name: "no service", golden: "clusterip", src: "10.244.0.9", dst: "10.96.0.99", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.PassedOn, reason: "no service this node programs"},
}

func TestTrace(t *testing.T) {
	for _, tc := range traceCases {
		t.Run(tc.name, func(t *testing.T) {
			r := tracePacket(t, tc)
			checkTrace(t, tc, r)
		})
	}
}

func tracePacket(t *testing.T, tc traceCase) trace.Result {
	t.Helper()
	var gc goldenCase
	for _, c := range goldenCases {
		if c.name == tc.golden {
			gc = c
		}
	}
	family := gc.family
	if family == "" {
		family = v1.IPv4Protocol
	}
	params := fuzzParams(t, family, false)
	if gc.params != nil {
		gc.params(&params)
	}
	p := newProxier(Config{Family: family, Kernel: &recordingKernel{}, Params: params, SyncPeriod: time.Minute}, nodeName)
	for _, s := range gc.services {
		p.OnService(s, false)
	}
	for _, s := range gc.slices {
		p.OnEndpointSlice(s, false)
	}
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	pkt, err := trace.ParsePacket(tc.src, tc.dst, tc.port, tc.protocol, tc.from)
	if err != nil {
		t.Fatal(err)
	}
	pkt.LocalDestination = tc.local
	r, err := p.Core.Trace(pkt, false)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func checkTrace(t *testing.T, tc traceCase, r trace.Result) {
	t.Helper()
	var text strings.Builder
	trace.WriteText(&text, r)
	if r.Outcome.Verdict != tc.verdict {
		t.Errorf("verdict %q, want %q\n%s", r.Outcome.Verdict, tc.verdict, text.String())
	}
	got := map[string]float64{}
	for _, c := range r.Outcome.Endpoints {
		got[c.Endpoint] += c.Probability
	}
	if len(got) != len(tc.endpoints) {
		t.Errorf("endpoints %v, want %v\n%s", got, tc.endpoints, text.String())
	}
	for ep, want := range tc.endpoints {
		if math.Abs(got[ep]-want) > 1e-6 {
			t.Errorf("endpoint %s has probability %v, want %v\n%s", ep, got[ep], want, text.String())
		}
	}
	if r.Outcome.Masquerade != tc.masquerade {
		t.Errorf("masquerade %v, want %v\n%s", r.Outcome.Masquerade, tc.masquerade, text.String())
	}
	if !strings.Contains(r.Outcome.Reason, tc.reason) {
		t.Errorf("reason %q, want it to say %q\n%s", r.Outcome.Reason, tc.reason, text.String())
	}
	if !strings.Contains(r.Outcome.Affinity, tc.affinity) || (tc.affinity == "") != (r.Outcome.Affinity == "") {
		t.Errorf("affinity %q, want %q", r.Outcome.Affinity, tc.affinity)
	}
	if testing.Verbose() {
		t.Log("\n" + text.String())
	}
}

// writtenKernel lists the rules of chains from a map, by "table chain".
type writtenKernel struct {
	recordingKernel
	chains map[string][]string
}

func (k *writtenKernel) ListRules(table, chain string) ([]string, error) {
	return k.chains[table+" "+chain], nil
}

// --verify reads the traced service's chains: a rule gone from one of
// them is a difference.
func TestTraceVerify(t *testing.T) {
	kernel := &writtenKernel{chains: map[string][]string{}}
	p := newProxier(Config{Family: v1.IPv4Protocol, Kernel: kernel, Params: fuzzParams(t, v1.IPv4Protocol, false), SyncPeriod: time.Minute}, nodeName)
	p.OnService(svc("web", nil), false)
	p.OnEndpointSlice(slice("web", v1.ProtocolTCP, local1), false)
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	// The kernel holds what the sync wrote, but for the DNAT rule.
	table := ""
	for _, line := range strings.Split(kernel.written.String(), "\n") {
		if t, ok := strings.CutPrefix(line, "*"); ok {
			table = t
		}
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok || strings.Contains(line, "DNAT") {
			continue
		}
		chain, rule, _ := strings.Cut(rest, " ")
		kernel.chains[table+" "+chain] = append(kernel.chains[table+" "+chain], rule)
	}
	pkt, _ := trace.ParsePacket("10.244.0.9", "10.96.0.10", "80", "TCP", "pod")
	r, err := p.Core.Trace(pkt, true)
	if err != nil {
		t.Fatal(err)
	}
	if r.Verify == nil || len(r.Verify.Differences) != 1 || !strings.Contains(r.Verify.Differences[0], "lacks") || !strings.Contains(r.Verify.Differences[0], "DNAT") {
		t.Errorf("verify: %+v, want the missing DNAT rule", r.Verify)
	}
}

// Every golden rule set can be traced: each of its services' addresses
// from each origin, with no rule the trace does not understand, and the
// ways through add up to certainty.
func TestTraceEveryGoldenService(t *testing.T) {
	for _, gc := range goldenCases {
		for _, s := range gc.services {
			for _, sp := range s.Spec.Ports {
				targets := map[string]bool{s.Spec.ClusterIP: false}
				for _, a := range s.Spec.ExternalIPs {
					targets[a] = false
				}
				for _, ing := range s.Status.LoadBalancer.Ingress {
					if ing.IPMode == nil || *ing.IPMode != v1.LoadBalancerIPModeProxy {
						targets[ing.IP] = false
					}
				}
				ports := map[string]string{}
				for a := range targets {
					ports[a] = strconv.Itoa(int(sp.Port))
				}
				if sp.NodePort != 0 {
					node := "10.255.0.2"
					if gc.family == v1.IPv6Protocol {
						node = "fd00:255::2"
					}
					targets[node], ports[node] = true, strconv.Itoa(int(sp.NodePort))
				}
				for dst, local := range targets {
					for _, from := range []string{"pod", "node", "external"} {
						src := map[string]string{"pod": "10.244.0.9", "node": "10.255.0.2", "external": "203.0.113.5"}[from]
						if gc.family == v1.IPv6Protocol {
							src = map[string]string{"pod": "fd00:244::9", "node": "fd00:255::2", "external": "2001:db8::5"}[from]
						}
						tc := traceCase{golden: gc.name, src: src, dst: dst, port: ports[dst], protocol: string(sp.Protocol), from: from, local: local}
						r := tracePacket(t, tc)
						total := 0.0
						for _, b := range r.Branches {
							total += b.Probability
						}
						if math.Abs(total-1) > 1e-9 || r.Service == "" {
							t.Errorf("%s: %s -> %s:%s from %s: service %q, chances adding up to %v", gc.name, src, dst, ports[dst], from, r.Service, total)
						}
					}
				}
			}
		}
	}
}
