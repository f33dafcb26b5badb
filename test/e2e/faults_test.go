package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Faults: a client loops requests through a service while something goes
// wrong, and each test logs what the client saw (requests sent, failed,
// the longest gap between answers) for docs/reliability.md.

// loadInterval paces the clients of these tests.
const loadInterval = 50 * time.Millisecond

// apiOutage is how long the API server stays down in the outage test.
const apiOutage = 60 * time.Second

// The API server stops for a minute, as in a control-plane upgrade: the
// rules stay and traffic flows, /healthz and /livez answer as upstream's
// do (200: no change is waiting for a sync), the watches resume without
// each informer listing over and over, and a change made as soon as the
// API server is back (while the watches reconnect) reaches the kernel.
func TestAPIServerOutageKeepsTrafficAndResumesWatches(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		const name = "outage"
		svc, client := servedService(t, name)
		load := startLoad(t, client, svc, apiOutage+10*time.Second)
		time.Sleep(2 * time.Second)
		cluster.StopAPIServer()
		stopped := time.Now()
		during := healthCodes{}
		for time.Since(stopped) < apiOutage {
			during.poll()
			time.Sleep(500 * time.Millisecond)
		}
		if err := cluster.StartAPIServer(context.Background()); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		defer func() {
			if t.Failed() {
				t.Logf("our kube-proxy's log, its last 100 lines:\n%s", running.LogTail(100))
			}
		}()
		t.Logf("API server down for %s; /healthz and /livez during the outage: %v", back.Sub(stopped).Round(time.Millisecond), during)
		if !during.onlyOK() {
			t.Errorf("/healthz or /livez failed during the outage: %v", during)
		}
		// A new endpoint, made while the watches reconnect: the
		// controller-manager's to write it into the slice, ours to see it.
		// Both back off (client-go's reflectors: 0.8 s doubling to 30 s),
		// as upstream's kube-proxy does.
		pod := addPod(t, name+"-c", framework.PodOptions{Labels: map[string]string{"app": name}})
		ourLists := 0 // of endpointslices, by this test
		eventually(t, 2*time.Minute, "the endpoint in the service's slices", func() error {
			ourLists++
			if !slices.Contains(readyAddresses(t, context.Background(), name), pod.IPv4) {
				return fmt.Errorf("%s not there yet", pod.IPv4)
			}
			return nil
		})
		sliced := time.Now()
		// Our reflectors back off on their own: the slice reaches us once
		// the controller-manager has written it and ours have reconnected,
		// which their wait (capped at 30 s, plus up to as much again of
		// jitter) and a watch that fails again while the restarted API
		// server warms up its caches put up to about two minutes after the
		// restart.
		reachesPodWithin(t, client, svc, name+"-c", max(time.Minute, time.Until(back.Add(2*reflectorMaxWait))))
		t.Logf("an endpoint added once the API server was ready: in the slices %s later, served %s after that (%s after the restart)",
			sliced.Sub(back).Round(time.Millisecond), time.Since(sliced).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
		after := healthCodes{}
		after.poll()
		if !after.onlyOK() {
			t.Errorf("/healthz or /livez after the outage: %v", after)
		}
		seen := waitLoad(t, "traffic through the outage", load)
		if seen.Failed > 0 {
			t.Errorf("%d requests failed:\n%s", seen.Failed, seen.Errors)
		}
		// The restarted API server's counters start at zero: these are the
		// lists of every client since, the controller-manager's included,
		// less this test's.
		lists := apiServerLists(t)
		lists["endpointslices"] -= float64(ourLists)
		t.Logf("LIST requests since the API server restarted: services %v, endpointslices %v, nodes %v, servicecidrs %v",
			lists["services"], lists["endpointslices"], lists["nodes"], lists["servicecidrs"])
		for _, resource := range []string{"services", "endpointslices", "nodes"} {
			// One list per informer (ours, the controller-manager's) at
			// most, with a margin: a storm would be one per retry.
			if lists[resource] > 4 {
				t.Errorf("%v LIST requests of %s since the restart, want at most 4", lists[resource], resource)
			}
		}
	})
}

// reflectorMaxWait is the longest a client-go reflector waits before it
// tries its watch again: its backoff is capped at 30 s, with a jitter of
// up to 100%.
const reflectorMaxWait = time.Minute

