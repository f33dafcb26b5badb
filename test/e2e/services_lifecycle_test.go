package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Services across flushes, updates, restarts, takeovers and failed syncs, in every mode (inEachMode).

// A UDP client that keeps its source port keeps its conntrack flow; when
// the endpoint behind the flow goes away the flow must be deleted, or the
// client would keep sending into the void.
func TestStaleUDPFlowsAreDeleted(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "udp-old", framework.PodOptions{Labels: map[string]string{"app": "udp"}})
		client := addPod(t, "udp-client", framework.PodOptions{})
		svc := service("udp", "udp", v1.ProtocolUDP)
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc = createService(t, svc)
		const sport = 40123
		target := net.JoinHostPort(svc.Spec.ClusterIP, "80")
		eventually(t, convergence, "the old pod answers", func() error {
			r, err := client.Netns.RequestFrom(sport, "udp", target, time.Second)
			if err == nil && r.Pod != "udp-old" {
				err = fmt.Errorf("answered by %s", r.Pod)
			}
			return err
		})
		addPod(t, "udp-new", framework.PodOptions{Labels: map[string]string{"app": "udp"}})
		if err := cluster.RemovePod(context.Background(), "udp-old"); err != nil {
			t.Fatal(err)
		}
		eventually(t, convergence, "the same flow reaches the new pod", func() error {
			r, err := client.Netns.RequestFrom(sport, "udp", target, time.Second)
			if err == nil && r.Pod != "udp-new" {
				err = fmt.Errorf("answered by %s", r.Pod)
			}
			return err
		})
	})
}

// Another program flushing the tables (a firewall reload, say), or in
// nftables mode deleting ours, is noticed and repaired within the sync
// period (in iptables mode, counted as a flush recovery: noticed, not left
// to a periodic sync).
func TestFlushedRulesAreRestored(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "flush-a", framework.PodOptions{Labels: map[string]string{"app": "flush"}})
		client := addPod(t, "flush-client", framework.PodOptions{})
		svc := service("flush", "flush", v1.ProtocolTCP)
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc = createService(t, svc)
		eventually(t, convergence, "the service answers", func() error {
			_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "flush-a")
			return err
		})
		recoveries := `kubeproxy_sync_proxy_rules_iptables_flush_recoveries_total{ip_family="IPv4"}`
		before := metricValue(metrics(t), recoveries)
		// Each of these is undone before the next.
		damage := map[string][][]string{
			iptablesMode: {{"iptables-nft", "-t", "filter", "-F"}, {"iptables-nft", "-t", "nat", "-F"}},
			nftablesMode: {{"nft", "flush", "table", "ip", "kube-proxy"}, {"nft", "delete", "table", "ip", "kube-proxy"}},
		}[mode]
		window := repairWindow(t, mode)
		for _, cmd := range damage {
			onNode(t, cmd)
			if _, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "flush-a"); err == nil {
				t.Logf("the service still answered right after %v (repaired already)", cmd)
			}
			eventually(t, window, fmt.Sprintf("the service answers again after %v", cmd), func() error {
				_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "flush-a")
				return err
			})
		}
		if mode != iptablesMode {
			return
		}
		if after := metricValue(metrics(t), recoveries); after <= before {
			t.Errorf("flush recoveries metric %v -> %v", before, after)
		}
	})
}

