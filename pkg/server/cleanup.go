package server

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	iptablesrunner "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
)

// Cleanup removes every rule and chain kube-proxy (this one or upstream's,
// in either backend and family) could have left on this node, and says
// what it removed.
func Cleanup(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration) error {
	var errs []error
	total := 0
	for _, backend := range []iptablesrunner.Backend{iptablesrunner.NFT, iptablesrunner.Legacy} {
		for _, ipv6 := range []bool{false, true} {
			kernel := iptablesrunner.New(ipv6, backend)
			if kernel.Available() != nil {
				continue
			}
			n, err := iptables.Cleanup(kernel)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s (ipv6=%v): %w", backend, ipv6, err))
			}
			if n > 0 {
				klog.InfoS("Removed kube-proxy chains", "backend", backend, "ipv6", ipv6, "chains", n)
			}
			total += n
		}
	}
	// After the iptables rules: they may still use the ipsets and the
	// nfacct objects.
	exclude, err := excludeCIDRs(cfg)
	if err != nil {
		return err
	}
	removed, err := ipvs.Cleanup(exclude)
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
	tables, err := cleanupNFTables()
	if err != nil {
		errs = append(errs, err)
	}
	removed = append(removed, tables...)
	if len(removed) > 0 {
		klog.InfoS("Removed what the IPVS and nftables modes and the nfacct counters left", "removed", removed)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup incomplete: %w", err)
	}
	if total == 0 && len(removed) == 0 {
		klog.InfoS("Cleanup done: nothing of kube-proxy's was present")
		return nil
	}
	klog.InfoS("Cleanup done", "iptablesChains", total, "other", len(removed))
	return nil
}

// nftablesTable is the table upstream's nftables mode keeps everything in.
const nftablesTable = "kube-proxy"

// cleanupNFTables deletes the nftables mode's table in both families,
// when the nft tool is there to do it.
func cleanupNFTables() ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil
	}
	var removed []string
	var errs []error
	for _, family := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", family, nftablesTable).Run() != nil {
			continue
		}
		if out, err := exec.Command("nft", "delete", "table", family, nftablesTable).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("nft delete table %s %s: %w: %s", family, nftablesTable, err, strings.TrimSpace(string(out))))
			continue
		}
		removed = append(removed, "nftables table "+family+" "+nftablesTable)
	}
	return removed, errors.Join(errs...)
}