// restartOurProxy ends our kube-proxy with sig and starts it again over
// the rules it left, returning the time from the signal to its first sync.
func restartOurProxy(t *testing.T, mode string, sig syscall.Signal) time.Duration {
	t.Helper()
	proxyMu.Lock()
	defer proxyMu.Unlock()
	recordServedMetrics()
	start := time.Now()
	if err := syscall.Kill(running.Pid(), sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-running.Exited():
	case <-time.After(15 * time.Second):
		t.Fatalf("our kube-proxy did not end within 15 s of %s", sig)
	}
	running = nil
	switchProxyLocked(t, true, mode)
	return time.Since(start)
}

// Our kube-proxy killed (SIGKILL) or stopped (SIGTERM) and started again
// fails no request, and rewrites no rule: every rule keeps its handle.
func TestKilledOrStoppedProxyRestartsWithoutFailedRequestsOrRewrites(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		svc, client := servedService(t, "restart")
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
			before := tableRules(t, mode)
			load := startLoad(t, client, svc, 8*time.Second)
			time.Sleep(time.Second)
			took := restartOurProxy(t, mode, sig)
			seen := waitLoad(t, fmt.Sprintf("%s and restart (first sync %s after the signal)", sig, took.Round(time.Millisecond)), load)
			if seen.Failed > 0 {
				t.Errorf("%s: %d requests failed:\n%s", sig, seen.Failed, seen.Errors)
			}
			after := tableRules(t, mode)
			var rewritten []string
			for chain, rules := range before {
				if !slices.Equal(rules, after[chain]) {
					rewritten = append(rewritten, chain)
				}
			}
			for chain := range after {
				if _, ok := before[chain]; !ok {
					rewritten = append(rewritten, chain)
				}
			}
			if len(rewritten) > 0 {
				slices.Sort(rewritten)
				t.Errorf("%s: the restart rewrote %v", sig, rewritten)
			}
		}
	})
}

// tampering is another program's change to our rules: one command (and
// its input), so that our kube-proxy cannot repair half of it first.
type tampering struct {
	name string
	cmd  func(t *testing.T, chain, clusterIP string) (args []string, stdin string)
}

var tamperings = map[string][]tampering{
	iptablesMode: {
		{"nat table flushed", func(*testing.T, string, string) ([]string, string) {
			return []string{"iptables-nft", "-t", "nat", "-F"}, ""
		}},
		{"a service chain deleted", func(t *testing.T, chain, _ string) ([]string, string) {
			// Its jump from KUBE-SERVICES too, in one transaction: a chain
			// in use cannot go.
			rules, err := cluster.Node.TableRules("ip", "nat")
			if err != nil {
				t.Fatal(err)
			}
			jump := slices.IndexFunc(rules["chain KUBE-SERVICES"], func(r framework.TableRule) bool { return strings.HasSuffix(r.Text, "jump "+chain) })
			if jump < 0 {
				t.Fatalf("no jump to %s in KUBE-SERVICES: %v", chain, rules["chain KUBE-SERVICES"])
			}
			return []string{"nft", "-f", "-"}, fmt.Sprintf("delete rule ip nat KUBE-SERVICES handle %s\nflush chain ip nat %s\ndelete chain ip nat %s\n",
				rules["chain KUBE-SERVICES"][jump].Handle, chain, chain)
		}},
		{"a rule inserted into a service chain", func(_ *testing.T, chain, _ string) ([]string, string) {
			return []string{"iptables-nft", "-t", "nat", "-I", chain, "1", "-j", "RETURN"}, ""
		}},
	},
	nftablesMode: {
		{"table flushed", func(*testing.T, string, string) ([]string, string) {
			return []string{"nft", "flush", "table", "ip", "kube-proxy"}, ""
		}},
		{"a service chain deleted", func(_ *testing.T, chain, clusterIP string) ([]string, string) {
			// Its element in the service map too: a chain in use cannot go.
			return []string{"nft", "-f", "-"},
				fmt.Sprintf("delete element ip kube-proxy service-ips { %s . tcp . 80 }\ndelete chain ip kube-proxy %s\n", clusterIP, chain)
		}},
		{"a rule inserted into a service chain", func(_ *testing.T, chain, _ string) ([]string, string) {
			return []string{"nft", "insert", "rule", "ip", "kube-proxy", chain, "drop"}, ""
		}},
	},
}

// repairTarget is the time within which our rules are meant to be back
// after another program changed them (docs/reliability.md reports it);
// the test asserts only the sync period (repairWindow), what kube-proxy
// promises, as the machine may be loaded.
const repairTarget = 2 * time.Second

