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

// NodeHelpers are shell functions for a script that runs the guest as a
// node with pods (after NodeAddresses), its kube-proxy reading the config
// file $CONFIG; Files must hold /usr/local/bin/podserver.
//
//	fail WHY        fails the run, saying WHY, with the end of kube-proxy's log
//	on NS CMD...    CMD in namespace NS, or on the node itself for "node"
//	pod NAME IP     a namespace wired to the node like a CNI plugin's pod
//	serve NAME      the pod server in pod NAME (TCP and UDP on 8080)
//	request NS URL  one request from NS to URL (tcp:// or udp://): prints
//	                the reply, "POD SOURCE" (who answered, the client
//	                address it saw), or the error, and fails
//	start BINARY    runs a kube-proxy as the node, logging to
//	                /out/kube-proxy.log, and waits for its first sync; its
//	                PID is KUBE_PROXY
//	stop            ends it
const NodeHelpers = `
fail() {
	echo "FAIL: $*"
	echo "$*" >/run/rpx-failure
	echo "the kube-proxy log ends with:"
	grep -v nfacct /out/kube-proxy.log | tail -n 20
	exit 1
}

on() {
	ns=$1
	shift
	if [ "$ns" = node ]; then "$@"; else ip netns exec "$ns" "$@"; fi
}

# 10.244.0.1 at the node's end of each pod's veth is its gateway.
pod() {
	ip netns add "$1"
	ip link add "v-$1" type veth peer name eth0 netns "$1"
	ip addr add 10.244.0.1/32 dev "v-$1"
	ip link set "v-$1" up
	ip route add "$2/32" dev "v-$1"
	ip -n "$1" link set lo up
	ip -n "$1" addr add "$2/32" dev eth0
	ip -n "$1" link set eth0 up
	ip -n "$1" route add 10.244.0.1 dev eth0 scope link
	ip -n "$1" route add default via 10.244.0.1 dev eth0
}

serve() {
	ip netns exec "$1" podserver -name "$1" -ports 8080 >/dev/null &
}

# On a new connection or socket each time.
request() {
	on "$1" podserver -client "$2" -timeout 2s 2>&1
}

start() {
	echo "--- $1" >>/out/kube-proxy.log
	$1 --config=$CONFIG --v=2 >>/out/kube-proxy.log 2>&1 &
	KUBE_PROXY=$!
	# WaitForSync exits without saying why.
	echo "$1 did not sync" >/run/rpx-failure
	` + WaitForSync + `
	rm /run/rpx-failure
}

stop() {
	kill $KUBE_PROXY
	wait $KUBE_PROXY || :
}
`

// WaitForSync is a script that waits until the kube-proxy started last
// ($!) has synced both IP families (the last-sync timestamp is set for
// each); it exits if that takes over 300 s, or the process ends.
const WaitForSync = `
i=0
until [ "$(wget -q -O - http://127.0.0.1:10249/metrics 2>/dev/null | grep -c '^kubeproxy_sync_proxy_rules_last_timestamp_seconds{')" = 2 ]; do
	i=$((i + 1))
	if [ $i -gt 300 ] || ! kill -0 $!; then
		grep -v nfacct /out/kube-proxy.log | tail -n 80
		exit 1
	fi
	sleep 1
done
echo "kube-proxy synced after about ${i}s"
`
