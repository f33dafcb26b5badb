package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// The churn soak (-soak): our kube-proxy in iptables mode (nft backend)
// over N services while Services and EndpointSlices change at a steady
// rate for a long time; its RSS and goroutines are sampled throughout, and
// at the end the kernel's rules are checked against the API's objects.
// Nothing is timed: it shows that every change lands and that nothing
// grows. docs/reliability.md has its figures.

// The kinds of change, one per API write, in turn for each service.
const (
	changeEndpoint      = iota // a new address for the slice's first endpoint
	changeEndpointAgain        // the same again: half the writes are slice updates
	changeServicePort          // the service's port flips between 80 and 81
	changeServiceExists        // the service is deleted; a deleted one is created at its next turn, whatever the kind
	changeKinds
)

// soakWorkers bound the API writes in flight.
const soakWorkers = 16

// soakSample is one reading of the proxy.
type soakSample struct {
	at         time.Duration // since the churn began
	rss        int64
	goroutines float64
}

// soakResult is what a soak measured.
type soakResult struct {
	n, e             int
	rate             int
	duration         time.Duration
	writes           [changeKinds]int64
	writeErrors      int64
	firstError       string
	settle           time.Duration // from the last write to a sync that includes it
	checked          int           // service ports compared with the kernel
	mismatches       []string
	samples          []soakSample
	warmup           time.Duration
	syncs, fullSyncs float64
}

// soaker drives the changes.
type soaker struct {
	*bench
	mu       []sync.Mutex  // per service: one write at a time
	services []*v1.Service // nil while deleted
	next     atomic.Int64  // endpoint addresses handed out, cyclically
}

// soak runs the churn soak for the first N and E given and writes its
// report to out.
func soak(ctx context.Context, opts options, out, log io.Writer) error {
	r, err := runSoak(ctx, opts, opts.services[0], opts.endpoints[0], log)
	if r != nil {
		r.write(out)
	}
	if err != nil {
		return err
	}
	return r.failure()
}

func runSoak(ctx context.Context, opts options, n, e int, log io.Writer) (*soakResult, error) {
	logf := progress(log, "soak")
	b, cluster, err := startWithObjects(ctx, opts, n, e, logf)
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	s := &soaker{bench: b, mu: make([]sync.Mutex, n), services: make([]*v1.Service, n)}
	for i := range n {
		svc, err := b.client.CoreV1().Services(framework.DefaultNamespace).Get(ctx, serviceName(i), metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		s.services[i] = svc
	}

	startProxy, stopNode, err := b.node(ctx, ours, string(framework.IPTablesNFT), false)
	if err != nil {
		return nil, err
	}
	defer stopNode()
	started := time.Now()
	kp, err := startProxy("kube-proxy-soak")
	if err != nil {
		return nil, err
	}
	defer kp.Stop()
	if c, err := b.firstSync(ctx, kp, started); err != nil || c.capped {
		return nil, fmt.Errorf("no first sync within %s: %v", opts.cap, err)
	}
	logf("first sync done; churning at %d writes/s for %s", opts.soakRate, opts.soak)

	r := &soakResult{n: n, e: e, rate: opts.soakRate, duration: opts.soak, warmup: soakWarmup(opts.soak)}
	churnCtx, stopChurn := context.WithTimeout(ctx, opts.soak)
	defer stopChurn()
	sampled := make(chan []soakSample)
	go func() { sampled <- sample(churnCtx, kp, opts.soakSample, logf) }()
	s.churn(churnCtx, opts.soakRate, r)
	lastWrite := time.Now()
	r.samples = <-sampled
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	select {
	case <-kp.Exited():
		return r, exitError(kp)
	default:
	}
	settled, err := b.waitQuiet(ctx, kp)
	if err != nil {
		return r, err
	}
	r.settle = time.Duration((settled.lastSync - unixSeconds(lastWrite)) * float64(time.Second))
	r.syncs = settled.count
	if m, err := framework.FetchMetrics(kp.metricsURL() + "/metrics"); err == nil {
		r.fullSyncs, _ = familyValue(m, "kubeproxy_sync_full_proxy_rules_duration_seconds_count")
	}
	logf("settled; checking the kernel against the API")
	r.checked, r.mismatches, err = checkIPTablesAgainstAPI(ctx, b)
	return r, err
}

// soakWarmup is the start of a soak whose samples a trend leaves out: the
// first churn allocates what the steady state then reuses.
func soakWarmup(d time.Duration) time.Duration { return min(d/5, 2*time.Minute) }

// churn makes rate writes a second until ctx ends, each from a worker.
func (s *soaker) churn(ctx context.Context, rate int, r *soakResult) {
	work := make(chan int, soakWorkers)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	for range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				kind, err := s.change(context.Background(), k)
				atomic.AddInt64(&r.writes[kind], 1)
				if err != nil {
					errMu.Lock()
					if r.writeErrors == 0 {
						r.firstError = err.Error()
					}
					r.writeErrors++
					errMu.Unlock()
				}
			}
		}()
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			close(work)
			wg.Wait()
			return
		case <-tick.C:
		}
		select {
		case work <- k:
		case <-ctx.Done():
		}
	}
}

