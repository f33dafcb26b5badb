package server

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/conntrack"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// A start in one mode over what another mode programmed switches the
// node's mode without failing a connection: the other mode's rules stay
// in place until this mode's first sync has put its own there, so a new
// connection always meets one complete rule set or the other
// (docs/architecture.md, "Switching modes", says why both can be present
// at once); then they go, all of them and in both families and iptables
// backends, except IPVS virtual servers that still forward connections,
// which stay until those end (ipvs.Retire), at most ipvs.DefaultMaxDrain.

// drainCheckInterval is how often the virtual servers a node that left the
// IPVS mode keeps are checked for their connections' end.
var drainCheckInterval = 10 * time.Second

// switchOver starts a switch: it has /healthz answer 503 from now on,
// before the servers start, while it looks for another mode's objects
// (in the background: the start does not wait for the look, which takes
// four process starts in nftables mode), and until the first sync if it
// finds some. The function it returns removes them once synced is
// closed, returning at once.
func switchOver(cfg *kpconfig.KubeProxyConfiguration, health *healthcheck.ProxyHealth) func(ctx context.Context, synced <-chan struct{}) {
	released := make(chan struct{})
	health.HoldUntil(released)
	found := make(chan []string, 1)
	go func() {
		from := otherModesPresent(cfg)
		if len(from) > 0 {
			klog.InfoS("Switching proxy mode: what the other modes programmed stays until this mode's first sync is in place", "mode", cfg.Mode, "found", from)
			metrics.ModeSwitchInProgress.Set(1)
		} else {
			close(released)
		}
		found <- from
	}()
	return func(ctx context.Context, synced <-chan struct{}) {
		go func() {
			from := <-found
			select {
			case <-ctx.Done():
				return
			case <-synced:
			}
			if len(from) > 0 {
				close(released)
			}
			retireOtherModes(ctx, cfg, from)
			if len(from) > 0 {
				klog.InfoS("Switched proxy mode: nothing of the other modes is left", "mode", cfg.Mode)
			}
			metrics.ModeSwitchInProgress.Set(0)
		}()
	}
}

// otherModesPresent names the other modes whose objects the node holds,
// as cheaply as it can tell: a netlink request for the nftables tables
// and kube-ipvs0, and in the nftables and IPVS modes a listing of one nat
// chain per iptables backend and family. (An IPVS mode start removes the
// iptables mode's chains with its own first restore, in which the nat
// table's KUBE-SERVICES changes from one mode's to the other's at once.)
func otherModesPresent(cfg *kpconfig.KubeProxyConfiguration) []string {
	var from []string
	if cfg.Mode != config.ModeNFTables {
		for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if exists, err := nftTableExists(family); err == nil && exists {
				from = append(from, string(config.ModeNFTables))
				break
			}
		}
	}
	if cfg.Mode != config.ModeIPVS {
		if _, err := netlink.LinkByName(ipvskernel.DummyLink); err == nil {
			from = append(from, string(config.ModeIPVS))
		}
	}
	// The chain both iptables-based modes make, and one only the
	// iptables mode makes.
	if (cfg.Mode == config.ModeNFTables && iptablesChainPresent("KUBE-SERVICES")) ||
		(cfg.Mode == config.ModeIPVS && iptablesChainPresent("KUBE-NODEPORTS")) {
		from = append(from, string(config.ModeIPTables))
	}
	return from
}

// iptablesChainPresent tells whether any iptables backend and family
// holds the nat chain.
func iptablesChainPresent(chain string) bool {
	for _, backend := range []iptableskernel.Backend{iptableskernel.NFT, iptableskernel.Legacy} {
		for _, ipv6 := range []bool{false, true} {
			r := iptableskernel.New(ipv6, backend)
			if r.Available() != nil {
				continue
			}
			if _, err := r.ListRules("nat", chain); err == nil {
				return true
			}
		}
	}
	return false
}

// retireOtherModes removes what the modes other than the configured one
// left: first their rules and sets (removeOtherRules), again every
// drainCheckInterval until nothing fails, then, as their connections
// end, the IPVS mode's virtual servers, addresses and kube-ipvs0.
func retireOtherModes(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration, from []string) {
	for {
		err := removeOtherRules(ctx, cfg, from)
		if err == nil {
			break
		}
		klog.ErrorS(err, "Removing what the other proxy modes left; trying again", "in", drainCheckInterval)
		select {
		case <-ctx.Done():
			return
		case <-time.After(drainCheckInterval):
		}
	}
	if cfg.Mode == config.ModeIPVS || (cfg.Mode == config.ModeIPTables && !slices.Contains(from, string(config.ModeIPVS))) {
		return
	}
	exclude, err := excludeCIDRs(cfg)
	if err != nil {
		klog.ErrorS(err, "Not removing the IPVS mode's virtual servers")
		return
	}
	drainIPVS(ctx, exclude)
}

