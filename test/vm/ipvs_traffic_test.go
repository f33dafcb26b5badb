package vm_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/rapidproxy/rapidproxy/deploy/monitoring"
	proxyconfig "github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
)

// The pods of the traffic tests: namespaces in the guest, with routed
// veths like a CNI plugin's. Their addresses, and the services' names and
// addresses, stay clear of createServices', which startCluster makes too.
const (
	podA = "10.244.0.101" // on node-1
	podB = "10.244.0.102" // on node-1
	podR = "10.244.1.101" // on node-2 in the API: a remote endpoint
	// excludedCIDR is the config's ipvs.excludeCIDRs: another program's.
	excludedCIDR = "10.255.9.0/24"
)

// TestIPVSModeWithTraffic runs our kube-proxy in IPVS mode in the VM, as
// node-1 of the local cluster, and checks with real packets between
// namespaces in the guest what each kind of service does on a real IPVS
// kernel (trafficScript), a new LoadBalancer's changes under traffic from
// outside the node (lbChangesScript), then restarts, upstream's takeover
// and back, and --cleanup (lifecycleScript), switches to the nftables and
// iptables modes and back (switchScript), a client reusing the ports of
// ended IPVS connections once the nftables mode serves (portReuseScript),
// then the faults of docs/reliability.md (faultsScript): one cluster, six
// boots. The guest asks the test for
// API changes over the tap (serveHostSteps).
func TestIPVSModeWithTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	cluster := startCluster(t)
	createTrafficServices(t, cluster)
	t.Cleanup(func() { deleteChangedServices(t, cluster) })
	steps := vm.ListenOnHost(t)
	go serveHostSteps(steps, cluster)

	config := filepath.Join(cluster.Dir, "kube-proxy-ipvs-traffic.yaml")
	ipvsConfig := cluster.KubeProxyConfig("mode: ipvs\nipvs:\n  excludeCIDRs: [" + excludedCIDR + "]\n")
	if err := os.WriteFile(config, []byte(ipvsConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	configs := map[string]string{}
	for _, mode := range []string{"nftables", "iptables"} {
		configs[mode] = filepath.Join(cluster.Dir, "kube-proxy-"+mode+"-traffic.yaml")
		if err := os.WriteFile(configs[mode], []byte(cluster.KubeProxyConfig("mode: "+mode+"\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files := vm.NodeFiles(cluster, cluster.KubeProxy(), config)
	for _, c := range configs {
		files[c] = c
	}
	files["/usr/local/bin/kube-proxy-upstream"] = cluster.UpstreamKubeProxy()
	files["/usr/local/bin/podserver"] = cluster.Podserver()
	files["/usr/local/bin/kube-proxy-explain"] = cluster.KubeProxyExplain()
	files["/usr/local/bin/probe"] = vm.BuildStatic(t, "./probe")
	served, err := monitoring.ServedIn("ipvs")
	if err != nil {
		t.Fatal(err)
	}
	header := fmt.Sprintf("CONFIG=%s CONFIG_NFT=%s CONFIG_IPT=%s SYNC_PERIOD_MS=%d HOST_STEPS=%s A=%s B=%s R=%s\nMON_SERVED=%q MON_NOT_SERVED=%q\n",
		config, configs["nftables"], configs["iptables"], syncPeriod(t, ipvsConfig).Milliseconds(), steps.Addr(), podA, podB, podR,
		strings.Join(served, " "), strings.Join(slices.Sorted(maps.Keys(monitoring.NotServedIn["ipvs"])), " "))
	for _, run := range []struct {
		name, script string
		timeout      time.Duration
	}{
		{"services", trafficScript, 0},
		{"lb-changes", lbChangesScript, 0},
		{"restart-takeover-cleanup", lifecycleScript, 0},
		// Five starts of each proxy under TCG, each waiting for its first
		// sync: some 8 minutes on an idle host, more when the host is busy
		// (upstream's starts took 40 s each instead of 15 s).
		{"switch-modes", switchScript, 15 * time.Minute},
		// Two minutes and a half of it waiting for IPVS's entries to expire.
		{"switch-port-reuse", portReuseScript, 10 * time.Minute},
		// A minute of it the API server's outage.
		{"faults", faultsScript, 15 * time.Minute},
	} {
		t.Run(run.name, func(t *testing.T) {
			vm.Run(t, vm.Config{
				Modules: vm.IPVSModules,
				Network: true,
				Files:   files,
				Script:  header + scriptHelpers + run.script,
				Timeout: run.timeout,
			})
		})
	}
}

// syncPeriod is the syncPeriod of a kube-proxy configuration file: the
// period within which kube-proxy promises to refresh its rules, and so
// the longest another program's change to them may stand.
func syncPeriod(t *testing.T, configFile string) time.Duration {
	t.Helper()
	cfg, err := proxyconfig.Decode([]byte(configFile))
	if err != nil {
		t.Fatal(err)
	}
	period, _ := proxyconfig.SyncPeriods(cfg)
	return period
}

// scriptHelpers set the guest up as node-1 with pods (vm.NodeHelpers), and
// are what the checks are written with. Each check prints one "ok: " line,
// or fails the run with a "FAIL: " line naming it.
const scriptHelpers = vm.NodeAddresses + vm.NodeHelpers + `
# check WHAT CMD...: CMD succeeds; CMD may describe what it saw in DETAIL.
check() {
	what=$1
	shift
	DETAIL=
	"$@" || fail "$what: $DETAIL"
	echo "ok: $what${DETAIL:+ ($DETAIL)}"
}

# eventually WHAT SECONDS CMD...: CMD succeeds within SECONDS (kube-proxy
# has an API change to apply first).
eventually() {
	what=$1 secs=$2 t0=$(date +%s)
	shift 2
	DETAIL=
	until "$@"; do
		[ $(($(date +%s) - t0)) -lt "$secs" ] || fail "$what: not within ${secs}s: $DETAIL"
		sleep 0.5
	done
	echo "ok: $what after $(($(date +%s) - t0))s${DETAIL:+ ($DETAIL)}"
}

# requests FROM URL N: N requests from FROM to URL. GOT is who answered,
# each pod's name once ("failed" for a request without answer), ERR the
# last error, SOURCE the client address the last answering pod saw, DETAIL
# GOT and ERR.
requests() {
	got= ERR=
	for i in $(seq "$3"); do
		if reply=$(request "$1" "$2"); then
			got="$got ${reply%% *}" SOURCE=${reply#* }
		else
			got="$got failed" ERR=$reply
		fi
	done
	GOT=$(echo $got | tr ' ' '\n' | sort -u | xargs)
	DETAIL="answered by: $GOT${ERR:+; $ERR}"
}

# serves PODS FROM URL N: N requests all answered, by exactly PODS.
serves() {
	requests "$2" "$3" "$4"
	[ "$GOT" = "$1" ]
}

# sticky FROM URL N: N requests all answered by the same pod.
sticky() {
	requests "$@"
	case $GOT in pod-a | pod-b) ;; *) false ;; esac
}

# refused FROM URL: the connection is refused at once (rather than
# dropped, which would time out).
refused() {
	requests "$1" "$2" 1
	case $ERR in *"connection refused"*) ;; *) false ;; esac
}

# source_is IP FROM URL: the pod that answers saw the client as IP.
source_is() {
	requests "$2" "$3" 1
	DETAIL="$DETAIL; the pod saw $SOURCE"
	[ "$GOT" != failed ] && [ "${SOURCE%:*}" = "$1" ]
}

# host COMMAND...: has the test make an API change (see serveHostSteps),
# and waits until it has.
host() {
	reply=$(echo "$*" | probe -connect "$HOST_STEPS" -chat | tail -n 1)
	[ "$reply" = done ] || fail "the host could not $*: $reply"
	echo "host: $*"
}

# snapshot FILE: what the kernel holds for kube-proxy, so that anything
# written again shows (nft gives a rewritten rule a new handle, ipset a
# recreated set a new initval); only the packet counters are left out.
snapshot() {
	{
		ipvsadm -S -n
		ipset save
		ip addr show kube-ipvs0
		nft -a list ruleset 2>/dev/null | sed 's/counter packets [0-9]* bytes [0-9]*/counter/'
	} >"$1"
}
# same A B: the snapshots are equal; DETAIL has the lines that differ.
same() {
	DETAIL=$(diff -U0 "$1" "$2" | grep -v -e '^---' -e '^+++' -e '^@@' | tr -s '\t\n' '  ')
	[ -z "$DETAIL" ]
}

# live: requests through the ClusterIP every 50 ms from the client pod, a
# new connection each with a 1 s timeout, until live_ok or live_seen,
# however long kube-proxy takes to be back.
live() {
	ip netns exec client podserver -client tcp://10.96.101.10:80 -load 1h -interval 50ms -timeout 1s >/tmp/live.out 2>&1 &
	LOAD=$!
	sleep 1
}
# live_seen: ends the load; DETAIL says what it saw, as the e2e fault
# tests log it (requests sent, failed, the longest gap between answers,
# the first errors), and FAILED how many failed.
live_seen() {
	kill -TERM $LOAD
	wait $LOAD || :
	set -- $(head -n 1 /tmp/live.out | tr '=' ' ')
	if [ "$1 $3 $5" != "ok failed gap" ]; then
		DETAIL="the load said: $(head -c 300 /tmp/live.out | tr '\n' ' ')" FAILED=unknown
		return 0
	fi
	FAILED=$4
	DETAIL="$(($2 + $4)) requests sent, $4 failed, longest gap between answers $6$(tail -n +2 /tmp/live.out | sed 's/^/; /' | tr -d '\n')"
}
# live_ok: ends the load, none of whose requests failed.
live_ok() {
	live_seen
	[ "$FAILED" = 0 ]
}

# hold NAME: the probe in pod NAME (TCP on 9090: it holds connections).
hold() {
	ip netns exec "$1" probe -listen :9090 -name "$1" &
}

pod pod-a $A
pod pod-b $B
pod client 10.244.0.150
serve pod-a
hold pod-a
serve pod-b
hold pod-b
`

// trafficScript checks each kind of service (see createTrafficServices),
// then endpoint changes and graceful termination, which the test makes
// through the API when the guest asks.
const trafficScript = `
pod pod-r $R
serve pod-r
hold pod-r
# Clients outside the cluster: one inside the LB's loadBalancerSourceRanges, one outside.
pod ext-in 10.255.1.2
pod ext-out 10.255.5.2
start kube-proxy

check "ClusterIP TCP from the node, both endpoints" serves "pod-a pod-b" node tcp://10.96.101.10:80 4
check "ClusterIP TCP from a pod" serves "pod-a pod-b" client tcp://10.96.101.10:80 4
check "ClusterIP UDP from the node" serves "pod-a pod-b" node udp://10.96.101.10:53 4
check "ClusterIP UDP from a pod" serves "pod-a pod-b" client udp://10.96.101.10:53 4
check "NodePort TCP on the node's address, from outside" serves "pod-a pod-b" ext-in tcp://10.255.0.2:30180 4
check "NodePort UDP on the node's address, from outside" serves "pod-a pod-b" ext-in udp://10.255.0.2:30153 4
check "NodePort from the node" serves "pod-a pod-b" node tcp://10.255.0.2:30180 2
check "NodePort with eTP=Cluster: the source is masqueraded" source_is 10.244.0.1 ext-in tcp://10.255.0.2:30180
check "hairpin: a pod reaches itself through its service" serves "pod-a pod-b" pod-a tcp://10.96.101.10:80 4
check "externalIP from outside" serves "pod-a pod-b" ext-in tcp://10.255.2.40:80 4
check "externalIP from the node" serves "pod-a pod-b" node tcp://10.255.2.40:80 2
check "LB IP from a source inside loadBalancerSourceRanges" serves "pod-a pod-b" ext-in tcp://10.255.3.40:80 4
check "LB IP from a source outside loadBalancerSourceRanges: dropped" serves failed ext-out tcp://10.255.3.40:80 1
check "LB IP from the node, outside the ranges too: dropped" serves failed node tcp://10.255.3.40:80 1
check "the same service's externalIP from outside the ranges: no ranges there" serves "pod-a pod-b" ext-out tcp://10.255.2.40:80 2
check "ClientIP affinity: 6 connections, one endpoint" sticky client tcp://10.96.101.20:80 6
check "iTP=Local from a pod: only the local endpoint" serves pod-a client tcp://10.96.101.50:80 4
check "iTP=Local from the node: only the local endpoint" serves pod-a node tcp://10.96.101.50:80 4
check "no endpoints: connection refused" refused client tcp://10.96.101.60:80

# explains ARGS TEXT: kube-proxy-explain ARGS prints TEXT, read with its
# lines joined (the table wraps at 80 columns).
explains() {
	DETAIL=$(kube-proxy-explain $1 2>&1 | tr -s ' \n' '  ')
	case $DETAIL in *"$2"*) DETAIL="says: $2" ;; *) false ;; esac
}
check "explain: the ClusterIP's virtual server" explains default/web "10.96.101.10:80/TCP: rr"
check "explain --verify: the kernel agrees" explains "default/web --verify" "verify: the kernel holds what this node wants"
# names_deleted: verify names a real server deleted by hand. kube-proxy's
# drift check puts it back within about a second, which may come first:
# then it is deleted again, up to 5 times. kube-proxy verifies at most once
# a second (a sooner request waits that long): each try waits out that
# second first, so that the verification follows the deletion at once.
names_deleted() {
	for i in 1 2 3 4 5; do
		sleep 1
		ipvsadm -d -t 10.96.101.10:80 -r $A:8080 2>/dev/null || :
		explains "default/web --verify" "lacks real server $A:8080" && return
	done
	false
}
# trace: where a packet goes, as kube-proxy-explain traces it from the
# mode's decisions and the kernel holds it; the real packets of the checks
# above went the same ways (the client pod's to both pods, ext-out's to
# the LB IP dropped).
TO_CLUSTER_IP="trace --source 10.244.0.150 --destination 10.96.101.10 --port 80 --from pod --verify"
check "trace: the client pod's packet to the ClusterIP, to pod-a at 50 %" explains "$TO_CLUSTER_IP" "$A:8080 50.0%"
check "trace: the client pod's packet to the ClusterIP, to pod-b at 50 %" explains "$TO_CLUSTER_IP" "$B:8080 50.0%"
check "trace --verify: the kernel holds the ClusterIP's objects as traced" explains "$TO_CLUSTER_IP" "Verify: the kernel holds the service's objects as traced"
check "trace: ext-out's packet to the LB IP, dropped by its source ranges" explains "trace --source 10.255.5.2 --destination 10.255.3.40 --port 80 --from external" "Outcome: dropped Reason: source range not allowed"
has_real() { ipvsadm -Ln -t "$1" | grep -q " $2 "; }
check "explain --verify: a real server deleted by hand" names_deleted
# The drift check lists the virtual servers again once a hundred times the
# last listing's CPU time has passed: seconds under emulation, more when
# the host is busy with other tests.
eventually "the real server deleted by hand is put back" 30 has_real 10.96.101.10:80 $A:8080

bound() { ip -4 addr show kube-ipvs0 | grep -q " $1/32 "; }
not_bound() { ! bound "$1"; }
check "an externalIP on kube-ipvs0" bound 10.255.2.40
check "externalIP = the node's IP: not on kube-ipvs0" not_bound 10.255.0.2
check "externalIP = the node's IP: served" serves pod-b ext-in tcp://10.255.0.2:8082 4

# health CODE: the eTP=Local service's health-check node port answers CODE.
health() {
	DETAIL=$(wget -S -O /dev/null http://10.255.0.2:30141/ 2>&1 | awk '/^ *HTTP\// { print $2; exit }')
	[ "$DETAIL" = "$1" ]
}
check "eTP=Local from outside: only the local endpoint" serves pod-a ext-in tcp://10.255.0.2:30140 4
check "eTP=Local: the pod sees the client's own address" source_is 10.255.1.2 ext-in tcp://10.255.0.2:30140
eventually "eTP=Local: the health-check node port answers 200 with a local endpoint" 10 health 200
host endpoints local $R
eventually "eTP=Local: the health-check node port answers 503 without" 30 health 503

# real VS RS: the real server's weight and active connections.
real() { ipvsadm -Ln -t "$1" | awk -v rs="$2" '$2 == rs { print $4, $5 }'; }
# weight VS RS W: the real server is there at weight W.
weight() {
	DETAIL=$(real "$1" "$2")
	[ -n "$DETAIL" ] && [ "${DETAIL% *}" = "$3" ]
}

# flow POD: a UDP request from the client pod's port 40123, one flow
# across requests, is answered by POD.
flow() {
	DETAIL=$(ip netns exec client podserver -client udp://10.96.101.80:53 -sport 40123 -timeout 1s 2>&1)
	[ "${DETAIL%% *}" = "$1" ]
}
check "churn: pod-a serves" serves pod-a client tcp://10.96.101.80:80 2
check "churn: a UDP flow reaches pod-a" flow pod-a
host endpoints churn $B
eventually "churn: pod-b replaces pod-a" 30 serves pod-b client tcp://10.96.101.80:80 2
eventually "churn: the same UDP flow reaches pod-b" 30 flow pod-b
# Its connections linger in TIME_WAIT: graceful termination keeps it.
check "churn: pod-a's TCP real server drains at weight 0" weight 10.96.101.80:80 $A:8080 0
host endpoints churn $A $B
eventually "churn: pod-a is back" 30 serves "pod-a pod-b" client tcp://10.96.101.80:80 4
check "churn: pod-a's TCP real server at weight 1 again" weight 10.96.101.80:80 $A:8080 1
host endpoints churn
eventually "churn: no endpoints left, refused" 30 refused client tcp://10.96.101.80:80

# Graceful termination. The held connection must be the first to the
# service: the real server it lands on must count no other connection.
drain_vs=10.96.101.90:80
mkfifo /tmp/held
ip netns exec client probe -connect $drain_vs -chat </tmp/held >/tmp/held.out 2>&1 &
held=$!
exec 3>/tmp/held
# answers N POD: the held connection has answered N times, the last by
# POD (a pattern).
answers() {
	DETAIL=$(tail -n 1 /tmp/held.out)
	[ "$(wc -l </tmp/held.out)" -ge "$1" ] && case ${DETAIL%% *} in $2) ;; *) false ;; esac
}
eventually "drain: a connection held open" 10 answers 1 "*"
first=$(head -n 1 /tmp/held.out)
case ${first%% *} in
pod-a) X=pod-a XIP=$A Y=pod-b YIP=$B ;;
pod-b) X=pod-b XIP=$B Y=pod-a YIP=$A ;;
*) fail "drain: the held connection got: $first" ;;
esac
weight0() { DETAIL=$(real $drain_vs $XIP:9090); [ "$DETAIL" = "0 1" ]; }
gone() { DETAIL=$(real $drain_vs $XIP:9090); [ -z "$DETAIL" ]; }
host endpoints drain $YIP
eventually "drain: $X's real server at weight 0, with the held connection" 30 weight0
echo ping >&3
eventually "drain: the held connection still answered by $X" 10 answers 2 $X
check "drain: new connections go to $Y" serves $Y client tcp://$drain_vs 4
exec 3>&-
wait $held || fail "drain: the held connection failed: $(cat /tmp/held.out)"
eventually "drain: $X's real server deleted once the connection ended (checked every 10s)" 40 gone

# Every series the rules and the dashboard of deploy/monitoring read is on
# /metrics (MON_SERVED), and none of the other modes' (MON_NOT_SERVED), now
# that endpoints changed (partial syncs, network programming latency, UDP
# flows cleared) and /healthz and /livez were asked, as a kubelet would.
series_served() {
	wget -q -O /dev/null http://127.0.0.1:10256/healthz || :
	wget -q -O /dev/null http://127.0.0.1:10256/livez || :
	m=$(wget -q -O - http://127.0.0.1:10249/metrics) || return 1
	DETAIL=
	for n in $MON_SERVED; do echo "$m" | grep -q "^$n[{ ]" || DETAIL="$DETAIL missing $n"; done
	for n in $MON_NOT_SERVED; do ! echo "$m" | grep -q "^$n[{ ]" || DETAIL="$DETAIL served $n"; done
	[ -z "$DETAIL" ]
}
eventually "the series of deploy/monitoring served, the other modes' not" 20 series_served
`

// lifecycleScript restarts kube-proxy, hands the node to upstream's and
// back, all under live traffic, and cleans up; another program's virtual
// server in excludeCIDRs survives it all.
const lifecycleScript = `
# Another program's virtual servers, there before kube-proxy: it leaves
# the one in excludeCIDRs alone and removes the other, as upstream does.
ipvsadm -A -t 10.255.9.9:80 -s rr
ipvsadm -A -t 10.255.8.8:80 -s rr
has_vs() { ipvsadm -Ln -t "$1" >/dev/null 2>&1; }
no_vs() { ! has_vs "$1"; }
start kube-proxy
check "excludeCIDRs: another program's virtual server survives the first sync" has_vs 10.255.9.9:80
check "a virtual server outside excludeCIDRs is removed" no_vs 10.255.8.8:80
check "ClusterIP" serves "pod-a pod-b" client tcp://10.96.101.10:80 4

snapshot /tmp/before
live
stop
start kube-proxy
check "restart with live traffic: no request failed" live_ok
snapshot /tmp/after
check "the restarted kube-proxy changed nothing" same /tmp/before /tmp/after

live
stop
start kube-proxy-upstream
stop
snapshot /tmp/upstream
start kube-proxy
check "upstream's takeover and back with live traffic: no request failed" live_ok
snapshot /tmp/ours
check "taking over from upstream changed nothing" same /tmp/upstream /tmp/ours
check "excludeCIDRs: the virtual server survives restarts and upstream" has_vs 10.255.9.9:80

stop
kube-proxy --cleanup --config=$CONFIG >>/out/kube-proxy.log 2>&1 || fail "kube-proxy --cleanup failed"
# none CMD...: CMD lists nothing of kube-proxy's.
none() { DETAIL=$("$@" 2>&1 | grep -e KUBE- -e kube-ipvs0 | tr '\n' ' '); [ -z "$DETAIL" ]; }
only_excluded() { DETAIL=$(ipvsadm -S -n | grep -v " 10.255.9.9:80 " | tr '\n' ' '); [ -z "$DETAIL" ]; }
check "--cleanup leaves no virtual server but the excluded one" only_excluded
check "--cleanup leaves no kube-ipvs0" none ip link
check "--cleanup leaves no KUBE- ipset" none ipset list -n
for save in iptables-nft-save ip6tables-nft-save iptables-legacy-save ip6tables-legacy-save; do
	check "--cleanup leaves no KUBE- chain ($save)" none $save
done
`

// createTrafficServices creates the services the scripts reach, with
// hand-written EndpointSlices (the services have no selector).
func createTrafficServices(t *testing.T, c *framework.Cluster) {
	t.Helper()
	port := func(proto v1.Protocol, port, target, nodePort int32) v1.ServicePort {
		return v1.ServicePort{Name: strings.ToLower(string(proto)), Protocol: proto, Port: port,
			TargetPort: intstr.FromInt32(target), NodePort: nodePort}
	}
	tcp := port(v1.ProtocolTCP, 80, 8080, 0)
	lb, local := v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal
	services := []struct {
		name      string
		spec      v1.ServiceSpec
		lbIP      string
		endpoints []string
	}{
		{"web", v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.101.10",
			Ports: []v1.ServicePort{port(v1.ProtocolTCP, 80, 8080, 30180), port(v1.ProtocolUDP, 53, 8080, 30153)}}, "", []string{podA, podB}},
		{"sticky", v1.ServiceSpec{ClusterIP: "10.96.101.20", Ports: []v1.ServicePort{tcp},
			SessionAffinity: v1.ServiceAffinityClientIP}, "", []string{podA, podB}},
		{"lb-ranges", v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.101.30",
			Ports: []v1.ServicePort{port(v1.ProtocolTCP, 80, 8080, 30130)}, ExternalTrafficPolicy: lb,
			ExternalIPs: []string{"10.255.2.40"}, LoadBalancerSourceRanges: []string{"10.255.1.0/24"}}, "10.255.3.40", []string{podA, podB}},
		// A LoadBalancer, without an IP, for its health-check node port.
		{"local", v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.101.40",
			Ports: []v1.ServicePort{port(v1.ProtocolTCP, 80, 8080, 30140)}, ExternalTrafficPolicy: local,
			HealthCheckNodePort: 30141}, "", []string{podA, podR}},
		{"itp", v1.ServiceSpec{ClusterIP: "10.96.101.50", Ports: []v1.ServicePort{tcp},
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyLocal)}, "", []string{podA, podR}},
		{"no-endpoints", v1.ServiceSpec{ClusterIP: "10.96.101.60", Ports: []v1.ServicePort{tcp}}, "", nil},
		{"node-ip", v1.ServiceSpec{ClusterIP: "10.96.101.70", Ports: []v1.ServicePort{port(v1.ProtocolTCP, 8082, 8080, 0)},
			ExternalIPs: []string{framework.NodeIPv4}}, "", []string{podB}},
		{"churn", v1.ServiceSpec{ClusterIP: "10.96.101.80", Ports: []v1.ServicePort{tcp, port(v1.ProtocolUDP, 53, 8080, 0)}},
			"", []string{podA}},
		// The probe's port: it holds connections.
		{"drain", v1.ServiceSpec{ClusterIP: "10.96.101.90", Ports: []v1.ServicePort{port(v1.ProtocolTCP, 80, 9090, 0)}},
			"", []string{podA, podB}},
	}
	ctx := context.Background()
	for _, s := range services {
		svc, err := c.Client.CoreV1().Services(framework.DefaultNamespace).Create(ctx, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: framework.DefaultNamespace}, Spec: s.spec},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating service %s: %v", s.name, err)
		}
		if s.lbIP != "" {
			svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: s.lbIP}}
			if _, err := c.Client.CoreV1().Services(framework.DefaultNamespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("service %s status: %v", s.name, err)
			}
		}
		slice := framework.ServiceEndpointSlice(svc, endpointsAt(s.endpoints)...)
		if _, err := c.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating the endpoint slice of %s: %v", s.name, err)
		}
	}
}

