package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// The service features, tested in every mode (inEachMode).

// convergence bounds how long a test waits for kube-proxy to act on a
// change; it is a deadline for correctness, not a speed measurement.
const convergence = 20 * time.Second

func TestClusterIPFromPodsAndTheNode(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "cip-a", framework.PodOptions{Labels: map[string]string{"app": "cip"}})
		addPod(t, "cip-b", framework.PodOptions{Labels: map[string]string{"app": "cip"}})
		client := addPod(t, "cip-client", framework.PodOptions{})
		svc := createService(t, service("cip", "cip", v1.ProtocolTCP, v1.ProtocolUDP))
		if len(svc.Spec.ClusterIPs) != 2 {
			t.Fatalf("want a dual-stack service, got cluster IPs %v", svc.Spec.ClusterIPs)
		}
		from := map[string]*framework.Netns{"client pod": client.Netns, "node": cluster.Node}
		for where, ns := range from {
			for _, ip := range svc.Spec.ClusterIPs {
				for _, proto := range []string{"tcp", "udp"} {
					eventually(t, convergence, fmt.Sprintf("%s %s to %s", where, proto, ip), func() error {
						_, err := answeredBy(ns, proto, ip, 80, "cip-a", "cip-b")
						return err
					})
				}
			}
		}
		// Both endpoints get traffic.
		seen := map[string]bool{}
		for i := 0; i < 40 && len(seen) < 2; i++ {
			if r, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "cip-a", "cip-b"); err == nil {
				seen[r.Pod] = true
			}
		}
		if len(seen) != 2 {
			t.Errorf("40 requests reached only %v", seen)
		}
	})
}

func TestNodePortFromOutsideAndLocalhost(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "np-a", framework.PodOptions{Labels: map[string]string{"app": "np"}})
		svc := service("np", "np", v1.ProtocolTCP, v1.ProtocolUDP)
		svc.Spec.Type = v1.ServiceTypeNodePort
		svc = createService(t, svc)
		for _, port := range svc.Spec.Ports {
			proto := strings.ToLower(string(port.Protocol))
			eventually(t, convergence, "external to the node port "+proto, func() error {
				_, err := answeredBy(cluster.External, proto, framework.NodeIPv4, port.NodePort, "np-a")
				return err
			})
		}
		nodePort := svc.Spec.Ports[0].NodePort
		if mode == nftablesMode {
			// As upstream's nftables mode: no NodePorts on localhost.
			if r, err := answeredBy(cluster.Node, "tcp", "127.0.0.1", nodePort, "np-a"); err == nil {
				t.Errorf("127.0.0.1:%d answered by %s in nftables mode", nodePort, r.Pod)
			}
			return
		}
		eventually(t, convergence, "the node to 127.0.0.1:nodePort", func() error {
			_, err := answeredBy(cluster.Node, "tcp", "127.0.0.1", nodePort, "np-a")
			return err
		})
	})
}

func TestExternalIPsAndLoadBalancerIPs(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "ext-a", framework.PodOptions{Labels: map[string]string{"app": "ext"}})
		svc := service("ext", "ext", v1.ProtocolTCP)
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc.Spec.ExternalIPs = []string{"10.255.2.20"}
		svc = createService(t, svc)
		setLoadBalancerIP(t, svc, "10.255.3.20")
		for _, ip := range []string{"10.255.2.20", "10.255.3.20"} {
			eventually(t, convergence, "external to "+ip, func() error {
				_, err := answeredBy(cluster.External, "tcp", ip, 80, "ext-a")
				return err
			})
		}
	})
}

func setLoadBalancerIP(t *testing.T, svc *v1.Service, ip string) {
	t.Helper()
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip}}
	if _, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestLoadBalancerSourceRanges(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "fw-a", framework.PodOptions{Labels: map[string]string{"app": "fw"}})
		svc := service("fw", "fw", v1.ProtocolTCP)
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
		svc.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
		svc = createService(t, svc)
		setLoadBalancerIP(t, svc, "10.255.3.21")
		// The external client is outside the allowed range: dropped. Wait for
		// the rules first: the cluster IP answers once they are in.
		eventually(t, convergence, "the cluster IP", func() error {
			_, err := answeredBy(cluster.Node, "tcp", svc.Spec.ClusterIP, 80, "fw-a")
			return err
		})
		eventually(t, convergence, "a source outside the ranges dropped", func() error {
			if r, err := answeredBy(cluster.External, "tcp", "10.255.3.21", 80, "fw-a"); err == nil {
				return fmt.Errorf("answered by %s", r.Pod)
			}
			return nil
		})
		current, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Get(context.Background(), "fw", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		current.Spec.LoadBalancerSourceRanges = []string{framework.ExternalIPv4 + "/32"}
		if _, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Update(context.Background(), current, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, convergence, "a source inside the ranges answered", func() error {
			_, err := answeredBy(cluster.External, "tcp", "10.255.3.21", 80, "fw-a")
			return err
		})
	})
}

func TestSessionAffinityKeepsAClientOnOnePod(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		for _, name := range []string{"aff-a", "aff-b", "aff-c"} {
			addPod(t, name, framework.PodOptions{Labels: map[string]string{"app": "aff"}})
		}
		client := addPod(t, "aff-client", framework.PodOptions{})
		svc := service("aff", "aff", v1.ProtocolTCP)
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc = createService(t, svc)
		var first string
		eventually(t, convergence, "the service answers", func() error {
			r, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "aff-a", "aff-b", "aff-c")
			first = r.Pod
			return err
		})
		for i := 0; i < 10; i++ {
			if r, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, first); err != nil {
				t.Fatalf("request %d: %v", i, err)
			} else if r.Pod != first {
				t.Fatalf("request %d went to %s, not %s", i, r.Pod, first)
			}
		}
	})
}

