package iptables

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
	"github.com/rapidproxy/rapidproxy/pkg/trace/tracetest"
)

// traceCases cover each outcome a person asks about; the rule sets are
// the golden cases', so a trace walks what those tests pin down.
var traceCases = []tracetest.Case{
	{Name: "cluster IP from a pod", Golden: "clusterip", Src: "10.244.0.9", Dst: "10.96.0.10", Port: "80", Protocol: "tcp", From: "pod",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 1.0 / 3, "10.244.0.6:8080": 1.0 / 3, "10.244.1.7:8080": 1.0 / 3}}},
	{Name: "cluster IP from outside is masqueraded", Golden: "clusterip", Src: "192.0.2.99", Dst: "10.96.0.11", Port: "53", Protocol: "udp", From: "external",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 1}, Masquerade: true}},
	{Name: "NodePort from outside", Golden: "nodeport", Src: "203.0.113.5", Dst: "10.255.0.2", Port: "30080", Protocol: "TCP", From: "external", Local: true,
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.7:8080": 0.5}, Masquerade: true}},
	{Name: "localhost NodePort from the node", Golden: "nodeport", Src: "127.0.0.1", Dst: "127.0.0.1", Port: "30080", Protocol: "TCP", From: "node", Local: true,
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.7:8080": 0.5}, Masquerade: true}},
	{Name: "load balancer from an allowed source", Golden: "loadbalancer-source-ranges", Src: "203.0.113.7", Dst: "192.0.2.20", Port: "80", Protocol: "TCP", From: "external",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 1}, Masquerade: true}},
	{Name: "load balancer from a source out of range", Golden: "loadbalancer-source-ranges", Src: "198.51.100.1", Dst: "192.0.2.20", Port: "80", Protocol: "TCP", From: "external",
		Want: tracetest.Want{Verdict: trace.Drop, Reason: "source range not allowed"}},
	{Name: "external policy Local without local endpoints", Golden: "external-policy-local", Src: "203.0.113.5", Dst: "10.255.0.2", Port: "30081", Protocol: "TCP", From: "external", Local: true,
		Want: tracetest.Want{Verdict: trace.Drop, Reason: "externalTrafficPolicy Local: no usable endpoint on this node"}},
	{Name: "external policy Local from a pod goes to every endpoint", Golden: "external-policy-local", Src: "10.244.0.9", Dst: "192.0.2.20", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.1.7:8080": 0.5}}},
	{Name: "internal policy Local without local endpoints", Golden: "internal-policy-local", Src: "10.244.0.9", Dst: "10.96.0.11", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.Drop, Reason: "internalTrafficPolicy Local"}},
	{Name: "no endpoints", Golden: "no-endpoints", Src: "10.244.0.9", Dst: "10.96.0.10", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.Reject, Reason: "no endpoints"}},
	{Name: "no endpoints at a NodePort", Golden: "no-endpoints", Src: "203.0.113.5", Dst: "10.255.0.2", Port: "30080", Protocol: "TCP", From: "external", Local: true,
		Want: tracetest.Want{Verdict: trace.Reject, Reason: "no endpoints"}},
	{Name: "session affinity", Golden: "session-affinity", Src: "10.244.0.9", Dst: "10.96.0.10", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 0.5, "10.244.0.6:8080": 0.5}, Affinity: "ClientIP, 600 s"}},
	{Name: "hairpin: an endpoint reaching itself is masqueraded", Golden: "masquerade-all-bit-5", Src: "10.244.0.5", Dst: "10.96.0.10", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.0.5:8080": 1}, Masquerade: true}},
	{Name: "IPv6 NodePort", Golden: "ipv6", Src: "2001:db8::1", Dst: "fd00:255::2", Port: "30080", Protocol: "TCP", From: "external", Local: true,
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"[fd00:244::5]:8080": 0.5, "[fd00:244:1::7]:8080": 0.5}, Masquerade: true}},
	{Name: "no service", Golden: "clusterip", Src: "10.244.0.9", Dst: "10.96.0.99", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.PassedOn, Reason: "no service this node programs"}},
}

func TestTrace(t *testing.T) {
	tracetest.Run(t, traceCases, tracePacket)
}

// tracePacket traces pkt through the rules the sync of a golden case
// writes.
func tracePacket(t *testing.T, golden string, pkt trace.Packet) trace.Result {
	t.Helper()
	var gc goldenCase
	for _, c := range goldenCases {
		if c.name == golden {
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
	r, err := p.Core.Trace(pkt, false)
	if err != nil {
		t.Fatal(err)
	}
	return r
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
						pkt := tracetest.Case{Src: src, Dst: dst, Port: ports[dst], Protocol: string(sp.Protocol), From: from, Local: local}.Packet(t)
						r := tracePacket(t, gc.name, pkt)
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
