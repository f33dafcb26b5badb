package framework

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// KubeProxy is a kube-proxy process (ours or upstream's) in the node namespace.
type KubeProxy struct {
	*Process
	ConfigPath string
	// HealthzIP is the address its health server answers on: the node's
	// primary IP (NodeIPv4 unless started by StartKubeProxyIn).
	HealthzIP string
}

// KubeProxyConfig returns a config file for this cluster's node; extra is
// appended as YAML (top-level fields, e.g. "mode: ipvs\n").
func (c *Cluster) KubeProxyConfig(extra string) string {
	return "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"clientConnection:\n  kubeconfig: " + c.KubeProxyKubeconfig + "\n" +
		"hostnameOverride: " + NodeName + "\n" +
		"clusterCIDR: " + ClusterCIDRs + "\n" + extra
}

// StartKubeProxy runs binary in the node namespace with the given config
// file content and extra flags, logging to name.log.
func (c *Cluster) StartKubeProxy(name, binary, config string, flags ...string) (*KubeProxy, error) {
	return c.StartKubeProxyUnder(name, nil, binary, config, flags...)
}

// StartKubeProxyUnder is StartKubeProxy with the command line run by a
// wrapper command, e.g. "env", "KEY=value".
func (c *Cluster) StartKubeProxyUnder(name string, wrapper []string, binary, config string, flags ...string) (*KubeProxy, error) {
	return c.startKubeProxy(c.Node, NodeIPv4, name, wrapper, binary, config, flags...)
}

// StartKubeProxyIn is StartKubeProxy in another node's namespace ns, whose
// primary address, healthzIP, its health server answers on.
func (c *Cluster) StartKubeProxyIn(ns *Netns, healthzIP, name, binary, config string, flags ...string) (*KubeProxy, error) {
	return c.startKubeProxy(ns, healthzIP, name, nil, binary, config, flags...)
}

func (c *Cluster) startKubeProxy(ns *Netns, healthzIP, name string, wrapper []string, binary, config string, flags ...string) (*KubeProxy, error) {
	path := filepath.Join(c.Dir, name+".yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return nil, err
	}
	args := append(append(slices.Clone(wrapper), binary, "--config="+path), flags...)
	p, err := c.start(name, ns.Command(args...))
	if err != nil {
		return nil, err
	}
	return &KubeProxy{Process: p, ConfigPath: path, HealthzIP: healthzIP}, nil
}

// StartKubeProxyCommand runs a whole command line (a kube-proxy binary,
// or a wrapper that runs one) in the node namespace, logging to name.log.
func (c *Cluster) StartKubeProxyCommand(name string, args ...string) (*KubeProxy, error) {
	p, err := c.start(name, c.Node.Command(args...))
	if err != nil {
		return nil, err
	}
	return &KubeProxy{Process: p, HealthzIP: NodeIPv4}, nil
}

// Healthz fetches kube-proxy's /healthz from its node's healthz port, as
// the node's primary IP serves it.
func (k *KubeProxy) Healthz() (int, string, error) { return Healthz(k.HealthzIP) }

// Healthz fetches /healthz from a kube-proxy whose node's primary IP is
// healthzIP, on the default healthz port.
func Healthz(healthzIP string) (int, string, error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + net.JoinHostPort(healthzIP, "10256") + "/healthz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// WaitHealthy waits until /healthz answers 200, the process exits, or the
// timeout passes.
func (k *KubeProxy) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	if err := WaitHealthz(ctx, timeout, k.HealthzIP, k.Exited(), k.Err); err != nil {
		return fmt.Errorf("%s: %w; log:\n%s", k.Name, err, k.LogTail(20))
	}
	return nil
}

// WaitHealthz waits until the kube-proxy at healthzIP answers /healthz
// with 200, or its process exits (exited is closed; exitErr says how), or
// the timeout or ctx ends. Callers add the process's name and log.
func WaitHealthz(ctx context.Context, timeout time.Duration, healthzIP string, exited <-chan struct{}, exitErr func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		code, _, err := Healthz(healthzIP)
		if err == nil && code == http.StatusOK {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited: %v", exitErr())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not healthy after %s (last: %d %v)", timeout, code, err)
		}
	}
}
