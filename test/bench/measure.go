// Over 600 lines: a shape's objects, the proxies it runs, and measure, one
// proxy's whole run (first sync, restart, single changes, churn, idle) in
// the order of the table's rows, which reads best in one place.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

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

// bench holds one shape's cluster and objects across every run.
type bench struct {
	cluster *framework.Cluster
	client  kubernetes.Interface
	opts    options
	n, e    int
	logf    func(string, ...any)

	slices []*discoveryv1.EndpointSlice // the current object of each service's slice
	fresh  int                          // fresh addresses handed out
	runs   int                          // runs so far, to spread changes over the services
}

func newBench(cluster *framework.Cluster, opts options, n, e int, logf func(string, ...any)) (*bench, error) {
	client, err := cluster.FastClient()
	if err != nil {
		return nil, err
	}
	return &bench{cluster: cluster, client: client, opts: opts, n: n, e: e, logf: logf,
		slices: make([]*discoveryv1.EndpointSlice, n)}, nil
}

func serviceName(i int) string { return fmt.Sprintf("bench-%05d", i) }

func address(i int) string { return fmt.Sprintf("10.244.%d.%d", i/256, i%256) }

// addresses are service i's initial endpoints.
func (b *bench) addresses(i int) []string {
	out := make([]string, b.e)
	for k := range out {
		out[k] = address((i*b.e + k) % initialAddresses)
	}
	return out
}

// freshAddress is an endpoint address no rule has held yet.
func (b *bench) freshAddress() (string, error) {
	if b.fresh >= freshAddresses {
		return "", errors.New("out of fresh endpoint addresses")
	}
	b.fresh++
	return address(initialAddresses + b.fresh - 1), nil
}