// Another program flushing our table, deleting one service chain, or
// inserting a rule into one: our kube-proxy notices, restores exactly
// what it had within the sync period, logs it and counts it in its
// metric. The time from the change to the rules restored is measured by
// listing the table every 20 ms, and logged.
func TestTamperedRulesAreRepaired(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		svc, client := servedService(t, "tamper")
		chain := serviceChain(mode, "tamper")
		logLine, counter := "Restored our iptables rules that another program had changed", `kubeproxy_sync_proxy_rules_iptables_flush_recoveries_total{ip_family="IPv4"}`
		if mode == nftablesMode {
			logLine, counter = "Restored the nftables table another program had changed", `kubeproxy_sync_proxy_rules_nftables_repairs_total{ip_family="IPv4"}`
		}
		window := repairWindow(t, mode)
		for _, tamper := range tamperings[mode] {
			want := tableRules(t, mode)
			if _, ok := want["chain "+chain]; !ok {
				t.Fatalf("no chain %s in our table", chain)
			}
			repairs, logged := metricValue(metrics(t), counter), logSize(t)
			load := startLoad(t, client, svc, 5*time.Second)
			time.Sleep(time.Second)
			args, stdin := tamper.cmd(t, chain, svc.Spec.ClusterIP)
			cmd := cluster.Node.Command(args...)
			cmd.Stdin = strings.NewReader(stdin)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %v: %s\n%s", tamper.name, args, err, out, modeRules(t, mode))
			}
			changed := time.Now()
			var took time.Duration
			for {
				if sameTexts(tableRules(t, mode), want) {
					took = time.Since(changed)
					break
				}
				if time.Since(changed) > window {
					t.Fatalf("%s: our rules not restored within the sync period (%s)", tamper.name, window)
				}
				time.Sleep(20 * time.Millisecond)
			}
			seen := waitLoad(t, fmt.Sprintf("%s: restored in %s (target %s)", tamper.name, took.Round(time.Millisecond), repairTarget), load)
			if seen.OK == 0 {
				t.Errorf("%s: no request answered", tamper.name)
			}
			eventually(t, 5*time.Second, tamper.name+": the repair counted", func() error {
				if after := metricValue(metrics(t), counter); after <= repairs {
					return fmt.Errorf("%s still %v", counter, after)
				}
				return nil
			})
			if log := logSince(t, logged); !strings.Contains(log, logLine) {
				t.Errorf("%s: no %q in our kube-proxy's log:\n%s", tamper.name, logLine, log)
			}
			if _, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "tamper-a", "tamper-b"); err != nil {
				t.Errorf("%s: after the repair: %v", tamper.name, err)
			}
		}
	})
}

