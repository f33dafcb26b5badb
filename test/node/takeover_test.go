//go:build realnode

package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/deploy"
	"github.com/rapidproxy/rapidproxy/test/framework"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
)

// takeoverLBIP is the takeover service's LoadBalancer IP; each node routes
// it out of its eth0, as a node's default route would, so that kube-proxy's
// rules on the node's output path catch it.
const takeoverLBIP = "10.255.3.40"

// upstreamImageArchive is upstream's kube-proxy image (make image-upstream):
// RAPIDPROXY_UPSTREAM_IMAGE, or built here by hack/build-image.sh.
func upstreamImageArchive(t *testing.T) string {
	t.Helper()
	if archive := os.Getenv("RAPIDPROXY_UPSTREAM_IMAGE"); archive != "" {
		if _, err := os.Stat(archive); err != nil {
			t.Fatalf("RAPIDPROXY_UPSTREAM_IMAGE: %v (make image-upstream builds it)", err)
		}
		return archive
	}
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "hack", "build-image.sh"), "upstream", t.TempDir())
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/build-image.sh upstream: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// upstreamImageRef is the name hack/build-image.sh gives upstream's image:
// registry.k8s.io/kube-proxy at hack/tools' k8s.io/kubernetes version, the
// image a kubeadm cluster of that version runs.
func upstreamImageRef(t *testing.T) string {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "hack", "tools", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mod), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "require" && f[1] == "k8s.io/kubernetes" {
			return "registry.k8s.io/kube-proxy:" + f[2]
		}
	}
	t.Fatal("hack/tools/go.mod requires no k8s.io/kubernetes")
	return ""
}

// kubeadmObjects are the objects `kubeadm init` makes for kube-proxy, in
// mode: deploy/base rendered for this cluster (its ConfigMap, ServiceAccount
// and DaemonSet are kubeadm's, with our image), then made kubeadm's exactly:
// upstream's image, the built-in system:node-proxier bound under kubeadm's
// binding name instead of our ClusterRole, and the container without the
// probes, resources and ports deploy/base adds (kubeadm's has none).
func kubeadmObjects(t *testing.T, mode, image string) []*unstructured.Unstructured {
	t.Helper()
	r := renderForNode(t, deploy.Base, mode)
	var objs []*unstructured.Unstructured
	for _, obj := range r.Objects {
		switch obj.GetKind() {
		case "ClusterRole":
			continue
		case "ClusterRoleBinding":
			obj = obj.DeepCopy()
			obj.SetName("kubeadm:node-proxier")
			if err := unstructured.SetNestedField(obj.Object, "system:node-proxier", "roleRef", "name"); err != nil {
				t.Fatal(err)
			}
		case "DaemonSet":
			ds := r.DaemonSet.DeepCopy()
			c := &ds.Spec.Template.Spec.Containers[0]
			c.Image = image
			c.LivenessProbe, c.ReadinessProbe, c.Ports = nil, nil, nil
			c.Resources = v1.ResourceRequirements{}
			one := intstr.FromInt32(1)
			ds.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &one}}
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ds)
			if err != nil {
				t.Fatal(err)
			}
			obj = &unstructured.Unstructured{Object: u}
			obj.SetAPIVersion("apps/v1")
			obj.SetKind("DaemonSet")
		}
		objs = append(objs, obj)
	}
	return objs
}

