package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Packets during rule changes (-synloss): a client pod opens a fresh TCP
// connection to a service every probeInterval while its endpoints change
// -synloss times; each proxy, mode and backend counts the connections that
// lost a SYN or were reset.
const (
	probeInterval = 5 * time.Millisecond
	// probeTimeout lets a connection whose first two SYNs were lost (1 s
	// and 3 s) still connect: it shows how many were lost.
	probeTimeout = 5 * time.Second
	// changeInterval paces the changes: several land in one sync period.
	changeInterval = 250 * time.Millisecond
)

// synLossResult is one run's counts.
type synLossResult struct {
	column, proxy string
	counts        framework.ProbeCounts
	// syncs during the probe (full ones apart), their mean duration, and
	// the mean time from a change to the end of the sync that applied it
	// (the network programming latency).
	syncs, fullSyncs      int
	meanSync, meanProgram time.Duration
	// windows are, for each removal, how long after it new connections
	// still failed: until the last failed one that started before the
	// next removal (0 if none did).
	windows []time.Duration
}

// runSynLoss measures every column and proxy in one cluster and prints a
// table to out; progress, every change and each failed connection, lined
// up with the change before it, go to log.
func runSynLoss(ctx context.Context, opts options, out, log io.Writer) error {
	logf := progress(log, "synloss")
	cluster, err := framework.Start(ctx)
	if err != nil {
		return err
	}
	defer cluster.Stop()
	b := &bench{cluster: cluster, opts: opts, logf: logf}
	client, err := cluster.AddPod(ctx, "synloss-client", framework.PodOptions{})
	if err != nil {
		return err
	}
	svc, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "synloss"},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": "synloss"}, Ports: []v1.ServicePort{{
			Name: "tcp", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	target := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	var results []synLossResult
	var failed error
	for _, column := range opts.columns() {
		for _, proxy := range opts.proxies {
			logf("%s kube-proxy, %s: %d changes", proxy, column, opts.synLoss)
			r, err := b.synLossRun(ctx, client.Netns, target, proxy, column, len(results))
			if err != nil {
				logf("%s, %s failed: %v", proxy, column, err)
				failed = errors.Join(failed, fmt.Errorf("%s, %s: %w", proxy, column, err))
				continue
			}
			logf("  %s", r.counts)
			results = append(results, r)
		}
	}
	fmt.Fprintf(out, "\n### Packets during rule changes: a fresh connection every %s, %d endpoint changes every %s, removed pods serving %s of grace\n\n",
		probeInterval, opts.synLoss, changeInterval, opts.synLossGrace)
	fmt.Fprintln(out, "| column | proxy | connections | lost a SYN | of them timed out | reset | other errors | syncs (full), mean duration | change to rules, mean | removals: failures for, mean (max) |")
	fmt.Fprintln(out, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range results {
		c := r.counts
		fmt.Fprintf(out, "| %s | %s | %d | %d | %d | %d | %d | %d (%d), %s | %s | %d: %s (%s) |\n", r.column, r.proxy, c.Total, c.LostSYN, c.Timeout, c.Reset, c.Error,
			r.syncs, r.fullSyncs, r.meanSync.Round(time.Millisecond), r.meanProgram.Round(time.Millisecond),
			len(r.windows), r.meanWindow().Round(time.Millisecond), slices.Max(append(r.windows, 0)).Round(time.Millisecond))
	}
	return failed
}

// synLossRun runs one proxy from a clean kernel, waits for the service to
// answer, and probes it through the churn.
func (b *bench) synLossRun(ctx context.Context, client *framework.Netns, target, proxy, column string, run int) (synLossResult, error) {
	r := synLossResult{column: column, proxy: proxy}
	startProxy, stopNode, err := b.node(ctx, proxy, column, false)
	if err != nil {
		return r, err
	}
	defer stopNode()
	kp, err := startProxy(fmt.Sprintf("synloss-%s-%s", proxy, column))
	if err != nil {
		return r, err
	}
	defer kp.Stop()
	churn, err := b.cluster.NewChurn(ctx, framework.ChurnOptions{
		Labels: map[string]string{"app": "synloss"}, NamePrefix: fmt.Sprintf("syn%d-", run),
		Pods: 3, MaxPods: 6, Changes: b.opts.synLoss, Interval: changeInterval, Grace: b.opts.synLossGrace, Seed: 1,
	})
	defer churn.Stop()
	if err != nil {
		return r, err
	}
	// Asked from the node, not the client: a request sent before the rules
	// exist leaves a conntrack flow that no DNAT changed, which a probed
	// connection reusing its source port would follow (docs/reliability.md).
	for deadline := time.Now().Add(b.opts.cap); ; {
		if _, err := b.cluster.Node.Request("tcp", target, time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the service did not answer within %s", b.opts.cap)
		}
		if err := pause(ctx, kp, 100*time.Millisecond); err != nil {
			return r, err
		}
	}
	before, err := readSyncState(kp)
	if err != nil {
		return r, err
	}
	probe, err := client.StartProbe(target, probeInterval, probeTimeout)
	if err != nil {
		return r, err
	}
	changes, churnErr := churn.Run(ctx)
	// And the syncs after the last change.
	time.Sleep(2 * time.Second)
	conns, err := probe.Stop()
	after, metricsErr := readSyncState(kp)
	if err := errors.Join(churnErr, err, metricsErr); err != nil {
		return r, err
	}
	r.syncs, r.fullSyncs = int(after.count-before.count), int(after.fullCount-before.fullCount)
	r.meanSync = meanSeconds(after.sum-before.sum, after.count-before.count)
	r.meanProgram = meanSeconds(after.programmingSum-before.programmingSum, after.programmed-before.programmed)
	r.counts = framework.CountConnections(conns)
	r.windows = removalWindows(conns, changes)
	for i, ch := range changes {
		b.logf("  change %d at %s: %s %s", i+1, ch.At.Format("15:04:05.000"), ch.Kind, ch.Pod)
	}
	for _, line := range framework.LineUpFailures(conns, changes) {
		b.logf("  %s", line)
	}
	return r, nil
}

func (r synLossResult) meanWindow() time.Duration {
	var sum time.Duration
	for _, w := range r.windows {
		sum += w
	}
	return meanSeconds(sum.Seconds(), float64(len(r.windows)))
}

// meanSeconds is sum/count seconds as a duration, 0 without a count.
func meanSeconds(sum, count float64) time.Duration {
	if count == 0 {
		return 0
	}
	return time.Duration(sum / count * float64(time.Second))
}

// removalWindows measures, for each removal, how long the rules still sent
// new connections to the removed pod: the start of the last connection
// that failed (lost a SYN, was reset or failed otherwise) among those that
// started after the removal and before the next one.
func removalWindows(conns []framework.Connection, changes []framework.EndpointChange) []time.Duration {
	var removals []time.Time
	for _, ch := range changes {
		if ch.Kind == framework.ChangeRemove {
			removals = append(removals, ch.At)
		}
	}
	windows := make([]time.Duration, len(removals))
	for _, c := range conns {
		if c.Outcome == framework.ProbeOK && !c.LostSYN() {
			continue
		}
		i, _ := slices.BinarySearchFunc(removals, c.Start, time.Time.Compare)
		if i > 0 {
			windows[i-1] = max(windows[i-1], c.Start.Sub(removals[i-1]))
		}
	}
	return windows
}
