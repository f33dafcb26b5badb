package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// traceOnTheNode runs kube-proxy-explain trace --verify -o json on the
// node for a TCP packet to port 80 and returns its answer.
func traceOnTheNode(source, destination, from string) (trace.Result, string, error) {
	var r trace.Result
	out, err := cluster.Node.Command(cluster.KubeProxyExplain(), "trace", "--source", source, "--destination", destination,
		"--port", "80", "--protocol", "tcp", "--from", from, "--verify", "-o", "json").CombinedOutput()
	if err != nil {
		return r, string(out), fmt.Errorf("kube-proxy-explain trace: %v: %s", err, out)
	}
	return r, string(out), json.Unmarshal(out, &r)
}

// A trace of a packet from a client pod to a service with two endpoint
// pods names both, each as likely, and the kernel holds what it walked;
// then real packets from that pod each reach one of the endpoints it
// named.
func TestTraceNamesWhereAPacketGoes(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		a := addPod(t, "trace-a", framework.PodOptions{Labels: map[string]string{"app": "trace"}})
		b := addPod(t, "trace-b", framework.PodOptions{Labels: map[string]string{"app": "trace"}})
		client := addPod(t, "trace-client", framework.PodOptions{})
		svc := createService(t, service("trace", "trace", v1.ProtocolTCP))
		var r trace.Result
		eventually(t, convergence, "a trace to both endpoints that the kernel agrees with", func() error {
			var err error
			if r, _, err = traceOnTheNode(client.IPv4, svc.Spec.ClusterIP, "pod"); err != nil {
				return err
			}
			if r.Outcome.Verdict != trace.DNAT || len(r.Outcome.Endpoints) != 2 {
				return fmt.Errorf("outcome %+v", r.Outcome)
			}
			if r.Verify == nil || r.Verify.Error != "" || len(r.Verify.Differences) > 0 {
				return fmt.Errorf("verify: %+v", r.Verify)
			}
			return nil
		})
		if r.Mode != mode || r.Outcome.Masquerade {
			t.Errorf("trace in %s mode, masquerade %v: want %s, not masqueraded", r.Mode, r.Outcome.Masquerade, mode)
		}
		named := map[string]bool{}
		for _, c := range r.Outcome.Endpoints {
			named[c.Endpoint] = true
			if c.Probability < 0.49 || c.Probability > 0.51 {
				t.Errorf("endpoint %s has probability %v, want 0.5", c.Endpoint, c.Probability)
			}
		}
		out, err := cluster.Node.Command(cluster.KubeProxyExplain(), "trace", "--source", client.IPv4, "--destination", svc.Spec.ClusterIP,
			"--port", "80", "--from", "pod").CombinedOutput()
		if err != nil {
			t.Errorf("kube-proxy-explain trace: %v\n%s", err, out)
		}
		t.Logf("kube-proxy-explain trace:\n%s", out)
		address := map[string]string{a.Name: net.JoinHostPort(a.IPv4, "8080"), b.Name: net.JoinHostPort(b.IPv4, "8080")}
		for i := 0; i < 10; i++ {
			reply, err := client.Netns.Request("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), time.Second)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if !named[address[reply.Pod]] {
				t.Errorf("request %d answered by %q (%s), which the trace did not name: %v", i, reply.Pod, address[reply.Pod], named)
			}
			if reply.Source != client.IPv4 && !strings.HasPrefix(reply.Source, client.IPv4+":") {
				t.Errorf("request %d arrived from %s: the trace said not masqueraded, from %s", i, reply.Source, client.IPv4)
			}
		}
	})
}

// A packet from a source outside a load balancer's source ranges: the
// trace says dropped and why, and a real one from there gets no answer.
func TestTraceOfADroppedPacket(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "trace-fw", framework.PodOptions{Labels: map[string]string{"app": "trace-fw"}})
		svc := service("trace-fw", "trace-fw", v1.ProtocolTCP)
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
		svc = createService(t, svc)
		const lbIP = "10.255.3.23"
		setLoadBalancerIP(t, svc, lbIP)
		var text string
		eventually(t, convergence, "the trace says dropped, source range not allowed", func() error {
			r, out, err := traceOnTheNode(framework.ExternalIPv4, lbIP, "external")
			if err != nil {
				return err
			}
			text = out
			if r.Outcome.Verdict != trace.Drop || !strings.Contains(r.Outcome.Reason, "source range not allowed") {
				return fmt.Errorf("outcome %+v", r.Outcome)
			}
			if r.Verify == nil || r.Verify.Error != "" || len(r.Verify.Differences) > 0 {
				return fmt.Errorf("verify: %+v", r.Verify)
			}
			if !slices.ContainsFunc(r.Steps, func(s trace.Step) bool { return strings.Contains(s.What, "drop") || strings.Contains(s.What, "DROP") }) {
				return fmt.Errorf("no step drops it: %+v", r.Steps)
			}
			return nil
		})
		if reply, err := cluster.External.Request("tcp", net.JoinHostPort(lbIP, "80"), 2*time.Second); err == nil {
			t.Errorf("the trace said dropped, but %s answered:\n%s", reply.Pod, text)
		}
		out, err := cluster.Node.Command(cluster.KubeProxyExplain(), "trace", "--source", framework.ExternalIPv4, "--destination", lbIP,
			"--port", "80", "--from", "external").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Outcome: dropped") {
			t.Errorf("kube-proxy-explain trace: %v\n%s", err, out)
		}
		t.Logf("kube-proxy-explain trace:\n%s", out)
	})
}
