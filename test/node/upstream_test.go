//go:build realnode

package node

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// defaultFocus is what make test runs (with our kube-proxy in iptables
// mode on three nodes, the defaults): about three minutes of specs.
const defaultFocus = `\[sig-network\] Services.*\[Conformance\]`

// skips are the patterns e2e.test skips, each with its reason.
var skips = []struct{ pattern, reason string }{
	{`\[Disruptive\]`, "restarts or breaks the cluster's components"},
	{`\[Flaky\]`, "upstream marks them flaky"},
	{`\[Slow\]`, "over five minutes each; not in this run's budget"},
	{`\[Serial\]`, "change cluster-wide state; upstream's CI runs them apart"},
	{`LoadBalancer|ESIPP`, "cloud load balancers: there is no cloud provider"},
	{`\[Feature:`, "need a feature gate or cluster setup this node does not have"},
	{`IPv6|[Dd]ual[- ]?[Ss]tack`, "the node's pods have IPv4 addresses only"},
}

// TestE2EUpstream runs upstream's e2e.test (v1.37.2) with a focus against
// real nodes (kubelet and containerd, RAPIDPROXY_E2E_NODES of them, each in
// its network namespace on the underlay the framework makes) whose
// kube-proxies are ours or upstream's, each run from a config file in its
// node's network namespace as its DaemonSet runs it in a cluster. `make
// e2e-upstream MODE=iptables KUBE_PROXY=ours|upstream NODES=3` runs it
// (KUBE_PROXY=upstream,ours runs both in turn on one cluster and its
// nodes); each run's JUnit report and results list go to
// _output/e2e-upstream/<mode>-<kube-proxy>. make test runs it with its
// defaults: ours, iptables mode, three nodes, the Services [Conformance]
// specs.
func TestE2EUpstream(t *testing.T) {
	tools := nodeTools(t)
	mode := envOr("RAPIDPROXY_E2E_MODE", "iptables")
	whichList := envOr("RAPIDPROXY_E2E_KUBE_PROXY", "ours")
	focus := envOr("RAPIDPROXY_E2E_FOCUS", defaultFocus)
	if d := envOr("RAPIDPROXY_E2E_DEPLOY", "process"); d != "process" && d != "daemonset" {
		t.Fatalf("RAPIDPROXY_E2E_DEPLOY=%q: want process or daemonset", d)
	}
	// IPVS needs a kernel with it: each node runs in a VM of test/vm's,
	// under TCG, two by default.
	inGuest := mode == "ipvs"
	nodeCount, err := strconv.Atoi(envOr("RAPIDPROXY_E2E_NODES", map[bool]string{false: "3", true: "2"}[inGuest]))
	if err != nil || nodeCount < 1 || nodeCount > maxNodes {
		t.Fatalf("RAPIDPROXY_E2E_NODES=%q: want 1 to %d", os.Getenv("RAPIDPROXY_E2E_NODES"), maxNodes)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 170*time.Minute)
	defer cancel()

	c, err := framework.StartWith(ctx, framework.Options{
		RealNodes: true, Scheduler: filepath.Join(tools, "kube-scheduler")})
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: the nodes' cleanups, registered later, run
	// before it.
	t.Cleanup(c.Stop)
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	agnhost, err := BuildAgnhostImage(tools, c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	conntrackImages, err := BuildConntrackTestImages(tools, c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	images := append([]string{agnhost}, conntrackImages...)
	if deployAsDaemonSet() {
		if inGuest {
			t.Fatal("RAPIDPROXY_E2E_DEPLOY=daemonset: not in IPVS mode, whose nodes are VMs; the kube-proxies there run as the DaemonSet's command line")
		}
		images = append(images, imageArchive(t), upstreamImageArchive(t))
		if _, err := os.Stat("/lib/modules"); os.IsNotExist(err) {
			t.Cleanup(func() { _ = os.Remove("/lib/modules") })
		}
	}
	var nodes []*Node
	var dns *ClusterDNS
	if inGuest {
		nodes, err = startGuestNodes(ctx, t, c, nodeCount, mode, Options{Tools: tools, ExtraImages: images})
		if err != nil {
			t.Fatal(err)
		}
		// The DNS stand-in listens on the host's end of the underlay;
		// the nodes' pods reach it through their kube-proxy.
		dns, err = StartClusterDNS(ctx, c.Client, "", framework.APIServerIP)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		nodes, err = startNodes(ctx, t, c, nodeCount, Options{Tools: tools, ExtraImages: images})
		if err != nil {
			t.Fatal(err)
		}
		// The DNS stand-in listens on the first node; pods on the others
		// reach it through their kube-proxy and the underlay.
		dns, err = StartClusterDNS(ctx, c.Client, nodes[0].NetnsPath(), nodes[0].IP)
		if err != nil {
			t.Fatal(err)
		}
	}
	defer dns.Stop()
	// Each kube-proxy named runs the suite in turn on the same cluster and
	// nodes; the one before is stopped and its rules removed with its own
	// --cleanup first, as when a cluster changes its kube-proxy.
	for _, which := range strings.Split(whichList, ",") {
		t.Run(which, func(t *testing.T) { runSuite(ctx, t, c, nodes, root, tools, mode, which, focus) })
	}
}

// maxNodes is how many nodes the addresses below leave room for.
const maxNodes = 9

// startNodes starts count nodes, real-1 to real-<count>, and waits until
// each is Ready: real-1 in the framework's node namespace at
// framework.NodeIPv4 (10.255.0.2), real-i in a namespace of its own at
// 10.255.0.<i+1>, all on the underlay; real-i's pod CIDR is
// 10.244.<i+4>.0/24, routed from every other node. Each node is stopped
// when the test ends.
func startNodes(ctx context.Context, t *testing.T, c *framework.Cluster, count int, opts Options) ([]*Node, error) {
	var nodes []*Node
	for i := 1; i <= count; i++ {
		o := opts
		o.Name, o.PodCIDR = fmt.Sprintf("real-%d", i), fmt.Sprintf("10.244.%d.0/24", i+4)
		if i > 1 {
			o.IP = fmt.Sprintf("10.255.0.%d", i+1)
			ns, err := c.AddNodeNetns(o.Name, o.IP)
			if err != nil {
				return nil, fmt.Errorf("node %s: %w", o.Name, err)
			}
			o.Netns = ns
		}
		n, err := Start(ctx, c, o)
		if err != nil {
			return nil, err
		}
		t.Cleanup(n.Stop)
		nodes = append(nodes, n)
	}
	if err := RouteBetween(nodes); err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if err := waitNodeReady(ctx, c, n.Name); err != nil {
			return nil, fmt.Errorf("node %s not Ready: %w", n.Name, err)
		}
	}
	return nodes, nil
}

// startGuestNodes starts count nodes in VMs of test/vm's, real-1 to
// real-<count>, and waits until each is Ready: real-i at 10.255.0.<i+10> on
// the underlay (clear of the framework's node namespace), pod CIDR
// 10.244.<i+4>.0/24, routed from every other node. Each can run our
// kube-proxy and upstream's with its config file for mode. Each node is
// stopped when the test ends.
func startGuestNodes(ctx context.Context, t *testing.T, c *framework.Cluster, count int, mode string, opts Options) ([]*Node, error) {
	agent := vm.BuildStatic(t, "github.com/rapidproxy/rapidproxy/test/vm/agent")
	ip := func(i int) string { return fmt.Sprintf("10.255.0.%d", i+10) }
	podCIDR := func(i int) string { return fmt.Sprintf("10.244.%d.0/24", i+4) }
	// One vCPU each when several share the machine's two cores.
	cpus := max(1, 2/count)
	var nodes []*Node
	for i := 1; i <= count; i++ {
		o := opts
		o.Name, o.IP, o.PodCIDR = fmt.Sprintf("real-%d", i), ip(i), podCIDR(i)
		config := guestKubeProxyConfig(c, o.Name)
		if err := os.WriteFile(config, []byte(kubeProxyConfig(c, &Node{Name: o.Name}, mode)), 0o644); err != nil {
			return nil, err
		}
		routes := map[string]string{}
		for j := 1; j <= count; j++ {
			if j != i {
				routes[podCIDR(j)] = ip(j)
			}
		}
		n, err := StartInGuest(ctx, c, GuestOptions{Options: o, Agent: agent,
			KubeProxies: []string{c.KubeProxy(), c.UpstreamKubeProxy()}, KubeProxyConfig: config,
			Routes: routes, CPUs: cpus})
		if err != nil {
			return nil, err
		}
		t.Cleanup(n.Stop)
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		if err := waitNodeReady(ctx, c, n.Name); err != nil {
			return nil, fmt.Errorf("node %s not Ready: %w; kubelet.log ends with:\n%s", n.Name, err,
				framework.FileTail(filepath.Join(n.guest.OutDir, "kubelet.log"), 30))
		}
	}
	return nodes, nil
}

// guestKubeProxyConfig is where a guest node's kube-proxy config file is,
// on the host and in the guest.
func guestKubeProxyConfig(c *framework.Cluster, node string) string {
	return filepath.Join(c.Dir, "kube-proxy-"+node+".yaml")
}

// runSuite runs one kube-proxy on each node and upstream's e2e.test
// against them, then stops them and removes their rules.
func runSuite(ctx context.Context, t *testing.T, c *framework.Cluster, nodes []*Node, root, tools, mode, which, focus string) {
	binary := c.KubeProxy()
	if which == "upstream" {
		binary = c.UpstreamKubeProxy()
	} else if which != "ours" {
		t.Fatalf("RAPIDPROXY_E2E_KUBE_PROXY=%q: want ours or upstream (or both, comma-separated)", which)
	}
	reportDir := filepath.Join(root, "_output", "e2e-upstream", mode+"-"+which)
	if err := os.RemoveAll(reportDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(reportDir, 0o755); err != nil {
		t.Fatal(err)
	}
	logs := []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}
	for _, n := range nodes {
		logs = append(logs, n.Name+"-kubelet", n.Name+"-containerd", "kube-proxy-"+which+"-"+n.Name)
	}
	defer func() {
		// The logs outlive the cluster's directory, for a failure's reasons.
		for _, log := range logs {
			_ = exec.Command("cp", c.LogPath(log), reportDir).Run()
		}
		for _, n := range nodes {
			if n.guest != nil {
				// The guest's /out (its kubelet's, containerd's and
				// kube-proxies' logs) in a directory of the node's name.
				_ = exec.Command("cp", "-rT", n.guest.OutDir, filepath.Join(reportDir, n.Name)).Run()
				_ = exec.Command("cp", n.consolePath(), reportDir).Run()
			}
		}
	}()
	// Flags beside the config file, as a DaemonSet's command line adds
	// them (--v=4 to see each sync).
	flags := strings.Fields(os.Getenv("RAPIDPROXY_E2E_KUBE_PROXY_FLAGS"))
	var stop func()
	if deployAsDaemonSet() {
		if len(flags) > 0 {
			t.Fatal("RAPIDPROXY_E2E_KUBE_PROXY_FLAGS: not with the DaemonSet, whose command line is kubeadm's")
		}
		stop = runDaemonSet(ctx, t, c, nodes, root, mode, which, binary, reportDir)
	} else {
		stop = runProcesses(ctx, t, c, nodes, mode, which, binary, flags)
	}
	defer stop()
	t.Logf("%d nodes Ready, %s kube-proxy (%s%s) healthy on each; running e2e.test", len(nodes), which, mode,
		map[bool]string{true: ", kubeadm's DaemonSet"}[deployAsDaemonSet()])

	var skipPatterns []string
	for _, s := range skips {
		skipPatterns = append(skipPatterns, s.pattern)
	}
	suiteArgs := []string{
		"--kubeconfig=" + c.AdminKubeconfig(),
		"--kubectl-path=" + filepath.Join(tools, "kubectl"),
		"--report-dir=" + reportDir,
		// No logs or node dumps: the node's logs are copied to the report dir.
		"--dump-logs-on-failure=false",
		// Said, not detected: in parallel only the first process detects
		// it, the others see -1.
		"--num-nodes=" + strconv.Itoa(len(nodes)),
	}
	ginkgoArgs := []string{"--focus=" + focus, "--skip=" + strings.Join(skipPatterns, "|"),
		"--no-color", "-v", "--timeout=160m"}
	// Every spec the focus and skips select must run (pass or fail): a
	// focus that matches nothing, or a spec skipped at run time, does not
	// pass for a run.
	selected, err := selectedSpecs(ctx, filepath.Join(tools, "e2e.test"), c.AdminKubeconfig(), filepath.Join(reportDir, "selected"), ginkgoArgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(selected) == 0 {
		t.Fatalf("the focus %q (less the skips) selects no spec of e2e.test", focus)
	}
	var cmd *exec.Cmd
	if procs := envOr("RAPIDPROXY_E2E_PROCS", "1"); procs == "1" {
		for i, a := range ginkgoArgs {
			ginkgoArgs[i] = "--ginkgo." + strings.TrimLeft(a, "-")
		}
		cmd = exec.CommandContext(ctx, filepath.Join(tools, "e2e.test"), append(suiteArgs, ginkgoArgs...)...)
	} else {
		// In parallel, as upstream's CI runs the suite: the ginkgo CLI
		// starts the processes and serves them the specs.
		ginkgo, err := buildGinkgo(root)
		if err != nil {
			t.Fatal(err)
		}
		args := append(append([]string{"--procs=" + procs}, ginkgoArgs...), filepath.Join(tools, "e2e.test"), "--")
		cmd = exec.CommandContext(ctx, ginkgo, append(args, suiteArgs...)...)
	}
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.AdminKubeconfig(), "PATH="+tools+":"+os.Getenv("PATH"))
	log, err := os.Create(filepath.Join(reportDir, "e2e.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	runErr := cmd.Run()

	results, err := readJUnit(reportDir)
	if err != nil {
		t.Fatalf("e2e.test: %v; report: %v; log tail:\n%s", runErr, err, framework.FileTail(log.Name(), 40))
	}
	passed, failed := results.write(t, filepath.Join(reportDir, "results.tsv"))
	fmt.Printf("%d passed, %d failed (%s kube-proxy, %s mode; report in %s)\n", passed, failed, which, mode, reportDir)
	if failed > 0 || runErr != nil {
		t.Errorf("e2e.test: %d failed (%v); see %s/e2e.log", failed, runErr, reportDir)
	}
	if missing := results.notRun(selected); passed+failed != len(selected) || len(missing) > 0 {
		t.Errorf("e2e.test ran %d specs, the focus selects %d; selected but not run: %q", passed+failed, len(selected), missing)
	}
}

// selectedSpecs lists the specs e2e.test runs with ginkgoArgs, from its
// dry run's JUnit report in dir: there the specs the focus and skips
// select are passed, the others skipped.
func selectedSpecs(ctx context.Context, e2eTest, kubeconfig, dir string, ginkgoArgs []string) ([]string, error) {
	args := []string{"--kubeconfig=" + kubeconfig, "--report-dir=" + dir, "--ginkgo.dry-run"}
	for _, a := range ginkgoArgs {
		args = append(args, "--ginkgo."+strings.TrimLeft(a, "-"))
	}
	if out, err := exec.CommandContext(ctx, e2eTest, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("e2e.test --ginkgo.dry-run: %w; its output ends with:\n%s", err, lastLines(string(out), 20))
	}
	rs, err := readJUnit(dir)
	if err != nil {
		return nil, fmt.Errorf("e2e.test --ginkgo.dry-run: %w", err)
	}
	var names []string
	for _, r := range rs {
		if r.status == "passed" {
			names = append(names, r.name)
		}
	}
	return names, nil
}

// notRun lists the specs of selected that did not run (neither passed nor
// failed).
func (rs results) notRun(selected []string) []string {
	ran := map[string]bool{}
	for _, r := range rs {
		if r.status != "skipped" {
			ran[r.name] = true
		}
	}
	var missing []string
	for _, name := range selected {
		if !ran[name] {
			missing = append(missing, name)
		}
	}
	return missing
}

// lastLines is the end of a command's output.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// runProcesses starts the kube-proxy on each node as its DaemonSet's
// command line, in the node's namespace or in its guest; the func it
// returns stops them, last first, and removes their rules.
func runProcesses(ctx context.Context, t *testing.T, c *framework.Cluster, nodes []*Node, mode, which, binary string, flags []string) func() {
	var cleanups []func()
	stopAll := func() {
		for _, cleanup := range slices.Backward(cleanups) {
			cleanup()
		}
	}
	for _, n := range nodes {
		var proxy interface {
			stop()
			cleanup() error
		}
		var err error
		if n.guest != nil {
			proxy, err = startGuestKubeProxy(ctx, n, "kube-proxy-"+which+"-"+n.Name, binary, guestKubeProxyConfig(c, n.Name), flags)
		} else {
			proxy, err = startNodeKubeProxy(ctx, c, n, "kube-proxy-"+which+"-"+n.Name, binary, mode, flags)
		}
		if err != nil {
			stopAll()
			t.Fatal(err)
		}
		cleanups = append(cleanups, func() {
			// Its rules go with its own --cleanup, as when a cluster
			// changes its kube-proxy.
			proxy.stop()
			err := proxy.cleanup()
			if err != nil && which == "upstream" && mode == "ipvs" {
				// Upstream's removes the iptables mode's chains before
				// the IPVS mode's, which still jump to KUBE-MARK-MASQ:
				// iptables-restore fails and it exits 1, having removed
				// the IPVS mode's. A second run finds nothing in the way.
				t.Logf("upstream's --cleanup after its IPVS mode failed, as it does; again: %s", firstLine(err.Error()))
				err = proxy.cleanup()
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	return stopAll
}

// runDaemonSet runs the kube-proxies as kubeadm's DaemonSet, of our image
// or upstream's, and waits until each node's pod has synced; the func it
// returns keeps the pods' logs, deletes the DaemonSet and removes the
// rules with the binary's own --cleanup, as when a cluster changes its
// kube-proxy.
func runDaemonSet(ctx context.Context, t *testing.T, c *framework.Cluster, nodes []*Node, root, mode, which, binary, reportDir string) func() {
	image := "ghcr.io/rapidproxy/kube-proxy:" + imageTag(t, root)
	if which == "upstream" {
		image = upstreamImageRef(t)
	}
	objs := kubeadmObjects(t, mode, image)
	client, mapper, err := c.DynamicClient()
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, client, mapper, objs)
	stop := func() {
		for _, n := range nodes {
			_ = os.WriteFile(filepath.Join(reportDir, "kube-proxy-"+which+"-"+n.Name+".log"), []byte(n.podLogs("kube-system", 2000)), 0o644)
		}
		remove(ctx, t, c, client, mapper, objs)
		for _, n := range nodes {
			if out, err := n.Command(binary, "--cleanup").CombinedOutput(); err != nil {
				t.Errorf("%s --cleanup on %s: %v\n%s", binary, n.Name, err, out)
			}
		}
	}
	// A failed wait ends the test here; what was made goes all the same.
	rolledOut := false
	defer func() {
		if !rolledOut {
			stop()
		}
	}()
	waitRolledOut(ctx, t, c, nodes, image, nil)
	rolledOut = true
	return stop
}

// buildGinkgo builds the ginkgo CLI of the version e2e.test was built
// with (hack/node-tools/kubernetes pins it) into _output/bin.
func buildGinkgo(root string) (string, error) {
	out := filepath.Join(root, "_output", "bin", "ginkgo")
	cmd := exec.Command("go", "build", "-o", out, "github.com/onsi/ginkgo/v2/ginkgo")
	cmd.Dir = filepath.Join(root, "hack", "node-tools", "kubernetes")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the ginkgo CLI: %w\n%s", err, b)
	}
	return out, nil
}

// kubeProxyConfig is the file kubeadm's kube-proxy ConfigMap holds, for
// this node. conntrack.maxPerCore is 0 so that nf_conntrack_max, a
// machine-wide setting, stays as it is on this shared machine.
func kubeProxyConfig(c *framework.Cluster, n *Node, mode string) string {
	return "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"clientConnection:\n  kubeconfig: " + c.KubeProxyKubeconfig + "\n" +
		"hostnameOverride: " + n.Name + "\n" +
		"clusterCIDR: " + framework.ClusterCIDRs + "\n" +
		"mode: " + mode + "\n" +
		"conntrack:\n  maxPerCore: 0\n"
}

func waitNodeReady(ctx context.Context, c *framework.Cluster, name string) error {
	return waitFor(ctx, 2*time.Minute, func() (bool, string) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == v1.NodeReady {
				return cond.Status == v1.ConditionTrue, cond.Reason + ": " + cond.Message
			}
		}
		return false, "no Ready condition"
	})
}

// deployAsDaemonSet says whether the kube-proxies run as kubeadm's
// DaemonSet (RAPIDPROXY_E2E_DEPLOY=daemonset: pods the nodes' kubelets
// start from the images), rather than as its command line in each node's
// namespace (the default, RAPIDPROXY_E2E_DEPLOY=process).
func deployAsDaemonSet() bool {
	return os.Getenv("RAPIDPROXY_E2E_DEPLOY") == "daemonset"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// junitSuites is what ginkgo's JUnit reporter writes.
type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string        `xml:"name,attr"`
			Time    float64       `xml:"time,attr"`
			Skipped *struct{}     `xml:"skipped"`
			Failure *junitFailure `xml:"failure"`
			Error   *junitFailure `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func (f *junitFailure) String() string {
	if strings.TrimSpace(f.Message) != "" {
		return f.Message
	}
	return f.Text
}

type result struct{ name, status, message string }

type results []result

// readJUnit reads every junit_*.xml e2e.test wrote in dir.
func readJUnit(dir string) (results, error) {
	files, err := filepath.Glob(filepath.Join(dir, "junit_*.xml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no junit_*.xml in %s (%v)", dir, err)
	}
	var rs results
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var js junitSuites
		if err := xml.Unmarshal(data, &js); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, s := range js.Suites {
			for _, tc := range s.Cases {
				// The suite's own nodes (before and after it) are not tests.
				if !strings.HasPrefix(tc.Name, "[It] ") {
					continue
				}
				r := result{name: strings.TrimPrefix(tc.Name, "[It] "), status: "passed"}
				switch {
				case tc.Skipped != nil:
					r.status = "skipped"
				case tc.Failure != nil:
					r.status, r.message = "failed", tc.Failure.String()
				case tc.Error != nil:
					r.status, r.message = "failed", tc.Error.String()
				}
				rs = append(rs, r)
			}
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].name < rs[j].name })
	return rs, nil
}

// write lists the specs that ran (not those skipped) with their outcome,
// one a line, and logs the failures' first lines.
func (rs results) write(t *testing.T, path string) (passed, failed int) {
	var b strings.Builder
	for _, r := range rs {
		if r.status == "skipped" {
			continue
		}
		if r.status == "passed" {
			passed++
		} else {
			failed++
			t.Logf("FAILED %s: %s", r.name, firstLine(r.message))
		}
		fmt.Fprintf(&b, "%s\t%s\t%s\n", r.name, r.status, firstLine(r.message))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
	return passed, failed
}

// firstLine is a failure's first non-empty line.
func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}
