package server

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/kernel"
	"github.com/rapidproxy/rapidproxy/internal/nfgen"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/nftables"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

// newNFT opens a family's kube-proxy table; knftables.New checks that the
// nft tool is there, is v1.0.1 or later, and works. The syncer streams its
// transactions to nft (nftables.Streamer). Tests replace it.
var newNFT = func(family knftables.Family, table string) (knftables.Interface, error) {
	nft, err := knftables.New(family, table)
	if err != nil {
		return nil, err
	}
	return nftables.NewStreamer(nft)
}

// newNFTablesMode checks, as upstream does, that the node can run the
// nftables mode (the nft tool, v1.0.1 or later, and a kernel of 5.13 or
// later unless KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK is set), and
// builds it for one family.
func newNFTablesMode(cfg *kpconfig.KubeProxyConfiguration, f familySetup) (proxy.Mode, error) {
	nft, err := openNFTables(f.family)
	if err != nil {
		return nil, err
	}
	if err := kernel.CheckNFTables(os.Getenv(kernel.SkipNFTablesCheckEnv), kernel.Release); err != nil {
		return nil, err
	}
	// Served from the start, at zero, as the sync failures' counter.
	metrics.NFTablesCleanupFailuresTotal.WithLabelValues(string(f.family))
	return nftables.New(nftables.Config{
		Family: f.family, NFT: nft,
		NFTOnly: !config.Enabled(cfg, config.GateNFTablesNetlink),
		Params: nftables.Params{
			MasqueradeBit:     int(*cfg.NFTables.MasqueradeBit),
			MasqueradeAll:     config.MasqueradeAll(cfg),
			LocalDetector:     f.detector,
			NodePortAddresses: withoutLoopback(f.nodePortAddrs),
			NodeIP:            f.nodeIP,
		},
	})
}

// openNFTables opens the family's kube-proxy table, naming what is
// missing when it cannot.
func openNFTables(family v1.IPFamily) (knftables.Interface, error) {
	nft, err := newNFT(nftables.Family(family), nftables.TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables mode needs the nft tool (v1.0.1 or later) and nf_tables in the kernel: %w", err)
	}
	return nft, nil
}

// withoutLoopback drops loopback addresses from nodePortAddresses
// silently, as upstream: the nftables mode has no localhost NodePorts. Nil
// (every address) stays nil: that rule skips 127.0.0.0/8 itself.
func withoutLoopback(addrs []netip.Addr) []netip.Addr {
	return slices.DeleteFunc(slices.Clone(addrs), netip.Addr.IsLoopback)
}

// ipv6Usable tells whether the kernel has IPv6 on, as upstream checks it
// for the nftables mode (nft itself serves both families).
func ipv6Usable(s sysctl.Interface, procNet string) error {
	if _, err := os.Stat(procNet + "/if_inet6"); err != nil {
		return errors.New("the kernel has no IPv6 support")
	}
	if v, err := s.Get("net/ipv6/conf/all/disable_ipv6"); err == nil && v == 1 {
		return errors.New("IPv6 is disabled in the kernel (net.ipv6.conf.all.disable_ipv6 = 1)")
	}
	return nil
}

// nftTableExists tells whether the kernel holds the nftables mode's table
// of the family; tests replace it with their fake's answer.
var nftTableExists = func(family v1.IPFamily) (bool, error) {
	proto := uint8(unix.NFPROTO_IPV4)
	if family == v1.IPv6Protocol {
		proto = unix.NFPROTO_IPV6
	}
	return nfgen.TableExists(proto, nftables.TableName)
}

// cleanupNFTables deletes the nftables mode's table in both families
// (ours or upstream's), when the nft tool is there to do it.
func cleanupNFTables(ctx context.Context) ([]string, error) {
	var removed []string
	var errs []error
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		// Most starts find no table: one netlink request tells, where
		// nft would take three processes.
		if exists, err := nftTableExists(family); err == nil && !exists {
			continue
		}
		nft, err := newNFT(nftables.Family(family), nftables.TableName)
		if err != nil {
			// No usable nft: nothing can have written the table either.
			continue
		}
		if _, err := nft.List(ctx, "chains"); knftables.IsNotFound(err) {
			continue
		}
		name := fmt.Sprintf("nftables table %s %s", nftables.Family(family), nftables.TableName)
		if err := nftables.Cleanup(ctx, nft); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
