//go:build realnode

// Built only with -tags realnode: the real-node tests need the node tools
// (RAPIDPROXY_NODE_TOOLS_DIR), minutes of building the first time, which
// make test, make e2e-node-smoke and make e2e-upstream build and pass; a
// plain go test ./... leaves them out.

package node

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// nodeTools is where `make e2e-node-smoke` built the node tools.
func nodeTools(t *testing.T) string {
	dir := os.Getenv("RAPIDPROXY_NODE_TOOLS_DIR")
	if dir == "" {
		t.Fatal("RAPIDPROXY_NODE_TOOLS_DIR is not set: run the real-node tests with `make e2e-node-smoke`")
	}
	return dir
}

// TestNodeSmoke runs one real node (kubelet, containerd, bridge CNI) joined
// to the framework's control plane and one pod on it (agnhost netexec and a
// busybox), and checks that the Node and the pod become Ready, that the pod
// got an address from the node's pod CIDR, that the node reaches it, and
// that our kube-proxy on the node serves a ClusterIP with it as endpoint.
func TestNodeSmoke(t *testing.T) {
	tools := nodeTools(t)
	// Long enough for framework.Start to wait for another test's cluster to
	// end (one runs per machine); each step below has its own deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c, err := framework.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	n, err := Start(ctx, c, Options{Name: "real-1", PodCIDR: "10.244.5.0/24", Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	defer func() {
		if t.Failed() {
			t.Logf("kubelet log tail:\n%s", framework.FileTail(c.LogPath(n.Name+"-kubelet"), 40))
			t.Logf("containerd log tail:\n%s", framework.FileTail(c.LogPath(n.Name+"-containerd"), 40))
		}
	}()

	if err := waitNodeReady(ctx, c, n.Name); err != nil {
		t.Fatalf("node %s not Ready: %v", n.Name, err)
	}
	t.Logf("node %s registered and Ready", n.Name)

	agnhost, err := AgnhostImage()
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: "default", Labels: map[string]string{"app": "smoke"}},
		Spec: v1.PodSpec{
			// No scheduler runs: the pod is bound by name.
			NodeName: n.Name,
			Containers: []v1.Container{
				{
					Name:            "agnhost",
					Image:           agnhost,
					ImagePullPolicy: v1.PullNever,
					Args:            []string{"netexec", "--http-port=8080"},
					// The kubelet probes from the node namespace, over the bridge.
					ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{
						HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
				},
				{
					Name:            "busybox",
					Image:           busyboxImage(t),
					ImagePullPolicy: v1.PullNever,
					Command:         []string{"/bin/sleep", "3600"},
				},
			},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podIP string
	if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "smoke", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		podIP = p.Status.PodIP
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodReady && cond.Status == v1.ConditionTrue {
				return true, ""
			}
		}
		return false, podSummary(p)
	}); err != nil {
		t.Fatalf("pod not Ready: %v", err)
	}
	if !strings.HasPrefix(podIP, "10.244.5.") {
		t.Fatalf("pod IP %q is not from the node's pod CIDR", podIP)
	}
	// The bridge routes to the pod from the node, and agnhost answers.
	out, err := c.Node.Exec("curl", "-sS", "--max-time", "5", "http://"+podIP+":8080/hostname")
	if err != nil || out != "smoke" {
		t.Errorf("agnhost at %s:8080/hostname from the node: %q, %v", podIP, out, err)
	}
	t.Logf("pod smoke Ready at %s", podIP)

	// Our kube-proxy (iptables mode) in the same namespace serves a
	// ClusterIP whose endpoint is the real pod.
	svc, err := c.Client.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke"},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": "smoke"},
			Ports: []v1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := c.StartKubeProxy("kube-proxy-real-1", c.KubeProxy(), c.KubeProxyConfig("mode: iptables\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := proxy.WaitHealthy(ctx, time.Minute); err != nil {
		t.Fatalf("kube-proxy: %v\n%s", err, proxy.LogTail(20))
	}
	if err := waitFor(ctx, 30*time.Second, func() (bool, string) {
		out, err := c.Node.Exec("curl", "-sS", "--max-time", "2", "http://"+svc.Spec.ClusterIP+"/hostname")
		if err != nil {
			return false, err.Error()
		}
		return out == "smoke", out
	}); err != nil {
		t.Fatalf("ClusterIP %s:80 from the node through our kube-proxy: %v", svc.Spec.ClusterIP, err)
	}
	t.Logf("ClusterIP %s:80 reaches the pod through our kube-proxy", svc.Spec.ClusterIP)
}

func podSummary(p *v1.Pod) string {
	var parts []string
	parts = append(parts, string(p.Status.Phase))
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Waiting != nil {
			parts = append(parts, cs.Name+" waiting: "+cs.State.Waiting.Reason+" "+cs.State.Waiting.Message)
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Status != v1.ConditionTrue {
			parts = append(parts, string(cond.Type)+": "+cond.Reason+" "+cond.Message)
		}
	}
	return strings.Join(parts, "; ")
}

// busyboxImage is the busybox image of the node tools, under the tag the
// pinned e2e.test names.
func busyboxImage(t *testing.T) string {
	t.Helper()
	k8s, err := kubernetesSource()
	if err != nil {
		t.Fatal(err)
	}
	tag, err := e2eImageTag(k8s, "BusyBox")
	if err != nil {
		t.Fatal(err)
	}
	return "registry.k8s.io/e2e-test-images/busybox:" + tag
}