// create creates the objects as kubeadm does (create, not apply), under
// its field manager.
func create(ctx context.Context, t *testing.T, client dynamic.Interface, mapper meta.RESTMapper, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		res := resourceFor(t, client, mapper, obj)
		if _, err := res.Create(ctx, obj, metav1.CreateOptions{FieldManager: "kubeadm"}); err != nil {
			t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// remove deletes the objects and waits until the DaemonSet's pods are gone.
func remove(ctx context.Context, t *testing.T, c *framework.Cluster, client dynamic.Interface, mapper meta.RESTMapper, objs []*unstructured.Unstructured) {
	t.Helper()
	foreground := metav1.DeletePropagationForeground
	for _, obj := range objs {
		if err := resourceFor(t, client, mapper, obj).Delete(ctx, obj.GetName(), metav1.DeleteOptions{PropagationPolicy: &foreground}); err != nil {
			t.Errorf("delete %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d kube-proxy pods left", len(pods.Items))
	}); err != nil {
		t.Error(err)
	}
}

func resourceFor(t *testing.T, client dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s %s: %v", gvk, obj.GetName(), err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return client.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	return client.Resource(mapping.Resource)
}

// takeoverCluster is the cluster the DaemonSet rollout tests run on: real
// nodes (RAPIDPROXY_TAKEOVER_NODES, default 3; kubelet, containerd, bridge
// CNI, our image and upstream's imported into each node's containerd), a
// podserver backend and a client pod on each node, a LoadBalancer Service
// over the backends, and the traffic's targets: from each node's client
// pod the ClusterIP, from each node's namespace the next node's NodePort
// and the LoadBalancer IP (which the node's own rules catch on its output
// path).
type takeoverCluster struct {
	ctx                  context.Context
	c                    *framework.Cluster
	nodes                []*Node
	root, tools          string
	client               dynamic.Interface
	mapper               meta.RESTMapper
	svc                  *v1.Service
	clients              []*framework.Netns
	targets              []target
	upstreamRef, oursRef string
}

func startTakeoverCluster(t *testing.T) *takeoverCluster {
	t.Helper()
	tc := &takeoverCluster{tools: nodeTools(t)}
	ours := imageArchive(t)
	upstream := upstreamImageArchive(t)
	tc.upstreamRef = upstreamImageRef(t)
	nodeCount, err := strconv.Atoi(envOr("RAPIDPROXY_TAKEOVER_NODES", "3"))
	if err != nil || nodeCount < 2 || nodeCount > maxNodes {
		t.Fatalf("RAPIDPROXY_TAKEOVER_NODES=%q: want 2 to %d", os.Getenv("RAPIDPROXY_TAKEOVER_NODES"), maxNodes)
	}
	if _, err := os.Stat("/lib/modules"); os.IsNotExist(err) {
		t.Cleanup(func() { _ = os.Remove("/lib/modules") })
	}
	if tc.root, err = framework.RepoRoot(); err != nil {
		t.Fatal(err)
	}
	tc.oursRef = "ghcr.io/rapidproxy/kube-proxy:" + imageTag(t, tc.root)
	// The start waits for any other test's cluster to end (one runs per
	// machine); the deadline counts from then.
	c, err := framework.StartWith(context.Background(), framework.Options{RealNodes: true, Scheduler: filepath.Join(tc.tools, "kube-scheduler")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	tc.c = c
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	t.Cleanup(cancel)
	tc.ctx = ctx
	agnhost, err := BuildAgnhostImage(tc.tools, c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nodes, err := startNodes(ctx, t, c, nodeCount, Options{Tools: tc.tools, ExtraImages: []string{agnhost, ours, upstream}})
	if err != nil {
		t.Fatal(err)
	}
	tc.nodes = nodes
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s kubelet log tail:\n%s", n.Name, framework.FileTail(c.LogPath(n.Name+"-kubelet"), 20))
				t.Logf("%s kube-system pod logs:\n%s", n.Name, n.podLogs("kube-system", 30))
			}
		}
	})
	t.Logf("%d nodes Ready, both images imported, after %v", len(nodes), time.Since(start).Round(time.Second))

	// A backend on each node: the podserver binary, mounted from the
	// host, in the agnhost image.
	agnhostRef, err := AgnhostImage()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		file := v1.HostPathFile
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "backend-" + n.Name, Namespace: "default", Labels: map[string]string{"app": "takeover"}},
			Spec: v1.PodSpec{
				NodeName: n.Name,
				Containers: []v1.Container{{Name: "podserver", Image: agnhostRef, ImagePullPolicy: v1.PullNever,
					Command:      []string{"/podserver", "-name", "backend-" + n.Name, "-ports", "8080"},
					VolumeMounts: []v1.VolumeMount{{Name: "podserver", MountPath: "/podserver", ReadOnly: true}},
					ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
						PeriodSeconds: 1}}},
				Volumes: []v1.Volume{{Name: "podserver", VolumeSource: v1.VolumeSource{
					HostPath: &v1.HostPathVolumeSource{Path: c.Podserver(), Type: &file}}}},
				TerminationGracePeriodSeconds: new(int64),
			},
		}
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.netns.Exec("ip", "route", "replace", takeoverLBIP+"/32", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := c.Client.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "takeover"},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": "takeover"}, Type: v1.ServiceTypeLoadBalancer,
			Ports: []v1.ServicePort{
				{Name: "tcp", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "udp", Protocol: v1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(8080)},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: takeoverLBIP}}
	if _, err := c.Client.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	tc.svc = svc
	if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=takeover"})
		if err != nil {
			return false, err.Error()
		}
		var waiting []string
		for i := range pods.Items {
			if !podReady(&pods.Items[i]) {
				waiting = append(waiting, pods.Items[i].Name+": "+podSummary(&pods.Items[i]))
			}
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	}); err != nil {
		t.Fatalf("backends not Ready: %v", err)
	}
	// A client pod on each node, its network namespace named on the host
	// for the framework's clients to run in.
	tc.clients = make([]*framework.Netns, len(nodes))
	for i, n := range nodes {
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "client-" + n.Name, Namespace: "default"},
			Spec: v1.PodSpec{
				NodeName: n.Name,
				Containers: []v1.Container{{Name: "agnhost", Image: agnhostRef, ImagePullPolicy: v1.PullNever,
					Args: []string{"pause"}}},
				TerminationGracePeriodSeconds: new(int64),
			},
		}
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var running *v1.Pod
		if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			running = p
			return podReady(p), podSummary(p)
		}); err != nil {
			t.Fatalf("pod %s not Ready: %v", pod.Name, err)
		}
		name := fmt.Sprintf("rpx-takeover-client-%d", i+1)
		pid := n.containerPID(ctx, t, running, "agnhost")
		if out, err := exec.Command("ip", "netns", "attach", name, strconv.Itoa(pid)).CombinedOutput(); err != nil {
			t.Fatalf("ip netns attach %s %d: %v: %s", name, pid, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
		tc.clients[i] = &framework.Netns{Name: name}
	}
	nodePort := strconv.Itoa(int(svc.Spec.Ports[0].NodePort))
	for i, n := range nodes {
		next := nodes[(i+1)%len(nodes)]
		tc.targets = append(tc.targets,
			target{"client-" + n.Name + " -> ClusterIP", tc.clients[i], net.JoinHostPort(svc.Spec.ClusterIP, "80")},
			target{n.Name + " -> " + next.Name + "'s NodePort", n.netns, net.JoinHostPort(next.IP, nodePort)},
			target{n.Name + " -> LoadBalancer IP", n.netns, net.JoinHostPort(takeoverLBIP, "80")})
	}
	if tc.client, tc.mapper, err = c.DynamicClient(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// kubectl runs kubectl against the cluster from the repository's root, as
// an operator runs the documented commands, and logs what it printed.
func (tc *takeoverCluster) kubectl(t *testing.T, args ...string) error {
	t.Helper()
	cmd := exec.CommandContext(tc.ctx, filepath.Join(tc.tools, "kubectl"), append([]string{"--kubeconfig", tc.c.AdminKubeconfig()}, args...)...)
	cmd.Dir = tc.root
	out, err := cmd.CombinedOutput()
	t.Logf("kubectl %s:\n%s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	if err != nil {
		return fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// serving waits until every target answers, and starts two UDP flows from
// each client pod, each kept on the endpoint it first reached.
func (tc *takeoverCluster) serving(t *testing.T, through string) []*udpFlow {
	t.Helper()
	for _, tg := range tc.targets {
		if err := waitFor(tc.ctx, time.Minute, func() (bool, string) {
			_, err := tg.from.Request("tcp", tg.hostPort, time.Second)
			return err == nil, fmt.Sprint(err)
		}); err != nil {
			t.Fatalf("%s (%s) through %s: %v", tg.what, tg.hostPort, through, err)
		}
	}
	var flows []*udpFlow
	for i, n := range tc.nodes {
		for j := range 2 {
			f := &udpFlow{from: "client-" + n.Name, netns: tc.clients[i], sport: 40100 + 10*i + j}
			r, err := f.netns.RequestFrom(f.sport, "udp", tc.udpTarget(), time.Second)
			if err != nil {
				t.Fatalf("%s UDP from port %d: %v", f.from, f.sport, err)
			}
			f.pod = r.Pod
			flows = append(flows, f)
		}
	}
	return flows
}

func (tc *takeoverCluster) udpTarget() string {
	return net.JoinHostPort(tc.svc.Spec.ClusterIP, "80")
}

// phase is one counted step: the traffic runs from 3 s before act until
// 10 s after it returns (longer than the syncs a new pod's start may
// queue: minSyncPeriod, 1 s by default). With strict, any failed new
// connection, broken long-lived one or moved UDP flow fails the test;
// otherwise (a baseline) they are logged.
func (tc *takeoverCluster) phase(t *testing.T, name string, strict bool, flows []*udpFlow, act func() error) phaseCounts {
	t.Helper()
	tr := startTraffic(t, tc.targets, flows, tc.udpTarget())
	time.Sleep(3 * time.Second)
	began := time.Now()
	if err := act(); err != nil {
		tr.finish(t)
		t.Fatalf("%s: %v", name, err)
	}
	took := time.Since(began)
	time.Sleep(10 * time.Second)
	pc := tr.finish(t)
	pc.took = took
	t.Logf("%s: %d new connections, %d failed (longest gap %s); %d long-lived, %d broken; %d UDP flows, %d moved, %d of %d UDP requests unanswered; done in %s",
		name, pc.newConns, pc.failed, pc.longestGap, pc.held, pc.broken, pc.flows, pc.moved, pc.udpLost, pc.udpAsked, took.Round(time.Second))
	if len(pc.errors) > 0 {
		report := t.Logf
		if strict {
			report = t.Errorf
		}
		report("%s:\n%s", name, strings.Join(pc.errors, "\n"))
	}
	if strict && (pc.failed > 0 || pc.broken > 0 || pc.moved > 0) {
		t.Errorf("%s: %d failed new connections, %d broken long-lived ones, %d moved UDP flows; want none",
			name, pc.failed, pc.broken, pc.moved)
	}
	return pc
}

// countsTable is the phases' counts as a markdown table, as
// docs/migrating.md shows them.
func countsTable(title string, phases []string, counts map[string]phaseCounts) string {
	var table strings.Builder
	fmt.Fprintf(&table, "\n| %s | new connections failed | long-lived broken | UDP flows moved | UDP requests unanswered | took |\n| --- | --- | --- | --- | --- | --- |\n", title)
	for _, p := range phases {
		pc := counts[p]
		fmt.Fprintf(&table, "| %s | %d of %d (longest gap %s) | %d of %d | %d of %d | %d of %d | %s |\n", p,
			pc.failed, pc.newConns, pc.longestGap, pc.broken, pc.held, pc.moved, pc.flows, pc.udpLost, pc.udpAsked, pc.took.Round(time.Second))
	}
	return table.String()
}

// TestDaemonSetTakeoverAndRollback moves a cluster's kube-proxy DaemonSet,
// as kubeadm made it with upstream's image, to ours and back by its
// rolling update, under traffic counted per phase, on takeoverCluster's
// nodes:
//
//	takeover  `kubectl apply --server-side --force-conflicts -k deploy/kubeadm`, as docs/migrating.md says
//	rollback  `kubectl -n kube-system rollout undo daemonset/kube-proxy`
//	baseline  `kubectl -n kube-system rollout restart daemonset/kube-proxy`: upstream replacing upstream
//
// Each phase waits for `kubectl rollout status`, then for every node's new
// pod's first sync (/healthz 200 and the sync timestamp metric set).
// Throughout, a client pod on each node opens a new TCP connection every
// 20 ms (after each answer) to each target and holds two long-lived
// connections to it, and two UDP flows from each client pod (a fixed
// source port each) ask the ClusterIP every second which endpoint (a
// podserver pod on each node) answers. The takeover and the rollback must
// fail no new connection, break no long-lived one and move no UDP flow;
// the baseline's figures are logged, for comparison. Each mode of
// RAPIDPROXY_TAKEOVER_MODES (default iptables,nftables) is a subtest, on
// the same nodes, with a DaemonSet made anew.
func TestDaemonSetTakeoverAndRollback(t *testing.T) {
	tc := startTakeoverCluster(t)
	for _, mode := range strings.Split(envOr("RAPIDPROXY_TAKEOVER_MODES", "iptables,nftables"), ",") {
		t.Run(mode, func(t *testing.T) {
			objs := kubeadmObjects(t, mode, tc.upstreamRef)
			create(tc.ctx, t, tc.client, tc.mapper, objs)
			defer remove(tc.ctx, t, tc.c, tc.client, tc.mapper, objs)
			// Upstream's pods serve before any phase: every node's
			// /healthz, and every target answers from every node.
			waitRolledOut(tc.ctx, t, tc.c, tc.nodes, tc.upstreamRef, nil)
			flows := tc.serving(t, "upstream's kube-proxy")

			phases := []struct {
				name, image string
				args        []string
				ours        bool
			}{
				{"takeover", tc.oursRef, []string{"apply", "--server-side", "--force-conflicts", "--field-manager=rapidproxy", "-k", "deploy/kubeadm"}, true},
				{"rollback", tc.upstreamRef, []string{"-n", "kube-system", "rollout", "undo", "daemonset/kube-proxy"}, true},
				{"baseline", tc.upstreamRef, []string{"-n", "kube-system", "rollout", "restart", "daemonset/kube-proxy"}, false},
			}
			counts := map[string]phaseCounts{}
			var names []string
			for _, p := range phases {
				before := kubeProxyPodUIDs(tc.ctx, t, tc.c)
				counts[p.name] = tc.phase(t, p.name+" ("+mode+")", p.ours, flows, func() error {
					err := tc.kubectl(t, p.args...)
					if err == nil {
						err = tc.kubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/kube-proxy", "--timeout=5m")
					}
					if err == nil {
						waitRolledOut(tc.ctx, t, tc.c, tc.nodes, p.image, before)
					}
					return err
				})
				names = append(names, p.name)
			}
			t.Log(countsTable(fmt.Sprintf("phase (%s mode, %d nodes)", mode, len(tc.nodes)), names, counts))
		})
	}
}

// imageTag is our image's tag, the VERSION file's.
func imageTag(t *testing.T, root string) string {
	t.Helper()
	v, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

func podReady(p *v1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodReady && cond.Status == v1.ConditionTrue {
			return true
		}
	}
	return false
}

// kubeProxyPodUIDs are the kube-proxy pods' UIDs.
func kubeProxyPodUIDs(ctx context.Context, t *testing.T, c *framework.Cluster) map[string]bool {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"})
	if err != nil {
		t.Fatal(err)
	}
	uids := map[string]bool{}
	for _, p := range pods.Items {
		uids[string(p.UID)] = true
	}
	return uids
}

// waitRolledOut waits until each node runs one Ready kube-proxy pod of the
// image, none of the before pods, and answers 200 on /healthz (its first
// sync is done).
func waitRolledOut(ctx context.Context, t *testing.T, c *framework.Cluster, nodes []*Node, image string, before map[string]bool) {
	t.Helper()
	if err := waitFor(ctx, 5*time.Minute, func() (bool, string) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"})
		if err != nil {
			return false, err.Error()
		}
		onNode := map[string]int{}
		var bad []string
		for i := range pods.Items {
			p := &pods.Items[i]
			switch {
			case before[string(p.UID)]:
				bad = append(bad, p.Name+" is still there")
			case p.Spec.Containers[0].Image != image:
				bad = append(bad, p.Name+" runs "+p.Spec.Containers[0].Image)
			case p.DeletionTimestamp != nil || !podReady(p):
				bad = append(bad, p.Name+": "+podSummary(p))
			default:
				onNode[p.Spec.NodeName]++
			}
		}
		for _, n := range nodes {
			if onNode[n.Name] != 1 {
				bad = append(bad, fmt.Sprintf("%s has %d Ready pods of %s", n.Name, onNode[n.Name], image))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	}); err != nil {
		t.Fatalf("kube-proxy pods of %s: %v", image, err)
	}
	for _, n := range nodes {
		if err := waitFor(ctx, 2*time.Minute, func() (bool, string) {
			out, err := n.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2",
				"http://"+n.IP+":10256/healthz").CombinedOutput()
			if err != nil || string(out) != "200" {
				return false, fmt.Sprintf("/healthz: %q %v", out, err)
			}
			metrics, err := n.Command("curl", "-sS", "--max-time", "2", "http://127.0.0.1:10249/metrics").CombinedOutput()
			if err != nil {
				return false, fmt.Sprintf("/metrics: %v: %s", err, metrics)
			}
			return synced(string(metrics)), "kubeproxy_sync_proxy_rules_last_timestamp_seconds is not set"
		}); err != nil {
			t.Fatalf("%s: the pod of %s: %v", n.Name, image, err)
		}
	}
}

// synced says whether metrics (Prometheus text) show a sync of the rules:
// kubeproxy_sync_proxy_rules_last_timestamp_seconds above 0.
func synced(metrics string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(line, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && v > 0 {
			return true
		}
	}
	return false
}
