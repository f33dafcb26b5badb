// Package node runs real Kubernetes nodes for the upstream e2e tests: a
// kubelet and containerd 2.x in one of the framework's network namespaces,
// with their own state, sockets, cgroup root, pod CIDR and bridge, joined
// to the framework's control plane. hack/build-node-tools.sh builds what
// they run.
package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node is a running kubelet and containerd.
type Node struct {
	Name    string
	IP      string
	PodCIDR string
	// Dir holds the node's state: containerd's root and state, the
	// kubelet's root directory, CNI configuration and IPAM, logs of pods.
	Dir string

	netns      *framework.Netns
	tools      string
	pauseTag   string
	ca         string
	cluster    *framework.Cluster
	containerd *framework.Process
	kubelet    *framework.Process

	extraImages []string

	// In a VM (StartInGuest): the machine, its agent, and the file its
	// console goes to; containerd runs runc with NoPivotRoot there.
	guest       *vm.Machine
	agent       *vm.Agent
	console     *os.File
	noPivotRoot bool
}

// Options say which node to run.
type Options struct {
	Name    string
	PodCIDR string
	// Tools is the directory hack/build-node-tools.sh printed.
	Tools string
	// ExtraImages are OCI archives imported after the node tools' images
	// (an image of the same name replaces theirs).
	ExtraImages []string
	// Netns and IP are the node's network namespace and address; by
	// default the framework's node namespace and framework.NodeIPv4.
	Netns *framework.Netns
	IP    string
}

// Start runs a node in its network namespace, imports the locally built
// images and waits for the kubelet to register its Node. On error, what
// was started is stopped.
func Start(ctx context.Context, c *framework.Cluster, opts Options) (_ *Node, err error) {
	if opts.Netns == nil {
		opts.Netns, opts.IP = c.Node, framework.NodeIPv4
	}
	n, err := newNode(c, opts)
	if err != nil {
		return nil, err
	}
	framework.CleanupCgroups(n.CgroupRoot())
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if err := n.writeConfigs(); err != nil {
		return nil, err
	}
	if err := framework.CreateCgroups(n.CgroupRoot()); err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	if err := n.importImages(ctx); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if err := n.routePods(); err != nil {
		return nil, err
	}
	return n, nil
}

// newNode is the node opts describe, with an empty directory, before
// anything runs.
func newNode(c *framework.Cluster, opts Options) (*Node, error) {
	n := &Node{
		Name: opts.Name, IP: opts.IP, PodCIDR: opts.PodCIDR,
		Dir: filepath.Join(c.Dir, opts.Name), netns: opts.Netns, tools: opts.Tools,
		ca: c.CACertPath(), cluster: c, extraImages: opts.ExtraImages,
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		return nil, err
	}
	tag, err := os.ReadFile(filepath.Join(n.tools, "images", "pause.tag"))
	if err != nil {
		return nil, fmt.Errorf("node tools: %w (run hack/build-node-tools.sh)", err)
	}
	n.pauseTag = strings.TrimSpace(string(tag))
	return n, nil
}

func (n *Node) path(rel string) string { return filepath.Join(n.Dir, rel) }

// NetnsPath is the node's network namespace, for setns.
func (n *Node) NetnsPath() string { return "/run/netns/" + n.netns.Name }

// Command is a command run in the node's network namespace.
func (n *Node) Command(args ...string) *exec.Cmd {
	return n.netns.Command(args...)
}

// RouteBetween gives each node a route to every other node's pod CIDR via
// that node's address on the underlay (its eth0), as a cluster's network
// plugin does in its simplest, routed form: pods reach pods on other
// nodes unmasqueraded.
func RouteBetween(nodes []*Node) error {
	for _, n := range nodes {
		for _, peer := range nodes {
			if peer == n {
				continue
			}
			if out, err := exec.Command("ip", "-n", n.netns.Name, "route", "replace", peer.PodCIDR, "via", peer.IP, "dev", "eth0").CombinedOutput(); err != nil {
				return fmt.Errorf("%s: route to %s's pods: %w: %s", n.Name, peer.Name, err, out)
			}
		}
	}
	return nil
}

// Socket is containerd's socket.
func (n *Node) Socket() string { return n.path("containerd.sock") }

// CgroupRoot is the cgroup under which the kubelet puts every pod; the
// framework's prefix lets a later run remove it if this one is killed.
func (n *Node) CgroupRoot() string { return "/rpx-" + n.Name }

