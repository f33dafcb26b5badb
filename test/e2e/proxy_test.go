package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// The proxy modes our kube-proxy runs the tests in.
const (
	iptablesMode = "iptables"
	nftablesMode = "nftables"
)

// modes are those the mode-independent tests run in, each as a subtest
// named after it (-run 'TestX/nftables' picks one).
var modes = []string{iptablesMode, nftablesMode}

// inEachMode runs test once per mode, with our kube-proxy running in it.
func inEachMode(t *testing.T, test func(t *testing.T, mode string)) {
	t.Helper()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			useOurProxy(t, mode)
			test(t, mode)
		})
	}
}

// proxyConfig is the configuration every kube-proxy of these tests runs
// with, ours or upstream's, in the given mode. Metrics are served on the
// node's IP so the tests can read them; conntrack limits are left alone
// because the node namespace cannot change them.
func proxyConfig(mode string) string { return proxyConfigWith(mode, 0) }

// repairWindow is how long another program's change to our rules may
// stand in mode: the syncPeriod of the configuration the tests run
// kube-proxy with, within which kube-proxy promises to refresh its rules
// (ours notices sooner; how soon is logged, not asserted).
func repairWindow(t *testing.T, mode string) time.Duration {
	t.Helper()
	cfg, err := config.Decode([]byte(cluster.KubeProxyConfig(proxyConfig(mode))))
	if err != nil {
		t.Fatal(err)
	}
	period, _ := config.SyncPeriods(cfg)
	return period
}

// proxyConfigWith is proxyConfig with a conntrack limit per core.
func proxyConfigWith(mode string, conntrackPerCore int) string {
	return "mode: " + mode + "\nmetricsBindAddress: 0.0.0.0:10249\nconntrack:\n  maxPerCore: " + strconv.Itoa(conntrackPerCore) + "\n"
}

var (
	proxyMu sync.Mutex
	// running is the kube-proxy in the node namespace, nil when none.
	running *framework.KubeProxy
	// runningOurs tells whether it is ours or upstream's, runningMode
	// which mode it runs in.
	runningOurs bool
	runningMode string
	started     int
	// syncedWhenHealthy tells whether the running kube-proxy had synced
	// when its /healthz first answered 200 (at the latest: read just after).
	syncedWhenHealthy bool
)

// useOurProxy makes sure our kube-proxy runs in the node namespace in
// mode. Tests share it; the few that replace it leave ours running again.
func useOurProxy(t *testing.T, mode string) {
	t.Helper()
	proxyMu.Lock()
	defer proxyMu.Unlock()
	if running != nil && runningOurs && runningMode == mode {
		select {
		case <-running.Exited():
			t.Errorf("our kube-proxy had exited: %v\n%s", running.Err(), running.LogTail(20))
		default:
			return
		}
	}
	switchProxyLocked(t, true, mode)
}

// switchProxy stops whatever kube-proxy runs and starts ours or upstream's
// in mode over the rules the previous one left.
func switchProxy(t *testing.T, ours bool, mode string) {
	t.Helper()
	proxyMu.Lock()
	defer proxyMu.Unlock()
	switchProxyLocked(t, ours, mode)
}

func switchProxyLocked(t *testing.T, ours bool, mode string) {
	t.Helper()
	startProxyLocked(t, ours, mode, nil, proxyConfig(mode))
}

// startProxyLocked is switchProxyLocked with the command line run by a
// wrapper command (none when nil) and another configuration.
func startProxyLocked(t *testing.T, ours bool, mode string, wrapper []string, config string) {
	t.Helper()
	stopProxyLocked()
	binary, name := cluster.KubeProxy(), "kube-proxy"
	if !ours {
		binary, name = cluster.UpstreamKubeProxy(), "kube-proxy-upstream"
	}
	started++
	p, err := cluster.StartKubeProxyUnder(fmt.Sprintf("%s-%s-%d", name, mode, started), wrapper, binary, cluster.KubeProxyConfig(config))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitHealthy(context.Background(), time.Minute); err != nil {
		p.Stop()
		t.Fatal(err)
	}
	running, runningOurs, runningMode = p, ours, mode
	text, err := fetchMetrics()
	syncedWhenHealthy = err == nil && metricValue(text, `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`) > 0
	// Healthy may come before the first sync; tests start after it.
	eventually(t, time.Minute, "the first sync", func() error {
		text, err := fetchMetrics()
		if err != nil {
			return err
		}
		if metricValue(text, `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`) <= 0 {
			return fmt.Errorf("no sync yet")
		}
		return nil
	})
}

