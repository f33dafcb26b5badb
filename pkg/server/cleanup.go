package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	iptablesrunner "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
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
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup incomplete: %w", err)
	}
	msg := fmt.Sprintf("Cleanup done: removed %d chains and the rules jumping to them", total)
	if strings.Contains(msg, " 0 chains") {
		msg = "Cleanup done: no kube-proxy rules were present"
	}
	klog.InfoS(msg)
	return nil
}