// A service change reaches the kernel; the time it took is logged (speed
// is measured by the benchmark, not asserted here).
func TestServiceUpdateReachesTheProxier(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "upd-a", framework.PodOptions{Labels: map[string]string{"app": "upd"}, Ports: []int{8080, 8081}})
		client := addPod(t, "upd-client", framework.PodOptions{})
		svc := service("upd", "upd", v1.ProtocolTCP)
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc = createService(t, svc)
		eventually(t, convergence, "port 80", func() error {
			_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "upd-a")
			return err
		})
		start := time.Now()
		updateService(t, "upd", func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "extra", Protocol: v1.ProtocolTCP, Port: 81, TargetPort: intstr.FromInt32(8081)})
		})
		// The new port's rule: its comment in iptables mode, its service
		// chain's name in nftables mode.
		marker := map[string]string{iptablesMode: "default/upd:extra cluster IP", nftablesMode: "default/upd/tcp/extra"}[mode]
		eventually(t, convergence, "the new port's rule", func() error {
			if !strings.Contains(modeRules(t, mode), marker) {
				return fmt.Errorf("%q not in the rules yet", marker)
			}
			return nil
		})
		t.Logf("API update -> rule in the kernel: %s", time.Since(start).Round(time.Millisecond))
		eventually(t, convergence, "port 81", func() error {
			_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 81, "upd-a")
			return err
		})
	})
}

func TestHealthAndMetricsAreServed(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		code, body, err := running.Healthz()
		if err != nil || code != 200 || !strings.Contains(body, `"lastUpdated"`) {
			t.Errorf("/healthz: %d %q %v", code, body, err)
		}
		if resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + framework.NodeIPv4 + ":10256/livez"); err != nil || resp.StatusCode != 200 {
			t.Errorf("/livez: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
		if got := proxyMode(t); got != mode {
			t.Errorf("/proxyMode: %q, want %q", got, mode)
		}
		text := metrics(t)
		positive := []string{
			`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
			`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		}
		// Served, and at zero unless this kube-proxy logged a failed sync
		// (one an earlier test caused, when -run keeps it running).
		var present []string
		switch mode {
		case iptablesMode:
			positive = append(positive, `kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}`)
		case nftablesMode:
			for _, family := range []string{"IPv4", "IPv6"} {
				present = append(present,
					`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="`+family+`"}`,
					`kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="`+family+`"}`)
			}
		}
		for _, name := range positive {
			if v := metricValue(text, name); v <= 0 {
				t.Errorf("%s = %v, want > 0", name, v)
			}
		}
		failed := loggedSyncFailures(logSince(t, 0))
		for _, name := range present {
			switch v := metricValue(text, name); {
			case v < 0:
				t.Errorf("%s is not served", name)
			case v != 0 && failed == 0:
				t.Errorf("%s = %v while our kube-proxy logged no failed sync, want 0", name, v)
			}
		}
	})
}

// Restarting kube-proxy, or replacing it with upstream's and back, does not
// fail a single request: each takes over the rules the other left.
func TestRestartAndTakeoverWithLiveTraffic(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "live-a", framework.PodOptions{Labels: map[string]string{"app": "live"}})
		addPod(t, "live-b", framework.PodOptions{Labels: map[string]string{"app": "live"}})
		client := addPod(t, "live-client", framework.PodOptions{})
		svc := service("live", "live", v1.ProtocolTCP)
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc = createService(t, svc)
		target := net.JoinHostPort(svc.Spec.ClusterIP, "80")
		answersTheNode(t, target)
		eventually(t, convergence, "the service answers", func() error {
			_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "live-a", "live-b")
			return err
		})
		defer useOurProxy(t, mode)
		for _, step := range []struct {
			name string
			ours bool
		}{{"restart ours", true}, {"ours -> upstream", false}, {"upstream -> ours", true}} {
			load, err := client.Netns.StartLoad("tcp", target, 8*time.Second, 50*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			switchProxy(t, step.ours, mode)
			seen, err := load.Wait()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s", step.name, seen)
			// Rarely (about one request in 300 over many runs, either
			// proxy starting, ours over rules it then leaves unchanged) a
			// new connection's first SYN went unanswered for 1 s around
			// a start, the request's timeout, which a 5 ms probe over 32
			// switches did not show. The likely cause was the wait above
			// made from the client before the rules existed (see
			// answersTheNode), now made from the node first; the
			// tolerance stays until runs show it gone. More
			// than one is a dropped flow.
			if seen.OK == 0 || seen.Failed > 1 {
				t.Errorf("%s: %d of %d requests failed:\n%s", step.name, seen.Failed, seen.OK+seen.Failed, seen.Errors)
			}
		}
	})
}

