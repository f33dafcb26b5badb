//go:build realnode

package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/deploy"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/test/framework"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
)

// imageArchive is our image's archive: RAPIDPROXY_IMAGE (make test builds
// it with make image first), or built here by hack/build-image.sh.
func imageArchive(t *testing.T) string {
	t.Helper()
	if archive := os.Getenv("RAPIDPROXY_IMAGE"); archive != "" {
		if _, err := os.Stat(archive); err != nil {
			t.Fatalf("RAPIDPROXY_IMAGE: %v (make image builds it)", err)
		}
		return archive
	}
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "hack", "build-image.sh"), "ours", t.TempDir())
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/build-image.sh: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// podConfig is deploy/base's config.conf for the test's node: the
// framework's pod CIDRs, and the conntrack table size left alone (the
// machine is shared; the node's namespace cannot change it anyway).
func podConfig(mode string) string {
	return "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"clientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n" +
		"mode: " + mode + "\n" +
		"clusterCIDR: " + framework.ClusterCIDRs + "\n" +
		"conntrack:\n  maxPerCore: 0\n"
}

// renderForNode renders a variant as an operator would for this cluster:
// config.conf as podConfig in mode, and kubeconfig.conf's server the API server's
// address (the rest of it, the service account's token and CA, as it is).
func renderForNode(t *testing.T, variant, mode string) *deploy.Rendered {
	t.Helper()
	kubeconfig, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "kubeconfig.conf"))
	if err != nil {
		t.Fatal(err)
	}
	server := "https://CONTROL_PLANE_ENDPOINT:6443"
	if !strings.Contains(string(kubeconfig), server) {
		t.Fatalf("deploy/base/kubeconfig.conf names no %s", server)
	}
	r, err := deploy.RenderEdited(variant, map[string]string{
		"base/config.conf":     podConfig(mode),
		"base/kubeconfig.conf": strings.Replace(string(kubeconfig), server, "https://"+framework.APIServerIP+":6443", 1),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// apply applies every object server-side, as `kubectl apply
// --server-side -k` would.
func apply(ctx context.Context, t *testing.T, client dynamic.Interface, mapper meta.RESTMapper, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, obj.GetName(), err)
		}
		var res dynamic.ResourceInterface = client.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			res = client.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := res.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "rapidproxy-test", Force: true}); err != nil {
			t.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
	}
}

// readyPod waits for the one pod with the labels in kube-system that is
// Ready, not terminating and not in except, and returns it.
func readyPod(ctx context.Context, t *testing.T, c *framework.Cluster, n *Node, selector string, except ...string) *v1.Pod {
	t.Helper()
	var ready *v1.Pod
	err := waitFor(ctx, 3*time.Minute, func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		var states []string
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil || slices.Contains(except, string(p.UID)) {
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == v1.PodReady && cond.Status == v1.ConditionTrue {
					ready = p
					return true, ""
				}
			}
			states = append(states, p.Name+": "+podSummary(p))
		}
		return false, fmt.Sprintf("%d pods: %s", len(states), strings.Join(states, "; "))
	})
	if err != nil {
		t.Fatalf("no Ready kube-proxy pod (%s): %v\ncontainer logs:\n%s", selector, err, n.podLogs("kube-system", 30))
	}
	return ready
}

// podLogs are the last lines of each container log of the namespace's pods
// on the node, as the kubelet wrote them.
func (n *Node) podLogs(namespace string, lines int) string {
	logs, _ := filepath.Glob(filepath.Join(n.path("pod-logs"), namespace+"_*", "*", "*.log"))
	var b strings.Builder
	for _, l := range logs {
		rel, _ := filepath.Rel(n.path("pod-logs"), l)
		fmt.Fprintf(&b, "== %s\n%s\n", rel, framework.FileTail(l, lines))
	}
	return b.String()
}

