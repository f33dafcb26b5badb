// Command bench compares our kube-proxy with upstream's in the local
// cluster (test/framework): for each shape (N services x E endpoints), each
// iptables backend and each proxy it measures the first sync, a restart
// over existing rules, single changes, network programming latency under
// endpoint churn, memory and idle CPU, then prints one markdown table per
// shape. With -mode nftables both run in nftables mode in the node
// namespace, with -mode ipvs in IPVS mode, each in a VM (guest.go); the
// rows that measure iptables are left out there. -mode takes a list
// (iptables,nftables): the modes share one cluster and its objects, each
// with its own columns. -switch times a switch of modes instead
// (switch.go). See docs/performance.md for what each row means.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// options are the benchmark's flags.
type options struct {
	modes      []string // modeIPTables, modeNFTables, modeIPVS; none is modeIPTables
	agent      string   // the VM's agent binary (mode ipvs)
	services   []int
	endpoints  []int
	backends   []framework.IPTablesBackend
	proxies    []string
	cap        time.Duration // longest wait for any sync, first syncs included
	idle       time.Duration
	changes    int // single changes of each kind
	churnRate  int // endpoint changes per second
	churnFor   time.Duration
	profileDir string
	profileFor time.Duration
	workers    int
	synLoss    int // endpoint changes of the packet-loss run; 0: the benchmark instead
	// synLossGrace is how long a pod the packet-loss run removes serves
	// after its endpoint turns terminating.
	synLossGrace time.Duration
	// soak, when set, runs the churn soak for that long instead of the
	// benchmark (soak.go).
	soak       time.Duration
	soakRate   int
	soakSample time.Duration
	// switchPath, when set, are the columns a mode switch runs in, one
	// after the other, measured instead of the benchmark (switch.go).
	switchPath []string
	// chartDir, when set, receives a chart per table's column group
	// (chart.go).
	chartDir string
}

const (
	ours     = "ours"
	upstream = "upstream"

	modeIPTables = "iptables"
	modeNFTables = "nftables"
	modeIPVS     = "ipvs"
	// modeSwitch is the mode of a switch's columns.
	modeSwitch = "switch"
)

