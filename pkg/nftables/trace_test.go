package nftables

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
	"github.com/rapidproxy/rapidproxy/pkg/trace/tracetest"
)

var traceCases = []tracetest.Case{
	{Name: "cluster IP from a pod, with affinity", Golden: "sample-ipv4", Src: "10.244.0.9", Dst: "10.96.10.30", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.1.11:8080": 1.0 / 3, "10.244.1.12:8080": 1.0 / 3, "10.244.1.13:8080": 1.0 / 3}, Affinity: "ClientIP, 10800 s"}},
	{Name: "NodePort from outside", Golden: "sample-ipv4", Src: "192.0.2.50", Dst: "10.250.0.2", Port: "31746", Protocol: "TCP", From: "external", Local: true,
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.1.13:8080": 1}, Masquerade: true}},
	{Name: "load balancer from an allowed source, policy Local", Golden: "sample-ipv4", Src: "203.0.113.10", Dst: "198.51.100.32", Port: "80", Protocol: "TCP", From: "external",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"10.244.1.11:8080": 1}}},
	{Name: "load balancer from a source out of range", Golden: "sample-ipv4", Src: "192.0.2.50", Dst: "198.51.100.32", Port: "80", Protocol: "TCP", From: "external",
		Want: tracetest.Want{Verdict: trace.Drop, Reason: "source range not allowed"}},
	{Name: "no endpoints", Golden: "sample-ipv4", Src: "10.244.0.9", Dst: "10.96.10.34", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.Reject, Reason: "no endpoints"}},
	{Name: "invalid port of a cluster IP", Golden: "sample-ipv4", Src: "10.244.0.9", Dst: "10.96.10.34", Port: "81", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.Reject, Reason: "invalid port of a ClusterIP"}},
	{Name: "ServiceCIDR guard", Golden: "sample-ipv4", Src: "10.244.0.9", Dst: "10.96.99.99", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.Drop, Reason: "ServiceCIDR guard"}},
	{Name: "external policy Local without local endpoints", Golden: "no-local-endpoints-drop", Src: "192.0.2.50", Dst: "198.51.100.13", Port: "80", Protocol: "TCP", From: "external",
		Want: tracetest.Want{Verdict: trace.Drop, Reason: "externalTrafficPolicy Local: no usable endpoint on this node"}},
	{Name: "no endpoints at a NodePort", Golden: "no-local-endpoints-drop", Src: "192.0.2.50", Dst: "10.250.0.2", Port: "30014", Protocol: "TCP", From: "external", Local: true,
		Want: tracetest.Want{Verdict: trace.Reject, Reason: "no endpoints"}},
	{Name: "localhost NodePort", Golden: "nodeport-addresses-all", Src: "127.0.0.1", Dst: "127.0.0.1", Port: "30020", Protocol: "TCP", From: "node", Local: true,
		Want: tracetest.Want{Verdict: trace.PassedOn, Reason: "localhost NodePort"}},
	{Name: "IPv6 NodePort", Golden: "ipv6", Src: "2001:db8::1", Dst: "fd00:250::2", Port: "30080", Protocol: "TCP", From: "external", Local: true,
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"[fd00:244::5]:8080": 0.5, "[fd00:244:1::7]:8080": 0.5}, Masquerade: true}},
	{Name: "IPv6 affinity", Golden: "ipv6", Src: "fd00:244::9", Dst: "fd00:96::11", Port: "80", Protocol: "TCP", From: "pod",
		Want: tracetest.Want{Verdict: trace.DNAT, Endpoints: map[string]float64{"[fd00:244::5]:8080": 1}, Affinity: "ClientIP, 600 s"}},
}

func TestTrace(t *testing.T) {
	tracetest.Run(t, traceCases, tracePacket)
}

