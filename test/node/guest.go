package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A node in test/vm's VM, for IPVS mode, which this machine's kernel lacks:
// Debian's kernel under qemu (TCG) runs containerd, runc, the kubelet and
// the agent (test/vm/agent), through which the host starts and stops the
// node's kube-proxy. The guest's link is a tap on the framework's underlay
// bridge, so guest nodes reach the API server and each other as the
// namespace nodes do, at an address of the underlay. Every file the node
// uses is copied into the guest at its host path, so that the configs
// test/node writes for a node in a namespace serve as they are. What
// differs from a node on the host:
//   - the guest's root is its initramfs, on which runc cannot pivot_root:
//     containerd runs runc with NoPivotRoot;
//   - cgroups are v2, mounted by the script;
//   - the kubelet's and containerd's state are on tmpfs mounts: cAdvisor
//     finds no filesystem for the initramfs.

// GuestOptions say which node to run in the VM.
type GuestOptions struct {
	Options
	// Agent is the static binary of test/vm/agent.
	Agent string
	// KubeProxies are the kube-proxy binaries the host may start in the
	// guest (at their host paths), and KubeProxyConfig their config file.
	KubeProxies     []string
	KubeProxyConfig string
	// Routes are the other nodes' pod CIDRs, each with the node's address.
	Routes map[string]string
	// CPUs is the guest's number of CPUs.
	CPUs int
}

// guestMemoryMB holds the node's containers' images and root filesystems,
// which live in the guest's memory, with the initramfs' 400 MB.
const guestMemoryMB = 6144

