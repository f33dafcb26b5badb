package node

import (
	"fmt"
	"path/filepath"
)

// containerdConfig is containerd 2.x's config (version 3) for one node: every
// directory and socket is the node's own, so nodes never share state with
// each other or with a containerd the machine may run.
func (n *Node) containerdConfig() string {
	noPivotRoot := ""
	if n.noPivotRoot {
		// A VM's root is its initramfs, which pivot_root cannot leave.
		noPivotRoot = "\n          NoPivotRoot = true"
	}
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = %[4]q
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # Built locally and imported: nothing is pulled.
      sandbox = 'registry.k8s.io/pause:%[5]s'
  [plugins.'io.containerd.cri.v1.runtime']
    # The pods' network namespaces are mounted under the node's state, not
    # /var/run/netns where the host's (and the framework's) live.
    netns_mounts_under_state_dir = true
    # This machine's root lacks CAP_SYS_RESOURCE, so no process may lower its
    # oom_score_adj, and runc fails the pause container's -998 ("failed to
    # update /proc/self/oom_score_adj: Permission denied"). Restricted, the
    # score is never set below containerd's own.
    restrict_oom_score_adj = true
    # This machine has no hugetlb hierarchy.
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '/usr/sbin/runc'
          # cgroupfs, as the kubelet's cgroupDriver: no systemd on this machine.
          SystemdCgroup = false%[8]s
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[6]q]
      conf_dir = %[7]q
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`, n.path("containerd/root"), n.path("containerd/state"), n.Socket(), n.path("containerd/opt"),
		n.pauseTag, filepath.Join(n.tools, "cni"), n.path("cni/net.d"), noPivotRoot)
}

// cniConfig is a bridge on the node with host-local addresses from the
// node's pod CIDR: the simplest network a real node has.
func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "rpx-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.path("cni/ipam"), n.PodCIDR)
}

// kubeletConfig is the node's KubeletConfiguration. Everything the kubelet
// would otherwise put in a machine-wide default place points into the
// node's directory.
func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine's cgroups are v1, which v1.37 still runs when asked.
failCgroupV1: false
cgroupDriver: cgroupfs
# The node's pods live under a cgroup of their own, removed at teardown.
cgroupRoot: %[1]q
containerRuntimeEndpoint: unix://%[2]s
address: %[3]q
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %[4]q
authorization:
  mode: AlwaysAllow
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
resolvConf: %[5]q
podCIDR: %[6]q
podLogsDir: %[7]q
volumePluginDir: %[8]q
staticPodPath: ""
# A shared machine's disk must not evict the test's pods or its images.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, n.CgroupRoot(), n.Socket(), n.IP, n.ca, n.path("resolv.conf"), n.PodCIDR,
		n.path("pod-logs"), n.path("volume-plugins"))
}

// initScript runs in the node's own mount namespace (made by unshare
// with private propagation) and ends by becoming containerd; the kubelet
// joins that namespace, so the two see each other's mounts, and none of
// them (volumes, container root filesystems, pod network namespaces)
// reaches the host's mount table: they vanish with the node.
//
// In its own UTS namespace too, the node's hostname is its name, as on a
// cluster's nodes: host-network pods share it, and the tests expect their
// endpoints to answer /hostname with the node's name.
//
// The kubelet sets vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
// kernel.panic_on_oops and kernel.keys.root_max* for the whole machine, or
// with protectKernelDefaults refuses to start unless they already hold its
// values. Neither is acceptable on a shared machine, so the node sees files
// holding those values bound over the /proc/sys entries instead.
func (n *Node) initScript(containerd string) string {
	return fmt.Sprintf(`set -eu
dir=%[1]q
hostname %[3]q
mkdir -p "$dir/sysctl"
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  f=${kv%%%%=*}
  echo "${kv#*=}" > "$dir/sysctl/${f##*/}"
  mount --bind "$dir/sysctl/${f##*/}" "/proc/sys/$f"
done
# Places the kubelet and containerd use whatever their configuration says.
for d in /var/log/containers /run/containerd /var/run/nri; do
  mkdir -p "$d" "$dir/mnt$d"
  mount --bind "$dir/mnt$d" "$d"
done
exec %[2]q --config "$dir/containerd.toml"
`, n.Dir, containerd, n.Name)
}
