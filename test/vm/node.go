package vm

import (
	"path/filepath"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// IPVSModules are what upstream's IPVS README has a node load before
// kube-proxy starts in IPVS mode (Config.Modules).
var IPVSModules = []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack"}

// NodeFiles are what a kube-proxy needs in the guest to be the cluster's
// node (Config.Files): the binary as /usr/local/bin/kube-proxy, its config,
// and the kubeconfig with its certificates, which the kubeconfig names by
// host path: the guest gets them at the same paths.
func NodeFiles(cluster *framework.Cluster, binary, config string) map[string]string {
	files := map[string]string{"/usr/local/bin/kube-proxy": binary,
		config: config, cluster.KubeProxyKubeconfig: cluster.KubeProxyKubeconfig}
	for _, f := range []string{"ca.crt", "kube-proxy.crt", "kube-proxy.key"} {
		path := filepath.Join(cluster.Dir, f)
		files[path] = path
	}
	return files
}

// NodeAddresses is a script that gives the guest the node's IPs, as its
// Node object has them, as local addresses like on a real node; the API
// server stays reached from the uplink's address.
const NodeAddresses = `
ip addr add ` + framework.NodeIPv4 + `/32 dev eth0
ip addr add ` + framework.NodeIPv6 + `/128 dev eth0 nodad
ip route replace ` + APIServerRoute + ` via ` + HostIP + ` src ` + GuestIP + `
`