// Another program holding the xtables lock (iptables-legacy's) for 10 s:
// our kube-proxy on the legacy backend waits for it to write an endpoint
// added meanwhile, then writes it; traffic to the rules already in place
// flows all along, and no sync fails. The nft backend, which the other
// tests use, takes no lock. Our kube-proxy and the holder use a lock file
// of the cluster's (XTABLES_LOCKFILE), not the machine's.
func TestHeldXtablesLockDelaysTheSyncOnly(t *testing.T) {
	lock := filepath.Join(cluster.Dir, "xtables.lock")
	reset := func() {
		stopProxy()
		if err := cluster.Node.ResetIPTables(); err != nil {
			t.Fatal(err)
		}
	}
	reset()
	// Registered first, so it runs after the pods and services are gone;
	// the next test starts our kube-proxy afresh.
	t.Cleanup(reset)
	proxyMu.Lock()
	startProxyLocked(t, true, iptablesMode, []string{"env", iptables.BackendEnv + "=" + string(iptables.Legacy), "XTABLES_LOCKFILE=" + lock}, proxyConfig(iptablesMode))
	proxyMu.Unlock()
	svc, client := servedService(t, "xlock")
	failures := `kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"}`
	partialFailures := `kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"}`
	text := metrics(t)
	before := metricValue(text, failures) + metricValue(text, partialFailures)

	load := startLoad(t, client, svc, 15*time.Second)
	time.Sleep(time.Second)
	// The holder says when it holds the lock, and holds it until its
	// input closes: neither is left to a time.
	holder := exec.Command("flock", lock, "sh", "-c", "echo held; exec cat >/dev/null")
	release, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	said, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { // if the test fails before the release
		release.Close()
		_ = holder.Process.Kill()
	}()
	holding := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(said).ReadString('\n')
		if err == nil && line != "held\n" {
			err = fmt.Errorf("the lock's holder said %q", line)
		}
		holding <- err
	}()
	select {
	case err := <-holding:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the lock's holder did not take it in a minute")
	}
	held := time.Now()
	pod := addPod(t, "xlock-c", framework.PodOptions{Labels: map[string]string{"app": "xlock"}})
	endpoint := framework.EndpointChain(framework.DefaultNamespace, "xlock", "tcp", "tcp", net.JoinHostPort(pod.IPv4, "8080"))
	for time.Since(held) < 10*time.Second {
		chains, err := cluster.Node.NATChains(framework.IPTablesLegacy)
		if err != nil {
			t.Fatal(err)
		}
		if chains[endpoint] {
			t.Fatalf("%s written %s after the lock was taken, while it is held", endpoint, time.Since(held).Round(time.Millisecond))
		}
		time.Sleep(500 * time.Millisecond)
	}
	release.Close()
	if err := holder.Wait(); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	eventually(t, convergence, "the new endpoint's chain", func() error {
		chains, err := cluster.Node.NATChains(framework.IPTablesLegacy)
		if err != nil || !chains[endpoint] {
			return fmt.Errorf("%s not written yet (%v)", endpoint, err)
		}
		return nil
	})
	t.Logf("lock held %s; the endpoint added meanwhile was written %s after its release",
		released.Sub(held).Round(time.Millisecond), time.Since(released).Round(time.Millisecond))
	seen := waitLoad(t, "traffic while the lock was held", load)
	if seen.Failed > 0 {
		t.Errorf("%d requests failed:\n%s", seen.Failed, seen.Errors)
	}
	text = metrics(t)
	if after := metricValue(text, failures) + metricValue(text, partialFailures); after != before {
		t.Errorf("restore failures went from %v to %v", before, after)
	}
	reachesPod(t, client, svc, "xlock-c")
}

// readOnlyProcSys runs the rest of a command line in a mount namespace of
// its own where /proc/sys is read-only, as a container runtime mounts it.
var readOnlyProcSys = []string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
	`mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"`, "sh"}

// A sysctl write refused (/proc/sys read-only, a conntrack limit above
// the node's) is logged clearly and our kube-proxy serves anyway: in
// iptables mode route_localnet too, whose refusal costs only NodePorts on
// localhost. Upstream exits on the conntrack limit and restarts in a loop.
//
// The conntrack table itself cannot be filled here: nf_conntrack_max is
// the machine's, read-only in a network namespace other than the host's
// (docs/reliability.md).
func TestRefusedSysctlWritesAreLoggedAndServed(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		svc, client := servedService(t, "sysctl")
		// The next test gets our kube-proxy started afresh, which sets
		// route_localnet again.
		t.Cleanup(stopProxy)
		if mode == iptablesMode {
			onNode(t, []string{"sysctl", "-qw", "net.ipv4.conf.all.route_localnet=0"})
		}
		current, err := cluster.Node.Exec("cat", "/proc/sys/net/netfilter/nf_conntrack_max")
		if err != nil {
			t.Fatal(err)
		}
		limit, _ := strconv.Atoi(strings.TrimSpace(current))
		load := startLoad(t, client, svc, 8*time.Second)
		time.Sleep(time.Second)
		proxyMu.Lock()
		// Per core, above the node's whole limit: a raise is due.
		startProxyLocked(t, true, mode, readOnlyProcSys, proxyConfigWith(mode, limit+1))
		proxyMu.Unlock()
		if seen := waitLoad(t, "traffic while our kube-proxy restarted under a read-only /proc/sys", load); seen.Failed > 0 {
			t.Errorf("%d requests failed:\n%s", seen.Failed, seen.Errors)
		}
		wantLogged := []string{"Could not apply the conntrack settings; serving without them", "read-only file system"}
		if mode == iptablesMode {
			wantLogged = append(wantLogged, "Could not enable route_localnet; NodePorts on localhost will not work")
		}
		log := logSince(t, 0)
		for _, line := range wantLogged {
			if !strings.Contains(log, line) {
				t.Errorf("no %q in our kube-proxy's log:\n%s", line, log)
			}
		}
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "Could not") {
				t.Logf("logged: %s", line)
			}
		}
		addPod(t, "sysctl-c", framework.PodOptions{Labels: map[string]string{"app": "sysctl"}})
		reachesPod(t, client, svc, "sysctl-c")
	})
}
