package vm_test

// faultsScript is TestIPVSModeWithTraffic's third script: the faults of
// docs/reliability.md that apply to the IPVS mode, each under the live
// load through the web service's ClusterIP, which reports requests sent,
// failed and the longest gap between answers (on the "ok:" line). As in
// test/e2e/faults_test.go: kube-proxy killed and stopped, then started
// again (no request fails, nothing is rewritten); another program
// changing our state (restored as it was within the sync period, counted
// and logged; the time to repair measured); the API server down for 60 s; the xtables lock held
// for 10 s; a refused sysctl write.
const faultsScript = `
start kube-proxy
check "ClusterIP" serves "pod-a pod-b" client tcp://10.96.101.10:80 4

# ms: the guest's clock in milliseconds (/proc/uptime: 10 ms steps).
ms() {
	read up _ </proc/uptime
	echo $(($(echo "$up" | tr -d .) * 10))
}
# metric NAME: our kube-proxy's IPv4 sample of NAME.
metric() {
	wget -q -O - http://127.0.0.1:10249/metrics | awk -v name="$1{ip_family=\"IPv4\"}" '$1 == name { print $2 }'
}
# logged_since BYTES TEXT: the kube-proxy log has TEXT past its first BYTES.
logged_since() {
	DETAIL=$(tail -c +$(($1 + 1)) /out/kube-proxy.log | grep -F -e "$2" | head -n 1)
	[ -n "$DETAIL" ]
}

# Killed (SIGKILL) or stopped (SIGTERM), and started again: no request
# fails and nothing is written again (snapshot: nft's rule handles,
# ipset's initvals, the order of virtual servers and addresses).
for sig in KILL TERM; do
	snapshot /tmp/before
	live
	t0=$(ms)
	kill -$sig $KUBE_PROXY
	wait $KUBE_PROXY || :
	start kube-proxy
	check "SIG$sig and restart with live traffic (synced within $(($(ms) - t0)) ms of the signal, polled every second): no request failed" live_ok
	snapshot /tmp/after
	check "SIG$sig and restart: nothing written again" same /tmp/before /tmp/after
done

# kstate: what kube-proxy keeps in the kernel, in an order that is not the
# kernel's hashing: virtual and real servers, set entries, kube-ipvs0's
# addresses, the nat table (without its counters).
kstate() {
	ipvsadm -S -n | sort
	ipset save | sort
	ip -o addr show kube-ipvs0 | awk '{ print $4 }' | sort
	iptables-nft-save -t nat 2>/dev/null | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]$//'
}
counted() {
	DETAIL="repairs: $(metric kubeproxy_sync_proxy_rules_ipvs_repairs_total)"
	[ "${DETAIL#repairs: }" -gt "$1" ]
}
# tampered WHAT CMD...: CMD, another program, changes our state under the
# live load. kube-proxy must put back exactly what was there within the
# sync period of its configuration (SYNC_PERIOD_MS), the longest kube-proxy
# lets its rules stand changed; how long it took is printed (meant to be
# within 2 s; it includes listing the state, about 0.1 s under TCG). It
# must count the repair and log it, and serve as before.
tampered() {
	fault=$1
	shift
	kstate >/tmp/want
	repairs=$(metric kubeproxy_sync_proxy_rules_ipvs_repairs_total)
	logged=$(wc -c </out/kube-proxy.log)
	live
	"$@" || fail "$fault: $* failed"
	t0=$(ms)
	until kstate >/tmp/got && cmp -s /tmp/got /tmp/want; do
		if [ $(($(ms) - t0)) -ge "$SYNC_PERIOD_MS" ]; then
			same /tmp/want /tmp/got || :
			fail "$fault: not restored within the sync period ($SYNC_PERIOD_MS ms): $DETAIL"
		fi
		sleep 0.05
	done
	took=$(($(ms) - t0))
	sleep 1
	live_seen
	echo "ok: $fault: restored in $took ms (target 2000 ms); the load: $DETAIL"
	eventually "$fault: the repair counted" 5 counted "$repairs"
	check "$fault: the repair logged" logged_since "$logged" "Restored the IPVS mode's kernel state another program had changed"
	check "$fault: served after the repair" serves "pod-a pod-b" client tcp://10.96.101.10:80 4
}
tampered "a virtual server deleted" ipvsadm -D -t 10.96.101.10:80
tampered "a real server deleted" ipvsadm -d -t 10.96.101.10:80 -r $A:8080
tampered "an address removed from kube-ipvs0" ip addr del 10.96.101.10/32 dev kube-ipvs0
tampered "the nat table flushed" iptables-nft -t nat -F
tampered "an ipset entry deleted" ipset del KUBE-CLUSTER-IP 10.96.101.10,tcp:80

# A refused sysctl write: /proc/sys read-only (a mount namespace of its
# own, as a container runtime mounts it), a sysctl the IPVS mode sets at
# another value. Logged, no crash, the traffic flows and a change is
# applied. Upstream exits.
cat >/usr/local/bin/readonly-sysctl <<'EOF'
#!/bin/sh
mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"
EOF
chmod +x /usr/local/bin/readonly-sysctl
sysctl -qw net.ipv4.vs.expire_nodest_conn=0
logged=$(wc -c </out/kube-proxy.log)
live
stop
start "unshare -m readonly-sysctl kube-proxy"
check "restart under a read-only /proc/sys with live traffic: no request failed" live_ok
check "the refused sysctl logged" logged_since "$logged" "Could not apply the IPVS mode's sysctls and timeouts; serving without them"
check "the refusal's reason logged" logged_since "$logged" "read-only file system"
grep -F "Could not apply" /out/kube-proxy.log | tail -n 1
host endpoints churn $A $B
eventually "under a read-only /proc/sys, an endpoint change applied" 30 serves "pod-a pod-b" client tcp://10.96.101.80:80 4
stop
start kube-proxy
expire_nodest_conn() { DETAIL=$(sysctl -n net.ipv4.vs.expire_nodest_conn); [ "$DETAIL" = 1 ]; }
check "started again as usual, it sets the sysctl" expire_nodest_conn

# The API server stopped for 60 s, then started again: the traffic flows
# and /healthz and /livez answer 200 throughout (no change waits for a
# sync), and a change made once it is back is applied (our informers
# resume: client-go's backoff, up to 30 s).
# health_poll: /healthz and /livez once each; BAD counts other answers.
health_poll() {
	for path in healthz livez; do
		wget -q -O /dev/null http://127.0.0.1:10256/$path || BAD=$((BAD + 1))
		POLLS=$((POLLS + 1))
	done
}
live
host apiserver stop
t0=$(ms) BAD=0 POLLS=0
while [ $(($(ms) - t0)) -lt 60000 ]; do
	health_poll
	sleep 2
done
host apiserver start
back=$(ms)
outage_health() { DETAIL="$((POLLS - BAD)) of $POLLS answered 200"; [ $BAD = 0 ]; }
check "API server down for $(((back - t0) / 1000)) s: /healthz and /livez" outage_health
host endpoints churn $B
eventually "a change made once the API server was back applied" 120 serves pod-b client tcp://10.96.101.80:80 2
BAD=0 POLLS=0
health_poll
check "after the outage: /healthz and /livez" outage_health
check "the API server's outage with live traffic: no request failed" live_ok

# The xtables lock held for 10 s by another program (iptables-legacy's;
# the nft backend takes none): kube-proxy on the legacy backend waits to
# write the rule a change needs (the local service's first externalIP: its
# set no longer empty), writes it once the lock is free, and no sync
# fails; the traffic through what is in place flows.
stop
start "env KUBE_PROXY_IPTABLES_BACKEND=legacy kube-proxy"
failures=$(metric kubeproxy_sync_proxy_rules_iptables_restore_failures_total)
written() { iptables-legacy-save -t nat | grep -q -e "--match-set KUBE-EXTERNAL-IP-LOCAL "; }
unwritten() { ! written; }
check "no externalIP of an eTP=Local service yet: no rule for its set" unwritten
logged=$(wc -c </out/kube-proxy.log)
live
# The holder marks when it holds the lock, and holds it until told to
# release it: neither is left to a time.
rm -f /tmp/xtables-held /tmp/xtables-release
flock /run/xtables.lock sh -c 'touch /tmp/xtables-held; until [ -e /tmp/xtables-release ]; do sleep 0.05; done' &
holder=$!
t0=$(ms)
until [ -e /tmp/xtables-held ]; do
	[ $(($(ms) - t0)) -lt 60000 ] || fail "the lock's holder did not take it in a minute"
	sleep 0.05
done
held=$(ms)
host externalips local 10.255.2.41
while [ $(($(ms) - held)) -lt 10000 ]; do
	unwritten || fail "the rule was written $(($(ms) - held)) ms after the lock was taken, while it is held"
	sleep 0.5
done
touch /tmp/xtables-release
wait $holder
released=$(ms)
until written; do
	[ $(($(ms) - released)) -lt 10000 ] || fail "the rule not written within 10 s of the lock's release"
	sleep 0.05
done
echo "ok: the lock held $((released - held)) ms; the rule written $(($(ms) - released)) ms after its release"
# no_failures: neither the restore failures' count nor the log shows a
# failed sync.
no_failures() {
	! logged_since "$logged" "sync failed" || return 1
	DETAIL="restore failures: $failures -> $(metric kubeproxy_sync_proxy_rules_iptables_restore_failures_total)"
	[ -n "$failures" ] && [ "${DETAIL##* }" = "$failures" ]
}
check "no sync failed while the lock was held" no_failures
check "the xtables lock held with live traffic: no request failed" live_ok

echo "what the drift checks found, and how long each check took:"
grep -o 'found=.*checkTook=[^ ]*' /out/kube-proxy.log
`