// A sync that fails is counted, and the rules are put right once one can
// succeed: here another program's rule jumps to a chain of ours that goes
// away, which the kernel then refuses to delete. In iptables mode that is
// an endpoint's chain (its pod goes), and partial and full restores alike
// fail; in nftables mode a service's chain (the service goes), counted as
// a failed sync or a failed clean-up, by where the mode deletes stale
// chains. The failure is contained: it is logged naming the chain (in
// iptables mode quoting the input line iptables refused), retried with
// backoff rather than at once, and another service keeps serving.
func TestFailedSyncsAreCountedAndRecovered(t *testing.T) {
	type failure struct {
		// chain finds the chain in the mode's rules.
		chain func(rules string) string
		// jump and unjump are another program's rule to it and its removal.
		jump, unjump func(chain string) [][]string
		// remove makes the chain stale; counted tells whether the
		// counters' values grew enough.
		remove  func(t *testing.T)
		counted func(before, after []float64) bool
		// counters are the failure counters read, each for IPv4.
		counters []string
	}
	removePod := func(t *testing.T) {
		if err := cluster.RemovePod(context.Background(), "fail-a"); err != nil {
			t.Fatal(err)
		}
	}
	deleteService := func(t *testing.T) {
		if err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Delete(context.Background(), "fail", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	each := func(before, after []float64) bool {
		for i := range before {
			if after[i] <= before[i] {
				return false
			}
		}
		return true
	}
	some := func(before, after []float64) bool {
		for i := range before {
			if after[i] > before[i] {
				return true
			}
		}
		return false
	}
	modeFailures := map[string]failure{
		iptablesMode: {
			chain: func(rules string) string {
				for _, line := range strings.Split(rules, "\n") {
					if f := strings.Fields(line); len(f) > 1 && f[0] == "-A" && strings.HasPrefix(f[1], "KUBE-SEP-") &&
						strings.Contains(line, `"default/fail:tcp"`) && strings.Contains(line, "DNAT") {
						return f[1]
					}
				}
				return ""
			},
			jump: func(chain string) [][]string {
				return [][]string{{"iptables-nft", "-t", "nat", "-N", "RPX-FOREIGN"}, {"iptables-nft", "-t", "nat", "-A", "RPX-FOREIGN", "-j", chain}}
			},
			unjump: func(string) [][]string {
				return [][]string{{"iptables-nft", "-t", "nat", "-F", "RPX-FOREIGN"}, {"iptables-nft", "-t", "nat", "-X", "RPX-FOREIGN"}}
			},
			remove:   removePod,
			counted:  each,
			counters: []string{"sync_proxy_rules_iptables_partial_restore_failures_total", "sync_proxy_rules_iptables_restore_failures_total"},
		},
		nftablesMode: {
			chain: func(rules string) string {
				if m := regexp.MustCompile(`chain (service-[A-Z2-7]{8}-default/fail/tcp/tcp) \{`).FindStringSubmatch(rules); m != nil {
					return m[1]
				}
				return ""
			},
			jump: func(chain string) [][]string {
				return [][]string{{"nft", "add", "chain", "ip", "kube-proxy", "rpx-foreign"}, {"nft", "add", "rule", "ip", "kube-proxy", "rpx-foreign", "jump", chain}}
			},
			unjump: func(string) [][]string {
				return [][]string{{"nft", "flush", "chain", "ip", "kube-proxy", "rpx-foreign"}, {"nft", "delete", "chain", "ip", "kube-proxy", "rpx-foreign"}}
			},
			remove:   deleteService,
			counted:  some,
			counters: []string{"sync_proxy_rules_nftables_sync_failures_total", "sync_proxy_rules_nftables_cleanup_failures_total"},
		},
	}
	inEachMode(t, func(t *testing.T, mode string) {
		f := modeFailures[mode]
		other, client := servedService(t, "fail-other")
		addPod(t, "fail-a", framework.PodOptions{Labels: map[string]string{"app": "fail"}})
		svc := service("fail", "fail", v1.ProtocolTCP)
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc = createService(t, svc)
		var chain string
		eventually(t, convergence, "the chain", func() error {
			if chain = f.chain(modeRules(t, mode)); chain == "" {
				return fmt.Errorf("not written yet")
			}
			return nil
		})
		// Another program's change makes our kube-proxy compare its rules
		// with the kernel in a full sync, which leaves that program's rule
		// alone: waiting for it sends the removal below to a partial sync.
		fullSyncs := func() float64 {
			return metricValue(metrics(t), `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`)
		}
		synced := fullSyncs()
		onNode(t, f.jump(chain)...)
		eventually(t, repairWindow(t, mode), "the full sync after another program's change", func() error {
			if fullSyncs() <= synced {
				return fmt.Errorf("none yet")
			}
			return nil
		})
		failures := func() []float64 {
			text := metrics(t)
			var values []float64
			for _, c := range f.counters {
				values = append(values, metricValue(text, "kubeproxy_"+c+`{ip_family="IPv4"}`))
			}
			return values
		}
		before := failures()
		logged := logSize(t)
		const watched = 10 * time.Second
		load := startLoad(t, client, other, watched+5*time.Second)
		f.remove(t)
		eventually(t, convergence, "the failures counted", func() error {
			if after := failures(); !f.counted(before, after) {
				return fmt.Errorf("%v: %v -> %v", f.counters, before, after)
			}
			return nil
		})
		attempts := func() int { return loggedSyncFailures(logSince(t, logged)) }
		first := attempts()
		time.Sleep(watched)
		retries := attempts() - first
		t.Logf("%d failed attempts logged by the time the failure was counted, %d more in the next %s", first, retries, watched)
		// Backing off from 1 s, doubling: 1+2+4 s, then 8 s.
		if first == 0 || retries > 4 {
			t.Errorf("%d failed attempts logged, then %d in %s: want some, then at most 4", first, retries, watched)
		}
		// The failures name the chain; in iptables mode they quote the
		// input line iptables refused.
		want := chain
		if mode == iptablesMode {
			want = `(input line `
		}
		if log := logSince(t, logged); !strings.Contains(log, chain) || !strings.Contains(log, want) {
			t.Errorf("the failures logged name no %s, or quote no input line:\n%s", chain, log)
		}
		if seen := waitLoad(t, "another service's traffic while the syncs failed", load); seen.Failed > 0 {
			t.Errorf("another service failed %d requests:\n%s", seen.Failed, seen.Errors)
		}
		onNode(t, f.unjump(chain)...)
		eventually(t, time.Minute, "the chain removed", func() error {
			if strings.Contains(modeRules(t, mode), chain) {
				return fmt.Errorf("%s is still there", chain)
			}
			return nil
		})
		eventually(t, convergence, "the service rejects, having no endpoint, or is gone", func() error {
			r, err := cluster.Node.Request("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), 2*time.Second)
			switch {
			case err == nil:
				return fmt.Errorf("answered by %s", r.Pod)
			case mode == iptablesMode && !strings.Contains(err.Error(), "connection refused"):
				return fmt.Errorf("want connection refused, got %v", err)
			}
			return nil
		})
	})
}

// loggedSyncFailures counts the lines of a kube-proxy log that report a
// failed sync or a failed deletion of stale chains.
func loggedSyncFailures(log string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		for _, failure := range []string{"Partial sync failed", "Full sync failed; retrying", "Deleting stale nftables chains failed"} {
			if strings.Contains(line, failure) {
				n++
			}
		}
	}
	return n
}
