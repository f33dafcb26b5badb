// How a proxier is put together: the mode and family each proxier
// serves, and the node addresses each family uses.

package server

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/conntrack"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// newProxier builds one proxier per IP family the node can serve: the
// proxy core, running the configured mode.
func newProxier(cfg *kpconfig.KubeProxyConfiguration, nodeName string, node *v1.Node, nodeIPs map[v1.IPFamily]netip.Addr, health *healthcheck.ProxyHealth) (proxy.DualStack, error) {
	var newMode modeFactory
	switch cfg.Mode {
	case config.ModeIPTables:
		newMode = newIPTablesMode
	case config.ModeIPVS:
		newMode = newIPVSMode
	case config.ModeNFTables:
		newMode = newNFTablesMode
	default:
		return nil, fmt.Errorf("proxy mode %q is not available in this build; use iptables, ipvs or nftables", cfg.Mode)
	}
	// The nftables mode needs no iptables tools.
	iptablesBased := cfg.Mode != config.ModeNFTables
	var backend iptableskernel.Backend
	var err error
	if iptablesBased {
		var why string
		if backend, why, err = iptableskernel.DetectBackend(); err != nil {
			return nil, err
		}
		klog.InfoS("Chose the iptables backend", "backend", backend, "reason", why)
		if legacyErr := iptableskernel.LegacyPermitted(); legacyErr != nil && os.Getenv(iptableskernel.BackendEnv) == "" {
			klog.InfoS("Picked the iptables backend without seeing the legacy one's tables; on a node whose other programs use iptables-legacy, grant CAP_NET_RAW or set "+iptableskernel.BackendEnv+"=legacy",
				"backend", backend, "err", legacyErr)
		}
	}
	sync, minSync := config.SyncPeriods(cfg)
	var nodePortAddrs []netip.Addr
	if len(cfg.NodePortAddresses) > 0 {
		if nodePortAddrs, err = localAddresses(cfg.NodePortAddresses); err != nil {
			return nil, err
		}
	}
	zone := ""
	var podCIDRs []string
	if node != nil {
		zone = node.Labels[v1.LabelTopologyZone]
		podCIDRs = node.Spec.PodCIDRs
	}
	detect := localdetect.Settings{Mode: string(cfg.DetectLocalMode), BridgeInterface: cfg.DetectLocal.BridgeInterface, InterfaceNamePrefix: cfg.DetectLocal.InterfaceNamePrefix}
	switch cfg.DetectLocalMode {
	case config.LocalModeClusterCIDR:
		if cfg.ClusterCIDR != "" {
			detect.CIDRs = strings.Split(cfg.ClusterCIDR, ",")
		}
	case config.LocalModeNodeCIDR:
		detect.CIDRs = podCIDRs
	}

	var healthAddrs []string
	for _, a := range nodePortAddrs {
		healthAddrs = append(healthAddrs, a.String())
	}
	serviceHealth := healthcheck.NewServiceHealth(healthAddrs, health)

	primary := v1.IPv4Protocol
	if _, ok := nodeIPs[v1.IPv4Protocol]; !ok {
		primary = v1.IPv6Protocol
	}
	var proxiers proxy.DualStack
	for _, family := range []v1.IPFamily{primary, otherFamily(primary)} {
		var ipt *iptableskernel.Runner
		if iptablesBased {
			ipt = iptableskernel.New(family == v1.IPv6Protocol, backend)
		}
		if err := familyUsable(cfg.Mode, family, ipt); err != nil {
			if family == primary {
				return nil, err
			}
			klog.InfoS("Not serving the secondary IP family", "ipFamily", family, "err", err)
			continue
		}
		detector, err := localdetect.New(detect, family)
		if err != nil {
			return nil, err
		}
		nodeIP, familyNodePortAddrs := familyNodePorts(cfg.NodePortAddresses, nodeIPs, nodePortAddrs, family)
		mode, err := newMode(cfg, familySetup{
			family: family, iptables: ipt, detector: detector, nodeIP: nodeIP, syncPeriod: sync,
			nodePortAddrs: familyNodePortAddrs,
		})
		if err != nil {
			if family == primary {
				return nil, err
			}
			klog.InfoS("Not serving the secondary IP family", "ipFamily", family, "err", err)
			continue
		}
		// Only one family runs the health-check node port servers.
		var sh *healthcheck.ServiceHealth
		if family == primary {
			sh = serviceHealth
		}
		proxiers = append(proxiers, proxy.NewCore(proxy.Config{
			Family: family, ModeName: string(cfg.Mode),
			Node:          state.Node{Name: nodeName, Zone: zone},
			MinSyncPeriod: minSync, SyncPeriod: sync,
			Health: health, ServiceHealth: sh, Conntrack: conntrack.Cleaner{},
		}, mode))
		using := []any{"mode", cfg.Mode, "ipFamily", family}
		if iptablesBased {
			using = append(using, "backend", backend)
		}
		klog.InfoS("Using proxier", using...)
	}
	return proxiers, nil
}

