package e2e

import (
	"context"
	"net"
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
		eventually(t, convergence, "the service answers", func() error {
			_, err := client.Netns.Request("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), time.Second)
			return err
		})
		probe, err := client.Netns.StartProbe(net.JoinHostPort(svc.Spec.ClusterIP, "80"), 5*time.Millisecond, 5*time.Second)
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
		if counts.Clean < counts.Total {
			for _, line := range framework.LineUpFailures(conns, made) {
				t.Log(line)
			}
		}
		// In a full make test run (after some 200 pods of other tests),
		// iptables mode, one or two connections of 5,000 fail with "no
		// route to host" after 2-3 s, an endpoint's address not
		// answering ARP, with no lost SYN or reset; alone the test sees
		// none. Their cause is not known yet (issue #16): they are
		// logged above, not failed. A lost SYN or a reset fails.
		if counts.Clean == 0 || counts.LostSYN > 0 || counts.Reset > 0 || counts.Error > counts.Total/1000 {
			t.Errorf("%d of %d connections failed or stalled", counts.Total-counts.Clean, counts.Total)
		}
	})
}
