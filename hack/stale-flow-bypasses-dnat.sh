#!/bin/sh
# The kernel's part in docs/reliability.md ("A connection that meets an
# earlier, un-NATed flow"): a SYN to a service address sent before any DNAT
# rule for it exists leaves a conntrack flow in SYN_SENT, not NATed, for
# 2 minutes (nf_conntrack_tcp_timeout_syn_sent). A later connection from
# the same source port to the same address:port is taken for that flow:
# conntrack ignores its SYN (not in the flow's window: the flow's timer is
# not even refreshed), NAT is not looked up again, and the SYN goes where
# the un-NATed address routes, past the DNAT rule that exists by then.
# Four namespaces (rpxt-sf-c client, -r router, -b backend, -x a link where
# nothing answers ARP, as the node's service-CIDR route), removed on exit;
# no packet leaves them. Needs root, iptables-nft, conntrack and
# test/podserver (RAPIDPROXY_PODSERVER, as `make build` writes it).
# Usage: sudo RAPIDPROXY_PODSERVER=_output/bin/podserver hack/stale-flow-bypasses-dnat.sh
set -eu
podserver=${RAPIDPROXY_PODSERVER:-_output/bin/podserver}
c=rpxt-sf-c r=rpxt-sf-r b=rpxt-sf-b x=rpxt-sf-x
server=
trap '[ -n "$server" ] && kill $server; for n in $c $r $b $x; do ip netns del $n 2>/dev/null; done' EXIT
trap 'exit 1' HUP INT PIPE TERM
for n in $c $r $b $x; do ip netns add $n; ip -n $n link set lo up; done
ip link add rpxt-sf0 netns $c type veth peer name rpxt-sf1 netns $r
ip link add rpxt-sf2 netns $b type veth peer name rpxt-sf3 netns $r
ip link add rpxt-sf4 netns $x type veth peer name rpxt-sf5 netns $r
ip -n $c addr add 10.250.8.2/24 dev rpxt-sf0
ip -n $r addr add 10.250.8.1/24 dev rpxt-sf1
ip -n $b addr add 10.250.7.2/24 dev rpxt-sf2
ip -n $r addr add 10.250.7.1/24 dev rpxt-sf3
for l in "$c rpxt-sf0" "$r rpxt-sf1" "$b rpxt-sf2" "$r rpxt-sf3" "$x rpxt-sf4" "$r rpxt-sf5"; do
	set -- $l
	ip -n $1 link set $2 up
done
ip -n $c route add default via 10.250.8.1
ip -n $b route add default via 10.250.7.1
ip -n $r route add 10.250.9.0/24 dev rpxt-sf5
ip netns exec $r sysctl -qw net.ipv4.ip_forward=1
ip netns exec $b "$podserver" -name backend -ports 8080 >/dev/null 2>&1 &
server=$!
sleep 0.5
# Another service's rule: conntrack runs in a namespace only once a rule needs it.
ip netns exec $r iptables-nft -t nat -A PREROUTING -d 10.250.9.6 -p tcp --dport 80 -j DNAT --to-destination 10.250.7.2:8080
request() {
	printf '%s: ' "$1"
	ip netns exec $c "$podserver" -client tcp://10.250.9.5:80 -sport "$2" -timeout "$3" 2>&1 || true
}
request "before the service's rule, from port 40000" 40000 1s
ip netns exec $r iptables-nft -t nat -A PREROUTING -d 10.250.9.5 -p tcp --dport 80 -j DNAT --to-destination 10.250.7.2:8080
request "after it, from port 40002" 40002 2s
request "after it, from port 40000 again" 40000 2s
echo "the router's flows:"
ip netns exec $r conntrack -L -p tcp 2>/dev/null
