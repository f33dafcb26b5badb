package e2e

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Starting in one mode removes what the others left, which would otherwise
// still act on the traffic, once its own first sync is in place: the
// iptables mode removes the nftables mode's tables and what only the IPVS
// mode has (its chains, ipsets and kube-ipvs0); the nftables mode the
// iptables and IPVS modes' chains (both backends and families), ipsets
// and kube-ipvs0.
func TestStartRemovesTheOtherModesLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		leftovers  [][]string
		// checks list what must no longer show any of gone.
		checks [][]string
		gone   []string
	}{{
		name: "iptables over nftables", mode: iptablesMode,
		leftovers: [][]string{{"nft", "add", "table", "ip", "kube-proxy"}, {"nft", "add", "table", "ip6", "kube-proxy"}},
		checks:    [][]string{{"nft", "list", "tables"}},
		gone:      []string{"kube-proxy"},
	}, {
		name: "nftables over iptables and IPVS", mode: nftablesMode,
		leftovers: [][]string{
			{"iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"iptables-nft", "-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"},
			{"iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"ip6tables-nft", "-t", "filter", "-N", "KUBE-FORWARD"},
			{"ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"},
			{"ip", "link", "add", "kube-ipvs0", "type", "bridge"},
		},
		checks: [][]string{{"iptables-nft-save"}, {"ip6tables-nft-save"}, {"iptables-legacy-save"}, {"ipset", "list", "-n"}, {"ip", "link"}},
		gone:   []string{"KUBE-", "kube-ipvs0"},
	}, {
		name: "iptables over IPVS", mode: iptablesMode,
		leftovers: [][]string{
			{"ipset", "create", "KUBE-NODE-PORT-TCP", "bitmap:port", "range", "0-65535"},
			{"ip", "link", "add", "kube-ipvs0", "type", "bridge"},
			{"iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"iptables-nft", "-t", "nat", "-N", "KUBE-NODE-PORT"},
			{"iptables-nft", "-t", "nat", "-A", "KUBE-NODE-PORT", "-p", "tcp", "-m", "set", "--match-set", "KUBE-NODE-PORT-TCP", "dst", "-j", "RETURN"},
			{"iptables-nft", "-t", "nat", "-A", "KUBE-SERVICES", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "KUBE-NODE-PORT"},
			{"iptables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"},
			{"iptables-nft", "-t", "filter", "-N", "KUBE-IPVS-FILTER"},
			{"iptables-nft", "-t", "filter", "-A", "INPUT", "-j", "KUBE-IPVS-FILTER"},
		},
		checks: [][]string{{"iptables-nft-save"}, {"ipset", "list", "-n"}, {"ip", "link"}},
		gone:   []string{"KUBE-NODE-PORT", "KUBE-IPVS-FILTER", "kube-ipvs0"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			// From a node without anything of kube-proxy's, so that the
			// leftovers made here are all there is.
			stopProxy()
			onNode(t, []string{cluster.KubeProxy(), "--cleanup"})
			onNode(t, tc.leftovers...)
			switchProxy(t, true, tc.mode)
			eventually(t, convergence, "the leftovers' removal", func() error {
				for _, check := range tc.checks {
					out, err := cluster.Node.Command(check...).Output()
					if err != nil {
						return fmt.Errorf("%v: %v", check, err)
					}
					for _, left := range tc.gone {
						if strings.Contains(string(out), left) {
							return fmt.Errorf("after a start in %s mode, %v still shows %s:\n%s", tc.mode, check, left, out)
						}
					}
				}
				return nil
			})
		})
	}
}

// A node switched from the iptables mode to the nftables mode and back
// (SIGTERM, a start in the other mode, twice) under a client opening a
// new connection every 20 ms to a ClusterIP, a NodePort and a
// LoadBalancer IP, and long-lived connections opened before the first
// switch that exchange a line every second: with ours not one fails, UDP
// flows keep their endpoints through each switch, /healthz answers only once the
// new mode's rules are in place, and nothing of the other mode is left
// after each switch. Upstream goes through the same switch for comparison
// (its start removes the other mode's rules before its first sync); its
// figures are logged, not checked.
func TestSwitchingModesFailsNoConnection(t *testing.T) {
	for _, name := range []string{"a", "b"} {
		addPod(t, "switch-"+name, framework.PodOptions{Labels: map[string]string{"app": "switch"}})
	}
	client := addPod(t, "switch-client", framework.PodOptions{})
	svc := service("switch", "switch", v1.ProtocolTCP, v1.ProtocolUDP)
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc = createService(t, svc)
	const lbIP = "10.255.3.40"
	setLoadBalancerIP(t, svc, lbIP)
	nodePort := net.JoinHostPort(framework.NodeIPv4, strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
	targets := []struct {
		what     string
		from     *framework.Netns
		hostPort string
	}{
		{"ClusterIP", client.Netns, net.JoinHostPort(svc.Spec.ClusterIP, "80")},
		{"NodePort", cluster.External, nodePort},
		{"LoadBalancer IP", cluster.External, net.JoinHostPort(lbIP, "80")},
	}
	serves := func(t *testing.T) {
		t.Helper()
		for _, target := range targets {
			eventually(t, convergence, target.what, func() error {
				_, err := target.from.Request("tcp", target.hostPort, time.Second)
				return err
			})
		}
	}
	for _, proxy := range []string{"ours", "upstream"} {
		ours := proxy == "ours"
		t.Run(proxy, func(t *testing.T) {
			switchProxy(t, ours, iptablesMode)
			serves(t)
			var loads []*framework.Load
			var held []*framework.Held
			for _, target := range targets {
				load, err := target.from.StartLoad("tcp", target.hostPort, 10*time.Minute, 20*time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				loads = append(loads, load)
				h, err := target.from.HoldConnections(target.hostPort, 2)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, h)
			}
			// UDP flows: one source port each, so one conntrack entry each,
			// which keeps its endpoint as long as the entry lives. Four of
			// them over two endpoints: a first sync that moved them would
			// keep all four in place through both switches by chance once
			// in 256 runs.
			udpTarget := net.JoinHostPort(svc.Spec.ClusterIP, "80")
			flowPorts := []int{40123, 40124, 40125, 40126}
			flowPods := map[int]string{}
			for _, port := range flowPorts {
				r, err := client.Netns.RequestFrom(port, "udp", udpTarget, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				flowPods[port] = r.Pod
			}
			time.Sleep(2 * time.Second)
			for _, mode := range []string{nftablesMode, iptablesMode} {
				start := time.Now()
				switchProxy(t, ours, mode)
				// Each flow keeps its endpoint: the first sync deletes only
				// the flows no rule translated (to a service that had no
				// endpoint) and those to endpoints that are gone.
				for _, port := range flowPorts {
					r, err := client.Netns.RequestFrom(port, "udp", udpTarget, time.Second)
					switch {
					case err != nil && ours:
						t.Errorf("%s: after the switch to %s mode the UDP flow from port %d got no answer: %v", proxy, mode, port, err)
					case err != nil:
						t.Logf("%s: after the switch to %s mode the UDP flow from port %d got no answer: %v", proxy, mode, port, err)
					case r.Pod != flowPods[port] && ours:
						t.Errorf("%s: after the switch to %s mode the UDP flow from port %d went to %s, before %s", proxy, mode, port, r.Pod, flowPods[port])
					case r.Pod != flowPods[port]:
						t.Logf("%s: after the switch to %s mode the UDP flow from port %d went to %s, before %s", proxy, mode, port, r.Pod, flowPods[port])
						flowPods[port] = r.Pod
					}
				}
				t.Logf("%s: switched to %s mode in %s", proxy, mode, time.Since(start).Round(time.Millisecond))
				time.Sleep(2 * time.Second)
			}
			for i, target := range targets {
				seen, err := loads[i].Stop()
				if err != nil {
					t.Fatal(err)
				}
				kept, err := held[i].Stop()
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s, %s: new connections: %s; %s", proxy, target.what, seen, kept)
				if ours && (seen.Failed > 0 || kept.Broken > 0) {
					t.Errorf("%s: failed or broken connections through a switch of modes:\n%s%s", target.what, seen.Errors, kept.Errors)
				}
			}
		})
	}
}

// switchDone says why a switch to mode is not over: the other mode's
// rules are still there, or the metric says so.
func switchDone(t *testing.T, mode string) error {
	switch mode {
	case nftablesMode:
		if rules := nodeRules(t); strings.Contains(rules, "KUBE-") {
			return fmt.Errorf("the iptables mode's rules are left in nftables mode:\n%s", rules)
		}
	case iptablesMode:
		if rules := nftablesRules(t); rules != "" {
			return fmt.Errorf("the nftables mode's tables are left in iptables mode:\n%s", rules)
		}
	}
	text, err := fetchMetrics()
	if err != nil {
		return err
	}
	if v := metricValue(text, "kubeproxy_mode_switch_in_progress"); v != 0 {
		return fmt.Errorf("kubeproxy_mode_switch_in_progress is %v", v)
	}
	return nil
}

// Killed (SIGKILL) in the middle of a switch, once the new mode has begun
// to write its rules, the next start finishes the switch in the new mode
// or reverses it in the old one, under the same clients as above, with no
// connection failing and nothing of the other mode left.
func TestSwitchKilledMidwayFinishesOrReverses(t *testing.T) {
	addPod(t, "midway-a", framework.PodOptions{Labels: map[string]string{"app": "midway"}})
	client := addPod(t, "midway-client", framework.PodOptions{})
	svc := service("midway", "midway", v1.ProtocolTCP)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc = createService(t, svc)
	clusterIP := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	nodePort := net.JoinHostPort(framework.NodeIPv4, strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
	useOurProxy(t, iptablesMode)
	eventually(t, convergence, "the service", func() error {
		_, err := client.Netns.Request("tcp", clusterIP, time.Second)
		return err
	})
	toClusterIP, err := client.Netns.StartLoad("tcp", clusterIP, 10*time.Minute, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	toNodePort, err := cluster.External.StartLoad("tcp", nodePort, 10*time.Minute, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	held, err := client.Netns.HoldConnections(clusterIP, 2)
	if err != nil {
		t.Fatal(err)
	}
	// written tells whether a mode has begun to write its rules.
	written := map[string][]string{
		nftablesMode: {"nft", "list", "table", "ip", "kube-proxy"},
		iptablesMode: {"iptables-nft", "-t", "nat", "-S", "KUBE-SERVICES"},
	}
	for _, step := range []struct{ killed, next string }{
		{nftablesMode, iptablesMode}, // reversed
		{nftablesMode, nftablesMode}, // finished
		{iptablesMode, nftablesMode}, // reversed
	} {
		killMidway(t, step.killed, written[step.killed])
		switchProxy(t, true, step.next)
		eventually(t, time.Minute, "the end of the switch to "+step.next, func() error {
			return switchDone(t, step.next)
		})
		t.Logf("killed while switching to %s mode, then started in %s mode", step.killed, step.next)
	}
	for _, load := range []*framework.Load{toClusterIP, toNodePort} {
		seen, err := load.Stop()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("new connections: %s", seen)
		if seen.Failed > 0 {
			t.Errorf("failed connections through killed switches:\n%s", seen.Errors)
		}
	}
	kept, err := held.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if t.Logf("%s", kept); kept.Broken > 0 {
		t.Errorf("broken connections through killed switches:\n%s", kept.Errors)
	}
}

// killMidway stops the running kube-proxy, starts ours in mode, and kills
// it (SIGKILL) as soon as written (a command) says its rules have begun
// to appear.
func killMidway(t *testing.T, mode string, written []string) {
	t.Helper()
	proxyMu.Lock()
	defer proxyMu.Unlock()
	stopProxyLocked()
	started++
	p, err := cluster.StartKubeProxy(fmt.Sprintf("kube-proxy-%s-%d", mode, started), cluster.KubeProxy(), cluster.KubeProxyConfig(proxyConfig(mode)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	deadline := time.Now().Add(time.Minute)
	for cluster.Node.Command(written...).Run() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no rules of the %s mode within a minute:\n%s", mode, p.LogTail(20))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
}
