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