func (n *Node) writeConfigs() error {
	files := map[string]string{
		"containerd.toml":           n.containerdConfig(),
		"cni/net.d/10-rpx.conflist": n.cniConfig(),
		"kubelet.yaml":              n.kubeletConfig(),
		"resolv.conf":               "nameserver 10.96.0.10\n",
	}
	for rel, content := range files {
		if err := os.MkdirAll(filepath.Dir(n.path(rel)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(n.path(rel), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{"pod-logs", "volume-plugins", "kubelet", "cni/ipam"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// startContainerd starts containerd in the node's network namespace and
// new mount and UTS namespaces (see initScript), and waits for its socket.
func (n *Node) startContainerd(ctx context.Context) error {
	script := n.path("init.sh")
	if err := os.WriteFile(script, []byte(n.initScript(filepath.Join(n.tools, "containerd"))), 0o755); err != nil {
		return err
	}
	cmd := exec.Command("nsenter", "--net="+n.NetnsPath(), "--",
		"unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", script)
	// The shim is found on PATH; runc is Debian's.
	cmd.Env = append(os.Environ(), "PATH="+n.tools+":"+os.Getenv("PATH"))
	p, err := n.cluster.StartProcess(n.Name+"-containerd", cmd)
	if err != nil {
		return err
	}
	n.containerd = p
	return framework.WaitUntil(ctx, p, time.Minute, "containerd's socket", func() bool {
		_, err := n.ctr(ctx, "version")
		return err == nil
	})
}

// ctr runs containerd's client against the node, in the CRI's namespace.
func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.tools, "ctr"),
		append([]string{"--address", n.Socket(), "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// importImages loads the OCI archives hack/build-node-tools.sh made.
func (n *Node) importImages(ctx context.Context) error {
	archives, err := n.imageArchives()
	if err != nil {
		return err
	}
	for _, a := range archives {
		if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", a); err != nil {
			return err
		}
	}
	return nil
}

// imageArchives are the images a node imports, in order: the node tools'
// archives, then the extra ones, so that an extra image replaces a tools'
// image of the same name.
func (n *Node) imageArchives() ([]string, error) {
	archives, err := filepath.Glob(filepath.Join(n.tools, "images", "*.tar"))
	if err != nil || len(archives) == 0 {
		return nil, fmt.Errorf("no image archives in %s/images: %v", n.tools, err)
	}
	return append(archives, n.extraImages...), nil
}

// routePods routes the node's pod CIDR from the host to the node: the
// control plane reaches pods as a cluster's does (the API server proxies
// to them: pods/proxy, services/proxy), and pods' answers to it come back.
func (n *Node) routePods() error {
	if out, err := exec.Command("ip", "route", "replace", n.PodCIDR, "via", n.IP, "dev", framework.NodeUplink).CombinedOutput(); err != nil {
		return fmt.Errorf("route to the pods: %w: %s", err, out)
	}
	return nil
}

// unroutePods removes what routePods added.
func (n *Node) unroutePods() {
	_ = exec.Command("ip", "route", "delete", n.PodCIDR, "via", n.IP, "dev", framework.NodeUplink).Run()
}

// startKubelet starts the kubelet in containerd's namespaces (network,
// mount and UTS) and waits for its Node object.
func (n *Node) startKubelet(ctx context.Context) error {
	kubeconfig, err := n.issueKubeconfig()
	if err != nil {
		return err
	}
	pid := n.containerd.Pid()
	cmd := exec.Command("nsenter", "--target", fmt.Sprint(pid), "--mount", "--net", "--uts", "--",
		filepath.Join(n.tools, "kubelet"),
		"--config="+n.path("kubelet.yaml"),
		"--kubeconfig="+kubeconfig,
		"--root-dir="+n.path("kubelet"),
		"--cert-dir="+n.path("kubelet/pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP,
		"--v=2",
	)
	p, err := n.cluster.StartProcess(n.Name+"-kubelet", cmd)
	if err != nil {
		return err
	}
	n.kubelet = p
	return framework.WaitUntil(ctx, p, 2*time.Minute, "the kubelet's Node", func() bool {
		_, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil
	})
}

// issueKubeconfig writes the kubelet's kubeconfig, with a client
// certificate in system:masters: the control plane runs RBAC alone,
// without the Node authorizer that would grant system:nodes what a
// kubelet needs.
func (n *Node) issueKubeconfig() (string, error) {
	return n.cluster.IssueKubeconfig(n.Name+"-kubelet", "system:node:"+n.Name, []string{"system:nodes", "system:masters"})
}

// Stop ends the node and removes everything it made: the pods' processes
// and cgroups, the kubelet and containerd (and with them their mount
// namespace and every mount in it), the bridge and the node's directory.
// It is safe to call more than once and after a failed Start.
func (n *Node) Stop() {
	if n.guest != nil {
		// The agent stops the kube-proxy it runs and quits; the guest
		// powers off, and its tap goes.
		if n.agent != nil {
			_ = n.agent.Quit()
		}
		n.guest.Stop()
		if n.console != nil {
			n.console.Close()
		}
		n.unroutePods()
		_ = os.RemoveAll(n.Dir)
		return
	}
	if n.kubelet != nil {
		n.kubelet.Stop()
	}
	// The containers' processes first: they are not children of anything
	// the framework started (runc reparents them to the shims).
	framework.CleanupCgroups(n.CgroupRoot())
	if n.containerd != nil {
		n.containerd.Stop()
	}
	killShims(n.Socket())
	_ = exec.Command("ip", "-n", n.netns.Name, "link", "delete", "cni0").Run()
	n.unroutePods()
	_ = os.RemoveAll(n.Dir)
}

// killShims kills the runc shims serving this node's containerd: they
// outlive containerd by design, and hold the node's mount namespace.
func killShims(socket string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		args := strings.Split(string(data), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == socket {
				var pid int
				fmt.Sscanf(filepath.Base(filepath.Dir(f)), "%d", &pid)
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
				}
			}
		}
	}
}

// waitFor polls ok until it holds, returning its last word on timeout.
func waitFor(ctx context.Context, timeout time.Duration, ok func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		done, why := ok()
		if done {
			return nil
		}
		last = why
		if time.Now().After(deadline) {
			return &timeoutError{last}
		}
		select {
		case <-ctx.Done():
			return &timeoutError{last + " (" + ctx.Err().Error() + ")"}
		case <-time.After(time.Second):
		}
	}
}

type timeoutError struct{ last string }

func (e *timeoutError) Error() string { return "timed out; last: " + e.last }
