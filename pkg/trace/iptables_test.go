package trace

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// Each match keyword Eval knows, alone and negated, and the targets.
func TestIPTablesEval(t *testing.T) {
	pkt := Packet{Source: netip.MustParseAddr("10.244.0.5"), Destination: netip.MustParseAddr("10.96.0.10"), Port: 80,
		Protocol: v1.ProtocolTCP, From: FromPod}
	rs := NewIPTablesRuleset(pkt)
	rs.MatchSet = func(set, flags string) bool { return set == "KUBE-CLUSTER-IP" && flags == "dst,dst" }
	for _, tc := range []struct {
		rule    string
		matched bool
		effect  Effect
		err     string
	}{
		{rule: `-m comment --comment "a b" -m tcp -p tcp -d 10.96.0.10/32 --dport 80 -j KUBE-SVC-X`, matched: true, effect: Effect{Verdict: Jump, Chain: "nat KUBE-SVC-X"}},
		{rule: `-p udp -j ACCEPT`, effect: Effect{Verdict: Accept}},
		{rule: `! -p udp -j DROP`, matched: true, effect: Effect{Verdict: Drop}},
		{rule: `-s 10.244.0.0/16 -j REJECT`, matched: true, effect: Effect{Verdict: Reject}},
		{rule: `! -s 10.244.0.0/16 -d 10.96.0.10 -j RETURN`, effect: Effect{Verdict: Return}},
		{rule: `--dport 443`},
		{rule: `-m ipvs --vaddr 10.96.0.10 --vport 80 --vproto 6`, matched: true},
		{rule: `-m addrtype --dst-type LOCAL`},
		{rule: `-m addrtype ! --src-type LOCAL`, matched: true},
		{rule: `-i cali+`, matched: true},
		{rule: `-m conntrack --ctstate NEW,RELATED`, matched: true},
		{rule: `-m conntrack --ctstate INVALID`},
		{rule: `-m mark --mark 0x4000/0x4000`},
		{rule: `-m set --match-set KUBE-CLUSTER-IP dst,dst`, matched: true},
		{rule: `-m set ! --match-set KUBE-CLUSTER-IP dst,dst`},
		{rule: `-m physdev ! --physdev-is-in`, matched: true},
		{rule: `-m recent --name KUBE-SEP-X --rcheck --seconds 10800 --reap -j KUBE-SEP-X`, effect: Effect{Verdict: Jump, Chain: "nat KUBE-SEP-X"}},
		{rule: `-m statistic --mode random --probability 0.2500000000 -j KUBE-SEP-X`, matched: true, effect: Effect{Verdict: Jump, Chain: "nat KUBE-SEP-X", Share: 0.25}},
		{rule: `-m recent --name KUBE-SEP-X --set -m tcp -p tcp -j DNAT --to-destination 10.244.0.5:8080`, matched: true,
			effect: Effect{Verdict: DNAT, To: netip.MustParseAddrPort("10.244.0.5:8080")}},
		{rule: `-j MARK --or-mark 0x4000`, matched: true, effect: Effect{Masquerade: true}},
		{rule: `-j MASQUERADE --random-fully`, matched: true, effect: Effect{Verdict: Accept, Masquerade: true}},
		{rule: `-j MARK --xor-mark 0x4000`, err: "clears the mark"},
		{rule: `-m statistic --probability x`, err: `probability "x"`},
		{rule: `-j DNAT --to-destination nowhere`, err: `DNAT to "nowhere"`},
		{rule: `-d 10.96.0.300`, err: `address "10.96.0.300"`},
		{rule: `-p`, err: "-p without a value"},
		{rule: `-m set --match-set KUBE-CLUSTER-IP`, err: "--match-set without a set and flags"},
		{rule: `--to-ports 80`, err: `does not know the match or option "--to-ports"`},
		{rule: `stray`, err: `does not know the match or option "stray"`},
	} {
		matched, effect, err := rs.Eval("nat KUBE-SERVICES", tc.rule)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one with %q", tc.rule, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.rule, err)
		case matched != tc.matched || !reflect.DeepEqual(effect, tc.effect):
			t.Errorf("%s: matched %v, %+v; want %v, %+v", tc.rule, matched, effect, tc.matched, tc.effect)
		}
	}
}
