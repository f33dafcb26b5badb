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
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/kernel"
	"github.com/rapidproxy/rapidproxy/internal/nfgen"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/localnodeport"
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
	localhost, localProxy := nftLocalhostNodePorts(cfg, f.family, nft)
	c := nftables.Config{
		Family: f.family,
		Kernel: nftables.NewKernel(f.family, nft, !config.Enabled(cfg, config.GateNFTablesNetlink)),
		Params: nftables.Params{
			MasqueradeBit:      int(*cfg.NFTables.MasqueradeBit),
			MasqueradeAll:      config.MasqueradeAll(cfg),
			LocalDetector:      f.detector,
			NodePortAddresses:  withoutLoopback(f.nodePortAddrs),
			NodeIP:             f.nodeIP,
			LocalhostNodePorts: localhost,
		},
	}
	if localProxy != nil {
		c.LocalhostProxy = localProxy
	}
	return nftables.New(c)
}

// nftLocalhostNodePorts is what the family's table does with NodePort
// traffic to the loopback address, as upstream decides it: nothing with
// the gate KubeProxyNFTablesLocalhostNodePorts off; with it on, TCP is
// served by a userspace proxy (returned) when nodePortAddresses holds a
// loopback CIDR of the family, and everything else is rejected and
// counted. The gate's metrics are registered with it on, and the
// table's rejection counters served.
func nftLocalhostNodePorts(cfg *kpconfig.KubeProxyConfiguration, family v1.IPFamily, nft knftables.Interface) (nftables.LocalhostNodePorts, *localnodeport.Proxy) {
	if !config.Enabled(cfg, config.GateNFTablesLocalhostNodePorts) {
		return nftables.LocalhostNodePortsOff, nil
	}
	metrics.RegisterLocalhostNodePorts()
	metrics.LocalhostNodePortRejected.AddFamily(string(family), func(ctx context.Context) (map[string]uint64, error) {
		return rejectedCounts(ctx, nft)
	})
	if !explicitLoopback(cfg.NodePortAddresses, family) {
		return nftables.LocalhostNodePortsReject, nil
	}
	klog.InfoS("Serving TCP NodePorts on the loopback address through a userspace proxy", "ipFamily", family)
	return nftables.LocalhostNodePortsProxy, localnodeport.New(context.Background(), family)
}

// explicitLoopback tells whether nodePortAddresses (expanded to CIDRs)
// holds a CIDR of the family that is loopback itself (127.0.0.0/8,
// ::1/128), not one that merely contains it (0.0.0.0/0), as upstream's
// ContainsExplicitLoopback.
func explicitLoopback(cidrs []string, family v1.IPFamily) bool {
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p.Addr().Is4() != (family == v1.IPv4Protocol) {
			continue
		}
		if p.Masked().Addr().IsLoopback() {
			return true
		}
	}
	return false
}

// rejectedCounts are the packets the table's localhost NodePort reject
// counters counted, by protocol; none when there is no table.
func rejectedCounts(ctx context.Context, nft knftables.Interface) (map[string]uint64, error) {
	counters, err := nft.ListCounters(ctx)
	if err != nil {
		if knftables.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	out := map[string]uint64{}
	for _, c := range counters {
		for _, proto := range nftables.LocalhostNodePortProtocols {
			if c != nil && c.Packets != nil && c.Name == nftables.LocalhostRejectedCounter(proto) {
				out[string(proto)] = *c.Packets
			}
		}
	}
	return out, nil
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
// silently, as upstream: the nftables mode cannot DNAT localhost NodePorts
// (with the gate KubeProxyNFTablesLocalhostNodePorts on, a userspace proxy
// serves them instead, see nftLocalhostNodePorts). Nil (every address) stays
// nil: that rule skips 127.0.0.0/8 itself.
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
