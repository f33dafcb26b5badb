package vm_test

// switchScript moves the node from the IPVS mode to the nftables mode and
// back, then to the iptables mode and back (SIGTERM, a start in the other
// mode), under clients opening a new connection every 50 ms to a
// ClusterIP, a NodePort and a LoadBalancer IP, and long-lived connections
// through IPVS opened before the first switch that exchange a line every
// second, and UDP flows (one source port each) asked before and after
// each switch which pod answers: with ours none fails or breaks, each UDP
// flow keeps its endpoint, the virtual servers carrying
// the long-lived ones stay while the node runs another mode, and nothing
// else of the IPVS mode does; a switch to the nftables mode killed midway
// is reversed by the next start in the IPVS mode. Then upstream's binary
// goes through the same switches; its figures are printed, not checked.
const switchScript = `
# Clients outside the cluster, inside the LB's loadBalancerSourceRanges:
# one address for the new connections, and one for each kind of held
# connection. IPVS finds a NAT connection's replies by the client's
# address and port and the real server alone, not the virtual server: a
# client that reuses a held connection's port toward another virtual
# server on the same pod (as connect() may, to another destination) has
# the newer connection take the held one's replies, in any mode that
# lets IPVS forward, with or without a switch.
pod ext-in 10.255.1.2
pod ext-lb 10.255.1.3
pod ext-new 10.255.1.4
IPVS=$CONFIG

# clients: new connections to the ClusterIP from a pod, and to a NodePort
# and an LB IP from outside, one after the other, each with a 2 s timeout
# (the guest's one emulated CPU, busy with a kube-proxy's start, can hold
# a reply back for over a second; a SYN the rules drop is sent again only
# after 1 s, and a gap in the rules shows for longer than that); two
# long-lived connections to each, opened now, each waiting 10 s for a line
# back (a connection a switch breaks never gets one; the guest's CPU,
# busy with a starting kube-proxy's reads of every iptables backend and
# family, has held a reply back for over 5 s).
clients_start() {
	ip netns exec client podserver -client tcp://10.96.101.10:80 -load 1h -interval 50ms -timeout 2s >/tmp/new-clusterip 2>&1 &
	CLIENTS=$!
	ip netns exec ext-new podserver -client tcp://10.255.0.2:30180 -load 1h -interval 50ms -timeout 2s >/tmp/new-nodeport 2>&1 &
	CLIENTS="$CLIENTS $!"
	ip netns exec ext-new podserver -client tcp://10.255.3.40:80 -load 1h -interval 50ms -timeout 2s >/tmp/new-lb 2>&1 &
	CLIENTS="$CLIENTS $!"
	ip netns exec client podserver -client tcp://10.96.101.10:80 -hold 2 -load 1h -interval 1s -timeout 10s >/tmp/held-clusterip 2>&1 &
	CLIENTS="$CLIENTS $!"
	ip netns exec ext-in podserver -client tcp://10.255.0.2:30180 -hold 2 -load 1h -interval 1s -timeout 10s >/tmp/held-nodeport 2>&1 &
	CLIENTS="$CLIENTS $!"
	ip netns exec ext-lb podserver -client tcp://10.255.3.40:80 -hold 2 -load 1h -interval 1s -timeout 10s >/tmp/held-lb 2>&1 &
	CLIENTS="$CLIENTS $!"
	sleep 2
}
# clients_seen WHO: ends the clients; prints what each saw, and sets
# FAILED to the failed and broken connections of all of them.
clients_seen() {
	kill -TERM $CLIENTS 2>/dev/null || :
	for pid in $CLIENTS; do wait "$pid" || :; done
	FAILED=0
	for f in new-clusterip new-nodeport new-lb held-clusterip held-nodeport held-lb; do
		line=$(head -n 1 /tmp/$f)
		echo "switch $1: $f: $line $(tail -n +2 /tmp/$f | head -n 3 | tr '\n' ' ')"
		case $line in
		ok=*) n=$(echo "$line" | sed 's/.*failed=\([0-9]*\).*/\1/') ;;
		held=*) n=$(echo "$line" | sed 's/.*broken=\([0-9]*\).*/\1/') ;;
		*) n=unknown ;;
		esac
		[ "$n" = 0 ] || FAILED="$FAILED+$n"
	done
}
# UDP flows from the client to the ClusterIP, one source port each, each
# answered first now, then asked every 5 s in the background until
# udp_flows_stop: that keeps their conntrack entries alive (30 s, or 120 s
# once a flow has lived 2 s; a switch under TCG can take longer than 30 s),
# and an answer from another pod than the flow's first, or none within
# 5 s, is written to /tmp/udp-moved.
udp_flows_start() {
	rm -f /tmp/udp-moved /tmp/udp-first-*
	for p in 40123 40124 40125 40126; do
		reply=$(ip netns exec client podserver -client udp://10.96.101.10:53 -sport $p -timeout 2s 2>&1) || fail "UDP flow from port $p: $reply"
		echo "${reply%% *}" >/tmp/udp-first-$p
	done
	(
		while sleep 5; do
			for p in 40123 40124 40125 40126; do
				reply=$(ip netns exec client podserver -client udp://10.96.101.10:53 -sport $p -timeout 5s 2>&1) || reply="no-answer"
				first=$(cat /tmp/udp-first-$p)
				[ "${reply%% *}" = "$first" ] || echo "$(date +%T) port $p: ${reply%% *}, first $first" >>/tmp/udp-moved
			done
		done
	) &
	UDP_FLOWS=$!
}
udp_flows_stop() {
	kill $UDP_FLOWS 2>/dev/null || :
	wait $UDP_FLOWS 2>/dev/null || :
}
# udp_flows_kept: no UDP flow has moved or gone unanswered so far.
udp_flows_kept() {
	DETAIL=$(cat /tmp/udp-moved 2>/dev/null | tr '\n' ' ')
	[ -z "$DETAIL" ]
}
# switch_keeping_udp WHAT BINARY CONFIG: in_mode, then a check of the UDP
# flows once each has been asked again.
switch_keeping_udp() {
	in_mode "$2" "$3"
	sleep 6
	check "$1: UDP flows keep their endpoints" udp_flows_kept
}
# in_mode BINARY CONFIG: stops kube-proxy, starts BINARY with CONFIG and
# waits for its first sync.
in_mode() {
	stop
	CONFIG=$2
	start "$1"
	sleep 3
}
# The removal of another mode's objects, after the first sync, reads and
# writes each iptables backend and family: tens of seconds under TCG.
none_of_ipvs_chains() {
	DETAIL=$({ iptables-nft-save; ip6tables-nft-save; } | grep -e KUBE-NODE-PORT -e KUBE-LOAD-BALANCER -e KUBE-IPVS -e match-set | tr '\n' ' ')
	[ -z "$DETAIL" ]
}
no_ipsets() {
	sets=$(ipset list -n | tr '\n' ' ')
	DETAIL="$sets; the log: $(grep -e 'Remov' /out/kube-proxy.log | tail -n 3 | tr '\n' ' ')"
	[ -z "$sets" ]
}
has_vs() { ipvsadm -Ln -t "$1" >/dev/null 2>&1; }
no_vs() { ! has_vs "$1"; }
no_nft_tables() { DETAIL=$(nft list tables | grep kube-proxy | tr '\n' ' '); [ -z "$DETAIL" ]; }
switching() { DETAIL=$(wget -q -O - http://127.0.0.1:10249/metrics | grep '^kubeproxy_mode_switch'| tr '\n' ' '); case $DETAIL in *"in_progress $1"*) ;; *) false ;; esac; }

start kube-proxy
check "ClusterIP in IPVS mode" serves "pod-a pod-b" client tcp://10.96.101.10:80 4
clients_start
udp_flows_start
switch_keeping_udp "ipvs -> nftables" kube-proxy $CONFIG_NFT
eventually "ipvs -> nftables: the IPVS mode's chains are gone" 90 none_of_ipvs_chains
eventually "ipvs -> nftables: its ipsets are gone" 90 no_ipsets
check "ipvs -> nftables: a virtual server with long-lived connections stays" has_vs 10.96.101.10:80
check "ipvs -> nftables: one without connections goes" no_vs 10.96.101.20:80
check "ipvs -> nftables: the switch is in progress while they drain" switching 1
switch_keeping_udp "nftables -> ipvs" kube-proxy $IPVS
eventually "nftables -> ipvs: the nftables tables are gone" 30 no_nft_tables
eventually "nftables -> ipvs: the switch is over" 30 switching 0
check "nftables -> ipvs: the virtual server without connections is back" has_vs 10.96.101.20:80
switch_keeping_udp "ipvs -> iptables" kube-proxy $CONFIG_IPT
eventually "ipvs -> iptables: the IPVS mode's chains are gone" 90 none_of_ipvs_chains
eventually "ipvs -> iptables: its ipsets are gone" 90 no_ipsets
check "ipvs -> iptables: a virtual server with long-lived connections stays" has_vs 10.96.101.10:80
switch_keeping_udp "iptables -> ipvs" kube-proxy $IPVS
# Killed midway: a start in the nftables mode killed (SIGKILL) as soon as
# its table appears; the next start, in the IPVS mode, reverses the switch.
stop
kube-proxy --config=$CONFIG_NFT --v=2 >>/out/kube-proxy.log 2>&1 &
midway=$!
i=0
until nft list table ip kube-proxy >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 1200 ] || fail "killed midway: no nftables table within a minute"
	sleep 0.05
done
kill -9 $midway
wait $midway || :
CONFIG=$IPVS
start kube-proxy
eventually "killed midway to nftables, then started in IPVS: no nftables table left" 60 no_nft_tables
eventually "killed midway: the switch is over" 60 switching 0
udp_flows_stop
check "ours: UDP flows kept their endpoints through every switch" udp_flows_kept
clients_seen ours
[ "$FAILED" = 0 ] || grep -v -e nfacct -e 'Feature gate' -e reflector /out/kube-proxy.log | tail -n 120
check "ours: no connection failed or broke through four switches and a killed one" [ "$FAILED" = 0 ]

in_mode kube-proxy-upstream $IPVS
clients_start
in_mode kube-proxy-upstream $CONFIG_NFT
in_mode kube-proxy-upstream $IPVS
in_mode kube-proxy-upstream $CONFIG_IPT
in_mode kube-proxy-upstream $IPVS
clients_seen upstream
echo "ok: upstream through the same switches: failed or broken: $FAILED"
stop
`