// endpointsAt are ready endpoints at the pods' addresses, on node-2 for
// those in its pod CIDR (10.244.1.0/24) and on node-1 otherwise; an
// address ending in "!" is a starting pod's: neither ready nor serving.
func endpointsAt(addresses []string) []discoveryv1.Endpoint {
	var out []discoveryv1.Endpoint
	for _, a := range addresses {
		a, starting := strings.CutSuffix(a, "!")
		node := framework.NodeName
		if strings.HasPrefix(a, "10.244.1.") {
			node = framework.RemoteNodeName
		}
		ep := framework.ReadyEndpoint(a, node)
		if starting {
			ep.Conditions.Ready, ep.Conditions.Serving = ptr.To(false), ptr.To(false)
		}
		out = append(out, ep)
	}
	return out
}

// serveHostSteps makes the API changes the guest asks for while its
// script runs: it connects (probe -chat), reads "host ready", and sends
// one command per line; the answer is "done" once the change is made, or
// "failed: <why>". The commands:
//
//	endpoints SERVICE [IP...]    sets the endpoints of its EndpointSlice
//	                             (IP! for one not ready)
//	create SERVICE TYPE POLICY CLUSTERIP NODEPORT
//	                             creates a service of one TCP port 80
//	                             (to 8080), with no endpoints
//	lbstatus SERVICE IP          sets the LB IP in its status
//	policy SERVICE Local|Cluster sets its externalTrafficPolicy
//	delete SERVICE               deletes it and its EndpointSlice
//	externalips SERVICE [IP...]  sets the service's externalIPs
//	apiserver stop|start         stops the API server, or starts it again
//	                             and waits until it is ready
func serveHostSteps(l net.Listener, c *framework.Cluster) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return // the test is over
		}
		go func() {
			defer conn.Close()
			fmt.Fprintln(conn, "host ready")
			for sc := bufio.NewScanner(conn); sc.Scan(); {
				answer := "done"
				if err := hostStep(c, strings.Fields(sc.Text())); err != nil {
					answer = "failed: " + err.Error()
				}
				fmt.Fprintln(conn, answer)
			}
		}()
	}
}

func hostStep(c *framework.Cluster, args []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch {
	case len(args) >= 2 && args[0] == "endpoints":
		slices := c.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace)
		slice, err := slices.Get(ctx, args[1]+"-manual", metav1.GetOptions{})
		if err != nil {
			return err
		}
		slice.Endpoints = endpointsAt(args[2:])
		// As the EndpointSlice controller marks a change: kube-proxy
		// measures network programming latency from it.
		if slice.Annotations == nil {
			slice.Annotations = map[string]string{}
		}
		slice.Annotations[v1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339)
		_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		return err
	case len(args) >= 2 && args[0] == "externalips":
		services := c.Client.CoreV1().Services(framework.DefaultNamespace)
		svc, err := services.Get(ctx, args[1], metav1.GetOptions{})
		if err != nil {
			return err
		}
		svc.Spec.ExternalIPs = args[2:]
		_, err = services.Update(ctx, svc, metav1.UpdateOptions{})
		return err
	case len(args) == 2 && args[0] == "apiserver" && args[1] == "stop":
		c.StopAPIServer()
		return nil
	case len(args) == 2 && args[0] == "apiserver" && args[1] == "start":
		return c.StartAPIServer(ctx)
	}
	return serviceChange(ctx, c, args)
}