// change makes write k: to service k mod N, of a kind that moves on with
// each round over the services, so each service sees every kind.
func (s *soaker) change(ctx context.Context, k int) (kind int, err error) {
	i := k % s.n
	kind = (k/s.n + i) % changeKinds
	s.mu[i].Lock()
	defer s.mu[i].Unlock()
	services := s.client.CoreV1().Services(framework.DefaultNamespace)
	svc := s.services[i]
	switch {
	case svc == nil:
		// A deleted service comes back at its next turn, so that nearly
		// all N exist throughout.
		created, err := services.Create(ctx, framework.SelectorlessService(serviceName(i), servicePort, endpointPort), metav1.CreateOptions{})
		if err == nil {
			s.services[i] = created
		}
		return changeServiceExists, err
	case kind == changeEndpoint || kind == changeEndpointAgain:
		slice := s.slices[i].DeepCopy()
		slice.Endpoints[0].Addresses = []string{address(initialAddresses + int(s.next.Add(1)%freshAddresses))}
		updated, err := s.client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Update(ctx, slice, metav1.UpdateOptions{})
		if err == nil {
			s.slices[i] = updated
		}
		return kind, err
	case kind == changeServicePort:
		svc = svc.DeepCopy()
		svc.Spec.Ports[0].Port = servicePort + 1 - (svc.Spec.Ports[0].Port - servicePort)
		updated, err := services.Update(ctx, svc, metav1.UpdateOptions{})
		if err == nil {
			s.services[i] = updated
		}
		return kind, err
	default:
		err := services.Delete(ctx, svc.Name, metav1.DeleteOptions{})
		if err == nil || apierrors.IsNotFound(err) {
			s.services[i], err = nil, nil
		}
		return kind, err
	}
}

// sample reads the proxy's RSS and goroutines every interval until ctx
// ends, and once more then.
func sample(ctx context.Context, kp proxyProcess, interval time.Duration, logf func(string, ...any)) []soakSample {
	start := time.Now()
	var out []soakSample
	read := func() {
		s := soakSample{at: time.Since(start).Round(time.Second)}
		if u, err := kp.usage(); err == nil {
			s.rss = u.RSS
		}
		if m, err := framework.FetchMetrics(kp.metricsURL() + "/metrics"); err == nil {
			s.goroutines, _ = m.Get("go_goroutines")
		}
		logf("  %s: RSS %.1f MiB, %.0f goroutines", s.at, mib(s.rss), s.goroutines)
		out = append(out, s)
	}
	read()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			read()
			return out
		case <-tick.C:
			read()
		}
	}
}

// checkIPTablesAgainstAPI compares the node's nat table with the API's
// benchmark services and their slices (compareIPTables).
func checkIPTablesAgainstAPI(ctx context.Context, b *bench) (int, []string, error) {
	services, err := b.client.CoreV1().Services(framework.DefaultNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, nil, err
	}
	slices_, err := b.client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, nil, err
	}
	// Standard output only: a warning on standard error may land in the
	// middle of a rule.
	out, err := b.cluster.Node.Command("iptables-nft-save", "-t", "nat").Output()
	if err != nil {
		return 0, nil, err
	}
	save := string(out)
	checked, bad := compareIPTables(services.Items, slices_.Items, save)
	if len(bad) > 0 {
		// Kept with the cluster's logs, which the next run's start removes.
		path := filepath.Join(b.cluster.Dir, "soak-nat.txt")
		b.logf("the kernel differs from the API; its nat table is in %s", path)
		return checked, bad, os.WriteFile(path, []byte(save), 0o644)
	}
	return checked, bad, nil
}

