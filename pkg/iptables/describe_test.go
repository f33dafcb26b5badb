package iptables

import (
	"slices"
	"testing"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
)

func TestChainDifferences(t *testing.T) {
	want := iptableskernel.OwnChain{Name: "KUBE-SEP-X", Rules: []iptableskernel.Rule{`-m comment --comment "ns/a" -s 10.0.0.1/32 -j KUBE-MARK-MASQ`, "-p tcp -j DNAT --to-destination 10.0.0.1:80"}}
	cases := []struct {
		name string
		have []iptableskernel.Rule
		want []string
	}{
		// iptables prints "-s 10.0.0.1" without the /32, and matches first.
		{"the same rules as iptables prints them", []iptableskernel.Rule{`-s 10.0.0.1 -m comment --comment "ns/a" -j KUBE-MARK-MASQ`, "-p tcp -j DNAT --to-destination 10.0.0.1:80"}, nil},
		{"a rule deleted", []iptableskernel.Rule{"-p tcp -j DNAT --to-destination 10.0.0.1:80"},
			[]string{`nat KUBE-SEP-X lacks: -m comment --comment "ns/a" -s 10.0.0.1/32 -j KUBE-MARK-MASQ`}},
		{"a rule added", append(slices.Clone(want.Rules), "-j DROP"), []string{"nat KUBE-SEP-X has an unwanted rule: -j DROP"}},
		{"the same rules in another order", []iptableskernel.Rule{want.Rules[1], want.Rules[0]}, []string{"nat KUBE-SEP-X has its rules in another order"}},
	}
	for _, tc := range cases {
		if got := chainDifferences(want, tc.have); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestWithoutComment(t *testing.T) {
	got := withoutComment(`-m comment --comment "ns/a:p cluster IP" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-X`)
	if want := "-m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-X"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
