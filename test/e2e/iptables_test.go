package e2e

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/nfacct"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
	proxymetrics "github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// What only the iptables mode does, or only it can be checked for.

// --cleanup removes every chain and jump of ours, in both families and
// both backends, and what the IPVS and nftables modes leave; nothing else.
func TestCleanupRemovesEverything(t *testing.T) {
	useOurProxy(t, iptablesMode)
	defer useOurProxy(t, iptablesMode)
	stopProxy()
	leftovers := [][]string{
		{"iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"},
		{"iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"},
		{"ip6tables-legacy", "-t", "filter", "-N", "KUBE-FORWARD"},
		{"ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"},
		{"ipset", "create", "KUBE-6-CLUSTER-IP", "hash:ip,port", "family", "inet6"},
		{"ipset", "create", "not-ours", "hash:ip"},
		{"ip", "link", "add", "kube-ipvs0", "type", "bridge"},
		{"nft", "add", "table", "ip", "kube-proxy"},
		{"nft", "add", "table", "ip6", "kube-proxy"},
	}
	onNode(t, leftovers...)
	nfacctObjects := func() (left []string) {
		testutil.DoInNetns(t, cluster.Node.Name, func() {
			for _, name := range []string{proxymetrics.NFAcctCTStateInvalidDropped, proxymetrics.NFAcctLocalhostNodePortsAccepted} {
				if _, err := nfacct.Get(name); !errors.Is(err, unix.ENOENT) {
					left = append(left, fmt.Sprintf("%s (%v)", name, err))
				}
			}
		})
		return left
	}
	if left := nfacctObjects(); len(left) != 2 {
		t.Errorf("before --cleanup, the nfacct objects our kube-proxy made: %v", left)
	}
	out, err := cluster.Node.Command(cluster.KubeProxy(), "--cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	if left := nfacctObjects(); len(left) > 0 {
		t.Errorf("after --cleanup, nfacct objects are left: %v", left)
	}
	for _, check := range [][]string{
		{"iptables-nft-save"}, {"ip6tables-nft-save"}, {"iptables-legacy-save"}, {"ip6tables-legacy-save"},
		{"ipset", "list", "-n"}, {"ip", "link"}, {"nft", "list", "tables"},
	} {
		out, err := cluster.Node.Command(check...).Output()
		if err != nil {
			t.Fatalf("%v: %v", check, err)
		}
		for _, left := range []string{"KUBE-", "kube-ipvs0", "kube-proxy"} {
			if strings.Contains(string(out), left) {
				t.Errorf("after --cleanup, %v still shows %s:\n%s", check, left, out)
			}
		}
	}
	if out, _ := cluster.Node.Command("ipset", "list", "-n").Output(); !strings.Contains(string(out), "not-ours") {
		t.Errorf("--cleanup removed an ipset that is not kube-proxy's")
	}
	_, _ = cluster.Node.Command("ipset", "destroy", "not-ours").CombinedOutput()
}

// A node moving from upstream's kube-proxy to ours finds nothing to
// rewrite: every rule upstream wrote, those counting packets in nfacct
// objects included, stays as it was (nft gives a rule written again a new
// handle).
func TestTakeoverFromUpstreamWritesNothing(t *testing.T) {
	useOurProxy(t, iptablesMode)
	defer useOurProxy(t, iptablesMode)
	addPod(t, "takeover-a", framework.PodOptions{Labels: map[string]string{"app": "takeover"}})
	svc := service("takeover", "takeover", v1.ProtocolTCP, v1.ProtocolUDP)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc = createService(t, svc)
	switchProxy(t, false, iptablesMode)
	// Both families' endpoints are in upstream's rules, so it has nothing
	// left to write.
	eventually(t, convergence, "upstream serves both cluster IPs and the node port on localhost", func() error {
		for _, ip := range append([]string{"127.0.0.1"}, svc.Spec.ClusterIPs...) {
			port := svc.Spec.Ports[0].Port
			if ip == "127.0.0.1" {
				port = svc.Spec.Ports[0].NodePort
			}
			if _, err := answeredBy(cluster.Node, "tcp", ip, port, "takeover-a"); err != nil {
				return err
			}
		}
		return nil
	})
	stopProxy()
	before := ruleset(t)
	switchProxy(t, true, iptablesMode)
	eventually(t, convergence, "our first sync of both families", func() error {
		text := metrics(t)
		for _, family := range []string{"IPv4", "IPv6"} {
			if metricValue(text, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="`+family+`"}`) <= 0 {
				return fmt.Errorf("%s not synced yet", family)
			}
		}
		return nil
	})
	if after := ruleset(t); after != before {
		t.Errorf("our kube-proxy rewrote upstream's rules:\n%s", testutil.LineDiff(before, after))
	}
}

// counters are the packet counts nft lists, which traffic changes.
var counters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// ruleset is the node's whole nftables ruleset (iptables-nft's tables),
// with each rule's handle and without its counters.
func ruleset(t *testing.T) string {
	t.Helper()
	out, err := cluster.Node.Command("nft", "-a", "list", "ruleset").Output()
	if err != nil {
		t.Fatalf("nft list ruleset: %v", err)
	}
	return counters.ReplaceAllString(string(out), "counter")
}
