package nftnl

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// Every rule shape of our tables without an anonymous set (those the
// kernel tests write and list), encoded and decoded again, is the same
// text: the writer is the reader's inverse.
func TestWriterEncodesWhatTheReaderDecodes(t *testing.T) {
	sets := map[string]*setInfo{}
	for name, typ := range map[string]string{
		"cluster-ips":         "ipv4_addr",
		"service-ips":         "ipv4_addr . inet_proto . inet_service : verdict",
		"service-nodeports":   "inet_proto . inet_service : verdict",
		"hairpin-connections": "ipv4_addr . ipv4_addr . inet_proto . inet_service",
		"affinity-x":          "ipv4_addr",
	} {
		info, err := parseSetType(typ, name == "service-ips" || name == "service-nodeports", nil)
		if err != nil {
			t.Fatal(err)
		}
		info.Name = name
		sets[name] = info
	}
	for _, rule := range []string{
		`ct state new jump service-endpoints-check`,
		`ip daddr . meta l4proto . th dport vmap @service-ips`,
		`ip daddr @cluster-ips ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000 comment "masquerade clusterIP traffic from outside cluster"`,
		`ip daddr 10.96.0.0/12 drop comment "Drop traffic to unallocated ClusterIPs"`,
		`meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random`,
		`ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random`,
		`fib daddr type local ip daddr != 127.0.0.1 meta l4proto . th dport vmap @service-nodeports`,
		`fib saddr type local goto service-x comment "short-circuit local traffic"`,
		`iifname "veth*" meta mark set meta mark & 0x0000ffff`,
		`ip daddr @cluster-ips iifname != "eth0" meta mark set 0x00000001`,
		`update @affinity-x { ip saddr }`,
		`ip saddr @affinity-x goto endpoint-x`,
		`meta l4proto tcp numgen random mod 3 0 dnat to 10.244.1.11:8080`,
		`meta l4proto udp dnat to 10.244.1.12`,
		`ip saddr != 203.0.113.10 drop`,
		`reject`,
		`return`,
	} {
		exprs, comment, anon, err := encodeRule(unix.NFPROTO_IPV4, new(uint32), rule)
		if err != nil || len(anon) > 0 {
			t.Errorf("%s: %v, %d anonymous sets", rule, err, len(anon))
			continue
		}
		d := &decoder{family: unix.NFPROTO_IPV4, sets: sets}
		var udata []byte
		if comment != "" {
			udata = userdata(0, comment)
		}
		if got, err := d.rule(encode(t, exprs...), udata); err != nil || got != rule {
			t.Errorf("encoded %q, decoded %q (%v)", rule, got, err)
		}
	}
}

// What the writer does not encode is refused before anything is sent,
// with ErrUnsupported: the syncer then writes the transaction with nft.
func TestWriterRefusesWhatItDoesNotKnow(t *testing.T) {
	w, err := NewWriter("ip", "kube-proxy", func(name string) (string, []string, bool) {
		return map[string]string{"s": "ipv4_addr", "m": "inet_proto . inet_service : verdict", "odd": "ether_addr"}[name], nil, name != "absent"
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"a counter":                       w.AddRule("c", "counter"),
		"tcp dport":                       w.AddRule("c", "tcp dport 80 accept"),
		"a log statement":                 w.AddRule("c", "ip saddr 10.0.0.1 log"),
		"an update with a timeout":        w.AddRule("c", "update @s { ip saddr timeout 10s }"),
		"ct state negated":                w.AddRule("c", "ct state != new drop"),
		"an ip6 match in an ip table":     w.AddRule("c", "ip6 saddr ::1 drop"),
		"th dport after meta l4proto":     w.AddRule("c", "meta l4proto tcp th dport 80 drop"),
		"an unquoted comment":             w.AddRule("c", "drop comment x"),
		"ranges nft would merge":          w.AddRule("c", "ip saddr { 10.0.0.0/8, 10.1.0.0/16 } drop"),
		"an element of an unknown type":   w.AddElement("odd", Element{Key: "00:11:22:33:44:55"}),
		"an element of an unknown set":    w.AddElement("absent", Element{Key: "10.0.0.1"}),
		"an element not of its type":      w.AddElement("s", Element{Key: "fd00::1"}),
		"a map element without verdict":   w.AddElement("m", Element{Key: "tcp . 80", Value: "10.0.0.1"}),
		"a set typed by typeof":           w.AddSet(Set{Name: "t", Type: "ip saddr"}),
		"a base chain at an unknown hook": w.AddChain(Chain{Name: "b", Base: &BaseChain{Type: "filter", Hook: "ingress", Priority: "0"}}),
	} {
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: got %v, want ErrUnsupported", name, err)
		}
	}
	if w.Len() != 0 {
		t.Errorf("%d messages made of refused operations:\n%s", w.Len(), w)
	}
}
