package server

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

// newIPVSMode checks that the kernel can run the IPVS mode (IPVS, the
// scheduler's module), sets the sysctls and timeouts it needs, and builds
// it for one family.
func newIPVSMode(cfg *kpconfig.KubeProxyConfiguration, f familySetup) (proxy.Mode, error) {
	kernel, err := ipvskernel.New(f.family == v1.IPv6Protocol)
	if err != nil {
		return nil, fmt.Errorf("ipvs mode: %w", err)
	}
	scheduler := cfg.IPVS.Scheduler
	if scheduler == "" {
		scheduler = ipvs.DefaultScheduler
	}
	if err := ipvs.CheckScheduler(kernel, ipvs.ModulesDir, scheduler, f.family == v1.IPv6Protocol); err != nil {
		return nil, fmt.Errorf("ipvs mode: %w", err)
	}
	params := ipvs.Params{
		IPv6:          f.family == v1.IPv6Protocol,
		Scheduler:     scheduler,
		MasqueradeBit: int(*cfg.IPTables.MasqueradeBit),
		MasqueradeAll: config.MasqueradeAll(cfg),
		LocalDetector: f.detector,
		NodeIP:        f.nodeIP,
	}
	// The sets are created at start, so that a missing ipset tool or
	// kernel module stops the start with its error, as upstream's check.
	if err := kernel.EnsureSets(params.Sets()); err != nil {
		return nil, fmt.Errorf("ipvs mode needs ipset: %w", err)
	}
	// Upstream exits here; the process serves anyway, as with the
	// conntrack settings (a read-only /proc/sys after --init-only set
	// them finds them set and writes nothing).
	if err := setIPVSParams(cfg); err != nil {
		klog.ErrorS(err, "Could not apply the IPVS mode's sysctls and timeouts; serving without them (connections to removed endpoints, SNAT or forwarding may not work as upstream's)")
	}
	exclude, err := excludeCIDRs(cfg)
	if err != nil {
		return nil, err
	}
	return ipvs.New(ipvs.Config{
		Family: f.family, Kernel: kernel, IPTables: f.iptables,
		Params:            params,
		NodePortAddresses: nodePortAddresses(cfg.NodePortAddresses, f.nodePortAddrs),
		ExcludeCIDRs:      exclude,
	}), nil
}

// nodePortAddresses picks, from the node's current addresses of the
// family, those the IPVS mode's NodePorts answer on: all of them when
// nodePortAddresses does not restrict the family (selected is nil), else
// those it selects (the primary IP, or those in its CIDRs).
func nodePortAddresses(setting []string, selected []netip.Addr) func(node []netip.Addr) []netip.Addr {
	if selected == nil {
		return func(node []netip.Addr) []netip.Addr { return node }
	}
	var prefixes []netip.Prefix
	for _, c := range setting {
		if p, err := netip.ParsePrefix(c); err == nil {
			prefixes = append(prefixes, p)
		}
	}
	return func(node []netip.Addr) []netip.Addr {
		var out []netip.Addr
		for _, a := range node {
			if slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
				out = append(out, a)
			}
		}
		return out
	}
}

// excludeCIDRs are the ranges whose virtual servers belong to other
// programs.
func excludeCIDRs(cfg *kpconfig.KubeProxyConfiguration) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range cfg.IPVS.ExcludeCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("ipvs.excludeCIDRs: %q is not a CIDR", c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// setIPVSParams sets the sysctls and the IPVS connection timeouts the
// IPVS mode needs (with ip_vs loaded: its sysctls exist only then). Every
// sysctl is read first and written only when it differs, so after an
// --init-only run a process without write access to /proc/sys passes.
func setIPVSParams(cfg *kpconfig.KubeProxyConfiguration) error {
	if err := ipvs.SetSysctls(sysctl.Proc{}, ipvs.KernelRelease(), cfg.IPVS.StrictARP); err != nil {
		return fmt.Errorf("ipvs mode: %w", err)
	}
	if err := ipvskernel.SetTimeouts(cfg.IPVS.TCPTimeout.Duration, cfg.IPVS.TCPFinTimeout.Duration, cfg.IPVS.UDPTimeout.Duration); err != nil {
		return fmt.Errorf("ipvs mode: %w", err)
	}
	return nil
}
