// How a proxier is put together: the mode and family each proxier
// serves, and the node addresses each family uses.

package server

import (
	"errors"
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

// modes are the proxy modes of this build: how each is built, and
// whether it writes through the iptables tools (the nftables mode needs
// none).
var modes = map[kpconfig.ProxyMode]struct {
	build    modeFactory
	iptables bool
}{
	config.ModeIPTables: {newIPTablesMode, true},
	config.ModeIPVS:     {newIPVSMode, true},
	config.ModeNFTables: {newNFTablesMode, false},
}

// proxierSetup is what the proxiers of every family are built from.
type proxierSetup struct {
	cfg *kpconfig.KubeProxyConfiguration
	// build builds the configured mode for a family.
	build modeFactory
	// backend is the iptables backend; empty when the mode needs none.
	backend iptableskernel.Backend
	node    state.Node
	nodeIPs map[v1.IPFamily]netip.Addr
	periods syncPeriods
	health  *healthcheck.ProxyHealth
	detect  localdetect.Settings
	// nodePortAddrs are the node's addresses nodePortAddresses selects;
	// nil when it is unset (every address).
	nodePortAddrs []netip.Addr
	serviceHealth *healthcheck.ServiceHealth
}

// syncPeriods are the configured mode's sync period and minimum interval
// between syncs, resolved once at start.
type syncPeriods struct{ sync, minSync time.Duration }

// newProxier builds one proxier per IP family the node can serve: the
// proxy core, running the configured mode. The primary family must be
// served; a secondary one the node cannot serve is left out.
func newProxier(cfg *kpconfig.KubeProxyConfiguration, nodeName string, node *v1.Node, nodeIPs map[v1.IPFamily]netip.Addr, health *healthcheck.ProxyHealth, periods syncPeriods) (proxy.DualStack, error) {
	s, err := newProxierSetup(cfg, nodeName, node, nodeIPs, health, periods)
	if err != nil {
		return nil, err
	}
	primary := primaryFamily(nodeIPs)
	var proxiers proxy.DualStack
	for _, family := range []v1.IPFamily{primary, otherFamily(primary)} {
		p, err := s.newFamilyProxier(family, family == primary)
		var unserved familyUnserved
		switch {
		case errors.As(err, &unserved) && family != primary:
			klog.InfoS("Not serving the secondary IP family", "ipFamily", family, "err", unserved.error)
			continue
		case err != nil:
			return nil, err
		}
		proxiers = append(proxiers, p)
	}
	return proxiers, nil
}

// newProxierSetup resolves what every family's proxier shares: the mode,
// the iptables backend, the node's zone, local traffic detection, the
// NodePort addresses and the health-check servers.
func newProxierSetup(cfg *kpconfig.KubeProxyConfiguration, nodeName string, node *v1.Node, nodeIPs map[v1.IPFamily]netip.Addr, health *healthcheck.ProxyHealth, periods syncPeriods) (*proxierSetup, error) {
	mode, ok := modes[cfg.Mode]
	if !ok {
		return nil, fmt.Errorf("proxy mode %q is not available in this build; use iptables, ipvs or nftables", cfg.Mode)
	}
	s := &proxierSetup{cfg: cfg, build: mode.build, node: state.Node{Name: nodeName}, nodeIPs: nodeIPs, periods: periods, health: health}
	if mode.iptables {
		backend, err := iptablesBackend()
		if err != nil {
			return nil, err
		}
		s.backend = backend
	}
	if len(cfg.NodePortAddresses) > 0 {
		addrs, err := localAddresses(cfg.NodePortAddresses)
		if err != nil {
			return nil, err
		}
		s.nodePortAddrs = addrs
	}
	var podCIDRs []string
	if node != nil {
		s.node.Zone = node.Labels[v1.LabelTopologyZone]
		podCIDRs = node.Spec.PodCIDRs
	}
	s.detect = detectLocalSettings(cfg, podCIDRs)
	var healthAddrs []string
	for _, a := range s.nodePortAddrs {
		healthAddrs = append(healthAddrs, a.String())
	}
	s.serviceHealth = healthcheck.NewServiceHealth(healthAddrs, health)
	return s, nil
}

// iptablesBackend picks the iptables backend (legacy or nft) the
// iptables-based modes write through.
func iptablesBackend() (iptableskernel.Backend, error) {
	backend, why, err := iptableskernel.DetectBackend()
	if err != nil {
		return "", err
	}
	klog.InfoS("Chose the iptables backend", "backend", backend, "reason", why)
	if legacyErr := iptableskernel.LegacyPermitted(); legacyErr != nil && os.Getenv(iptableskernel.BackendEnv) == "" {
		klog.InfoS("Picked the iptables backend without seeing the legacy one's tables; on a node whose other programs use iptables-legacy, grant CAP_NET_RAW or set "+iptableskernel.BackendEnv+"=legacy",
			"backend", backend, "err", legacyErr)
	}
	return backend, nil
}

// detectLocalSettings are the configured way of telling local traffic,
// with the CIDRs it needs: the cluster's, or the node's pod CIDRs.
func detectLocalSettings(cfg *kpconfig.KubeProxyConfiguration, podCIDRs []string) localdetect.Settings {
	detect := localdetect.Settings{Mode: string(cfg.DetectLocalMode), BridgeInterface: cfg.DetectLocal.BridgeInterface, InterfaceNamePrefix: cfg.DetectLocal.InterfaceNamePrefix}
	switch cfg.DetectLocalMode {
	case config.LocalModeClusterCIDR:
		if cfg.ClusterCIDR != "" {
			detect.CIDRs = strings.Split(cfg.ClusterCIDR, ",")
		}
	case config.LocalModeNodeCIDR:
		detect.CIDRs = podCIDRs
	}
	return detect
}

// primaryFamily is IPv4 when the node has an IPv4 address, else IPv6.
func primaryFamily(nodeIPs map[v1.IPFamily]netip.Addr) v1.IPFamily {
	if _, ok := nodeIPs[v1.IPv4Protocol]; ok {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// familyUnserved is why the node cannot serve an IP family in the mode:
// fatal for the primary family, only logged for the secondary one.
type familyUnserved struct{ error }

func (e familyUnserved) Unwrap() error { return e.error }

// newFamilyProxier builds the proxy core of one family, running the mode
// built for it; only the primary family's runs the health-check node
// port servers.
func (s *proxierSetup) newFamilyProxier(family v1.IPFamily, primary bool) (*proxy.Core, error) {
	var ipt *iptableskernel.Runner
	if s.backend != "" {
		ipt = iptableskernel.New(family == v1.IPv6Protocol, s.backend)
	}
	if err := familyUsable(s.cfg.Mode, family, ipt); err != nil {
		return nil, familyUnserved{err}
	}
	detector, err := localdetect.New(s.detect, family)
	if err != nil {
		return nil, err
	}
	nodeIP, nodePortAddrs := familyNodePorts(s.cfg.NodePortAddresses, s.nodeIPs, s.nodePortAddrs, family)
	mode, err := s.build(s.cfg, familySetup{
		family: family, iptables: ipt, detector: detector, nodeIP: nodeIP, syncPeriod: s.periods.sync,
		nodePortAddrs: nodePortAddrs,
	})
	if err != nil {
		return nil, familyUnserved{err}
	}
	var serviceHealth *healthcheck.ServiceHealth
	if primary {
		serviceHealth = s.serviceHealth
	}
	using := []any{"mode", s.cfg.Mode, "ipFamily", family}
	if s.backend != "" {
		using = append(using, "backend", s.backend)
	}
	klog.InfoS("Using proxier", using...)
	return proxy.NewCore(proxy.Config{
		Family: family, ModeName: string(s.cfg.Mode), Node: s.node,
		MinSyncPeriod: s.periods.minSync, SyncPeriod: s.periods.sync,
		Health: s.health, ServiceHealth: serviceHealth, Conntrack: conntrack.Cleaner{},
	}, mode), nil
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
