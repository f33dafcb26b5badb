//go:build realnode

package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// nodeKubeProxy is a kube-proxy running in one node's network namespace,
// as its DaemonSet's pod runs it with hostNetwork.
type nodeKubeProxy struct {
	node   *Node
	binary string
	config string
	proc   *framework.Process
}

// startNodeKubeProxy writes the node's config file, starts binary with it
// in the node's network namespace (logging to name.log in the cluster's
// directory) and waits for its /healthz on the node's address.
func startNodeKubeProxy(ctx context.Context, c *framework.Cluster, n *Node, name, binary, mode string) (*nodeKubeProxy, error) {
	config := filepath.Join(c.Dir, name+".yaml")
	if err := os.WriteFile(config, []byte(kubeProxyConfig(c, n, mode)), 0o644); err != nil {
		return nil, err
	}
	proc, err := c.StartProcess(name, n.Command(binary, "--config="+config))
	if err != nil {
		return nil, err
	}
	kp := &nodeKubeProxy{node: n, binary: binary, config: config, proc: proc}
	healthz := "http://" + n.IP + ":10256/healthz"
	client := &http.Client{Timeout: 2 * time.Second}
	err = framework.WaitUntil(ctx, proc, time.Minute, name+"'s /healthz", func() bool {
		resp, err := client.Get(healthz)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusOK
	})
	if err != nil {
		kp.stop()
		return nil, err
	}
	return kp, nil
}

// stop ends the kube-proxy and removes its rules with its own --cleanup,
// as when a cluster changes its kube-proxy.
func (kp *nodeKubeProxy) stop() error {
	kp.proc.Stop()
	if out, err := kp.node.Command(kp.binary, "--config="+kp.config, "--cleanup").CombinedOutput(); err != nil {
		return fmt.Errorf("%s --cleanup on %s: %w\n%s", kp.binary, kp.node.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}
