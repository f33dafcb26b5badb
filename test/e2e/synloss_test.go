package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// No new connection to a service is lost or reset while its endpoints
// change: pods added, removed (each serving out its grace period, as a
// kubelet lets it) and turning ready or not, always one ready. A fresh
// connection every 5 ms through 50 changes; `make synloss` is the longer
// run against upstream's (docs/reliability.md).
func TestNoConnectionIsLostWhileEndpointsChange(t *testing.T) {
	const (
		changes  = 50
		interval = 250 * time.Millisecond
		grace    = 3 * time.Second
	)
	inEachMode(t, func(t *testing.T, mode string) {
		ctx := context.Background()
		client := addPod(t, "syn-client", framework.PodOptions{})
		churn, err := cluster.NewChurn(ctx, framework.ChurnOptions{
			Labels: map[string]string{"app": "syn"}, NamePrefix: "syn-" + mode[:3] + "-",
			Pods: 3, MaxPods: 6, Changes: changes, Interval: interval, Grace: grace, Seed: 1,
		})
		t.Cleanup(churn.Stop)
		if err != nil {
			t.Fatal(err)
		}
		svc := service("syn", "syn", v1.ProtocolTCP)
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc = createService(t, svc)
		target := net.JoinHostPort(svc.Spec.ClusterIP, "80")
		answersTheNode(t, target)
		probe, err := client.Netns.StartProbe(target, 5*time.Millisecond, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		made, churnErr := churn.Run(ctx)
		time.Sleep(2 * time.Second) // the syncs after the last change
		conns, err := probe.Stop()
		if churnErr != nil {
			t.Fatal(churnErr)
		}
		if err != nil {
			t.Fatal(err)
		}
		counts := framework.CountConnections(conns)
		t.Logf("%d changes: %s", len(made), counts)
		if counts.Total == 0 || counts.Clean < counts.Total {
			t.Errorf("%d of %d connections failed or stalled", counts.Total-counts.Clean, counts.Total)
			for _, line := range framework.LineUpFailures(conns, made) {
				t.Log(line)
			}
			logUnanswered(t, client, target, churn, made)
		}
	})
}

// logUnanswered logs where the node sent each connection to target that
// no packet answered (a failure without a reset), which of the churn's
// pods had that address and what the churn did to it, and the neighbour
// entries on the way: the node's for the endpoint, the client's for its
// gateway.
func logUnanswered(t *testing.T, client *framework.Pod, target string, churn *framework.Churn, made []framework.EndpointChange) {
	t.Helper()
	unanswered, err := cluster.Node.UnansweredConnections(target)
	if err != nil {
		t.Logf("listing unanswered connections: %v", err)
		return
	}
	gateway, err := client.Netns.Neighbour(framework.PodGatewayIPv4)
	t.Logf("%d connections unanswered in the node's conntrack table; the client's neighbour entry for its gateway: %s %v", len(unanswered), gateway, err)
	for _, c := range unanswered {
		address, _, _ := net.SplitHostPort(c.Endpoint)
		pod := churn.PodAt(address)
		var history []string
		for i, ch := range made {
			if ch.Pod == pod {
				history = append(history, fmt.Sprintf("%s at change %d", ch.Kind, i+1))
			}
		}
		neighbour, err := cluster.Node.Neighbour(address)
		t.Logf("from %s to %s (pod %q: %s); the node's neighbour entry: %s %v; %s", c.Client, c.Endpoint, pod, strings.Join(history, ", "), neighbour, err, c.Entry)
	}
}
