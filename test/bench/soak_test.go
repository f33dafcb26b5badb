package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// TestChurnSoakAppliesEveryChange is the short churn soak of `make test`:
// a minute of 50 writes/s over 1,000 services, after which the kernel
// holds exactly what the API says and the goroutines have not grown. Its
// figures are logged; `make soak` runs the long one.
func TestChurnSoakAppliesEveryChange(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "iptables-nft", "iptables-nft-save")
	opts := options{
		services: []int{1000}, endpoints: []int{5},
		cap: 2 * time.Minute, workers: 32,
		soak: time.Minute, soakRate: 50, soakSample: 5 * time.Second,
	}
	// As TestBenchSmoke: the wait for the machine's cluster lock counts too.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	err := soak(ctx, opts, &out, &log)
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatalf("%v\nlog:\n%s", err, log.String())
	}
	if !strings.Contains(out.String(), "| service ports checked in the kernel against the API / differences | ") {
		t.Errorf("no kernel check in the report")
	}
}

// The kernel check finds each way the nat table can differ from the API.
func TestCompareIPTables(t *testing.T) {
	svc := func(name, ip string, port int32) v1.Service {
		s := framework.SelectorlessService(name, port, endpointPort)
		s.Spec.ClusterIP = ip
		return *s
	}
	slice := func(name string, addrs ...string) discoveryv1.EndpointSlice {
		return *framework.ManualEndpointSlice(name, endpointPort, addrs...)
	}
	// rules is the nat table of bench-a at ip:port with endpoints.
	rules := func(name, ip string, port int32, endpoints ...string) string {
		svcChain := framework.ServiceChain(framework.DefaultNamespace, name, framework.ServicePortName, "tcp")
		out := fmt.Sprintf("-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"default/%s:tcp cluster IP\" -m tcp --dport %d -j %s\n", ip, name, port, svcChain)
		for _, ep := range endpoints {
			sep := framework.EndpointChain(framework.DefaultNamespace, name, framework.ServicePortName, "tcp", ep+":8080")
			out += fmt.Sprintf("-A %s -m comment --comment \"default/%s:tcp -> %s:8080\" -m statistic --mode random --probability 0.5 -j %s\n", svcChain, name, ep, sep)
			out += fmt.Sprintf("-A %s -p tcp -m comment --comment \"default/%s:tcp\" -m tcp -j DNAT --to-destination %s:8080\n", sep, name, ep)
		}
		return out
	}
	api := []v1.Service{svc("bench-a", "10.96.0.10", 80)}
	apiSlices := []discoveryv1.EndpointSlice{slice("bench-a", "10.244.0.1", "10.244.0.2")}
	for _, tc := range []struct {
		name, save string
		bad        int
	}{
		{"the same", rules("bench-a", "10.96.0.10", 80, "10.244.0.1", "10.244.0.2"), 0},
		{"an old port", rules("bench-a", "10.96.0.10", 81, "10.244.0.1", "10.244.0.2"), 1},
		{"an old endpoint", rules("bench-a", "10.96.0.10", 80, "10.244.0.1", "10.244.0.3"), 2},
		{"a missing endpoint", rules("bench-a", "10.96.0.10", 80, "10.244.0.1"), 2},
		{"a deleted service", rules("bench-a", "10.96.0.10", 80, "10.244.0.1", "10.244.0.2") + rules("bench-b", "10.96.0.11", 80), 1},
	} {
		checked, bad := compareIPTables(api, apiSlices, tc.save)
		if checked != 1 || len(bad) != tc.bad {
			t.Errorf("%s: checked %d, differences %q; want 1 checked, %d differences", tc.name, checked, bad, tc.bad)
		}
	}
}

func TestTrend(t *testing.T) {
	at := []time.Duration{0, time.Minute, 2 * time.Minute, 3 * time.Minute}
	if got := trend(at, []float64{10, 12, 14, 16}); got != 2 {
		t.Errorf("a line rising 2 a minute: trend %v", got)
	}
	if got := trend(at, []float64{10, 11, 10, 11}); got < 0.19 || got > 0.21 {
		t.Errorf("a saw: trend %v, want 0.2", got)
	}
}
