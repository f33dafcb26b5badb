package framework

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"time"
)

// Options change what a cluster runs. The zero value is what the
// framework's own tests get: pods are plain objects whose status the
// framework writes, on two Node objects it creates.
type Options struct {
	// RealNodes runs the control plane as a cluster with real kubelets
	// expects it (test/node, and upstream's e2e suite against them): no Node
	// objects are created (the kubelets register theirs), the ServiceAccount
	// admission is on and the controller-manager runs every controller that
	// needs no cloud, with what the service-account token and root CA
	// publishers need; the API server reaches kubelets at their InternalIP
	// with a client certificate of its own. The host and the node
	// namespace are joined by an underlay bridge that more nodes join
	// (AddNodeNetns), not a veth of their own.
	RealNodes bool
	// Scheduler, if set, is a kube-scheduler binary to run (with RealNodes).
	Scheduler string
	// ControlPlane, if set, is a directory holding the kube-apiserver and
	// kube-controller-manager to run instead of the tools' (another
	// Kubernetes version's: hack/build-tools.sh hack/skew/vX.Y).
	ControlPlane string
}

// realNodeControllers are the controller-manager's defaults: the
// cloud controllers among them do nothing without a cloud provider.
const realNodeControllers = "*"

func (c *Cluster) realNodeAPIServerArgs(args []string) ([]string, error) {
	if err := c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil); err != nil {
		return nil, err
	}
	args = slices.DeleteFunc(slices.Clone(args), func(a string) bool {
		return a == "--disable-admission-plugins=ServiceAccount"
	})
	return append(args,
		"--kubelet-client-certificate="+c.pki.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+c.pki.path("apiserver-kubelet-client.key"),
		// A node's name does not resolve on this machine.
		"--kubelet-preferred-address-types=InternalIP",
	), nil
}

func (c *Cluster) realNodeControllerFlags() []string {
	return []string{
		"--service-account-private-key-file=" + c.pki.path("sa.key"),
		"--root-ca-file=" + c.pki.path("ca.crt"),
	}
}

// startForRealNodes starts what RealNodes adds after the control plane.
func (c *Cluster) startForRealNodes() error {
	if c.opts.Scheduler == "" {
		return nil
	}
	kubeconfig, err := c.IssueKubeconfig("scheduler", "system:kube-scheduler", []string{"system:masters"})
	if err != nil {
		return err
	}
	s, err := c.start("kube-scheduler", exec.Command(c.opts.Scheduler,
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=0",
	))
	if err != nil {
		return err
	}
	select {
	case <-s.Exited():
		return fmt.Errorf("kube-scheduler exited: %v\n%s", s.Err(), s.LogTail(20))
	case <-time.After(time.Second):
	}
	return nil
}

// AdminKubeconfig is a cluster-admin kubeconfig (system:masters), for
// clients the framework does not build, such as upstream's e2e.test.
func (c *Cluster) AdminKubeconfig() string { return filepath.Join(c.Dir, "admin.kubeconfig") }

// underlayPrefix is the real nodes' network, 10.255.0.0/24: the API
// server's APIServerIP, the first node's NodeIPv4, then one address per
// node that AddNodeNetns adds.
const underlayPrefix = "/24"

// setUpUnderlay makes the network real nodes share, as a cluster's nodes
// share theirs: a bridge in a namespace of its own, to which the host's
// end of the framework's link (where the API server listens) and the node
// namespace's eth0 are attached. More nodes join it with AddNodeNetns; the
// host keeps a single link, and node-to-node traffic never reaches it.
func (c *Cluster) setUpUnderlay(node *Netns) error {
	underlay, err := newNetns("underlay")
	if err != nil {
		return err
	}
	c.underlay = underlay
	if err := runAll(
		ipCmd(underlay, "link", "add", UnderlayBridge, "type", "bridge"),
		ipCmd(underlay, "link", "set", UnderlayBridge, "up"),
	); err != nil {
		return err
	}
	if err := link(nil, namePrefix+"node0", underlay, "host"); err != nil {
		return err
	}
	if err := runAll(ipCmd(underlay, "link", "set", "host", "master", UnderlayBridge)); err != nil {
		return err
	}
	return c.joinUnderlay(node, "node")
}

// joinUnderlay attaches ns's eth0 to the underlay's bridge as port.
func (c *Cluster) joinUnderlay(ns *Netns, port string) error {
	if err := link(ns, "eth0", c.underlay, port); err != nil {
		return err
	}
	return runAll(ipCmd(c.underlay, "link", "set", port, "master", UnderlayBridge))
}

// UnderlayBridge is the bridge in the underlay's namespace whose ports
// are the nodes' links and the host's.
const UnderlayBridge = "br0"

// UnderlayNetns is the underlay's namespace (Options.RealNodes), for a
// link a caller puts on its bridge (a VM's tap), with an address ip in
// the underlay's /24 as AddNodeNetns gives a node's.
func (c *Cluster) UnderlayNetns() (name string, err error) {
	if c.underlay == nil {
		return "", fmt.Errorf("the cluster has no underlay (Options.RealNodes)")
	}
	return c.underlay.Name, nil
}

// UnderlayCIDR is ip with the underlay's prefix length.
func UnderlayCIDR(ip string) string { return ip + underlayPrefix }

// AddNodeNetns makes the network namespace of another real node (with
// RealNodes): its eth0 on the underlay with address ip (in
// 10.255.0.0/24), forwarding as a node does. A real node's connections to
// service IPs need a route before kube-proxy's DNAT picks the endpoint;
// this one has no default route, so the service CIDR is on-link on the
// underlay, where what kube-proxy does not rewrite finds no neighbour and
// is dropped, as the first node's is on its link to the external
// namespace. It goes with the cluster (Stop, or a later run after a
// killed one: every namespace with the prefix).
func (c *Cluster) AddNodeNetns(name, ip string) (*Netns, error) {
	if c.underlay == nil {
		return nil, fmt.Errorf("node %s: the cluster has no underlay (Options.RealNodes)", name)
	}
	ns, err := newNetns(name)
	if err != nil {
		return nil, err
	}
	if err := c.joinUnderlay(ns, name); err != nil {
		return nil, err
	}
	if err := runAll(
		ipCmd(ns, "addr", "add", ip+underlayPrefix, "dev", "eth0"),
		ipCmd(ns, "route", "add", "10.96.0.0/16", "dev", "eth0"),
		[]string{"ip", "netns", "exec", ns.Name, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	); err != nil {
		return nil, err
	}
	return ns, nil
}
