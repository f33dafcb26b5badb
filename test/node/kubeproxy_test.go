//go:build realnode

package node

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
)

// nodeKubeProxy is a kube-proxy running in one node's network namespace,
// as its DaemonSet's pod runs it with hostNetwork.
type nodeKubeProxy struct {
	*framework.KubeProxy
	node   *Node
	binary string
}

// startNodeKubeProxy starts binary with the node's config file and flags
// in the node's network namespace (logging to name.log in the cluster's
// directory) and waits for its /healthz on the node's address.
func startNodeKubeProxy(ctx context.Context, c *framework.Cluster, n *Node, name, binary, mode string, flags []string) (*nodeKubeProxy, error) {
	kp, err := c.StartKubeProxyIn(n.netns, n.IP, name, binary, kubeProxyConfig(c, n, mode), flags...)
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

func (kp *nodeKubeProxy) stop() { kp.Stop() }

// cleanup removes the kube-proxy's rules with its own --cleanup.
func (kp *nodeKubeProxy) cleanup() error {
	if out, err := kp.node.Command(kp.binary, "--config="+kp.ConfigPath, "--cleanup").CombinedOutput(); err != nil {
		return fmt.Errorf("%s --cleanup on %s: %w\n%s", kp.binary, kp.node.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// guestKubeProxy is a kube-proxy the agent runs in a guest node (a node
// in the VM), as its DaemonSet's pod runs it with hostNetwork.
type guestKubeProxy struct {
	node                 *Node
	name, binary, config string
	proc                 *vm.GuestProcess
}

// startGuestKubeProxy starts binary in n's guest with the config file at
// config (copied into the guest when it booted) and flags, logging to
// name.log in the guest's /out, and waits for its /healthz on the node's
// address.
func startGuestKubeProxy(ctx context.Context, n *Node, name, binary, config string, flags []string) (*guestKubeProxy, error) {
	proc, err := n.agent.Start("/out/"+name+".log", append([]string{binary, "--config=" + config}, flags...)...)
	if err != nil {
		return nil, err
	}
	kp := &guestKubeProxy{node: n, name: name, binary: binary, config: config, proc: proc}
	err = framework.WaitHealthz(ctx, 3*time.Minute, n.IP, proc.Exited(), proc.Err)
	if err != nil {
		kp.stop()
		return nil, fmt.Errorf("%s: %w; log:\n%s", name, err, kp.logTail(20))
	}
	return kp, nil
}

func (kp *guestKubeProxy) logTail(lines int) string {
	return framework.FileTail(filepath.Join(kp.node.guest.OutDir, kp.name+".log"), lines)
}

func (kp *guestKubeProxy) stop() { kp.node.agent.Stop(kp.proc) }

// cleanup removes the kube-proxy's rules with its own --cleanup.
func (kp *guestKubeProxy) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := kp.node.agent.Run(ctx, "/out/"+kp.name+"-cleanup.log", kp.binary, "--config="+kp.config, "--cleanup"); err != nil {
		return fmt.Errorf("%s --cleanup on %s: %w\n%s", kp.binary, kp.node.Name, err,
			framework.FileTail(filepath.Join(kp.node.guest.OutDir, kp.name+"-cleanup.log"), 20))
	}
	return nil
}
