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
)

// traceCase is a packet sent into one of the golden cases' tables, and
// where it must end.
type traceCase struct {
	name, golden                   string
	src, dst, port, protocol, from string
	local                          bool
	verdict                        trace.Verdict
	endpoints                      map[string]float64
	masquerade                     bool
	reason, affinity               string
}

var traceCases = []traceCase{
	{name: "cluster IP from a pod, with affinity", golden: "sample-ipv4", src: "10.244.0.9", dst: "10.96.10.30", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.1.11:8080": 1.0 / 3, "10.244.1.12:8080": 1.0 / 3, "10.244.1.13:8080": 1.0 / 3}, affinity: "ClientIP, 10800 s"},
	{name: "NodePort from outside", golden: "sample-ipv4", src: "192.0.2.50", dst: "10.250.0.2", port: "31746", protocol: "TCP", from: "external", local: true,
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.1.13:8080": 1}, masquerade: true},
	{name: "load balancer from an allowed source, policy Local", golden: "sample-ipv4", src: "203.0.113.10", dst: "198.51.100.32", port: "80", protocol: "TCP", from: "external",
		verdict: trace.DNAT, endpoints: map[string]float64{"10.244.1.11:8080": 1}},
	{name: "load balancer from a source out of range", golden: "sample-ipv4", src: "192.0.2.50", dst: "198.51.100.32", port: "80", protocol: "TCP", from: "external",
		verdict: trace.Drop, reason: "source range not allowed"},
	{name: "no endpoints", golden: "sample-ipv4", src: "10.244.0.9", dst: "10.96.10.34", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.Reject, reason: "no endpoints"},
	{name: "invalid port of a cluster IP", golden: "sample-ipv4", src: "10.244.0.9", dst: "10.96.10.34", port: "81", protocol: "TCP", from: "pod",
		verdict: trace.Reject, reason: "invalid port of a ClusterIP"},
	{name: "ServiceCIDR guard", golden: "sample-ipv4", src: "10.244.0.9", dst: "10.96.99.99", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.Drop, reason: "ServiceCIDR guard"},
	{name: "external policy Local without local endpoints", golden: "no-local-endpoints-drop", src: "192.0.2.50", dst: "198.51.100.13", port: "80", protocol: "TCP", from: "external",
		verdict: trace.Drop, reason: "externalTrafficPolicy Local: no usable endpoint on this node"},
	{name: "no endpoints at a NodePort", golden: "no-local-endpoints-drop", src: "192.0.2.50", dst: "10.250.0.2", port: "30014", protocol: "TCP", from: "external", local: true,
		verdict: trace.Reject, reason: "no endpoints"},
	{name: "localhost NodePort", golden: "nodeport-addresses-all", src: "127.0.0.1", dst: "127.0.0.1", port: "30020", protocol: "TCP", from: "node", local: true,
		verdict: trace.PassedOn, reason: "localhost NodePort"},
	{name: "IPv6 NodePort", golden: "ipv6", src: "2001:db8::1", dst: "fd00:250::2", port: "30080", protocol: "TCP", from: "external", local: true,
		verdict: trace.DNAT, endpoints: map[string]float64{"[fd00:244::5]:8080": 0.5, "[fd00:244:1::7]:8080": 0.5}, masquerade: true},
	{name: "IPv6 affinity", golden: "ipv6", src: "fd00:244::9", dst: "fd00:96::11", port: "80", protocol: "TCP", from: "pod",
		verdict: trace.DNAT, endpoints: map[string]float64{"[fd00:244::5]:8080": 1}, affinity: "ClientIP, 600 s"},
}

func TestTrace(t *testing.T) {
	for _, tc := range traceCases {
		t.Run(tc.name, func(t *testing.T) {
			var gc goldenCase
			for _, c := range goldenCases {
				if c.name == tc.golden {
					gc = c
				}
			}
			h := newHarness(t, gc.ipFamily(), gc.params(t))
			core := proxy.NewCore(proxy.Config{Family: gc.ipFamily(), ModeName: "nftables", Node: state.Node{Name: nodeName},
				MinSyncPeriod: time.Second, SyncPeriod: time.Minute}, h.syncer)
			for _, o := range gc.objs {
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
			pkt, err := trace.ParsePacket(tc.src, tc.dst, tc.port, tc.protocol, tc.from)
			if err != nil {
				t.Fatal(err)
			}
			pkt.LocalDestination = tc.local
			r, err := core.Trace(pkt, false)
			if err != nil {
				t.Fatal(err)
			}
			checkTrace(t, tc, r)
		})
	}
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

// --verify reads the traced service's objects: the table holds what the
// sync wrote, so nothing differs.
func TestTraceVerify(t *testing.T) {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	core := proxy.NewCore(proxy.Config{Family: v1.IPv4Protocol, ModeName: "nftables", Node: state.Node{Name: nodeName},
		MinSyncPeriod: time.Second, SyncPeriod: time.Minute}, h.syncer)
	for _, o := range sampleObjects() {
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

// tracedCore is a core of the nftables mode on a fake table that has
// synced the objects.
func tracedCore(t *testing.T, family v1.IPFamily, params Params, objs []any) *proxy.Core {
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
	return core
}

// Every golden table can be traced: each of its services' addresses from
// each origin, with no rule or element the trace does not understand,
// and the ways through add up to certainty.
func TestTraceEveryGoldenService(t *testing.T) {
	for _, gc := range goldenCases {
		params := gc.params(t)
		core := tracedCore(t, gc.ipFamily(), params, gc.objs)
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
						pkt, err := trace.ParsePacket(src, dst, itoa(tg.port), string(sp.Protocol), from)
						if err != nil {
							t.Fatal(err)
						}
						pkt.LocalDestination = tg.local
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
		core := tracedCore(t, v1.IPv4Protocol, v4(nil)(t), []any{
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
