package nftnl

import (
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// encode writes expressions as the kernel dumps a rule's.
func encode(t *testing.T, exprs ...expr.Any) []byte {
	t.Helper()
	var list []netlink.Attribute
	for _, e := range exprs {
		b, err := expr.Marshal(unix.NFPROTO_IPV4, e)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	b, err := netlink.MarshalAttributes(list)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	daddr   = &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	l4proto = &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}
	tcp     = &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}
	dport   = &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	port80  = &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 80}}
	drop    = &expr.Verdict{Kind: expr.VerdictDrop}
)

// The decoder prints what nft lists for the shapes it knows, and refuses
// anything else rather than print it otherwise than nft would.
func TestRuleDecoding(t *testing.T) {
	for _, tc := range []struct {
		name  string
		exprs []expr.Any
		udata []byte
		want  string // or the error's text, after "error: "
	}{
		{"a comparison and a verdict", []expr.Any{daddr, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{10, 96, 0, 1}}, drop}, nil,
			"ip daddr != 10.96.0.1 drop"},
		{"a prefix by a shorter load", []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 2},
			&expr.Cmp{Register: 1, Data: []byte{10, 244}}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: "x"}}, []byte("\x00\x0chello world\x00"),
			`ip saddr 10.244.0.0/16 goto x comment "hello world"`},
		{"a concatenation in a verdict map", []expr.Any{daddr, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9}, &expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: "service-ips"}}, nil,
			"ip daddr . meta l4proto . th dport vmap @service-ips"},
		{"a port after an l4proto match (nft prints tcp dport)", []expr.Any{l4proto, tcp, dport, port80, drop}, nil,
			"error: payload"},
		{"an expression it does not know", []expr.Any{&expr.Counter{}, drop}, nil,
			`error: expression "counter"`},
		{"a value loaded and never used", []expr.Any{daddr, drop}, nil,
			"error: \"ip daddr\" loaded and never used"},
		{"a comparison other than equal or not", []expr.Any{daddr, &expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: []byte{10, 0, 0, 0}}, drop}, nil,
			"error: cmp: ip daddr compared by"},
		{"a set it was not given", []expr.Any{daddr, &expr.Lookup{SourceRegister: 1, SetName: "elsewhere"}, drop}, nil,
			`error: lookup: set "elsewhere" not in the table`},
		{"userdata other than a comment", []expr.Any{drop}, []byte("\x01\x01x"),
			"error: userdata of type 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serviceIPs := &setInfo{Set: Set{Name: "service-ips", Map: true}, keyTypes: []uint32{typeIPv4, typeInetProto, typeInetService}, keyLen: 12, dataTypes: []uint32{typeVerdict}}
			d := &decoder{family: unix.NFPROTO_IPV4, sets: map[string]*setInfo{"service-ips": serviceIPs}}
			got, err := d.rule(encode(t, tc.exprs...), tc.udata)
			if err != nil {
				got = "error: " + err.Error()
			}
			if want, isErr := strings.CutPrefix(tc.want, "error: "); isErr && !strings.HasPrefix(got, "error: "+want) || !isErr && got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// nft names a base chain's priority after a standard one within 10 of
// it that the hook takes.
func TestPriority(t *testing.T) {
	for _, tc := range []struct {
		hook uint32
		prio int32
		want string
	}{
		{unix.NF_INET_PRE_ROUTING, -100, "dstnat"},
		{unix.NF_INET_PRE_ROUTING, -110, "dstnat - 10"},
		{unix.NF_INET_LOCAL_OUT, -100, "-100"},
		{unix.NF_INET_LOCAL_OUT, -110, "-110"},
		{unix.NF_INET_POST_ROUTING, 100, "srcnat"},
		{unix.NF_INET_FORWARD, 0, "filter"},
		{unix.NF_INET_FORWARD, 5, "filter + 5"},
		{unix.NF_INET_LOCAL_IN, -150, "mangle"},
	} {
		if got := priority(tc.hook, tc.prio); got != tc.want {
			t.Errorf("hook %d priority %d: %q, want %q", tc.hook, tc.prio, got, tc.want)
		}
	}
}
