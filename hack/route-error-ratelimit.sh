#!/bin/sh
# The kernel's part in docs/reliability.md ("Packets during rule changes"):
# SYNs that a router cannot route (a pod whose namespace is gone while the
# rules still lead to it) are answered with ICMP "network unreachable" only
# as the route-error rate limit allows (net.ipv4.route.error_burst = 5 s,
# error_cost = 1 s per source host: 5 at once, then one a second); the
# others vanish, so the client waits out its SYN retransmission timer.
# Two namespaces (rpxt-icmp-c, rpxt-icmp-r), removed on exit; no packet
# leaves them. Needs root and test/podserver (RAPIDPROXY_PODSERVER, as
# `make build` writes it).
# Usage: sudo RAPIDPROXY_PODSERVER=_output/bin/podserver hack/route-error-ratelimit.sh
set -eu
podserver=${RAPIDPROXY_PODSERVER:-_output/bin/podserver}
c=rpxt-icmp-c r=rpxt-icmp-r
ip netns add $c
ip netns add $r
trap 'ip netns del $c; ip netns del $r' EXIT
ip link add rpxt-icmp0 netns $c type veth peer name rpxt-icmp1 netns $r
ip -n $c addr add 10.250.0.2/24 dev rpxt-icmp0
ip -n $r addr add 10.250.0.1/24 dev rpxt-icmp1
ip -n $c link set rpxt-icmp0 up
ip -n $r link set rpxt-icmp1 up
ip -n $c route add default via 10.250.0.1
ip netns exec $r sysctl -qw net.ipv4.ip_forward=1
echo "route error_burst=$(sysctl -n net.ipv4.route.error_burst) error_cost=$(sysctl -n net.ipv4.route.error_cost) (jiffies)"
# 200 connections in 1 s to an address the router has no route for.
ip netns exec $c "$podserver" -client tcp://10.251.0.9:80 -probe 1s -interval 5ms -timeout 2500ms |
	awk '{ n[$3 " " ($2 < 900000 ? "at once" : "after a retransmission or never")]++ }
	     END { for (k in n) print n[k], k }'
