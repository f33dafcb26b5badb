package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

const (
	servicePort  = 80
	endpointPort = 8080
	// The services' endpoints cycle through 10.244.0.0-10.244.199.255;
	// every endpoint a change adds is new, from 10.244.200.0 up, so that its
	// DNAT rule can be recognised. No traffic is ever sent to any of them.
	initialAddresses = 200 * 256
	freshAddresses   = 56 * 256
	// The proxies' minSyncPeriod (1 s) plus a margin: a change made sooner
	// after a sync waits for the period, which is not what is measured.
	quietBeforeChange = 1100 * time.Millisecond
	pollInterval      = 20 * time.Millisecond
)

// measure runs one proxy from a clean kernel, in the column's iptables
// backend or in mode nftables or ipvs, and fills its column; after an
// error, what it measured so far.
func (b *bench) measure(ctx context.Context, proxy, column string) (results, error) {
	b.runs++
	mode := columnMode(column)
	r := results{}
	profile := proxy == ours && b.opts.profileDir != ""
	startProxy, stopNode, err := b.node(ctx, proxy, column, profile)
	if err != nil {
		return r, err
	}
	defer stopNode()
	name := fmt.Sprintf("%s-%s", proxy, column)

	// Cold start.
	start := time.Now()
	kp, err := startProxy(name)
	if err != nil {
		return r, err
	}
	defer b.keepLog(kp, proxy, column, "first-start.log")
	defer kp.Stop()
	var profiled sync.WaitGroup
	if profile {
		b.profileCPU(ctx, kp, column, "first-sync", b.opts.profileFor, &profiled)
	}
	first, err := b.firstSync(ctx, kp, start)
	if err != nil {
		return r, err
	}
	r["firstSync"] = first
	b.logf("  first sync %s s", first.format(3))
	if first.capped {
		return r, nil
	}
	if own, ok := firstSyncDuration(ctx, kp); ok {
		r["firstSyncOwn"] = cell{value: own}
	}
	switch mode {
	case modeIPTables:
		m, err := framework.FetchMetrics(framework.MetricsURL + "/metrics")
		if err != nil {
			return r, err
		}
		if v, ok := familyValue(m, "kubeproxy_sync_proxy_rules_iptables_total", "table=nat"); ok {
			r["natRules"] = cell{value: v}
		}
		if b.opts.profileDir != "" {
			// Both proxies' rules, to compare what each leaves in the kernel.
			path := b.outputPath(proxy, column, "rules.txt")
			if out, err := b.cluster.Node.Exec("iptables-" + column + "-save"); err != nil {
				b.logf("saving the rules: %v", err)
			} else if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				b.logf("saving the rules: %v", err)
			}
		}
	case modeNFTables:
		if b.opts.profileDir != "" {
			path := b.outputPath(proxy, column, "rules.txt")
			if out, err := b.cluster.Node.Exec("nft", "list", "ruleset"); err != nil {
				b.logf("saving the rules: %v", err)
			} else if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				b.logf("saving the rules: %v", err)
			}
		}
	}

	// Idle: settle first, as both may sync again just after starting.
	if err := sleep(ctx, 5*time.Second); err != nil {
		return r, err
	}
	profiled.Wait() // a process takes one CPU profile at a time
	if profile {
		b.profileCPU(ctx, kp, column, "idle", b.opts.idle, &profiled)
	}
	before, err := kp.usage()
	if err != nil {
		return r, err
	}
	if err := sleep(ctx, b.opts.idle); err != nil {
		return r, err
	}
	after, err := kp.usage()
	if err != nil {
		return r, err
	}
	r["idleCPU"] = cell{value: (after.CPU - before.CPU).Seconds(), note: "in " + b.opts.idle.String()}
	r["peakRSS"] = cell{value: float64(after.PeakRSS) / 1e6}
	r["steadyRSS"] = cell{value: float64(after.RSS) / 1e6}
	b.logf("  idle CPU %.2f s, RSS peak %.0f MB, steady %.0f MB", r["idleCPU"].value, r["peakRSS"].value, r["steadyRSS"].value)
	// The live heap apart from the GC's headroom and the runtime's own
	// memory, which RSS includes: both proxies export Go's collector.
	if heap, err := goHeapInUse(kp); err != nil {
		b.logf("  heap in use: %v", err)
	} else {
		r["steadyHeap"] = cell{value: heap / 1e6}
		b.logf("  heap in use %.0f MB", r["steadyHeap"].value)
	}
	profiled.Wait()
	if profile {
		// The heap after the first sync: what is kept (inuse_space) and
		// everything allocated since the start (alloc_space).
		path := b.outputPath(ours, column, "heap.pprof")
		if err := fetchProfile(ctx, kp, "heap", path); err != nil {
			b.logf("heap profile: %v", err)
		} else {
			b.logf("heap profile written to %s", path)
		}
	}
	kp.Stop()

	// Restart over the rules the first process left.
	start = time.Now()
	kp, err = startProxy(name + "-restart")
	if err != nil {
		return r, err
	}
	defer b.keepLog(kp, proxy, column, "restart.log")
	defer kp.Stop()
	if profile {
		b.profileCPU(ctx, kp, column, "restart", b.opts.profileFor, &profiled)
	}
	restart, err := b.firstSync(ctx, kp, start)
	if err != nil {
		return r, err
	}
	profiled.Wait()
	r["restartSync"] = restart
	b.logf("  restart sync %s s", restart.format(3))
	if restart.capped {
		return r, nil
	}
	if own, ok := firstSyncDuration(ctx, kp); ok {
		r["restartSyncOwn"] = cell{value: own}
	}
	// The restart's peak, before any change: it reads every rule back,
	// which a cold start does not.
	if r["restartPeakRSS"], err = settledPeakRSS(ctx, kp); err != nil {
		return r, err
	}
	b.logf("  restart RSS peak %.0f MB", r["restartPeakRSS"].value)
	if b.n == 0 {
		// The zero-service floor: with no service there is no change to
		// make, and the floors and churn rewrite a service's rules.
		return r, nil
	}

	if err := b.singleChanges(ctx, kp, r); err != nil {
		return r, err
	}
	switch mode {
	case modeIPVS:
		return r, nil
	case modeNFTables:
		if err := b.nftFloor(r); err != nil {
			return r, err
		}
	default:
		if err := b.restoreFloor(framework.IPTablesBackend(column), r); err != nil {
			return r, err
		}
	}
	if err := b.churn(ctx, column, r); err != nil {
		return r, err
	}
	return r, nil
}

