// Package server is the ProxyServer: it connects to the API server, watches
// Services, EndpointSlices and the node's own Node, and drives a proxier.
package server

import (
	"context"
	"errors"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// Options are the inputs of a run that are not part of the configuration file.
type Options struct {
	// Master overrides the API server address of the kubeconfig (--master).
	Master string
}

// Run runs kube-proxy until ctx is cancelled or a fatal error occurs.
func Run(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration, opts Options) error {
	return errors.New("the proxy server is not implemented yet")
}

// Cleanup removes every rule, chain, ipset, IPVS service and link that any
// mode could have left on this node.
func Cleanup(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration) error {
	return errors.New("cleanup is not implemented yet: nothing was removed")
}

// InitOnly does the privileged node set-up (sysctls, conntrack limits) and returns.
func InitOnly(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration) error {
	return errors.New("--init-only is not implemented yet: no sysctl was changed")
}