// containerPID is the host PID of the pod's container's first process.
func (n *Node) containerPID(ctx context.Context, t *testing.T, p *v1.Pod, container string) int {
	t.Helper()
	var id string
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			id = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if id == "" {
		t.Fatalf("pod %s has no container %s running", p.Name, container)
	}
	out, err := n.ctr(ctx, "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		var task string
		var pid int
		if _, err := fmt.Sscan(line, &task, &pid); err == nil && task == id {
			return pid
		}
	}
	t.Fatalf("no task %s in:\n%s", id, out)
	return 0
}

// capEff is a process's effective capabilities, from /proc/PID/status.
func capEff(t *testing.T, pid int) string {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapEff:\s*(\S+)$`).FindSubmatch(status)
	if m == nil {
		t.Fatalf("/proc/%d/status has no CapEff", pid)
	}
	return string(m[1])
}

// checkContainer checks what the kubelet made of the DaemonSet's
// container: the process is our image's binary, in the node's network
// namespace, with the node's /run/xtables.lock and /lib/modules mounted.
func checkContainer(t *testing.T, n *Node, pid int) {
	t.Helper()
	nodeNet, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", n.kubelet.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if net, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil || net != nodeNet {
		t.Errorf("the container's network namespace is %s (%v), the node's %s: not hostNetwork", net, err, nodeNet)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.HasPrefix(string(cmdline), "/usr/local/bin/kube-proxy\x00") {
		t.Errorf("the container runs %q (%v)", cmdline, err)
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	// /lib is a link to usr/lib in the image (merged /usr), so the node's
	// /lib/modules is mounted at /usr/lib/modules.
	for _, target := range []string{"/run/xtables.lock", "/usr/lib/modules", "/var/lib/kube-proxy"} {
		if !regexp.MustCompile(`(?m)^\S+ \S+ \S+ \S+ ` + regexp.QuoteMeta(target) + ` `).Match(mounts) {
			t.Errorf("nothing is mounted at %s in the container:\n%s", target, mounts)
		}
	}
}

// TestKubeProxyDaemonSet runs our image as deploy/base's DaemonSet on a
// real node (kubelet, containerd, bridge CNI), as a cluster runs it: the
// image archive `make image` writes imported into the node's containerd,
// the manifests applied as rendered, with only config.conf and the API
// server's address in kubeconfig.conf written for this cluster. The
// kubelet starts the pod (hostNetwork, privileged, with the node's
// /run/xtables.lock and /lib/modules), its probes pass, and a ClusterIP
// answers through it from the node and from a pod. Then
// deploy/least-privilege in nftables mode replaces it (the --init-only init
// container, then the proxy with only NET_ADMIN and NET_RAW), and `kube-proxy --cleanup`
// run as a pod of our image leaves none of its rules.
func TestKubeProxyDaemonSet(t *testing.T) {
	tools := nodeTools(t)
	archive := imageArchive(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// The node's kernel may have no modules (everything built in), and so
	// no /lib/modules, which the DaemonSet mounts; containerd then makes
	// the directory for the bind mount. It goes again if this test made it.
	if _, err := os.Stat("/lib/modules"); os.IsNotExist(err) {
		t.Cleanup(func() { _ = os.Remove("/lib/modules") })
	}
	c, err := framework.StartWith(ctx, framework.Options{RealNodes: true, Scheduler: filepath.Join(tools, "kube-scheduler")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	agnhost, err := BuildAgnhostImage(tools, c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n, err := Start(ctx, c, Options{Name: "real-1", PodCIDR: "10.244.5.0/24", Tools: tools, ExtraImages: []string{agnhost, archive}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log tail:\n%s", framework.FileTail(c.LogPath(n.Name+"-kubelet"), 40))
			t.Logf("containerd log tail:\n%s", framework.FileTail(c.LogPath(n.Name+"-containerd"), 20))
			t.Logf("pod logs:\n%s", n.podLogs("kube-system", 30))
		}
	})
	if err := waitNodeReady(ctx, c, n.Name); err != nil {
		t.Fatalf("node %s not Ready: %v", n.Name, err)
	}
	t.Logf("node %s Ready, our image imported, after %v", n.Name, time.Since(start).Round(time.Second))
	kubeletChains := iptablesChains(t, n)

	// A backend and a client pod, and a ClusterIP in front of the backend.
	agnhostRef, err := AgnhostImage()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name string
		args []string
	}{{"backend", []string{"netexec", "--http-port=8080"}}, {"client", []string{"pause"}}} {
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default", Labels: map[string]string{"app": p.name}},
			Spec: v1.PodSpec{
				Containers: []v1.Container{{Name: "agnhost", Image: agnhostRef,
					ImagePullPolicy: v1.PullNever, Args: p.args}},
				TerminationGracePeriodSeconds: new(int64),
			},
		}
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := c.Client.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": "backend"},
			Ports: []v1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + svc.Spec.ClusterIP + "/hostname"
	serves := func(t *testing.T, how string) {
		t.Helper()
		if err := waitFor(ctx, time.Minute, func() (bool, string) {
			out, err := n.Command("curl", "-sS", "--max-time", "2", url).CombinedOutput()
			return err == nil && string(out) == "backend", fmt.Sprintf("from the node: %q %v", out, err)
		}); err != nil {
			t.Fatalf("%s: ClusterIP %s: %v", how, url, err)
		}
		if err := waitFor(ctx, time.Minute, func() (bool, string) {
			out, err := exec.CommandContext(ctx, filepath.Join(tools, "kubectl"), "--kubeconfig", c.AdminKubeconfig(),
				"exec", "-n", "default", "client", "--", "curl", "-sS", "--max-time", "2", url).CombinedOutput()
			return err == nil && string(out) == "backend", fmt.Sprintf("from the client pod: %q %v", out, err)
		}); err != nil {
			t.Fatalf("%s: ClusterIP %s: %v", how, url, err)
		}
		t.Logf("%s: ClusterIP %s answers from the node and from a pod", how, svc.Spec.ClusterIP)
	}

	client, mapper, err := c.DynamicClient()
	if err != nil {
		t.Fatal(err)
	}
	base := renderForNode(t, deploy.Base, "iptables")
	applied := time.Now()
	apply(ctx, t, client, mapper, base.Objects)
	selector := "k8s-app=kube-proxy"
	pod := readyPod(ctx, t, c, n, selector)
	t.Logf("deploy/base: pod %s Ready %v after the apply", pod.Name, time.Since(applied).Round(time.Second))
	if !pod.Spec.HostNetwork || pod.Status.PodIP != n.IP {
		t.Errorf("pod %s: hostNetwork %v, IP %s; want the node's, %s", pod.Name, pod.Spec.HostNetwork, pod.Status.PodIP, n.IP)
	}
	pid := n.containerPID(ctx, t, pod, "kube-proxy")
	checkContainer(t, n, pid)
	if eff := capEff(t, pid); eff != capEff(t, n.kubelet.Pid()) {
		t.Errorf("the privileged container's CapEff is %s, the kubelet's %s", eff, capEff(t, n.kubelet.Pid()))
	}
	serves(t, "deploy/base")
	// kube-proxy-explain in the pod, as the README runs it: the service's
	// endpoint, and the rules the proxy reads back through the image's
	// iptables-save matching what it wants.
	backend, err := c.Client.CoreV1().Pods("default").Get(ctx, "backend", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	explain, err := exec.CommandContext(ctx, filepath.Join(tools, "kubectl"), "--kubeconfig", c.AdminKubeconfig(),
		"exec", "-n", "kube-system", pod.Name, "--", "kube-proxy-explain", "default/backend", "--verify").CombinedOutput()
	if err != nil || !strings.Contains(string(explain), backend.Status.PodIP) ||
		!strings.Contains(string(explain), "verify: the kernel holds what this node wants") {
		t.Errorf("kubectl exec %s -- kube-proxy-explain default/backend --verify: %v\n%s", pod.Name, err, explain)
	}
	// What the probes ask, asked from the node: 200 once synced.
	for _, path := range []string{"/healthz", "/livez"} {
		out, err := n.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2",
			"http://"+n.IP+":10256"+path).CombinedOutput()
		if err != nil || string(out) != "200" {
			t.Errorf("%s on the node's address: %q %v", path, out, err)
		}
	}
	// The image's iptables drives the backend the node's other programs
	// (the kubelet, the CNI plugins) use: nft, here.
	var proxyChains []string
	for _, c := range iptablesChains(t, n) {
		if !slices.Contains(kubeletChains, c) {
			proxyChains = append(proxyChains, c)
		}
	}
	if !slices.Contains(proxyChains, "iptables-nft-save nat KUBE-SERVICES") || slices.ContainsFunc(proxyChains, func(c string) bool {
		return strings.Contains(c, "-legacy-")
	}) {
		t.Errorf("kube-proxy's chains are not all in the kubelet's (nft) backend: %v", proxyChains)
	}
	if p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 0 {
		t.Errorf("the container restarted: %+v", cs)
	}

	t.Run("least-privilege", func(t *testing.T) {
		// In nftables mode: the nft of the image, and a change of mode
		// with the rollout, the iptables mode's rules going after the
		// first sync.
		lp := renderForNode(t, deploy.LeastPrivilege, "nftables")
		applied := time.Now()
		apply(ctx, t, client, mapper, lp.Objects)
		pod := readyPod(ctx, t, c, n, selector, string(pod.UID))
		t.Logf("deploy/least-privilege: pod %s Ready %v after the apply", pod.Name, time.Since(applied).Round(time.Second))
		init := pod.Status.InitContainerStatuses
		if len(init) != 1 || init[0].State.Terminated == nil || init[0].State.Terminated.ExitCode != 0 {
			t.Errorf("the --init-only init container did not exit 0: %+v", init)
		}
		pid := n.containerPID(ctx, t, pod, "kube-proxy")
		checkContainer(t, n, pid)
		// CAP_NET_ADMIN (12) and CAP_NET_RAW (13), nothing else.
		if eff := capEff(t, pid); eff != "0000000000003000" {
			t.Errorf("the proxy's CapEff is %s, want 0000000000003000 (NET_ADMIN and NET_RAW)", eff)
		}
		t.Logf("the proxy (PID %d) runs with CapEff %s", pid, capEff(t, pid))
		serves(t, "deploy/least-privilege")
		if err := waitFor(ctx, time.Minute, func() (bool, string) {
			left := slices.DeleteFunc(iptablesChains(t, n), func(c string) bool { return slices.Contains(kubeletChains, c) })
			return len(left) == 0, fmt.Sprintf("the iptables mode's chains are left: %v", left)
		}); err != nil {
			t.Errorf("after the switch to nftables mode: %v", err)
		}
	})

	t.Run("drain", func(t *testing.T) {
		// The node drained as the cluster autoscaler drains one it
		// removes: cordoned, tainted ToBeDeletedByClusterAutoscaler, its
		// pods evicted but the DaemonSet's. /healthz then answers 503, as
		// upstream's does, for load balancers; the pod stays Ready, and a
		// rolling update of the DaemonSet still completes on that node.
		kubectl := func(args ...string) {
			t.Helper()
			out, err := exec.CommandContext(ctx, filepath.Join(tools, "kubectl"), append([]string{"--kubeconfig", c.AdminKubeconfig()}, args...)...).CombinedOutput()
			t.Logf("kubectl %s:\n%s", strings.Join(args, " "), strings.TrimSpace(string(out)))
			if err != nil {
				t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
			}
		}
		kubectl("cordon", n.Name)
		kubectl("taint", "node", n.Name, healthcheck.ToBeDeletedTaint+"=1700000000:NoSchedule")
		defer func() {
			kubectl("taint", "node", n.Name, healthcheck.ToBeDeletedTaint+"-")
			kubectl("uncordon", n.Name)
		}()
		kubectl("drain", n.Name, "--ignore-daemonsets", "--force", "--pod-selector=app=client", "--timeout=2m")
		for path, want := range map[string]string{"/healthz": "503", "/livez": "200"} {
			if err := waitFor(ctx, time.Minute, func() (bool, string) {
				out, err := n.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2",
					"http://"+n.IP+":10256"+path).CombinedOutput()
				return err == nil && string(out) == want, fmt.Sprintf("%q %v", out, err)
			}); err != nil {
				t.Errorf("%s on the drained node: want %s: %v", path, want, err)
			}
		}
		before := readyPod(ctx, t, c, n, selector)
		kubectl("-n", "kube-system", "rollout", "restart", "daemonset/kube-proxy")
		kubectl("-n", "kube-system", "rollout", "status", "daemonset/kube-proxy", "--timeout=3m")
		after := readyPod(ctx, t, c, n, selector, string(before.UID))
		t.Logf("on the drained node the rolling update replaced %s with %s, Ready", before.Name, after.Name)
		if err := waitFor(ctx, time.Minute, func() (bool, string) {
			out, err := n.Command("curl", "-sS", "--max-time", "2", url).CombinedOutput()
			return err == nil && string(out) == "backend", fmt.Sprintf("from the node: %q %v", out, err)
		}); err != nil {
			t.Errorf("ClusterIP %s on the drained node: %v", url, err)
		}
	})

	t.Run("cleanup", func(t *testing.T) {
		ds := base.DaemonSet
		propagation := metav1.DeletePropagationForeground
		if err := c.Client.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{PropagationPolicy: &propagation}); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
			pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return false, err.Error()
			}
			return len(pods.Items) == 0, fmt.Sprintf("%d kube-proxy pods left", len(pods.Items))
		}); err != nil {
			t.Fatal(err)
		}
		if out, err := n.Command("nft", "list", "tables").CombinedOutput(); err != nil || !strings.Contains(string(out), "table ip kube-proxy") {
			t.Fatalf("no nftables table kube-proxy before the cleanup (%v):\n%s", err, out)
		}
		// The DaemonSet's pod, run once with --cleanup.
		spec := base.DaemonSet.Spec.Template.Spec.DeepCopy()
		spec.Containers[0].Command = append(spec.Containers[0].Command, "--cleanup")
		spec.Containers[0].LivenessProbe, spec.Containers[0].ReadinessProbe = nil, nil
		spec.RestartPolicy = v1.RestartPolicyNever
		spec.NodeName = n.Name
		cleanup := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy-cleanup", Namespace: "kube-system"}, Spec: *spec}
		if _, err := c.Client.CoreV1().Pods("kube-system").Create(ctx, cleanup, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
			p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, cleanup.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || err != nil {
				return false, fmt.Sprint(err)
			}
			if p.Status.Phase == v1.PodFailed {
				t.Fatalf("the --cleanup pod failed: %s\n%s", podSummary(p), n.podLogs("kube-system", 20))
			}
			return p.Status.Phase == v1.PodSucceeded, podSummary(p)
		}); err != nil {
			t.Fatal(err)
		}
		left := slices.DeleteFunc(iptablesChains(t, n), func(c string) bool { return slices.Contains(kubeletChains, c) })
		if len(left) > 0 {
			t.Errorf("after the --cleanup pod, chains other than the kubelet's are left: %v", left)
		}
		for _, check := range [][]string{{"ipset", "list", "-n"}, {"nft", "list", "tables"}} {
			out, err := n.Command(check...).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v: %s", check, err, out)
			}
			if strings.Contains(string(out), "KUBE-") || strings.Contains(string(out), "kube-proxy") {
				t.Errorf("after the --cleanup pod, %v shows:\n%s", check, out)
			}
		}
		t.Logf("the --cleanup pod succeeded and left no rule, set or table (the kubelet's chains stay: %v)", kubeletChains)
	})
}

// iptablesChains are the KUBE- chains in the node's namespace, of both
// families and both backends, as "backend family table chain".
func iptablesChains(t *testing.T, n *Node) []string {
	t.Helper()
	var chains []string
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := n.Command(save).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", save, err, out)
		}
		table := ""
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "*") {
				table = line[1:]
			}
			if strings.HasPrefix(line, ":KUBE-") {
				chains = append(chains, save+" "+table+" "+strings.Fields(line[1:])[0])
			}
		}
	}
	return chains
}
