package server

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	fakediscovery "k8s.io/client-go/discovery/fake"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/nftables"
)

// The nft tool missing or too old stops the start with knftables' reason
// and what the mode needs.
func TestNFTablesModeNamesWhatIsMissing(t *testing.T) {
	orig := newNFT
	defer func() { newNFT = orig }()
	for _, reason := range []string{
		`could not find nftables binary: exec: "nft": executable file not found in $PATH`,
		"nft version must be v1.0.1 or later (got nftables v0.9.8 (E.D.S.))",
	} {
		newNFT = func(knftables.Family, string) (knftables.Interface, error) { return nil, errors.New(reason) }
		_, err := newNFTablesMode(defaultedMode(t, config.ModeNFTables), familySetup{family: v1.IPv4Protocol})
		if err == nil || !strings.Contains(err.Error(), "nftables mode needs the nft tool (v1.0.1 or later)") || !strings.Contains(err.Error(), reason) {
			t.Errorf("with %q: %v", reason, err)
		}
	}
}

func defaultedMode(t *testing.T, mode kpconfig.ProxyMode) *kpconfig.KubeProxyConfiguration {
	t.Helper()
	cfg := &kpconfig.KubeProxyConfiguration{Mode: mode}
	config.Default(cfg)
	return cfg
}

func TestWithoutLoopback(t *testing.T) {
	if got := withoutLoopback(nil); got != nil {
		t.Errorf("nil (every address) became %v", got)
	}
	if got := withoutLoopback([]netip.Addr{}); got == nil || len(got) != 0 {
		t.Errorf("none became %#v", got)
	}
	in := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::1")}
	if got := withoutLoopback(in); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.0.0.1")}) {
		t.Errorf("got %v", got)
	}
	if !in[0].IsLoopback() {
		t.Error("the input was changed")
	}
}

func TestIPv6Usable(t *testing.T) {
	dir := t.TempDir()
	enabled := &sysctl.Fake{Values: map[string]int{"net/ipv6/conf/all/disable_ipv6": 0}}
	if err := ipv6Usable(enabled, dir); err == nil || !strings.Contains(err.Error(), "no IPv6 support") {
		t.Errorf("without if_inet6: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "if_inet6"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ipv6Usable(enabled, dir); err != nil {
		t.Errorf("enabled: %v", err)
	}
	disabled := &sysctl.Fake{Values: map[string]int{"net/ipv6/conf/all/disable_ipv6": 1}}
	if err := ipv6Usable(disabled, dir); err == nil || !strings.Contains(err.Error(), "disable_ipv6 = 1") {
		t.Errorf("disabled: %v", err)
	}
}

// The tables are deleted through knftables, in both families; a family
// without one is left alone and not reported.
func TestCleanupNFTablesDeletesBothFamiliesTables(t *testing.T) {
	orig := newNFT
	defer func() { newNFT = orig }()
	fakes := map[knftables.Family]*knftables.Fake{
		knftables.IPv4Family: knftables.NewFake(knftables.IPv4Family, nftables.TableName),
		knftables.IPv6Family: knftables.NewFake(knftables.IPv6Family, nftables.TableName),
	}
	newNFT = func(family knftables.Family, table string) (knftables.Interface, error) {
		if table != nftables.TableName {
			t.Errorf("table %q", table)
		}
		return fakes[family], nil
	}
	origExists := nftTableExists
	defer func() { nftTableExists = origExists }()
	nftTableExists = func(family v1.IPFamily) (bool, error) {
		return fakes[nftables.Family(family)].Table != nil, nil
	}
	ctx := context.Background()
	tx := fakes[knftables.IPv4Family].NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "services"})
	if err := fakes[knftables.IPv4Family].Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	removed, err := cleanupNFTables(ctx)
	if err != nil || !slices.Equal(removed, []string{"nftables table ip kube-proxy"}) {
		t.Errorf("removed %v, %v", removed, err)
	}
	for family, f := range fakes {
		if f.Table != nil {
			t.Errorf("%s: the table is still there", family)
		}
	}
	if removed, err := cleanupNFTables(ctx); err != nil || len(removed) > 0 {
		t.Errorf("with no tables: removed %v, %v", removed, err)
	}
}