// With externalTrafficPolicy Local the pod sees the client's own address;
// with Cluster the node masquerades it.
func TestExternalTrafficPolicyPreservesTheSource(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "etp-a", framework.PodOptions{Labels: map[string]string{"app": "etp"}})
		for _, policy := range []v1.ServiceExternalTrafficPolicy{v1.ServiceExternalTrafficPolicyLocal, v1.ServiceExternalTrafficPolicyCluster} {
			name := "etp-" + strings.ToLower(string(policy))
			svc := service(name, "etp", v1.ProtocolTCP)
			svc.Spec.Type = v1.ServiceTypeNodePort
			svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
			svc.Spec.ExternalTrafficPolicy = policy
			svc = createService(t, svc)
			var reply framework.Reply
			eventually(t, convergence, name, func() error {
				var err error
				reply, err = answeredBy(cluster.External, "tcp", framework.NodeIPv4, svc.Spec.Ports[0].NodePort, "etp-a")
				return err
			})
			source, _, _ := net.SplitHostPort(reply.Source)
			preserved := source == framework.ExternalIPv4
			if preserved != (policy == v1.ServiceExternalTrafficPolicyLocal) {
				t.Errorf("%s: the pod saw %s (client %s)", policy, source, framework.ExternalIPv4)
			}
		}
	})
}

// internalTrafficPolicy Local sends cluster traffic only to endpoints on
// this node: with only a remote one, nothing answers.
func TestInternalTrafficPolicyLocal(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		addPod(t, "itp-remote", framework.PodOptions{Labels: map[string]string{"app": "itp"}, Remote: true})
		client := addPod(t, "itp-client", framework.PodOptions{})
		svc := createService(t, service("itp", "itp", v1.ProtocolTCP))
		eventually(t, convergence, "cluster policy reaches the remote pod", func() error {
			_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "itp-remote")
			return err
		})
		updateService(t, "itp", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptrTo(v1.ServiceInternalTrafficPolicyLocal) })
		eventually(t, convergence, "local policy with no local endpoint drops", func() error {
			if r, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "itp-remote"); err == nil {
				return fmt.Errorf("answered by %s", r.Pod)
			}
			return nil
		})
		addPod(t, "itp-local", framework.PodOptions{Labels: map[string]string{"app": "itp"}})
		eventually(t, convergence, "local policy reaches the local pod only", func() error {
			_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "itp-local")
			return err
		})
	})
}

func updateService(t *testing.T, name string, change func(*v1.Service)) {
	t.Helper()
	svc, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	change(svc)
	if _, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A service without endpoints rejects connections at once, rather than
// letting them time out.
func TestNoEndpointsIsRejected(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		client := addPod(t, "rej-client", framework.PodOptions{})
		svc := createService(t, service("rej", "nobody", v1.ProtocolTCP))
		eventually(t, convergence, "connection refused", func() error {
			_, err := client.Netns.Request("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), 5*time.Second)
			if err == nil || !strings.Contains(err.Error(), "connection refused") {
				return fmt.Errorf("want connection refused, got %v", err)
			}
			return nil
		})
	})
}

// A pod that stops being ready gets no new connection once kube-proxy has
// seen its EndpointSlice change.
func TestEndpointChurn(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		a := addPod(t, "churn-a", framework.PodOptions{Labels: map[string]string{"app": "churn"}})
		addPod(t, "churn-b", framework.PodOptions{Labels: map[string]string{"app": "churn"}})
		client := addPod(t, "churn-client", framework.PodOptions{})
		svc := createService(t, service("churn", "churn", v1.ProtocolTCP))
		eventually(t, convergence, "both pods serve", func() error {
			seen := map[string]bool{}
			for i := 0; i < 30 && len(seen) < 2; i++ {
				if r, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "churn-a", "churn-b"); err == nil {
					seen[r.Pod] = true
				}
			}
			if len(seen) < 2 {
				return fmt.Errorf("only %v answered", seen)
			}
			return nil
		})
		if err := cluster.SetPodReady(context.Background(), "churn-a", false); err != nil {
			t.Fatal(err)
		}
		waitForReadyEndpoints(t, "churn", 2) // churn-b, both families
		// Our kube-proxy has seen the change once churn-a's DNAT is gone
		// from the rules (its endpoint chain is flushed at once).
		gone := net.JoinHostPort(a.IPv4, "8080")
		eventually(t, convergence, "churn-a's endpoint out of the rules", func() error {
			if strings.Contains(modeRules(t, mode), gone) {
				return fmt.Errorf("%s still in the rules", gone)
			}
			return nil
		})
		for i := 0; i < 20; i++ {
			if _, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "churn-b"); err != nil {
				t.Fatalf("request %d, after churn-a's endpoint left the rules: %v", i, err)
			}
		}
	})
}

// waitForReadyEndpoints waits until the service's slices list n ready addresses.
func waitForReadyEndpoints(t *testing.T, svc string, n int) {
	t.Helper()
	eventually(t, convergence, "endpoint slices of "+svc, func() error {
		if got := readyAddresses(t, context.Background(), svc); len(got) != n {
			return fmt.Errorf("%d ready addresses: %v", len(got), got)
		}
		return nil
	})
}
