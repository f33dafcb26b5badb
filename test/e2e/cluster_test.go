package e2e

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

func TestEndpointSlicesComeFromTheController(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"slice-a", "slice-b"} {
		addPod(t, name, framework.PodOptions{Labels: map[string]string{"app": "slices"}})
	}
	createService(t, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "slices"},
		Spec: v1.ServiceSpec{
			Selector:       map[string]string{"app": "slices"},
			IPFamilyPolicy: ptrTo(v1.IPFamilyPolicyPreferDualStack),
			Ports:          []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	})
	var got []string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got = readyAddresses(t, ctx, "slices")
		if len(got) == 4 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	slices.Sort(got)
	if len(got) != 4 {
		t.Fatalf("want the two pods' IPv4 and IPv6 addresses as ready endpoints, got %v", got)
	}
}

// readyAddresses lists the ready endpoint addresses of a service's slices
// written by the EndpointSlice controller.
func readyAddresses(t *testing.T, ctx context.Context, service string) []string {
	t.Helper()
	list, err := cluster.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: discovery.LabelServiceName + "=" + service})
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, s := range list.Items {
		if s.Labels[discovery.LabelManagedBy] != "endpointslice-controller.k8s.io" {
			t.Errorf("slice %s managed by %q", s.Name, s.Labels[discovery.LabelManagedBy])
		}
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				addrs = append(addrs, ep.Addresses...)
			}
		}
	}
	return addrs
}

func TestPodAnswersOnItsOwnIP(t *testing.T) {
	server := addPod(t, "direct", framework.PodOptions{})
	client := addPod(t, "direct-client", framework.PodOptions{})
	from := map[string]*framework.Netns{"client pod": client.Netns, "external": cluster.External}
	for where, ns := range from {
		for _, proto := range []string{"tcp", "udp"} {
			for _, ip := range []string{server.IPv4, server.IPv6} {
				reply, err := ns.Request(proto, net.JoinHostPort(ip, "8080"), 2*time.Second)
				if err != nil {
					t.Errorf("from %s, %s to %s: %v", where, proto, ip, err)
					continue
				}
				if reply.Pod != "direct" {
					t.Errorf("from %s, %s to %s: answered by %q", where, proto, ip, reply.Pod)
				}
			}
		}
	}
}

func addPod(t *testing.T, name string, opts framework.PodOptions) *framework.Pod {
	t.Helper()
	p, err := cluster.AddPod(context.Background(), name, opts)
	if err != nil {
		t.Fatalf("adding pod %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cluster.RemovePod(context.Background(), name) })
	return p
}

func createService(t *testing.T, svc *v1.Service) *v1.Service {
	t.Helper()
	created, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s: %v", svc.Name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cluster.Client.CoreV1().Services(framework.DefaultNamespace).Delete(ctx, svc.Name, metav1.DeleteOptions{})
		// The cluster has no garbage collector: the controller's slices of
		// the service would outlive it, and join a later service of the
		// same name (each test runs once per mode).
		_ = cluster.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: discovery.LabelServiceName + "=" + svc.Name + "," + discovery.LabelManagedBy + "=endpointslice-controller.k8s.io"})
	})
	return created
}

func ptrTo[T any](v T) *T { return &v }