// tracePacket traces pkt through the table the sync of a golden case
// writes.
func tracePacket(t *testing.T, golden string, pkt trace.Packet) trace.Result {
	t.Helper()
	var gc goldenCase
	for _, c := range goldenCases {
		if c.name == golden {
			gc = c
		}
	}
	core, _ := tracedCore(t, gc.ipFamily(), gc.params(t), gc.objs)
	r, err := core.Trace(pkt, false)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// --verify reads the traced service's objects: the table holds what the
// sync wrote, so nothing differs.
func TestTraceVerify(t *testing.T) {
	core, h := tracedCore(t, v1.IPv4Protocol, v4(nil)(t), sampleObjects())
	pkt, _ := trace.ParsePacket("10.244.0.9", "10.96.10.30", "80", "TCP", "pod")
	r, err := core.Trace(pkt, true)
	if err != nil || r.Verify == nil || r.Verify.Error != "" || len(r.Verify.Differences) > 0 {
		t.Fatalf("verify: %v %+v", err, r.Verify)
	}
	// Another program empties the service chain the trace went through.
	chain := strings.TrimPrefix(r.Branches[0].Steps[0].Where, "ip kube-proxy ")
	tx := h.nft.NewTransaction()
	tx.Flush(&knftables.Chain{Name: chain})
	if err := h.nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	r, err = core.Trace(pkt, true)
	if err != nil || r.Verify == nil || len(r.Verify.Differences) == 0 || !strings.Contains(strings.Join(r.Verify.Differences, "\n"), chain+" lacks") {
		t.Errorf("verify after flushing %s: %v %+v", chain, err, r.Verify)
	}
}

// tracedCore is a core of the nftables mode on a fake table (the
// harness's) that has synced the objects.
func tracedCore(t *testing.T, family v1.IPFamily, params Params, objs []any) (*proxy.Core, *harness) {
	t.Helper()
	h := newHarness(t, family, params)
	core := proxy.NewCore(proxy.Config{Family: family, ModeName: "nftables", Node: state.Node{Name: nodeName},
		MinSyncPeriod: time.Second, SyncPeriod: time.Minute}, h.syncer)
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			core.OnService(o, false)
		case *discovery.EndpointSlice:
			core.OnEndpointSlice(o, false)
		}
	}
	core.OnServicesSynced()
	core.OnEndpointSlicesSynced()
	if err := core.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	return core, h
}

// Every golden table can be traced: each of its services' addresses from
// each origin, with no rule or element the trace does not understand,
// and the ways through add up to certainty.
func TestTraceEveryGoldenService(t *testing.T) {
	for _, gc := range goldenCases {
		params := gc.params(t)
		core, _ := tracedCore(t, gc.ipFamily(), params, gc.objs)
		for _, o := range gc.objs {
			s, ok := o.(*v1.Service)
			if !ok {
				continue
			}
			for _, sp := range s.Spec.Ports {
				type target struct {
					port  int32
					local bool
				}
				targets := map[string]target{}
				for _, a := range append(append([]string{}, s.Spec.ClusterIPs...), s.Spec.ExternalIPs...) {
					targets[a] = target{sp.Port, false}
				}
				for _, ing := range s.Status.LoadBalancer.Ingress {
					targets[ing.IP] = target{sp.Port, false}
				}
				if sp.NodePort != 0 && params.NodeIP.IsValid() {
					targets[params.NodeIP.String()] = target{sp.NodePort, true}
				}
				for dst, tg := range targets {
					v6 := strings.Contains(dst, ":")
					if v6 != (gc.ipFamily() == v1.IPv6Protocol) {
						continue
					}
					for _, from := range []string{"pod", "node", "external"} {
						src := map[string]string{"pod": "10.244.0.9", "node": "10.250.0.2", "external": "203.0.113.5"}[from]
						if v6 {
							src = map[string]string{"pod": "fd00:244::9", "node": "fd00:250::2", "external": "2001:db8::5"}[from]
						}
						pkt := tracetest.Case{Src: src, Dst: dst, Port: itoa(tg.port), Protocol: string(sp.Protocol), From: from, Local: tg.local}.Packet(t)
						r, err := core.Trace(pkt, false)
						total := 0.0
						for _, b := range r.Branches {
							total += b.Probability
						}
						if err != nil || math.Abs(total-1) > 1e-9 || r.Service == "" {
							t.Errorf("%s: %s: service %q, chances adding up to %v, %v", gc.name, pkt, r.Service, total, err)
						}
					}
				}
			}
		}
	}
}

// Above the cascade's limit a policy chain picks with a numgen map, as
// upstream's always do: the trace reads the map.
func TestTraceThroughANumgenMap(t *testing.T) {
	var eps []discovery.Endpoint
	for i := range cascadeLimit + 8 {
		eps = append(eps, ep(fmt.Sprintf("10.244.1.%d", i+1), "node=node-2"))
	}
	for _, sticky := range []bool{false, true} {
		core, _ := tracedCore(t, v1.IPv4Protocol, v4(nil)(t), []any{
			service("ns", "big", "10.96.0.40", http80, func(s *v1.Service) {
				if sticky {
					s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				}
			}),
			endpointSlice("ns", "big", ep8080, eps...),
		})
		pkt, _ := trace.ParsePacket("10.244.0.9", "10.96.0.40", "80", "TCP", "pod")
		r, err := core.Trace(pkt, false)
		if err != nil || r.Outcome.Verdict != trace.DNAT || len(r.Outcome.Endpoints) != len(eps) {
			t.Fatalf("affinity %v: %v %+v", sticky, err, r.Outcome)
		}
		for _, c := range r.Outcome.Endpoints {
			if math.Abs(c.Probability-1/float64(len(eps))) > 1e-9 {
				t.Errorf("affinity %v: %s has probability %v", sticky, c.Endpoint, c.Probability)
			}
		}
	}
}
