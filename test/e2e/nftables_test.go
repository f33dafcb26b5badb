package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// What only the nftables mode does.

// clusterIPsCheck is the nftables mode's cluster-ips-check chain of a
// family ("ip", "ip6"), "" while there is none.
func clusterIPsCheck(family string) string {
	out, err := cluster.Node.Command("nft", "list", "chain", family, "kube-proxy", "cluster-ips-check").Output()
	if err != nil {
		return ""
	}
	return string(out)
}

// As upstream's nftables mode: traffic to a ClusterIP on a port no service
// uses is rejected, and traffic to an address of the ServiceCIDRs that no
// service has is dropped; the ServiceCIDR objects (the API server's
// "kubernetes" from --service-cluster-ip-range, and any added) are
// followed as they come and go.
func TestNFTablesModeGuardsTheServiceCIDRs(t *testing.T) {
	useOurProxy(t, nftablesMode)
	ctx := context.Background()
	addPod(t, "guard-a", framework.PodOptions{Labels: map[string]string{"app": "guard"}})
	client := addPod(t, "guard-client", framework.PodOptions{})
	svc := createService(t, service("guard", "guard", v1.ProtocolTCP))
	eventually(t, convergence, "the service answers", func() error {
		_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "guard-a")
		return err
	})
	v4, v6, _ := strings.Cut(framework.ServiceCIDRs, ",")
	eventually(t, convergence, "the service CIDRs in cluster-ips-check", func() error {
		if c := clusterIPsCheck("ip"); !strings.Contains(c, v4) {
			return fmt.Errorf("ip: %s", c)
		}
		if c := clusterIPsCheck("ip6"); !strings.Contains(c, v6) {
			return fmt.Errorf("ip6: %s", c)
		}
		return nil
	})
	if _, err := client.Netns.Request("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "81"), 2*time.Second); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("a port the cluster IP does not serve: want connection refused, got %v", err)
	}
	unallocated := unallocatedServiceIP(t)
	if _, err := client.Netns.Request("tcp", net.JoinHostPort(unallocated, "80"), 2*time.Second); err == nil || !strings.Contains(err.Error(), "i/o timeout") {
		t.Errorf("an unallocated address of the service CIDR (%s): want it dropped (a timeout), got %v", unallocated, err)
	}

	const extra = "10.98.0.0/24"
	cidrs := cluster.Client.NetworkingV1().ServiceCIDRs()
	if _, err := cidrs.Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "e2e-extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{extra}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Without the service CIDR controller, nothing removes the API
	// server's finalizer: the test does.
	deleteCIDR := func() error {
		if err := cidrs.Delete(ctx, "e2e-extra", metav1.DeleteOptions{}); err != nil {
			return err
		}
		obj, err := cidrs.Get(ctx, "e2e-extra", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		obj.Finalizers = nil
		_, err = cidrs.Update(ctx, obj, metav1.UpdateOptions{})
		return err
	}
	t.Cleanup(func() { _ = deleteCIDR() })
	eventually(t, convergence, "an added ServiceCIDR in cluster-ips-check", func() error {
		if c := clusterIPsCheck("ip"); !strings.Contains(c, extra) || !strings.Contains(c, v4) {
			return fmt.Errorf("ip: %s", c)
		}
		return nil
	})
	if err := deleteCIDR(); err != nil {
		t.Fatal(err)
	}
	eventually(t, convergence, "a deleted ServiceCIDR gone from cluster-ips-check", func() error {
		if c := clusterIPsCheck("ip"); strings.Contains(c, extra) || !strings.Contains(c, v4) {
			return fmt.Errorf("ip: %s", c)
		}
		return nil
	})
}