// firstSync waits for the first complete sync: the moment the IPv4
// proxier's kubeproxy_sync_proxy_rules_last_timestamp_seconds is first set.
// Every object exists before the process starts and neither proxy syncs
// before its informers have listed them all, so that sync programs all of
// them. The time is the metric's own value (the end of the sync) minus
// the process start.
func (b *bench) firstSync(ctx context.Context, kp proxyProcess, start time.Time) (cell, error) {
	return b.waitFor(ctx, kp, start, func() (float64, bool) {
		m, err := framework.FetchMetrics(kp.metricsURL() + "/metrics")
		if err != nil {
			return 0, false
		}
		ts, ok := familyValue(m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
		return kp.hostTime(ts), ok && ts > 0
	})
}

// waitFor polls at, every 50 ms at least, until it tells when (Unix
// seconds, of our clock) what it looks for happened, and returns that
// time less start; at the cap, the cap, as a lower bound.
func (b *bench) waitFor(ctx context.Context, kp proxyProcess, start time.Time, at func() (float64, bool)) (cell, error) {
	deadline := start.Add(b.opts.cap)
	for {
		if t, ok := at(); ok {
			return cell{value: t - unixSeconds(start)}, nil
		}
		if time.Now().After(deadline) {
			return cell{value: b.opts.cap.Seconds(), capped: true}, nil
		}
		if err := pause(ctx, kp, max(50*time.Millisecond, kp.pollInterval())); err != nil {
			return cell{}, err
		}
	}
}

// settledPeakRSS is the process's peak RSS (VmHWM, MB) 5 s from now, as
// both proxies may sync again just after a start.
func settledPeakRSS(ctx context.Context, kp proxyProcess) (cell, error) {
	if err := sleep(ctx, 5*time.Second); err != nil {
		return cell{}, err
	}
	usage, err := kp.usage()
	if err != nil {
		return cell{}, err
	}
	return cell{value: float64(usage.PeakRSS) / 1e6}, nil
}

// goHeapInUse is the process's go_memstats_heap_inuse_bytes.
func goHeapInUse(kp proxyProcess) (float64, error) {
	m, err := framework.FetchMetrics(kp.metricsURL() + "/metrics")
	if err != nil {
		return 0, err
	}
	v, ok := m.Get("go_memstats_heap_inuse_bytes")
	if !ok {
		return 0, errors.New("no go_memstats_heap_inuse_bytes in the metrics")
	}
	return v, nil
}

// firstSyncDuration is the duration a fresh process reports for its first
// sync. Upstream sets the sync timestamp before it records the duration,
// so the histogram may still be empty when the timestamp shows.
func firstSyncDuration(ctx context.Context, kp proxyProcess) (float64, bool) {
	for range 100 {
		if s, err := readSyncState(kp); err == nil && s.count > 0 {
			return s.sum, true
		}
		if sleep(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	return 0, false
}

// syncState is what the proxy's metrics say about its IPv4 syncs.
type syncState struct {
	lastSync, lastQueued float64 // Unix seconds, of our clock
	count, sum           float64 // of the sync duration histogram
	fullCount            float64 // of the full sync duration histogram
	// Of the network programming latency histogram: from each change's
	// trigger time (the EndpointSlice controller's annotation) to the end
	// of the sync that applied it.
	programmed, programmingSum float64
}

func readSyncState(kp proxyProcess) (syncState, error) {
	m, err := framework.FetchMetrics(kp.metricsURL() + "/metrics")
	if err != nil {
		return syncState{}, err
	}
	var s syncState
	s.lastSync, _ = familyValue(m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
	s.lastQueued, _ = familyValue(m, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds")
	s.lastSync, s.lastQueued = kp.hostTime(s.lastSync), kp.hostTime(s.lastQueued)
	s.count, _ = familyValue(m, "kubeproxy_sync_proxy_rules_duration_seconds_count")
	s.sum, _ = familyValue(m, "kubeproxy_sync_proxy_rules_duration_seconds_sum")
	s.fullCount, _ = familyValue(m, "kubeproxy_sync_full_proxy_rules_duration_seconds_count")
	s.programmed, _ = familyValue(m, "kubeproxy_network_programming_duration_seconds_count")
	s.programmingSum, _ = familyValue(m, "kubeproxy_network_programming_duration_seconds_sum")
	return s, nil
}

// timedChange makes one change once the proxy is idle, and waits until a
// sync has applied it: a change was queued after the write, and a sync
// that started after the write ended after that. It returns that sync's
// duration and the time from the write to its end.
func (b *bench) timedChange(ctx context.Context, kp proxyProcess, change func() error) (sync, wall float64, err error) {
	prev, err := b.waitQuiet(ctx, kp)
	if err != nil {
		return 0, 0, err
	}
	t0 := unixSeconds(time.Now())
	if err := change(); err != nil {
		return 0, 0, err
	}
	deadline := time.Now().Add(b.opts.cap)
	// A sync that seemed to start before the write, and until when the
	// next is awaited.
	var early struct {
		own, wall float64
		until     time.Time
	}
	for time.Now().Before(deadline) {
		s, err := readSyncState(kp)
		if err == nil && s.lastQueued >= t0 && s.lastSync >= s.lastQueued && s.count > prev.count {
			// A sync that was running at the write (a periodic one, when
			// syncs are slow) has not applied the change: wait for the
			// next. The polls come more often than minSyncPeriod, so they
			// see the syncs one at a time, each one's duration the sum's
			// increase; after two at once, their mean. (The start is
			// checked against the write, not the queueing a few ms later:
			// upstream's duration ends a little after its timestamp.)
			own := (s.sum - prev.sum) / (s.count - prev.count)
			if s.count > prev.count+1 || s.lastSync-own >= t0 {
				return own, s.lastSync - t0, nil
			}
			// The change queued that next sync, which starts within
			// minSyncPeriod of this one's start. Unless this one only
			// seemed early: upstream records its duration some ms after
			// its timestamp, and v1.36 has no periodic sync (syncPeriod
			// only paces retries) to come next. Without a
			// next sync in the time one more would take, this one applied
			// the change.
			early.own, early.wall = own, s.lastSync-t0
			early.until = time.Now().Add(quietBeforeChange + time.Second + time.Duration(3*own*float64(time.Second)))
		}
		if !early.until.IsZero() && time.Now().After(early.until) {
			return early.own, early.wall, nil
		}
		if err == nil {
			prev = s
		}
		if err := pause(ctx, kp, kp.pollInterval()); err != nil {
			return 0, 0, err
		}
	}
	return 0, 0, fmt.Errorf("no sync within %s of a change written at %.3f: last read queued %.3f, synced %.3f, %.0f syncs",
		b.opts.cap, t0, prev.lastQueued, prev.lastSync, prev.count)
}

// waitQuiet waits until every queued change is applied and the last sync
// is more than minSyncPeriod ago.
func (b *bench) waitQuiet(ctx context.Context, kp proxyProcess) (syncState, error) {
	deadline := time.Now().Add(b.opts.cap)
	for time.Now().Before(deadline) {
		s, err := readSyncState(kp)
		if err == nil && s.lastSync >= s.lastQueued && unixSeconds(time.Now())-s.lastSync >= quietBeforeChange.Seconds() {
			return s, nil
		}
		if err := pause(ctx, kp, kp.pollInterval()); err != nil {
			return s, err
		}
	}
	return syncState{}, fmt.Errorf("the proxy did not settle within %s", b.opts.cap)
}

// singleChanges times endpoint changes, service additions and service
// deletions, one at a time.
func (b *bench) singleChanges(ctx context.Context, kp proxyProcess, r results) error {
	k := b.opts.changes
	var epSync, epWall, addSync, addWall, delSync, delWall []float64
	record := func(s, w *[]float64, change func() error) error {
		sync, wall, err := b.timedChange(ctx, kp, change)
		*s, *w = append(*s, sync), append(*w, wall)
		return err
	}
	for j := range k {
		i := ((b.runs-1)*k + j) % b.n
		if err := record(&epSync, &epWall, func() error { return b.replaceEndpoint(ctx, i, nil) }); err != nil {
			return fmt.Errorf("endpoint change: %w", err)
		}
	}
	services := b.client.CoreV1().Services(framework.DefaultNamespace)
	endpointSlices := b.client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace)
	added := make([]string, k)
	for j := range added {
		added[j] = fmt.Sprintf("bench-added-%d-%d", b.runs, j)
		// The slice first: the service's creation is then the one change
		// that makes the proxy program it, endpoints included.
		_, err := endpointSlices.Create(ctx, framework.ManualEndpointSlice(added[j], endpointPort, b.addresses(b.n+j)...), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if err := record(&addSync, &addWall, func() error {
			_, err := services.Create(ctx, framework.SelectorlessService(added[j], servicePort, endpointPort), metav1.CreateOptions{})
			return err
		}); err != nil {
			return fmt.Errorf("service add: %w", err)
		}
	}
	for _, name := range added {
		if err := record(&delSync, &delWall, func() error { return services.Delete(ctx, name, metav1.DeleteOptions{}) }); err != nil {
			return fmt.Errorf("service delete: %w", err)
		}
		if err := endpointSlices.Delete(ctx, name+"-manual", metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	for key, v := range map[string][]float64{"endpointSync": epSync, "endpointWall": epWall,
		"addSync": addSync, "addWall": addWall, "deleteSync": delSync, "deleteWall": delWall} {
		r[key] = cell{value: quantile(v, 0.5)}
	}
	b.logf("  endpoint change sync %.3f s / wall %.3f s; service add %.3f / %.3f; delete %.3f / %.3f",
		r["endpointSync"].value, r["endpointWall"].value, r["addSync"].value, r["addWall"].value, r["deleteSync"].value, r["deleteWall"].value)
	return nil
}

// quantile is the nearest-rank quantile q of values.
func quantile(values []float64, q float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	s := slices.Clone(values)
	slices.Sort(s)
	rank := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(rank, 0)]
}

// familyValue is the IPv4 proxier's series (every per-family metric
// carries the ip_family label, in both proxies).
func familyValue(m framework.Metrics, name string, labels ...string) (float64, bool) {
	return m.Get(name, append(labels, "ip_family=IPv4")...)
}

// pause waits, unless the process exits or ctx ends first.
func pause(ctx context.Context, kp proxyProcess, d time.Duration) error {
	select {
	case <-kp.Exited():
		return exitError(kp)
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
