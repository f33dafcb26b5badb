//go:build realnode

package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// nodeKubeProxy is a kube-proxy running in one node's network namespace,
// as its DaemonSet's pod runs it with hostNetwork.
type nodeKubeProxy struct {
	*framework.KubeProxy
	node   *Node
	binary string
}

// startNodeKubeProxy starts binary with the node's config file in the
// node's network namespace (logging to name.log in the cluster's
// directory) and waits for its /healthz on the node's address.
func startNodeKubeProxy(ctx context.Context, c *framework.Cluster, n *Node, name, binary, mode string) (*nodeKubeProxy, error) {
	kp, err := c.StartKubeProxyIn(n.netns, n.IP, name, binary, kubeProxyConfig(c, n, mode))
	if err != nil {
		return nil, err
	}
	proxy := &nodeKubeProxy{KubeProxy: kp, node: n, binary: binary}
	if err := kp.WaitHealthy(ctx, time.Minute); err != nil {
		proxy.stop()
		return nil, err
	}
	return proxy, nil
}

// stop ends the kube-proxy and removes its rules with its own --cleanup,
// as when a cluster changes its kube-proxy.
func (kp *nodeKubeProxy) stop() error {
	kp.Stop()
	if out, err := kp.node.Command(kp.binary, "--config="+kp.ConfigPath, "--cleanup").CombinedOutput(); err != nil {
		return fmt.Errorf("%s --cleanup on %s: %w\n%s", kp.binary, kp.node.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}