func main() {
	var opts options
	var modes, services, endpoints, backends, proxies, switchModes, chartFrom string
	flag.StringVar(&modes, "mode", modeIPTables, "comma-separated proxy modes: iptables (in the cluster's node namespace, on each of -backends), nftables (in the node namespace) or ipvs (in a VM)")
	flag.StringVar(&opts.agent, "agent", "", "mode ipvs: the static binary of test/vm/agent, which the VM runs")
	flag.StringVar(&services, "n", "1000", "comma-separated numbers of services (N)")
	flag.StringVar(&endpoints, "e", "5", "comma-separated endpoints per service (E); every N x E shape runs")
	flag.StringVar(&backends, "backends", "nft", "comma-separated iptables backends: nft, legacy")
	flag.StringVar(&proxies, "proxies", ours+","+upstream, "comma-separated proxies: ours, upstream")
	flag.DurationVar(&opts.cap, "cap", 10*time.Minute, "longest wait for one sync (first syncs included); a capped value prints as >= cap")
	flag.DurationVar(&opts.idle, "idle", time.Minute, "how long to measure CPU while idle")
	flag.IntVar(&opts.changes, "changes", 20, "single changes of each kind (endpoint change, service add, service delete)")
	flag.IntVar(&opts.churnRate, "churn-rate", 20, "endpoint changes per second during the churn")
	flag.DurationVar(&opts.churnFor, "churn-for", 30*time.Second, "how long the churn lasts")
	flag.StringVar(&opts.profileDir, "profile-dir", "", "if set, write there CPU profiles of our first sync, restart and idle time, a heap profile after the first sync (enableProfiling), each proxy's log of its first start and restart, and each proxy's iptables-save (nft list ruleset in mode nftables) after its first sync")
	flag.DurationVar(&opts.profileFor, "profile-for", 20*time.Second, "length of that profile, from our process start")
	flag.IntVar(&opts.workers, "workers", 32, "parallel API writers when creating the objects")
	flag.DurationVar(&opts.synLossGrace, "synloss-grace", 3*time.Second, "with -synloss: a removed pod's termination grace period, which it serves through; 0 removes it at once, before any proxy can know")
	flag.IntVar(&opts.synLoss, "synloss", 0, "instead of the benchmark, probe a service with a fresh TCP connection every 5 ms while its endpoints change this many times, and count the connections lost or reset (modes iptables and nftables; -n and -e unused)")
	flag.DurationVar(&opts.soak, "soak", 0, "instead of the benchmark, run the churn soak this long: our kube-proxy (iptables mode, nft) over the first -n x -e while Services and EndpointSlices change at -soak-rate, then the kernel checked against the API (docs/reliability.md)")
	flag.IntVar(&opts.soakRate, "soak-rate", 50, "API writes per second during the soak")
	flag.DurationVar(&opts.soakSample, "soak-sample", 10*time.Second, "how often the soak reads the proxy's RSS and goroutines")
	flag.StringVar(&switchModes, "switch", "", "instead of the benchmark, time mode switches: comma-separated modes (iptables,nftables: from, to; more go on switching), each proxy run in the first until its first sync, then in each next over the rules the one before left (-mode unused; iptables on the one backend of -backends)")
	flag.StringVar(&opts.chartDir, "chart-dir", "", "if set, write there each shape's table as bench-NxE.md and beside it an SVG chart per mode and backend of ours / upstream per measure, named bench-NxE-MODE[-BACKEND].svg, and print their paths under the table")
	flag.StringVar(&chartFrom, "chart-from", "", "instead of the benchmark, draw the charts of the tables in this file (bench-NxE.md, or bench's printed output) into -chart-dir")
	flag.Parse()
	err := func() error {
		var err error
		if chartFrom != "" {
			if opts.chartDir == "" {
				return errors.New("-chart-from needs -chart-dir")
			}
			return chartsFrom(chartFrom, opts.chartDir, os.Stdout)
		}
		// -n 0 runs a shape with no service at all: the floor of the
		// memory figures, the process's RSS and heap with nothing to do.
		if opts.services, err = ints(services, 0); err != nil {
			return err
		}
		if slices.Contains(opts.services, 0) && (opts.soak > 0 || switchModes != "") {
			return errors.New("-n 0 measures the zero-service floor of the benchmark; -soak and -switch need services")
		}
		if opts.endpoints, err = ints(endpoints, 1); err != nil {
			return err
		}
		for _, b := range strings.Split(backends, ",") {
			if b != string(framework.IPTablesNFT) && b != string(framework.IPTablesLegacy) {
				return fmt.Errorf("unknown backend %q", b)
			}
			opts.backends = append(opts.backends, framework.IPTablesBackend(b))
		}
		for _, p := range strings.Split(proxies, ",") {
			if p != ours && p != upstream {
				return fmt.Errorf("unknown proxy %q", p)
			}
			opts.proxies = append(opts.proxies, p)
		}
		for _, m := range strings.Split(modes, ",") {
			if m != modeIPTables && m != modeNFTables && (m != modeIPVS || opts.agent == "") {
				return fmt.Errorf("unknown mode %q: -mode takes iptables, nftables, or ipvs with -agent", m)
			}
			opts.modes = append(opts.modes, m)
		}
		if switchModes != "" {
			if opts.synLoss > 0 || opts.soak > 0 {
				return errors.New("-switch goes with neither -synloss nor -soak")
			}
			if opts.switchPath, err = switchPath(switchModes, opts.backends); err != nil {
				return err
			}
		}
		if opts.profileDir != "" {
			if err := os.MkdirAll(opts.profileDir, 0o755); err != nil {
				return err
			}
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if opts.synLoss > 0 {
			return runSynLoss(ctx, opts, os.Stdout, os.Stderr)
		}
		return run(ctx, opts, os.Stdout, os.Stderr)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// ints parses a comma-separated list of numbers, each at least least.
func ints(list string, least int) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < least {
			return nil, fmt.Errorf("not a number of at least %d: %q", least, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// run benchmarks every shape, each in a cluster of its own, and prints a
// table per shape to out; progress goes to log. With -soak it runs the
// soak instead.
func run(ctx context.Context, opts options, out, log io.Writer) error {
	if opts.soak > 0 {
		return soak(ctx, opts, out, log)
	}
	var shapes []shapeTable
	defer func() { writePerService(out, opts.columns(), shapes) }()
	for _, n := range opts.services {
		for _, e := range opts.endpoints {
			if n == 0 && e != opts.endpoints[0] {
				continue // with no service, the number of endpoints changes nothing
			}
			results, err := benchShape(ctx, opts, n, e, log)
			if results != nil {
				shapes = append(shapes, shapeTable{n: n, e: e, columns: opts.columns(), all: results})
				fmt.Fprintln(out)
				writeShape(out, n, e, opts.columns(), results)
				if opts.chartDir != "" {
					// The table and its charts, from the same results.
					table, tableErr := writeTableFile(opts.chartDir, n, e, opts.columns(), results)
					if tableErr == nil {
						fmt.Fprintf(out, "\nTable: %s\n", table)
					}
					files, chartErr := writeCharts(opts.chartDir, n, e, opts.columns(), results)
					for _, f := range files {
						fmt.Fprintf(out, "\nChart: %s\n", f)
					}
					err = errors.Join(err, tableErr, chartErr)
				}
			}
			if err != nil {
				return fmt.Errorf("N=%d E=%d: %w", n, e, err)
			}
		}
	}
	return nil
}

// columns are the table's groups of columns, mode by mode: one per
// iptables backend in mode iptables, one for each other mode (named after
// it); with -switch, one per switch.
func (o options) columns() []string {
	if len(o.switchPath) > 0 {
		return switchColumns(o.switchPath)
	}
	modes := o.modes
	if len(modes) == 0 {
		modes = []string{modeIPTables}
	}
	var out []string
	for _, m := range modes {
		if m != modeIPTables {
			out = append(out, m)
			continue
		}
		for _, b := range o.backends {
			out = append(out, string(b))
		}
	}
	return out
}

// columnMode is the proxy mode of a group of columns.
func columnMode(column string) string {
	switch {
	case column == modeNFTables || column == modeIPVS:
		return column
	case strings.Contains(column, " -> "):
		return modeSwitch
	}
	return modeIPTables // an iptables backend
}

// progress returns a logger writing timestamped lines, each marked with
// what is running, to log.
func progress(log io.Writer, what string) func(format string, args ...any) {
	return func(format string, args ...any) {
		fmt.Fprintf(log, "%s %s: "+format+"\n", append([]any{time.Now().Format("15:04:05"), what}, args...)...)
	}
}

// startWithObjects starts the local cluster and creates the N x E
// services and slices in it; the caller stops the cluster.
func startWithObjects(ctx context.Context, opts options, n, e int, logf func(string, ...any)) (*bench, *framework.Cluster, error) {
	logf("N=%d E=%d: starting the local cluster", n, e)
	cluster, err := framework.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	b, err := newBench(cluster, opts, n, e, logf)
	if err == nil {
		start := time.Now()
		if err = b.createObjects(ctx); err == nil {
			logf("created %d services and %d EndpointSlices in %s", n, n, time.Since(start).Round(time.Millisecond))
		}
	}
	if err != nil {
		cluster.Stop()
		return nil, nil, err
	}
	return b, cluster, nil
}

func benchShape(ctx context.Context, opts options, n, e int, log io.Writer) (map[string]map[string]results, error) {
	logf := progress(log, "bench")
	b, cluster, err := startWithObjects(ctx, opts, n, e, logf)
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	all := map[string]map[string]results{}
	var failed error
	if len(opts.switchPath) > 0 {
		for _, column := range opts.columns() {
			all[column] = map[string]results{}
		}
		for _, proxy := range opts.proxies {
			logf("%s kube-proxy, switching %s", proxy, strings.Join(opts.switchPath, " -> "))
			r, err := b.measureSwitch(ctx, proxy)
			for column, results := range r {
				all[column][proxy] = results
			}
			if err != nil {
				logf("%s, switching failed: %v", proxy, err)
				failed = errors.Join(failed, fmt.Errorf("%s, switching: %w", proxy, err))
			}
		}
		return all, failed
	}
	for _, column := range opts.columns() {
		all[column] = map[string]results{}
		for _, proxy := range opts.proxies {
			logf("%s kube-proxy, %s", proxy, column)
			r, err := b.measure(ctx, proxy, column)
			all[column][proxy] = r
			if err != nil {
				// Keep what the other runs measure: a table with gaps beats none.
				logf("%s, %s failed: %v", proxy, column, err)
				failed = errors.Join(failed, fmt.Errorf("%s, %s: %w", proxy, column, err))
			}
		}
	}
	return all, failed
}