// removeOtherRules removes, logging what it removed: in every mode the
// nftables mode's tables; in nftables mode the iptables-based modes'
// chains (both backends and families) and nfacct objects; in iptables
// mode, when the IPVS mode was found, the chains only it has; then the
// IPVS mode's ipsets. The iptables mode reads the tables only when
// kube-ipvs0 was found: its restarts stay free of the four table
// listings.
func removeOtherRules(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration, from []string) error {
	var errs []error
	if cfg.Mode != config.ModeNFTables {
		removed, err := cleanupNFTables(ctx)
		if len(removed) > 0 {
			klog.InfoS("Removed the nftables mode's tables", "removed", removed)
		}
		errs = append(errs, err)
	}
	if cfg.Mode == config.ModeIPVS || (cfg.Mode == config.ModeIPTables && !slices.Contains(from, string(config.ModeIPVS))) {
		return errors.Join(errs...)
	}
	removeChains := iptableskernel.Cleanup
	if cfg.Mode == config.ModeIPTables {
		removeChains = iptableskernel.CleanupIPVSModeChains
	}
	chains, err := eachIPTables(removeChains)
	errs = append(errs, err)
	// After the chains, which use them.
	removed, err := ipvs.CleanupSets()
	errs = append(errs, err)
	if cfg.Mode == config.ModeNFTables {
		counters, err := iptables.CleanupNFAcctObjects()
		errs = append(errs, err)
		for _, name := range counters {
			removed = append(removed, "nfacct object "+name)
		}
	}
	if chains > 0 || len(removed) > 0 {
		klog.InfoS("Removed the other modes' iptables chains and ipsets", "iptablesChains", chains, "removed", removed)
	}
	return errors.Join(errs...)
}

// eachIPTables runs remove over every iptables backend and family there
// are tools for, and says how many chains it removed.
func eachIPTables(remove func(iptableskernel.Kernel) (int, error)) (int, error) {
	var errs []error
	total := 0
	for _, backend := range []iptableskernel.Backend{iptableskernel.NFT, iptableskernel.Legacy} {
		for _, ipv6 := range []bool{false, true} {
			kernel := iptableskernel.New(ipv6, backend)
			if kernel.Available() != nil {
				continue
			}
			n, err := remove(kernel)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s (ipv6=%v): %w", backend, ipv6, err))
			}
			total += n
		}
	}
	return total, errors.Join(errs...)
}

// drainIPVS takes the IPVS mode's virtual servers and addresses away as
// their connections end (every drainCheckInterval, all of them after
// ipvs.DefaultMaxDrain), then kube-ipvs0.
func drainIPVS(ctx context.Context, exclude []netip.Prefix) {
	kernels := ipvsKernels()
	defer func() {
		for _, k := range kernels {
			k.Close()
		}
	}()
	if err := ipvs.SetDrainSysctls(sysctl.Proc{}); err != nil {
		klog.ErrorS(err, "The IPVS connections that have ended will expire on their own, up to 2 minutes after they end")
	}
	deadline := time.Now().Add(ipvs.DefaultMaxDrain)
	last := -1
	for {
		force := time.Now().After(deadline)
		draining := 0
		for _, k := range kernels {
			r, err := ipvs.Retire(k, exclude, force)
			if err != nil {
				klog.ErrorS(err, "Removing the IPVS mode's virtual servers")
			}
			draining += r.Draining
			if r.EndedReals > 0 {
				klog.V(2).InfoS("Removed IPVS real servers whose connections had all ended", "realServers", r.EndedReals)
			}
			if len(r.Cut) > 0 {
				klog.InfoS("Removed IPVS virtual servers that still forwarded connections", "virtualServers", len(r.Cut), "bound", ipvs.DefaultMaxDrain)
				releaseUDPFlows(r.Cut)
			}
		}
		metrics.ModeSwitchDrainingVirtualServers.Set(float64(draining))
		if draining != last && draining > 0 {
			klog.InfoS("IPVS virtual servers still forward connections; they stay until those end", "virtualServers", draining, "until", deadline.Format(time.RFC3339))
		}
		last = draining
		if draining == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(drainCheckInterval):
		}
	}
	removed, err := ipvs.Cleanup(kernelsOf(kernels), exclude)
	if err != nil {
		klog.ErrorS(err, "Removing the IPVS mode's leftovers")
	}
	if len(removed) > 0 {
		klog.InfoS("Removed the IPVS mode's leftovers", "removed", removed)
	}
}

// releaseUDPFlows deletes the conntrack entries of UDP flows IPVS was
// forwarding through virtual servers that are gone: their packets no
// longer reach IPVS, and while its entry lives (a client that keeps
// sending keeps it alive) a flow would go nowhere. Without the entry the
// next packet starts a new flow, which this mode's rules take.
func releaseUDPFlows(cut []ipvskernel.VirtualServerKey) {
	byFamily := map[v1.IPFamily][]netip.AddrPort{}
	for _, key := range cut {
		if key.Protocol != v1.ProtocolUDP {
			continue
		}
		family := v1.IPv4Protocol
		if key.Addr.Is6() {
			family = v1.IPv6Protocol
		}
		byFamily[family] = append(byFamily[family], netip.AddrPortFrom(key.Addr, key.Port))
	}
	for family, destinations := range byFamily {
		if err := conntrack.DeleteUDPFlowsTo(family, destinations); err != nil {
			klog.ErrorS(err, "Deleting the conntrack entries of UDP flows IPVS forwarded", "ipFamily", family)
		}
	}
}

// kernelsOf is the mode's view of the adapters.
func kernelsOf(kernels []*ipvskernel.Kernel) []ipvskernel.Interface {
	out := make([]ipvskernel.Interface, len(kernels))
	for i, k := range kernels {
		out[i] = k
	}
	return out
}

// ipvsKernels opens IPVS in each family, when the ip_vs module is loaded:
// without it there is no IPVS state, and loading it would only add some.
func ipvsKernels() []*ipvskernel.Kernel {
	if !ipvskernel.Loaded() {
		return nil
	}
	var kernels []*ipvskernel.Kernel
	for _, ipv6 := range []bool{false, true} {
		k, err := ipvskernel.New(ipv6)
		if err != nil {
			klog.ErrorS(err, "Opening IPVS to remove the IPVS mode's virtual servers", "ipv6", ipv6)
			continue
		}
		kernels = append(kernels, k)
	}
	return kernels
}
