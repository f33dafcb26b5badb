package framework

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

func TestNFTablesReaderFindsDestinations(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "ip", "nft")
	// Not "rpx-": a cluster's clean-up removes those.
	ns := &Netns{Name: fmt.Sprintf("nftwatch-test-%d", os.Getpid())}
	if out, err := exec.Command("ip", "netns", "add", ns.Name).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns.Name).Run()
	r, err := ns.NFTablesReader()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	svc := NFTablesServiceChain("default", "web", "http", "tcp")
	if ok, err := r.ChainSendsTo(svc, "10.244.1.2:8080"); ok || err != nil {
		t.Fatalf("before the table: %v, %v", ok, err)
	}
	// Upstream's layouts: the map in the service chain; an endpoint chain.
	cmd := ns.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(`add table ip kube-proxy
add chain ip kube-proxy ` + svc + `
add rule ip kube-proxy ` + svc + ` meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.2 . 8080, 1 : 10.244.1.3 . 8080 }
add chain ip kube-proxy endpoint-X
add rule ip kube-proxy endpoint-X meta l4proto tcp dnat to 10.244.9.9:8080
`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, tc := range []struct {
		chain, dest string
		want        bool
	}{
		{svc, "10.244.1.2:8080", true},
		{svc, "10.244.1.3:8080", true},
		{svc, "10.244.1.3:8081", false},
		{svc, "10.244.1.4:8080", false},
		{"endpoint-X", "10.244.9.9:8080", true},
		{"endpoint-X", "10.244.1.2:8080", false},
		{"no-such-chain", "10.244.1.2:8080", false},
	} {
		if got, err := r.ChainSendsTo(tc.chain, tc.dest); got != tc.want || err != nil {
			t.Errorf("ChainSendsTo(%s, %s) = %v, %v; want %v", tc.chain, tc.dest, got, err, tc.want)
		}
	}
}