// stopProxy ends the running kube-proxy, leaving its rules in place.
func stopProxy() {
	proxyMu.Lock()
	defer proxyMu.Unlock()
	stopProxyLocked()
}

func stopProxyLocked() {
	if running == nil {
		return
	}
	if runningOurs {
		recordServedMetrics()
	}
	running.Stop()
	running = nil
}

// servedMetrics are the metric families any of our kube-proxy processes
// served during the run, each read just before it stopped.
var servedMetrics = map[string]bool{}

func recordServedMetrics() {
	text, err := fetchMetrics()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: reading our kube-proxy's metrics before stopping it:", err)
		return
	}
	for _, line := range strings.Split(text, "\n") {
		if family, ok := strings.CutPrefix(line, "# TYPE "); ok {
			servedMetrics[strings.Fields(family)[0]] = true
		}
	}
}

// service is a Service of the default namespace selecting pods labelled
// app=<selector> (none when empty), dual-stack, with one port per protocol,
// all to target port 8080.
func service(name, selector string, protocols ...v1.Protocol) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.ServiceSpec{IPFamilyPolicy: ptrTo(v1.IPFamilyPolicyPreferDualStack)},
	}
	if selector != "" {
		svc.Spec.Selector = map[string]string{"app": selector}
	}
	for _, proto := range protocols {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{
			Name: strings.ToLower(string(proto)), Protocol: proto, Port: 80, TargetPort: intstr.FromInt32(8080)})
	}
	return svc
}

// eventually retries check until it succeeds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// answeredBy sends a request and checks that one of pods answers.
func answeredBy(ns *framework.Netns, proto, ip string, port int32, pods ...string) (framework.Reply, error) {
	reply, err := ns.Request(proto, net.JoinHostPort(ip, strconv.Itoa(int(port))), time.Second)
	if err != nil {
		return reply, err
	}
	for _, p := range pods {
		if reply.Pod == p {
			return reply, nil
		}
	}
	return reply, fmt.Errorf("answered by %q, want one of %v", reply.Pod, pods)
}

// metrics fetches our kube-proxy's metrics from the node.
func metrics(t *testing.T) string {
	t.Helper()
	text, err := fetchMetrics()
	if err != nil {
		t.Fatal(err)
	}
	return text
}

func fetchMetrics() (string, error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + net.JoinHostPort(framework.NodeIPv4, "10249") + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/metrics: %d", resp.StatusCode)
	}
	return string(body), nil
}

// metricValue is the value of the first sample whose line starts with
// prefix (a name, optionally with labels), or -1.
func metricValue(text, prefix string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				return v
			}
		}
	}
	return -1
}

// onNode runs each command in the node namespace, failing the test at
// the first that fails.
func onNode(t *testing.T, cmds ...[]string) {
	t.Helper()
	for _, cmd := range cmds {
		if out, err := cluster.Node.Command(cmd...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
}

// proxyMode is what our kube-proxy's /proxyMode says.
func proxyMode(t *testing.T) string {
	t.Helper()
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + net.JoinHostPort(framework.NodeIPv4, "10249") + "/proxyMode")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// modeRules is what the mode wrote in the node namespace, both families.
func modeRules(t *testing.T, mode string) string {
	t.Helper()
	if mode == nftablesMode {
		return nftablesRules(t)
	}
	return nodeRules(t)
}

// nftablesRules lists the nftables mode's tables of both families, empty
// for a family without one.
func nftablesRules(t *testing.T) string {
	t.Helper()
	var all strings.Builder
	for _, family := range []string{"ip", "ip6"} {
		out, err := cluster.Node.Command("nft", "list", "table", family, "kube-proxy").CombinedOutput()
		switch {
		case err == nil:
			all.Write(out)
		case !strings.Contains(string(out), "No such file or directory"):
			t.Fatalf("nft list table %s kube-proxy: %v: %s", family, err, out)
		}
	}
	return all.String()
}

// nodeRules is iptables-save of both families in the node namespace, with
// the backend our kube-proxy and upstream's pick there (nft).
func nodeRules(t *testing.T) string {
	t.Helper()
	var all strings.Builder
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out, err := cluster.Node.Command(tool).Output()
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		all.Write(out)
	}
	return all.String()
}
