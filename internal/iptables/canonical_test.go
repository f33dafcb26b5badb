package iptables

import "testing"

// savedForms pairs a rule as written with its form as iptables-save
// (1.8.9, both backends) prints it back.
var savedForms = []struct{ written, saved string }{
	{`-m comment --comment "ns/svc:p cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-X`,
		`-d 10.96.0.10/32 -p tcp -m comment --comment "ns/svc:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-X`},
	{`-m comment --comment "a" -m sctp -p sctp -d 10.96.0.11 --dport 80 -j KUBE-SVC-X`,
		`-d 10.96.0.11/32 -p sctp -m comment --comment a -m sctp --dport 80 -j KUBE-SVC-X`},
	{`-m comment --comment "ns/svc:p cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ`,
		`! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "ns/svc:p cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ`},
	{`-m comment --comment "ns/svc:p -> 10.244.0.5:8080" -m recent --name KUBE-SEP-A --rcheck --seconds 10800 --reap -j KUBE-SEP-A`,
		`-m comment --comment "ns/svc:p -> 10.244.0.5:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A`},
	{`-m comment --comment "ns/svc:p -> 10.244.0.5:8080" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-A`,
		`-m comment --comment "ns/svc:p -> 10.244.0.5:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-A`},
	{`-m comment --comment "ns/svc:p" -s 10.244.0.5 -j KUBE-MARK-MASQ`,
		`-s 10.244.0.5/32 -m comment --comment "ns/svc:p" -j KUBE-MARK-MASQ`},
	{`-m comment --comment "ns/svc:p" -m recent --name KUBE-SEP-A --set -m tcp -p tcp -j DNAT --to-destination 10.244.0.5:8080`,
		`-p tcp -m comment --comment "ns/svc:p" -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.0.5:8080`},
	{`-p sctp -m comment --comment "a port with type 'hash ip:port'" -m set --match-set S dst,dst -j RETURN`,
		`-p sctp -m comment --comment "a port with type \'hash ip:port\'" -m set --match-set S dst,dst -j RETURN`},
	{`-j MARK --or-mark 0x004000`, `-j MARK --set-xmark 0x4000/0x4000`},
	{`-j MARK --xor-mark 0x004000`, `-j MARK --set-xmark 0x4000/0x0`},
	{`-m mark ! --mark 0x004000/0x004000 -j RETURN`, `-m mark ! --mark 0x4000/0x4000 -j RETURN`},
	{`-m comment --comment "ns/svc:p has no endpoints" -m tcp -p tcp -d 10.96.0.12 --dport 80 -j REJECT`,
		`-d 10.96.0.12/32 -p tcp -m comment --comment "ns/svc:p has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`},
	{`-m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
		`! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`},
	// nfacct's save prints two spaces before the object's name.
	{`-m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP`,
		`-m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP`},
	{`-m comment --comment "ns/svc:p" -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-X`,
		`-d 127.0.0.0/8 -p tcp -m comment --comment "ns/svc:p" -m tcp --dport 30080 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT-X`},
	{`-m comment --comment "x" -m tcp -p tcp -d fd00:10:96::a --dport 80 -j KUBE-SVC-X`,
		`-d fd00:10:96::a/128 -p tcp -m comment --comment x -m tcp --dport 80 -j KUBE-SVC-X`},
}

func TestCanonicalRuleUndoesSaveFormatting(t *testing.T) {
	for _, tc := range savedForms {
		w, s := CanonicalRule(Rule(tc.written)), CanonicalRule(Rule(tc.saved))
		if w != s {
			t.Errorf("written and saved forms differ:\n %s\n %s\nas\n %s\n %s", tc.written, tc.saved, w, s)
		}
		if again := CanonicalRule(Rule(w)); again != w {
			t.Errorf("the canonical form is not its own:\n %s\n %s", w, again)
		}
	}
}

// Every full sync puts each rule, generated and read back, through
// CanonicalRule: at 10k services, 340k calls.
func BenchmarkCanonicalRule(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		for _, tc := range savedForms {
			CanonicalRule(Rule(tc.written))
			CanonicalRule(Rule(tc.saved))
		}
	}
}

func TestCanonicalRuleKeepsDifferences(t *testing.T) {
	base := `-m comment --comment "ns/svc:p" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-X`
	for _, other := range []string{
		`-m comment --comment "ns/svc:p" -m tcp -p tcp -d 10.96.0.11 --dport 80 -j KUBE-SVC-X`,
		`-m comment --comment "ns/svc:p" -m tcp -p tcp -d 10.96.0.10 --dport 81 -j KUBE-SVC-X`,
		`-m comment --comment "ns/svc:p" -m udp -p udp -d 10.96.0.10 --dport 80 -j KUBE-SVC-X`,
		`-m comment --comment "ns/svc:q" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-X`,
		`-m comment --comment "ns/svc:p" -m tcp -p tcp ! -d 10.96.0.10 --dport 80 -j KUBE-SVC-X`,
		`-m comment --comment "ns/svc:p" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-Y`,
		`-m comment --comment "ns/svc:p" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-X -m statistic --mode random --probability 0.5`,
	} {
		if CanonicalRule(Rule(base)) == CanonicalRule(Rule(other)) {
			t.Errorf("these should differ:\n %s\n %s", base, other)
		}
	}
}
