package localdetect

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestNew(t *testing.T) {
	cases := []struct {
		name            string
		settings        Settings
		family          v1.IPFamily
		ifLocal, notLoc string
		wantErr         bool
		// nft and nftNot are the nftables forms, as nft lists them.
		nft, nftNot string
	}{
		{"cluster CIDR v4", Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16", "fd00::/48"}}, v1.IPv4Protocol, "[-s 10.244.0.0/16]", "[! -s 10.244.0.0/16]", false, "ip saddr 10.244.0.0/16", "ip saddr != 10.244.0.0/16"},
		{"cluster CIDR v6 of a dual-stack pair", Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16", "fd00::/48"}}, v1.IPv6Protocol, "[-s fd00::/48]", "[! -s fd00::/48]", false, "ip6 saddr fd00::/48", "ip6 saddr != fd00::/48"},
		{"CIDR is masked", Settings{Mode: "NodeCIDR", CIDRs: []string{"10.244.1.7/24"}}, v1.IPv4Protocol, "[-s 10.244.1.0/24]", "[! -s 10.244.1.0/24]", false, "ip saddr 10.244.1.0/24", "ip saddr != 10.244.1.0/24"},
		{"no CIDR of the family: no detection", Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16"}}, v1.IPv6Protocol, "[]", "[]", false, "", ""},
		{"no CIDR at all: no detection", Settings{Mode: "ClusterCIDR"}, v1.IPv4Protocol, "[]", "[]", false, "", ""},
		{"bad CIDR", Settings{Mode: "ClusterCIDR", CIDRs: []string{"nope"}}, v1.IPv4Protocol, "", "", true, "", ""},
		{"bridge", Settings{Mode: "BridgeInterface", BridgeInterface: "cbr0"}, v1.IPv6Protocol, "[-i cbr0]", "[! -i cbr0]", false, `iifname "cbr0"`, `iifname != "cbr0"`},
		{"bridge missing", Settings{Mode: "BridgeInterface"}, v1.IPv4Protocol, "", "", true, "", ""},
		{"prefix", Settings{Mode: "InterfaceNamePrefix", InterfaceNamePrefix: "veth"}, v1.IPv4Protocol, "[-i veth+]", "[! -i veth+]", false, `iifname "veth*"`, `iifname != "veth*"`},
		{"prefix missing", Settings{Mode: "InterfaceNamePrefix"}, v1.IPv4Protocol, "", "", true, "", ""},
		{"unknown mode", Settings{Mode: "Magic"}, v1.IPv4Protocol, "", "", true, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.settings, tc.family)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if got := fmt.Sprint(d.IfLocal()); got != tc.ifLocal {
				t.Errorf("IfLocal = %s, want %s", got, tc.ifLocal)
			}
			if got := fmt.Sprint(d.IfNotLocal()); got != tc.notLoc {
				t.Errorf("IfNotLocal = %s, want %s", got, tc.notLoc)
			}
			if d.IfLocalNFT() != tc.nft || d.IfNotLocalNFT() != tc.nftNot {
				t.Errorf("nft forms = %q, %q, want %q, %q", d.IfLocalNFT(), d.IfNotLocalNFT(), tc.nft, tc.nftNot)
			}
			if d.Implemented() != (tc.ifLocal != "[]") {
				t.Errorf("Implemented = %v", d.Implemented())
			}
		})
	}
}