// familyUsable tells whether the node can serve a family in the mode: the
// iptables-based modes need the family's iptables tools (ipt), the
// nftables mode an IPv6-enabled kernel for IPv6 (its nft serves both).
func familyUsable(mode kpconfig.ProxyMode, family v1.IPFamily, ipt *iptableskernel.Runner) error {
	if ipt != nil {
		if err := ipt.Available(); err != nil {
			return fmt.Errorf("%s mode needs the iptables tools: %w", mode, err)
		}
		return nil
	}
	if family == v1.IPv6Protocol {
		return ipv6Usable(sysctl.Proc{}, "/proc/net")
	}
	return nil
}

// familySetup is what every mode is built from for one IP family.
type familySetup struct {
	family v1.IPFamily
	// iptables is nil in the nftables mode.
	iptables   *iptableskernel.Runner
	detector   localdetect.Detector
	nodeIP     netip.Addr
	syncPeriod time.Duration
	// nodePortAddrs are nodePortAddresses' addresses of the family; nil
	// when it is unset (every address).
	nodePortAddrs []netip.Addr
}

// modeFactory builds one proxy mode for one IP family.
type modeFactory func(cfg *kpconfig.KubeProxyConfiguration, f familySetup) (proxy.Mode, error)

func otherFamily(f v1.IPFamily) v1.IPFamily {
	if f == v1.IPv4Protocol {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

// familyNodePorts is what a family's proxier is built with: the node's IP
// of the family (familyNodeIP), and the addresses its NodePorts answer on
// out of nodePortAddrs, those nodePortAddresses (setting) selects, nil
// for every local address when it does not restrict the family.
func familyNodePorts(setting []string, nodeIPs map[v1.IPFamily]netip.Addr, nodePortAddrs []netip.Addr, family v1.IPFamily) (netip.Addr, []netip.Addr) {
	nodeIP := familyNodeIP(nodeIPs, family)
	return nodeIP, ofFamily(nodePortAddrs, family, restrictsFamily(setting, family))
}

// familyNodeIP is the node's primary IP of the family, or the family's
// loopback address when the node has none, as upstream passes it to each
// family's proxier.
func familyNodeIP(nodeIPs map[v1.IPFamily]netip.Addr, family v1.IPFamily) netip.Addr {
	if a, ok := nodeIPs[family]; ok {
		return a
	}
	if family == v1.IPv6Protocol {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// restrictsFamily tells whether nodePortAddresses limits the NodePorts of
// a family, as upstream decides it: it does when it holds a CIDR of the
// family and none of them is /0 (a family without any answers on all its
// addresses).
func restrictsFamily(setting []string, family v1.IPFamily) bool {
	restricted := false
	for _, c := range setting {
		p, err := netip.ParsePrefix(c)
		if err != nil || familyOf(p.Addr()) != family {
			continue
		}
		if p.Bits() == 0 {
			return false
		}
		restricted = true
	}
	return restricted
}

// ofFamily keeps the addresses of one family; nil (all local addresses)
// unless restricted is set.
func ofFamily(addrs []netip.Addr, family v1.IPFamily, restricted bool) []netip.Addr {
	if !restricted {
		return nil
	}
	out := []netip.Addr{}
	for _, a := range addrs {
		if familyOf(a) == family {
			out = append(out, a)
		}
	}
	return out
}