// compareIPTables checks, for every benchmark service (named bench-*),
// that the nat table (iptables-save) holds what the objects ask for: its
// cluster IP and port jumping to its KUBE-SVC chain, which jumps to
// exactly the KUBE-SEP chains of the slice's endpoints, each DNATing to
// its endpoint; and that no KUBE-SERVICES rule is left of a service the
// API no longer has. It returns the services checked and what differs.
func compareIPTables(services []v1.Service, endpointSlices []discoveryv1.EndpointSlice, save string) (int, []string) {
	endpoints := map[string][]string{}
	for _, sl := range endpointSlices {
		service := sl.Labels[discoveryv1.LabelServiceName]
		for _, ep := range sl.Endpoints {
			endpoints[service] = append(endpoints[service], fmt.Sprintf("%s:%d", ep.Addresses[0], *sl.Ports[0].Port))
		}
	}
	chains := natChains(save)
	var bad []string
	inAPI := map[string]bool{}
	for _, svc := range services {
		if !strings.HasPrefix(svc.Name, "bench-") {
			continue
		}
		inAPI[svc.Name] = true
		name := svc.Namespace + "/" + svc.Name + ":" + framework.ServicePortName
		svcChain := framework.ServiceChain(svc.Namespace, svc.Name, framework.ServicePortName, "tcp")
		dest, jump := "-d "+svc.Spec.ClusterIP+"/32 ", fmt.Sprintf("--dport %d -j %s", svc.Spec.Ports[0].Port, svcChain)
		if !slices.ContainsFunc(chains["KUBE-SERVICES"], func(rule string) bool {
			return strings.HasPrefix(rule, dest) && strings.HasSuffix(rule, jump)
		}) {
			bad = append(bad, fmt.Sprintf("%s: no KUBE-SERVICES rule %s... %s", name, dest, jump))
		}
		var want, got []string
		for _, ep := range endpoints[svc.Name] {
			sep := framework.EndpointChain(svc.Namespace, svc.Name, framework.ServicePortName, "tcp", ep)
			want = append(want, sep)
			if !slices.ContainsFunc(chains[sep], func(rule string) bool { return strings.HasSuffix(rule, "--to-destination "+ep) }) {
				bad = append(bad, fmt.Sprintf("%s: %s does not DNAT to %s", name, sep, ep))
			}
		}
		for _, rule := range chains[svcChain] {
			if _, target, ok := strings.Cut(rule, "-j KUBE-SEP-"); ok {
				got = append(got, "KUBE-SEP-"+target)
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			bad = append(bad, fmt.Sprintf("%s: %s jumps to %v, want %v (endpoints %v)", name, svcChain, got, want, endpoints[svc.Name]))
		}
	}
	for _, rule := range chains["KUBE-SERVICES"] {
		_, after, ok := strings.Cut(rule, `--comment "`)
		if !ok {
			continue
		}
		service, _, _ := strings.Cut(after, ":")
		if _, name, _ := strings.Cut(service, "/"); strings.HasPrefix(name, "bench-") && !inAPI[name] {
			bad = append(bad, "a rule of a deleted service: "+rule)
		}
	}
	return len(inAPI), bad
}

// natChains are the rules of each chain of an iptables-save output, by
// chain name.
func natChains(save string) map[string][]string {
	out := map[string][]string{}
	for _, line := range strings.Split(save, "\n") {
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		chain, rule, _ := strings.Cut(rest, " ")
		out[chain] = append(out[chain], rule)
	}
	return out
}

// trend is the least-squares slope of values over times, per minute.
func trend(at []time.Duration, values []float64) float64 {
	n := float64(len(values))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for k, v := range values {
		x := at[k].Minutes()
		sx, sy, sxx, sxy = sx+x, sy+v, sxx+x*x, sxy+x*v
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// steady are the samples after the warm-up.
func (r *soakResult) steady() (at []time.Duration, rss, goroutines []float64) {
	for _, s := range r.samples {
		if s.at >= r.warmup {
			at = append(at, s.at)
			rss = append(rss, mib(s.rss))
			goroutines = append(goroutines, s.goroutines)
		}
	}
	return at, rss, goroutines
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

func mean(values []float64) float64 {
	var sum float64
	for _, v := range values {
		sum += v
	}
	return sum / float64(len(values))
}

// failure is why the soak failed, if it did: a write the API refused,
// the kernel disagreeing with the API, or goroutines that grew (a leak
// shows as a steady climb; more than half again over the run is one).
func (r *soakResult) failure() error {
	var errs []error
	if r.writeErrors > 0 {
		errs = append(errs, fmt.Errorf("%d API writes failed, the first: %s", r.writeErrors, r.firstError))
	}
	if len(r.mismatches) > 0 {
		shown := r.mismatches[:min(len(r.mismatches), 20)]
		errs = append(errs, fmt.Errorf("the kernel differs from the API in %d places, among them:\n%s", len(r.mismatches), strings.Join(shown, "\n")))
	}
	if _, _, g := r.steady(); len(g) >= 2 && g[len(g)-1] > 1.5*slices.Min(g) {
		errs = append(errs, fmt.Errorf("goroutines grew from %.0f to %.0f after the warm-up", slices.Min(g), g[len(g)-1]))
	}
	return errors.Join(errs...)
}

// write prints the soak's figures as markdown: a summary, then the samples.
func (r *soakResult) write(w io.Writer) {
	var total int64
	for _, n := range r.writes {
		total += n
	}
	at, rss, goroutines := r.steady()
	fmt.Fprintf(w, "\n### Churn soak: %d services x %d endpoints, %d writes/s for %s\n\n", r.n, r.e, r.rate, r.duration)
	fmt.Fprintf(w, "| measure | value |\n| --- | --- |\n")
	fmt.Fprintf(w, "| API writes (achieved rate) | %d (%.1f/s) |\n", total, float64(total)/r.duration.Seconds())
	fmt.Fprintf(w, "| of which EndpointSlice updates / Service port updates / Service deletions or creations | %d / %d / %d |\n",
		r.writes[changeEndpoint]+r.writes[changeEndpointAgain], r.writes[changeServicePort], r.writes[changeServiceExists])
	fmt.Fprintf(w, "| writes the API refused | %d |\n", r.writeErrors)
	fmt.Fprintf(w, "| syncs (full) | %.0f (%.0f) |\n", r.syncs, r.fullSyncs)
	fmt.Fprintf(w, "| last write to the sync that applied it | %.1f s |\n", r.settle.Seconds())
	fmt.Fprintf(w, "| service ports checked in the kernel against the API / differences | %d / %d |\n", r.checked, len(r.mismatches))
	if len(rss) > 0 {
		fmt.Fprintf(w, "| RSS after the %s warm-up: first / min / max / last | %.1f / %.1f / %.1f / %.1f MiB |\n",
			r.warmup, rss[0], slices.Min(rss), slices.Max(rss), rss[len(rss)-1])
		slope := trend(at, rss)
		fmt.Fprintf(w, "| RSS trend after the warm-up (least squares) | %+.3f MiB/min (%+.1f%% of its mean over the run) |\n",
			slope, 100*slope*(at[len(at)-1]-at[0]).Minutes()/mean(rss))
		fmt.Fprintf(w, "| goroutines after the warm-up: first / min / max / last | %.0f / %.0f / %.0f / %.0f |\n",
			goroutines[0], slices.Min(goroutines), slices.Max(goroutines), goroutines[len(goroutines)-1])
		fmt.Fprintf(w, "| goroutine trend after the warm-up | %+.3f /min |\n", trend(at, goroutines))
	}
	fmt.Fprintf(w, "\n| time | RSS (MiB) | goroutines |\n| --- | --- | --- |\n")
	for _, s := range r.samples {
		fmt.Fprintf(w, "| %s | %.1f | %s |\n", s.at, mib(s.rss), strconv.FormatFloat(s.goroutines, 'f', 0, 64))
	}
}