// StartInGuest boots a VM that runs a node at opts.IP on the underlay,
// waits for the kubelet's Node and routes the node's pod CIDR from the host
// to it. On error, what was started is stopped.
func StartInGuest(ctx context.Context, c *framework.Cluster, opts GuestOptions) (_ *Node, err error) {
	underlay, err := c.UnderlayNetns()
	if err != nil {
		return nil, err
	}
	opts.Netns = nil
	n, err := newNode(c, opts.Options)
	if err != nil {
		return nil, err
	}
	n.noPivotRoot = true
	if err := n.writeConfigs(); err != nil {
		return nil, err
	}
	kubeconfig, err := n.issueKubeconfig()
	if err != nil {
		return nil, err
	}
	archives, err := n.imageArchives()
	if err != nil {
		return nil, err
	}
	files, err := n.guestFiles(kubeconfig, archives, opts)
	if err != nil {
		return nil, err
	}
	if n.console, err = os.Create(n.consolePath()); err != nil {
		return nil, err
	}
	n.guest, err = vm.Start(vm.Config{
		Modules: append([]string{"overlay", "br_netfilter"}, vm.IPVSModules...),
		Underlay: &vm.Underlay{Netns: underlay, Bridge: framework.UnderlayBridge, Tap: "vm-" + n.Name,
			GuestCIDR: framework.UnderlayCIDR(n.IP)},
		Files: files, MemoryMB: guestMemoryMB, CPUs: opts.CPUs,
		Script: n.guestScript(kubeconfig, archives, opts.Routes),
		// The script ends when the host tells the agent to quit.
		Timeout: 24 * time.Hour,
	}, n.consoleLog())
	if err != nil {
		n.console.Close()
		return nil, err
	}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	n.agent = vm.AgentOf(n.guest)
	// Booting a 400 MB initramfs, starting containerd and importing the
	// images take minutes under TCG.
	if err := n.agent.WaitReady(ctx, 10*time.Minute); err != nil {
		return nil, fmt.Errorf("%w; the guest's console (%s) ends with:\n%s", err, n.consolePath(), framework.FileTail(n.consolePath(), 30))
	}
	if err := n.routePods(); err != nil {
		return nil, err
	}
	err = waitFor(ctx, 5*time.Minute, func() (bool, string) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if err != nil {
		return nil, fmt.Errorf("the kubelet's Node: %w; kubelet.log ends with:\n%s", err,
			framework.FileTail(filepath.Join(n.guest.OutDir, "kubelet.log"), 30))
	}
	return n, nil
}

// guestFiles are what the guest gets, guest path -> host path.
func (n *Node) guestFiles(kubeconfig string, archives []string, opts GuestOptions) (map[string]string, error) {
	files := map[string]string{
		"/usr/local/bin/containerd":              filepath.Join(n.tools, "containerd"),
		"/usr/local/bin/containerd-shim-runc-v2": filepath.Join(n.tools, "containerd-shim-runc-v2"),
		"/usr/local/bin/ctr":                     filepath.Join(n.tools, "ctr"),
		"/usr/local/bin/kubelet":                 filepath.Join(n.tools, "kubelet"),
		"/usr/local/bin/agent":                   opts.Agent,
		// Debian's runc and the library it loads; the guest's /lib is a
		// link to /usr/lib.
		"/usr/sbin/runc": "/usr/sbin/runc",
		"/usr/lib/x86_64-linux-gnu/libseccomp.so.2": "/lib/x86_64-linux-gnu/libseccomp.so.2",
	}
	same := []string{opts.KubeProxyConfig, kubeconfig, n.ca, n.cluster.KubeProxyKubeconfig}
	same = append(same, opts.KubeProxies...)
	for _, name := range []string{n.Name + "-kubelet", "kube-proxy"} {
		same = append(same, filepath.Join(n.cluster.Dir, name+".crt"), filepath.Join(n.cluster.Dir, name+".key"))
	}
	same = append(same, archives...)
	for _, pattern := range []string{filepath.Join(n.tools, "cni", "*"), filepath.Join(n.Dir, "*"), filepath.Join(n.Dir, "cni", "net.d", "*")} {
		matches, err := filepath.Glob(pattern)
		if err != nil {
			return nil, err
		}
		same = append(same, matches...)
	}
	for _, path := range same {
		if st, err := os.Stat(path); err != nil {
			return nil, err
		} else if st.Mode().IsRegular() {
			files[path] = path
		}
	}
	return files, nil
}

// guestScript sets the guest up as a node, starts containerd, imports the
// images, starts the kubelet (each logging to /out) and runs the agent
// until the host tells it to quit.
func (n *Node) guestScript(kubeconfig string, images []string, routes map[string]string) string {
	var routing strings.Builder
	for cidr, via := range routes {
		fmt.Fprintf(&routing, "ip route replace %s via %s dev eth0\n", cidr, via)
	}
	return routing.String() + fmt.Sprintf(`
mount -t cgroup2 none /sys/fs/cgroup
# The controllers the kubelet requires of its cgroup root.
echo "+cpuset +cpu +io +memory +hugetlb +pids" >/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup%[1]s
hostname %[2]s
# What a node's /etc has and the kubelet and containerd read: the system
# UUID, the users, and the hosts file each pod's starts from.
cat /proc/sys/kernel/random/uuid | tr -d - >/etc/machine-id
[ -e /etc/passwd ] || echo "root:x:0:0:root:/root:/bin/sh" >/etc/passwd
[ -e /etc/group ] || echo "root:x:0:" >/etc/group
[ -e /etc/hosts ] || printf "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n" >/etc/hosts
sysctl -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 >/dev/null
dir=%[3]q
mkdir -p "$dir/pod-logs" "$dir/volume-plugins" "$dir/kubelet" "$dir/containerd" "$dir/cni/ipam" /run/containerd /var/log/containers /var/run/nri
# cAdvisor finds no filesystem for the initramfs ("rootfs"): the kubelet's
# and containerd's state go on filesystems it knows.
mount -t tmpfs tmpfs "$dir/kubelet"
mount -t tmpfs tmpfs "$dir/containerd"
containerd --config "$dir/containerd.toml" >/out/containerd.log 2>&1 &
c() { ctr --address %[4]q --namespace k8s.io "$@"; }
i=0
until c version >/dev/null 2>&1; do
	i=$((i + 1))
	if [ $i -gt 1200 ]; then echo "containerd did not start" >/run/rpx-failure; exit 1; fi
	sleep 0.1
done
for a in %[5]s; do c images import --platform linux/amd64 "$a" >/dev/null; done
kubelet --config="$dir/kubelet.yaml" --kubeconfig=%[6]q --root-dir="$dir/kubelet" --cert-dir="$dir/kubelet/pki" \
	--hostname-override=%[2]s --node-ip=%[7]s --v=2 >/out/kubelet.log 2>&1 &
agent -listen %[7]s:%[8]s
`, n.CgroupRoot(), n.Name, n.Dir, n.Socket(), strings.Join(images, " "), kubeconfig, n.IP, vm.AgentPort)
}

// consolePath is where the guest's console and the VM harness' messages
// go: the cluster's directory, with the other processes' logs.
func (n *Node) consolePath() string { return n.cluster.LogPath(n.Name + "-console") }

// consoleLog is vm.Start's logf, writing to n.console (consolePath).
func (n *Node) consoleLog() func(string, ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(n.console, format+"\n", args...)
	}
}
