package server

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
)

// Cleanup removes every rule, chain and table kube-proxy (this one or
// upstream's, in any mode, either iptables backend and both families)
// could have left on this node, and says what it removed.
func Cleanup(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration) error {
	chains, removed, err := cleanupIPTablesModes(cfg)
	tables, nftErr := cleanupNFTables(ctx)
	removed = append(removed, tables...)
	if len(removed) > 0 {
		klog.InfoS("Removed what the IPVS and nftables modes and the nfacct counters left", "removed", removed)
	}
	if err := errors.Join(err, nftErr); err != nil {
		return fmt.Errorf("cleanup incomplete: %w", err)
	}
	if chains == 0 && len(removed) == 0 {
		klog.InfoS("Cleanup done: nothing of kube-proxy's was present")
		return nil
	}
	klog.InfoS("Cleanup done", "iptablesChains", chains, "other", len(removed))
	return nil
}

// cleanupIPTablesModes removes what the iptables and IPVS modes leave:
// the chains and jumps in both families and backends, the IPVS virtual
// servers, link and ipsets, and the nfacct objects; it says how many
// chains and what else it removed.
func cleanupIPTablesModes(cfg *kpconfig.KubeProxyConfiguration) (int, []string, error) {
	total, err := eachIPTables(iptableskernel.Cleanup)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	// After the iptables rules: they may still use the ipsets and the
	// nfacct objects.
	exclude, err := excludeCIDRs(cfg)
	if err != nil {
		return total, nil, errors.Join(append(errs, err)...)
	}
	kernels := ipvsKernels()
	removed, err := ipvs.Cleanup(kernelsOf(kernels), exclude)
	for _, k := range kernels {
		k.Close()
	}
	if err != nil {
		errs = append(errs, err)
	}
	counters, err := iptables.CleanupNFAcctObjects()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range counters {
		removed = append(removed, "nfacct object "+name)
	}
	return total, removed, errors.Join(errs...)
}
