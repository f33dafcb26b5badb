package vm_test

// portReuseScript switches the node from the IPVS mode to the nftables
// mode, then has a client reuse the ports of connections IPVS forwarded
// and that have ended, for connections the nftables mode's rules serve.
// IPVS keeps an ended connection's entry (TIME_WAIT) for 2 minutes; when
// it expires, the kernel (ip_vs_conn_drop_conntrack) deletes the
// conntrack entry of the same client address and port and virtual
// address and port, which is now the new connection's: the new
// connection's next packet starts a new entry, which the rules may send
// to another pod, and it breaks. With ours the drain deletes the real
// servers whose connections have all ended, and the kernel
// (expire_nodest_conn) expires their entries at once, before a client can
// reuse a port (it holds one a minute in TIME_WAIT after it closed). The
// new connections run past the 2 minutes and must keep their conntrack
// entries and their pods. Its counts are in the log.
const portReuseScript = `
start kube-proxy
check "ClusterIP in IPVS mode" serves "pod-a pod-b" client tcp://10.96.101.10:80 4
# Eight connections through IPVS, from client ports 41000 to 41007, each
# closed by the client after the pod's greeting.
for p in $(seq 41000 41007); do
	reply=$(ip netns exec client podserver -client tcp://10.96.101.10:80 -sport $p -timeout 2s 2>&1) || fail "through IPVS from port $p: $reply"
done
ENDED=$(date +%s)
ended_entries() { ipvsadm -Lnc | grep -c -e ':4100[0-7] ' || :; }
echo "IPVS entries of the ended connections: $(ended_entries)"
conntrack -E -e DESTROY -p tcp -o timestamp >/tmp/ct-destroyed 2>&1 &
EVENTS=$!
sleep 1
stop
CONFIG=$CONFIG_NFT
start kube-proxy
# The first round of the drain comes once the IPVS mode's ipsets are gone.
no_ipsets() { DETAIL=$(ipset list -n | tr '\n' ' '); [ -z "$DETAIL" ]; }
eventually "ipvs -> nftables: the IPVS mode's ipsets are gone" 90 no_ipsets
sleep 2
ENTRIES=$(ended_entries)
echo "IPVS entries of the ended connections $(($(date +%s) - ENDED))s after they ended, after the drain's first round: $ENTRIES"
# The client's TIME_WAIT ends a minute after it closed.
while [ $(($(date +%s) - ENDED)) -lt 62 ]; do sleep 1; done
LEFT=$((ENDED + 120 - $(date +%s)))
[ $LEFT -gt 10 ] || fail "the switch took until ${LEFT}s before IPVS's entries would expire: too late to reuse the ports in time"
HELD_FROM=$(date +%s)
ip netns exec client podserver -client tcp://10.96.101.10:80 -sport 41000 -hold 8 -load $((LEFT + 15))s -interval 1s -timeout 5s >/tmp/reused 2>&1
kill $EVENTS 2>/dev/null || :
wait $EVENTS 2>/dev/null || :
HELD=$(head -n 1 /tmp/reused)
# Entries deleted once the connections were held: the reopening SYNs of
# the first 3 s delete the old connections' entries, as they should.
DELETED=$(awk -v from=$((HELD_FROM + 3)) '{ t = substr($1, 2) + 0 } t > from && /sport=4100[0-7] / { n++ } END { print n + 0 }' /tmp/ct-destroyed)
echo "ports reused: held connections: $HELD; their conntrack entries deleted while held: $DELETED"
[ "$DELETED" = 0 ] || grep 'sport=4100[0-7] ' /tmp/ct-destroyed | tail -n 8
check "connections from reused ports kept their conntrack entries past IPVS's expiry" [ "$DELETED" = 0 ]
check "connections from reused ports kept working" [ "$HELD" = "held=8 broken=0" ]
check "the drain's first round left no entry of an ended connection" [ "$ENTRIES" = 0 ]
stop
`