// unallocatedServiceIP is an IPv4 address of the service CIDR that no
// service has.
func unallocatedServiceIP(t *testing.T) string {
	t.Helper()
	list, err := cluster.Client.CoreV1().Services(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, s := range list.Items {
		for _, ip := range s.Spec.ClusterIPs {
			used[ip] = true
		}
	}
	for i := 250; i > 0; i-- {
		if ip := fmt.Sprintf("10.96.255.%d", i); !used[ip] {
			return ip
		}
	}
	t.Fatal("no unallocated address in 10.96.255.0/24")
	return ""
}

// A family the Node lists no address of answers NodePorts, under the
// nftables mode's default nodePortAddresses "primary", on every local
// address of the family but loopback (fib daddr type local, no
// nodeport-ips set), the other family only on its node IP; its node IP is
// loopback, which loadBalancerSourceRanges holding it let through with the
// LB IP. Ours writes what upstream's does, taking over its tables, for
// either family missing.
func TestNFTablesNodePortsOfAFamilyWithoutANodeIP(t *testing.T) {
	defer useOurProxy(t, nftablesMode)
	addPod(t, "nonodeip-a", framework.PodOptions{Labels: map[string]string{"app": "nonodeip"}})
	svc := service("nonodeip", "nonodeip", v1.ProtocolTCP)
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.LoadBalancerSourceRanges = []string{"127.0.0.0/8", "192.0.2.0/24", "::1/128", "2001:db8::/64"}
	svc = createService(t, svc)
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.255.3.23"}, {IP: "fd00:255:3::23"}}
	if _, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ missing, family, kept, lbIP string }{
		{framework.NodeIPv6, "ip6", framework.NodeIPv4, "fd00:255:3::23"},
		{framework.NodeIPv4, "ip", framework.NodeIPv6, "10.255.3.23"},
	} {
		t.Run("without "+tc.missing, func(t *testing.T) {
			stopProxy()
			setNodeAddresses(t, tc.kept)
			switchProxy(t, false, nftablesMode)
			var upstream string
			eventually(t, convergence, "upstream's NodePort rules of both families", func() error {
				// Both families synced: until then a family's table is
				// the one the previous subtest left.
				text, err := fetchMetrics()
				if err != nil {
					return err
				}
				for _, family := range []string{"IPv4", "IPv6"} {
					if metricValue(text, `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="`+family+`"}`) <= 0 {
						return fmt.Errorf("upstream has not synced %s yet", family)
					}
				}
				upstream = nodePortRules()
				for _, want := range []string{
					tc.family + " nodeport-ips: none",
					"fib daddr type local " + tc.family + " daddr != ",
					"nodeport-ips {", tc.kept,
					tc.lbIP,
				} {
					if !strings.Contains(upstream, want) {
						return fmt.Errorf("no %q in:\n%s", want, upstream)
					}
				}
				return nil
			})
			switchProxy(t, true, nftablesMode)
			eventually(t, convergence, "ours the same as upstream's", func() error {
				if ours := nodePortRules(); ours != upstream {
					return fmt.Errorf("upstream's (-) and ours (+) differ:\n%s", testutil.LineDiff(upstream, ours))
				}
				return nil
			})
		})
	}
}

// setNodeAddresses leaves the node's Node object with the internal IPs
// given, until the test ends; no kube-proxy runs when it changes them.
func setNodeAddresses(t *testing.T, ips ...string) {
	t.Helper()
	ctx := context.Background()
	set := func(addrs []v1.NodeAddress) error {
		node, err := cluster.Client.CoreV1().Nodes().Get(ctx, framework.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Addresses = addrs
		_, err = cluster.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}
	node, err := cluster.Client.CoreV1().Nodes().Get(ctx, framework.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := node.Status.Addresses
	t.Cleanup(func() {
		stopProxy()
		if err := set(before); err != nil {
			t.Errorf("restoring the node's addresses: %v", err)
		}
	})
	addrs := []v1.NodeAddress{{Type: v1.NodeHostName, Address: framework.NodeName}}
	for _, ip := range ips {
		addrs = append(addrs, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	if err := set(addrs); err != nil {
		t.Fatal(err)
	}
}

// nodePortRules are the nftables mode's chains that pick NodePort traffic,
// its nodeport-ips set and its loadBalancerSourceRanges rules, both
// families, or why nft could not list them.
func nodePortRules() string {
	var all strings.Builder
	for _, family := range []string{"ip", "ip6"} {
		table, err := cluster.Node.Command("nft", "list", "table", family, "kube-proxy").CombinedOutput()
		if err != nil {
			fmt.Fprintf(&all, "%s: %v: %s", family, err, table)
			continue
		}
		for _, line := range strings.Split(string(table), "\n") {
			if strings.Contains(line, " saddr != {") {
				fmt.Fprintln(&all, line)
			}
		}
		for _, chain := range []string{"services", "nodeport-endpoints-check"} {
			out, err := cluster.Node.Command("nft", "list", "chain", family, "kube-proxy", chain).CombinedOutput()
			if err != nil {
				fmt.Fprintf(&all, "%s %s: %v: %s", family, chain, err, out)
				continue
			}
			all.Write(out)
		}
		out, err := cluster.Node.Command("nft", "list", "set", family, "kube-proxy", "nodeport-ips").CombinedOutput()
		switch {
		case err == nil:
			all.Write(out)
		case strings.Contains(string(out), "No such file or directory"):
			fmt.Fprintf(&all, "%s nodeport-ips: none\n", family)
		default:
			fmt.Fprintf(&all, "%s nodeport-ips: %v: %s", family, err, out)
		}
	}
	return all.String()
}