// createObjects creates every selector-less Service and its EndpointSlice,
// logging the rate at each tenth: the apiserver's ClusterIP allocator counts
// every allocated address at each allocation, so the rate falls as N grows.
func (b *bench) createObjects(ctx context.Context) error {
	var created atomic.Int64
	start, tenth := time.Now(), max(b.n/10, 1)
	return framework.Parallel(ctx, b.n, b.opts.workers, func(ctx context.Context, i int) error {
		defer func() {
			if done := int(created.Add(1)); done%tenth == 0 {
				b.logf("  created %d of %d services after %s", done, b.n, time.Since(start).Round(time.Second))
			}
		}()
		name := serviceName(i)
		slice, err := b.client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Create(ctx,
			framework.ManualEndpointSlice(name, endpointPort, b.addresses(i)...), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		b.slices[i] = slice
		_, err = b.client.CoreV1().Services(framework.DefaultNamespace).Create(ctx,
			framework.SelectorlessService(name, servicePort, endpointPort), metav1.CreateOptions{})
		return err
	})
}

// replaceEndpoint gives service i a fresh first endpoint and returns its
// DNAT destination; written, if set, learns the destination just before
// the API write.
func (b *bench) replaceEndpoint(ctx context.Context, i int, written func(dest string)) error {
	addr, err := b.freshAddress()
	if err != nil {
		return err
	}
	slice := b.slices[i].DeepCopy()
	slice.Endpoints[0].Addresses = []string{addr}
	if written != nil {
		written(fmt.Sprintf("%s:%d", addr, endpointPort))
	}
	updated, err := b.client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Update(ctx, slice, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	b.slices[i] = updated
	return nil
}

// proxyProcess is a running kube-proxy: in the cluster's node namespace
// (localProxy) or in a VM (guestProxy).
type proxyProcess interface {
	Exited() <-chan struct{}
	Err() error // how it ended, once Exited is closed
	LogTail(lines int) string
	Stop()
	usage() (framework.ProcUsage, error)
	metricsURL() string
	// hostTime turns a time of the process's clock (Unix seconds, as its
	// metrics give it) into one of ours.
	hostTime(unix float64) float64
	// pollInterval is how often the bench reads its metrics while it
	// waits for a sync.
	pollInterval() time.Duration
}

// localProxy is a kube-proxy in the cluster's node namespace.
type localProxy struct{ *framework.KubeProxy }

func (p localProxy) usage() (framework.ProcUsage, error) { return framework.ReadProcUsage(p.Pid()) }
func (localProxy) metricsURL() string                    { return framework.MetricsURL }
func (localProxy) hostTime(unix float64) float64         { return unix }
func (localProxy) pollInterval() time.Duration           { return pollInterval }

// exitError says that kp has exited, and how.
func exitError(kp proxyProcess) error {
	return fmt.Errorf("kube-proxy exited: %v\n%s", kp.Err(), kp.LogTail(20))
}

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

// node prepares where the run's kube-proxy runs, with a config that
// serves metrics to the bench (and profiles, if profile), and returns what
// starts it there (name tells its log apart) and what ends the node.
func (b *bench) node(ctx context.Context, proxy, column string, profile bool) (startProxy func(name string) (proxyProcess, error), stop func(), err error) {
	if columnMode(column) == modeIPVS {
		binary := b.cluster.KubeProxy()
		if proxy == upstream {
			binary = b.cluster.UpstreamKubeProxy()
		}
		g, err := b.bootGuest(ctx, binary, b.cluster.KubeProxyConfig("mode: ipvs\n"+proxyConfig(profile)))
		if err != nil {
			return nil, nil, err
		}
		return g.startProxy, g.stop, nil
	}
	if err := b.resetNode(column); err != nil {
		return nil, nil, err
	}
	var backend framework.IPTablesBackend
	if columnMode(column) == modeIPTables {
		backend = framework.IPTablesBackend(column)
	}
	start, err := b.localStarter(proxy, column, backend, profile)
	if err != nil {
		return nil, nil, err
	}
	return func(name string) (proxyProcess, error) { return start(name) }, func() {}, nil
}

// proxyConfig is the config every run adds: metrics served to the bench
// and, if profile, profiles.
func proxyConfig(profile bool) string {
	config := "metricsBindAddress: 0.0.0.0:10249\n"
	if profile {
		// Verbosity 2 logs each sync with its time, for the logs kept
		// beside the profiles.
		config += "enableProfiling: true\nlogging:\n  verbosity: 2\n"
	}
	return config
}

// resetNode empties the node namespace's kernel for a run that starts in
// the column's mode: no nftables table (nft flush ruleset) and no iptables
// rule of either backend; in mode iptables, the backend is then marked
// as the one in use.
func (b *bench) resetNode(column string) error {
	if err := b.cluster.Node.ResetIPTables(); err != nil {
		return err
	}
	if columnMode(column) != modeIPTables {
		return nil
	}
	return b.cluster.Node.PreferIPTablesBackend(framework.IPTablesBackend(column))
}

// localStarter returns what starts the proxy in the node namespace in the
// column's mode (iptables or nftables) over whatever the kernel holds;
// upstream's runs `iptables` of backend, if set, else the system's.
func (b *bench) localStarter(proxy, column string, backend framework.IPTablesBackend, profile bool) (func(name string) (localProxy, error), error) {
	binary := b.cluster.KubeProxy()
	if proxy == upstream {
		binary = b.cluster.UpstreamKubeProxy()
	}
	mode := columnMode(column)
	if backend != "" && proxy == upstream {
		var err error
		if binary, err = b.upstreamWrapper(backend); err != nil {
			return nil, err
		}
	}
	// Inside a network namespace nf_conntrack_max is read-only: leave it.
	config := b.cluster.KubeProxyConfig("mode: " + mode + "\n" + proxyConfig(profile) + "conntrack:\n  maxPerCore: 0\n")
	return func(name string) (localProxy, error) {
		kp, err := b.cluster.StartKubeProxy(name, binary, config)
		return localProxy{kp}, err
	}, nil
}

// upstreamWrapper runs upstream's kube-proxy on an iptables backend. Ours
// picks its backend itself (by counting rules, see
// PreferIPTablesBackend); upstream's runs plain `iptables`, so the wrapper
// puts the backend's commands first in PATH, as upstream's image does with
// its iptables-wrapper.
func (b *bench) upstreamWrapper(backend framework.IPTablesBackend) (string, error) {
	dir := filepath.Join(b.cluster.Dir, "iptables-"+string(backend))
	if err := framework.IPTablesAlternatives(dir, backend); err != nil {
		return "", err
	}
	wrapper := filepath.Join(b.cluster.Dir, "kube-proxy-upstream-"+string(backend))
	script := fmt.Sprintf("#!/bin/sh\nPATH=%s:$PATH exec %s \"$@\"\n", dir, b.cluster.UpstreamKubeProxy())
	return wrapper, os.WriteFile(wrapper, []byte(script), 0o755)
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

// restoreFloor times what the iptables tools alone need to rewrite one
// service chain, unchanged, over the proxy's rules: the floor under any
// single-change sync. Median of 5 runs of iptables-restore --noflush
// (started through ip netns exec, a few ms more than the proxy's own).
func (b *bench) restoreFloor(backend framework.IPTablesBackend, r results) error {
	chain := framework.ServiceChain(framework.DefaultNamespace, serviceName(b.n/2), framework.ServicePortName, "tcp")
	listed, err := b.cluster.Node.Exec("iptables-"+string(backend), "-w", "-t", "nat", "-S", chain)
	if err != nil {
		return fmt.Errorf("listing %s: %w", chain, err)
	}
	input := "*nat\n:" + chain + " - [0:0]\n"
	for _, line := range strings.Split(listed, "\n") {
		if strings.HasPrefix(line, "-A ") {
			input += line + "\n"
		}
	}
	input += "COMMIT\n"
	var times []float64
	for range 5 {
		cmd := b.cluster.Node.Command("iptables-"+string(backend)+"-restore", "-w", "--noflush")
		cmd.Stdin = strings.NewReader(input)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("restoring %s alone: %w: %s", chain, err, out)
		}
		times = append(times, time.Since(start).Seconds())
	}
	r["restoreFloor"] = cell{value: quantile(times, 0.5)}
	b.logf("  floor: %s rewritten alone in %.3f s", chain, r["restoreFloor"].value)
	return nil
}

// nftFloor is restoreFloor in mode nftables: the service's chain in table
// ip kube-proxy, flushed and written again as nft lists it, in one
// `nft -f -` (median of 5, through ip netns exec too). Each nft process
// pays for reading the table it writes into, as each of the proxies'
// transactions does.
func (b *bench) nftFloor(r results) error {
	chain := framework.NFTablesServiceChain(framework.DefaultNamespace, serviceName(b.n/2), framework.ServicePortName, "tcp")
	listed, err := b.cluster.Node.Exec("nft", "list", "chain", "ip", "kube-proxy", chain)
	if err != nil {
		return fmt.Errorf("listing %s: %w", chain, err)
	}
	input := "flush chain ip kube-proxy " + chain + "\n" + listed
	var times []float64
	for range 5 {
		cmd := b.cluster.Node.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(input)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("rewriting %s alone: %w: %s", chain, err, out)
		}
		times = append(times, time.Since(start).Seconds())
	}
	r["nftFloor"] = cell{value: quantile(times, 0.5)}
	b.logf("  floor: %s rewritten alone in %.3f s", chain, r["nftFloor"].value)
	return nil
}

// pending is one churn change until its endpoint chain (in mode
// nftables: its destination in the service's chain) is seen.
type pending struct {
	chain   string
	dest    string // mode nftables
	written time.Time
	seen    time.Time
	dropped bool
}

// findChains calls found, as soon as it knows, for each change whose
// chain the node's nat table holds. On nft each chain is listed alone,
// which stays cheap at any table size; on legacy listing even one chain
// copies the whole table, so one iptables-save answers for all of them (a
// time is then late by up to one save, about 0.6 s at 10,000 services, for
// both proxies alike). In mode nftables (nft, not nil) the service's
// chain, whose DNAT map holds the endpoints, is read over netlink
// (framework.NFTablesReader: `nft list chain` reads every set first, 2.7 s
// at 10,000 services).
func (b *bench) findChains(column string, nft *framework.NFTablesReader, todo []*pending, found func(*pending)) {
	if nft != nil {
		for _, p := range todo {
			ok, err := nft.ChainSendsTo(p.chain, p.dest)
			if err != nil {
				b.logf("  churn: reading %s: %v", p.chain, err)
			}
			if ok {
				found(p)
			}
		}
		return
	}
	backend := framework.IPTablesBackend(column)
	if backend == framework.IPTablesLegacy && len(todo) > 0 {
		chains, err := b.cluster.Node.NATChains(backend)
		if err != nil {
			b.logf("  churn: %v", err)
		}
		for _, p := range todo {
			if chains[p.chain] {
				found(p)
			}
		}
		return
	}
	for _, p := range todo {
		if b.cluster.Node.HasNATChain(backend, p.chain) {
			found(p)
		}
	}
}

// churn changes one endpoint of a different service at a steady rate and
// times each change from the API write to the new endpoint's KUBE-SEP
// chain (and so its DNAT rule) appearing in the kernel, in mode nftables
// to its address and port appearing in the service chain's DNAT map. A poller checks
// every change not yet seen (see findChains), then sleeps pollInterval: a
// time is late by up to one round. A change that a later
// change to the same service replaced before it was seen is left out.
// The result is not fatal: changes never seen leave p99 as a lower bound.
func (b *bench) churn(ctx context.Context, column string, r results) error {
	var nft *framework.NFTablesReader
	if column == modeNFTables {
		var err error
		if nft, err = b.cluster.Node.NFTablesReader(); err != nil {
			return err
		}
		defer nft.Close()
	}
	var mu sync.Mutex
	var all []*pending
	lastOf := map[int]*pending{}
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	var polling sync.WaitGroup
	polling.Add(1)
	go func() {
		defer polling.Done()
		for pollCtx.Err() == nil {
			mu.Lock()
			var todo []*pending
			for _, p := range all {
				if p.seen.IsZero() && !p.dropped {
					todo = append(todo, p)
				}
			}
			mu.Unlock()
			b.findChains(column, nft, todo, func(p *pending) {
				at := time.Now()
				mu.Lock()
				p.seen = at
				mu.Unlock()
			})
			_ = sleep(pollCtx, pollInterval)
		}
	}()

	total := int(b.opts.churnFor.Seconds() * float64(b.opts.churnRate))
	start := time.Now()
	for k := range total {
		if err := sleep(ctx, time.Until(start.Add(time.Duration(k)*time.Second/time.Duration(b.opts.churnRate)))); err != nil {
			return err
		}
		i := ((b.runs-1)*total + k) % b.n
		err := b.replaceEndpoint(ctx, i, func(dest string) {
			p := &pending{chain: framework.EndpointChain(framework.DefaultNamespace, serviceName(i), framework.ServicePortName, "tcp", dest),
				written: time.Now()}
			if nft != nil {
				p.chain = framework.NFTablesServiceChain(framework.DefaultNamespace, serviceName(i), framework.ServicePortName, "tcp")
				p.dest = dest
			}
			mu.Lock()
			defer mu.Unlock()
			if prev := lastOf[i]; prev != nil && prev.seen.IsZero() {
				prev.dropped = true
			}
			all, lastOf[i] = append(all, p), p
		})
		if err != nil {
			return err
		}
	}
	b.logf("  churn: %d changes written in %s", total, time.Since(start).Round(time.Millisecond))

	deadline := time.Now().Add(b.opts.cap)
	var latencies []float64
	missing := 0
	for {
		mu.Lock()
		latencies, missing = latencies[:0], 0
		for _, p := range all {
			switch {
			case !p.seen.IsZero():
				latencies = append(latencies, p.seen.Sub(p.written).Seconds())
			case !p.dropped:
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	stopPolling()
	polling.Wait()
	note := ""
	if len(latencies) < total {
		note = fmt.Sprintf("%d of %d seen", len(latencies), total)
	}
	for _, p := range all {
		if p.seen.IsZero() && !p.dropped {
			b.logf("  churn: never seen, for one: chain %s %s", p.chain, p.dest)
			break
		}
	}
	if len(latencies) == 0 {
		r["churnP99"] = cell{value: b.opts.cap.Seconds(), capped: true, note: note}
		b.logf("  churn: no change reached the kernel within %s", b.opts.cap)
		return nil
	}
	r["churnP50"] = cell{value: quantile(latencies, 0.5), note: note}
	r["churnP99"] = cell{value: quantile(latencies, 0.99), capped: missing > 0, note: note}
	b.logf("  churn latency p50 %.3f s, p99 %s s", r["churnP50"].value, r["churnP99"].format(3))
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

// profileCPU writes a CPU profile of kp's next length, taken in the
// background; done tells when it is written.
func (b *bench) profileCPU(ctx context.Context, kp proxyProcess, column, what string, length time.Duration, done *sync.WaitGroup) {
	done.Add(1)
	go func() {
		defer done.Done()
		path := b.outputPath(ours, column, what+".pprof")
		query := fmt.Sprintf("profile?seconds=%d", int(length.Seconds()))
		if err := fetchProfile(ctx, kp, query, path); err != nil {
			b.logf("CPU profile: %v", err)
		} else {
			b.logf("CPU profile of %s (%s) written to %s", what, length, path)
		}
	}()
}

// keepLog copies the process's log into the profile directory, if one
// was given: its timestamps tell where a start's seconds went.
func (b *bench) keepLog(kp proxyProcess, proxy, column, name string) {
	if b.opts.profileDir == "" {
		return
	}
	if err := os.WriteFile(b.outputPath(proxy, column, name), []byte(kp.LogTail(1<<20)), 0o644); err != nil {
		b.logf("keeping the log: %v", err)
	}
}

// outputPath names a file of -profile-dir for one proxy, column and shape.
func (b *bench) outputPath(proxy, column, name string) string {
	return filepath.Join(b.opts.profileDir, fmt.Sprintf("%s-%s-N%d-E%d-%s", proxy, column, b.n, b.e, name))
}

// fetchProfile saves the process's pprof profile named by query, for
// example "heap" or "profile?seconds=20" (CPU, from now on).
func fetchProfile(ctx context.Context, kp proxyProcess, query, path string) error {
	for { // the metrics server comes up first thing
		if _, err := framework.FetchMetrics(kp.metricsURL() + "/metrics"); err == nil {
			break
		}
		if err := pause(ctx, kp, kp.pollInterval()); err != nil {
			return err
		}
	}
	url := kp.metricsURL() + "/debug/pprof/" + query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