// A proxier using the service CIDRs gets the ranges of every ServiceCIDR
// object, again after each change.
func TestServiceCIDRsReachTheProxier(t *testing.T) {
	cidr := func(name string, cidrs ...string) *networkingv1.ServiceCIDR {
		return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	}
	client := fake.NewClientset(cidr("kubernetes", "10.96.0.0/16", "fd00:10:96::/112"), cidr("extra", "10.97.0.0/24"))
	servesCIDRs(client)
	proxier := &recordingProxier{usesCIDRs: true}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		_ = watch(ctx, client, defaulted(t), "node-1", nil, proxier, healthcheck.NewProxyHealth(time.Minute))
	}()
	waitFor := func(want ...string) {
		t.Helper()
		for {
			proxier.mu.Lock()
			var got []string
			for _, p := range proxier.cidrs {
				got = append(got, p.String())
			}
			proxier.mu.Unlock()
			slices.Sort(got)
			slices.Sort(want)
			if slices.Equal(got, want) {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("service CIDRs %v, want %v", got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("10.96.0.0/16", "fd00:10:96::/112", "10.97.0.0/24")
	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("10.96.0.0/16", "fd00:10:96::/112")
}

// servesCIDRs makes the fake API server list ServiceCIDRs in discovery, as
// every one since 1.33 does.
func servesCIDRs(client *fake.Clientset) {
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: "networking.k8s.io/v1",
		APIResources: []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}},
	}}
}

// Against an API server older than 1.33, which has no ServiceCIDRs, the
// nftables mode runs without them: no watch that fails forever.
func TestServiceCIDRsLeftOutWhenTheAPIServerLacksThem(t *testing.T) {
	client := fake.NewClientset()
	if servesServiceCIDRs(client) {
		t.Error("an API server without networking.k8s.io/v1 is taken to serve ServiceCIDRs")
	}
	servesCIDRs(client)
	if !servesServiceCIDRs(client) {
		t.Error("an API server listing servicecidrs is taken to lack them")
	}
}

// The gate KubeProxyNFTablesLocalhostNodePorts off changes nothing; on,
// localhost NodePorts are rejected, or served by the userspace proxy for
// TCP when nodePortAddresses holds the family's loopback CIDR; and the
// rejection counters are served by protocol.
func TestNFTablesLocalhostNodePorts(t *testing.T) {
	nft := knftables.NewFake(knftables.IPv4Family, nftables.TableName)
	for _, tc := range []struct {
		name  string
		gate  bool
		cidrs []string
		want  [2]nftables.LocalhostNodePorts
	}{
		{"gate off", false, []string{"127.0.0.0/8", "::1/128"}, [2]nftables.LocalhostNodePorts{nftables.LocalhostNodePortsOff, nftables.LocalhostNodePortsOff}},
		{"no loopback", true, []string{"10.0.0.0/8"}, [2]nftables.LocalhostNodePorts{nftables.LocalhostNodePortsReject, nftables.LocalhostNodePortsReject}},
		{"every address is not explicit", true, []string{"0.0.0.0/0", "::/0"}, [2]nftables.LocalhostNodePorts{nftables.LocalhostNodePortsReject, nftables.LocalhostNodePortsReject}},
		{"localhost keyword", true, config.ExpandNodePortAddresses([]string{"localhost"}, nil), [2]nftables.LocalhostNodePorts{nftables.LocalhostNodePortsProxy, nftables.LocalhostNodePortsProxy}},
		{"IPv4 loopback only", true, []string{"127.0.0.1/32", "fd00::/64"}, [2]nftables.LocalhostNodePorts{nftables.LocalhostNodePortsProxy, nftables.LocalhostNodePortsReject}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaultedMode(t, config.ModeNFTables)
			cfg.NodePortAddresses = tc.cidrs
			if tc.gate {
				cfg.FeatureGates = map[string]bool{string(config.GateNFTablesLocalhostNodePorts): true}
			}
			for i, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
				got, proxy := nftLocalhostNodePorts(cfg, family, nft)
				if got != tc.want[i] || (proxy != nil) != (got == nftables.LocalhostNodePortsProxy) {
					t.Errorf("%s: got %v (proxy %v), want %v", family, got, proxy != nil, tc.want[i])
				}
			}
		})
	}

	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Counter{Name: nftables.LocalhostRejectedCounter(v1.ProtocolUDP)})
	tx.Add(&knftables.Counter{Name: "another"})
	if err := nft.Run(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	nft.Table.Counters[nftables.LocalhostRejectedCounter(v1.ProtocolUDP)].Packets = knftables.PtrTo[uint64](7)
	nft.Table.Counters["another"].Packets = knftables.PtrTo[uint64](9)
	if counts, err := rejectedCounts(t.Context(), nft); err != nil || len(counts) != 1 || counts["UDP"] != 7 {
		t.Errorf("got %v, %v: want UDP 7 only", counts, err)
	}
}
