package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Addresses of the cluster; see the package documentation.
const (
	APIServerIP     = "10.255.0.1"
	NodeIPv4        = "10.255.0.2"
	NodeIPv6        = "fd00:255::2"
	NodeExternalIP  = "10.255.1.1"
	PodGatewayIPv4  = "10.244.0.1" // the node's end of every pod's veth
	ExternalIPv4    = "10.255.1.2"
	ClusterCIDRs    = "10.244.0.0/16,fd00:244::/56"
	ServiceCIDRs    = "10.96.0.0/16,fd00:10:96::/112"
	NodeName        = "node-1"
	Zone            = "zone-a"
	apiServerPort   = "6443"
	etcdClientURL   = "http://127.0.0.1:23790"
	etcdPeerURL     = "http://127.0.0.1:23800"
	startupDeadline = 2 * time.Minute
)

// Cluster is a running local cluster.
type Cluster struct {
	// Dir holds certificates, kubeconfigs, logs and etcd's data.
	Dir string
	// Client is a cluster-admin client for the tests.
	Client kubernetes.Interface
	// KubeProxyKubeconfig authenticates as system:kube-proxy, which has
	// only the system:node-proxier permissions.
	KubeProxyKubeconfig string
	Node                *Netns
	External            *Netns
	// underlay holds the bridge real nodes share (Options.RealNodes only).
	underlay *Netns

	bins      binaries
	opts      Options
	pki       *pki
	lock      *os.File
	processes []*Process
	// apiServerArgs start kube-apiserver, again after StopAPIServer.
	apiServerArgs []string
	apiServer     *Process

	mu        sync.Mutex
	pods      map[string]*Pod
	nextHost  int
	freeHosts []int // of removed pods, oldest first
}

// Start brings up a cluster, first removing whatever a killed run left.
// Only one cluster runs on a machine at a time: Start waits for the other.
func Start(ctx context.Context) (*Cluster, error) { return StartWith(ctx, Options{}) }

// StartWith is Start with options; Options{} is what Start runs.
func StartWith(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster needs root (network namespaces, iptables)")
	}
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(bins.root, "_output", "cluster")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := lockMachine()
	if err != nil {
		return nil, err
	}
	killRecorded()
	if err := cleanupLeftovers(); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, bins: bins, lock: lock, opts: opts, pods: map[string]*Pod{}, nextHost: 10}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := c.setUpNetwork(); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := c.startControlPlane(ctx); err != nil {
		return nil, err
	}
	if opts.RealNodes {
		if err := c.startForRealNodes(); err != nil {
			return nil, err
		}
		return c, nil
	}
	if err := c.createNodes(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Stop ends every process and removes every namespace and link. It is safe
// to call more than once.
func (c *Cluster) Stop() {
	c.mu.Lock()
	pods := c.pods
	c.pods = map[string]*Pod{}
	c.mu.Unlock()
	for _, p := range pods {
		p.Server.Stop()
	}
	for i := len(c.processes) - 1; i >= 0; i-- {
		c.processes[i].Stop()
	}
	c.processes = nil
	killRecorded()
	_ = cleanupLeftovers()
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
}

// lockMachine waits until no other cluster (or clean-up test) runs on the
// machine, from this checkout or another.
func lockMachine() (*os.File, error) {
	if err := os.MkdirAll(machineState, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(machineState, "cluster.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, fmt.Errorf("waiting for another local cluster to finish: %w", err)
	}
	return lock, nil
}

func (c *Cluster) setUpNetwork() error {
	node, err := newNetns("node")
	if err != nil {
		return err
	}
	c.Node = node
	external, err := newNetns("external")
	if err != nil {
		return err
	}
	c.External = external
	// The host (the API server) and the node share a /30, or with real
	// nodes the underlay's /24, which more nodes join (AddNodeNetns).
	prefix := "/30"
	if c.opts.RealNodes {
		if err := c.setUpUnderlay(node); err != nil {
			return err
		}
		prefix = underlayPrefix
	} else if err := link(nil, namePrefix+"node0", node, "eth0"); err != nil {
		return err
	}
	if err := link(node, "eth1", external, "eth0"); err != nil {
		return err
	}
	return runAll(
		ipCmd(nil, "addr", "add", APIServerIP+prefix, "dev", namePrefix+"node0"),
		ipCmd(nil, "addr", "add", "fd00:255::1/64", "dev", namePrefix+"node0", "nodad"),
		ipCmd(node, "addr", "add", NodeIPv4+prefix, "dev", "eth0"),
		ipCmd(node, "addr", "add", NodeIPv6+"/64", "dev", "eth0", "nodad"),
		ipCmd(node, "addr", "add", NodeExternalIP+"/24", "dev", "eth1"),
		ipCmd(node, "addr", "add", "fd00:255:1::1/64", "dev", "eth1", "nodad"),
		ipCmd(external, "addr", "add", ExternalIPv4+"/24", "dev", "eth0"),
		ipCmd(external, "addr", "add", "fd00:255:1::2/64", "dev", "eth0", "nodad"),
		ipCmd(external, "route", "add", "default", "via", NodeExternalIP),
		ipCmd(external, "-6", "route", "add", "default", "via", "fd00:255:1::1"),
		// The node's own connections to service IPs need a route before
		// kube-proxy's DNAT picks the endpoint; a real node has a default
		// route. Without rules they end in the external namespace.
		ipCmd(node, "route", "add", "10.96.0.0/16", "dev", "eth1"),
		ipCmd(node, "-6", "route", "add", "fd00:10:96::/112", "dev", "eth1"),
		[]string{"ip", "netns", "exec", node.Name, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"},
	)
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	pki, err := newPKI(c.Dir)
	if err != nil {
		return err
	}
	c.pki = pki
	steps := []error{
		pki.issue("apiserver", "kube-apiserver", nil,
			[]net.IP{net.ParseIP(APIServerIP), net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
			[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"}),
		pki.issue("admin", "admin", []string{"system:masters"}, nil, nil),
		pki.issue("kube-proxy", "system:kube-proxy", nil, nil, nil),
		// The controller-manager runs without per-controller service accounts;
		// it acts for the EndpointSlice controller, which needs more than its own role.
		pki.issue("controller-manager", "system:kube-controller-manager", []string{"system:masters"}, nil, nil),
		pki.serviceAccountKey(),
	}
	if err := errors.Join(steps...); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	server := "https://" + net.JoinHostPort(APIServerIP, apiServerPort)
	if _, err := pki.kubeconfig("admin", server); err != nil {
		return err
	}
	if c.KubeProxyKubeconfig, err = pki.kubeconfig("kube-proxy", server); err != nil {
		return err
	}
	kcmConfig, err := pki.kubeconfig("controller-manager", server)
	if err != nil {
		return err
	}

	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	controlPlane := c.bins.tools
	if c.opts.ControlPlane != "" {
		controlPlane = c.opts.ControlPlane
	}
	c.apiServerArgs = []string{filepath.Join(controlPlane, "kube-apiserver"),
		"--etcd-servers=" + etcdClientURL,
		"--bind-address=" + APIServerIP,
		"--secure-port=" + apiServerPort,
		"--advertise-address=" + APIServerIP,
		"--tls-cert-file=" + pki.path("apiserver.crt"),
		"--tls-private-key-file=" + pki.path("apiserver.key"),
		"--client-ca-file=" + pki.path("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + pki.path("sa.key"),
		"--service-account-signing-key-file=" + pki.path("sa.key"),
		"--service-cluster-ip-range=" + ServiceCIDRs,
		"--authorization-mode=RBAC",
		// As kubeadm's API server: kube-proxy's DaemonSet is privileged.
		"--allow-privileged=true",
		// No kubelet and no service-account controller run here: pods are
		// plain objects whose status the framework writes.
		"--disable-admission-plugins=ServiceAccount",
		"--endpoint-reconciler-type=none",
	}
	controllers := "endpointslice,endpointslicemirroring"
	var kcmExtra []string
	if c.opts.RealNodes {
		if c.apiServerArgs, err = c.realNodeAPIServerArgs(c.apiServerArgs); err != nil {
			return err
		}
		controllers, kcmExtra = realNodeControllers, c.realNodeControllerFlags()
	}
	restConfig, err := c.adminRESTConfig()
	if err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(restConfig); err != nil {
		return err
	}
	if err := c.StartAPIServer(ctx); err != nil {
		return err
	}
	kcm, err := c.start("kube-controller-manager", exec.Command(filepath.Join(controlPlane, "kube-controller-manager"),
		append([]string{
			"--kubeconfig=" + kcmConfig,
			"--authentication-kubeconfig=" + kcmConfig,
			"--authorization-kubeconfig=" + kcmConfig,
			"--controllers=" + controllers,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port=0",
		}, kcmExtra...)...))
	if err != nil {
		return err
	}
	// The controller-manager has no readiness endpoint with serving off;
	// give it a moment to show it stays up.
	select {
	case <-kcm.Exited():
		return fmt.Errorf("kube-controller-manager exited: %v\n%s", kcm.Err(), kcm.LogTail(20))
	case <-time.After(time.Second):
	}
	return nil
}

// StartAPIServer starts kube-apiserver, with the same flags, certificates
// and etcd after StopAPIServer, and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	apiserver, err := c.start("kube-apiserver", exec.Command(c.apiServerArgs[0], c.apiServerArgs[1:]...))
	if err != nil {
		return err
	}
	c.apiServer = apiserver
	if err := waitFor(ctx, apiserver, "kube-apiserver ready", func() bool {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok"
	}); err != nil {
		return fmt.Errorf("%w\nits failing readiness checks:\n%s", err, c.failingReadyChecks())
	}
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, as a control-plane
// upgrade does); etcd, the controller-manager and kube-proxy stay up.
func (c *Cluster) StopAPIServer() { c.apiServer.Stop() }

// adminRESTConfig is the admin's client configuration, certificates and
// key loaded as data: client-go caches transports by certificate file path,
// so a second cluster in one test binary (new certificates at the same
// paths) would get the first one's and fail to trust its API server.
func (c *Cluster) adminRESTConfig() (*rest.Config, error) {
	config, err := clientcmd.BuildConfigFromFlags("", filepath.Join(c.Dir, "admin.kubeconfig"))
	if err != nil {
		return nil, err
	}
	return config, rest.LoadTLSFiles(config)
}

// failingReadyChecks lists the API server's readiness checks that fail,
// which its log rarely names.
func (c *Cluster) failingReadyChecks() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").Param("verbose", "1").DoRaw(ctx)
	var failing []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.Contains(line, "failed") {
			failing = append(failing, line)
		}
	}
	if len(failing) == 0 {
		return fmt.Sprintf("(none named; /readyz?verbose answered %v)", err)
	}
	return strings.Join(failing, "\n")
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	etcd, err := c.start("etcd", exec.Command(c.bins.etcd,
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+etcdClientURL,
		"--advertise-client-urls="+etcdClientURL,
		"--listen-peer-urls="+etcdPeerURL,
		"--initial-advertise-peer-urls="+etcdPeerURL,
		"--initial-cluster=default="+etcdPeerURL,
		"--unsafe-no-fsync",
	))
	if err != nil {
		return err
	}
	return waitFor(ctx, etcd, "etcd healthy", func() bool {
		resp, err := http.Get(etcdClientURL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// createNodes creates this node's Node object and a second node, which
// hosts "remote" pods: namespaces wired to this node like the others but
// declared elsewhere, to exercise the node-local traffic policies.
func (c *Cluster) createNodes(ctx context.Context) error {
	nodes := []*v1.Node{
		{
			ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{
				"kubernetes.io/hostname": NodeName, "topology.kubernetes.io/zone": Zone}},
			Spec: v1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd00:244::/64"}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: RemoteNodeName, Labels: map[string]string{
				"kubernetes.io/hostname": RemoteNodeName, "topology.kubernetes.io/zone": "zone-b"}},
			Spec: v1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:244:0:1::/64"}},
		},
	}
	for _, n := range nodes {
		created, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", n.Name, err)
		}
		created.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		if n.Name == NodeName {
			created.Status.Addresses = []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: NodeIPv4}, {Type: v1.NodeInternalIP, Address: NodeIPv6},
				{Type: v1.NodeHostName, Address: NodeName}}
		}
		if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s status: %w", n.Name, err)
		}
	}
	return nil
}

// StartProcess starts a program on this machine (in no namespace of the
// cluster's), logging to name.log in Dir. Stop ends it, and a later Start
// kills it if this run died first.
func (c *Cluster) StartProcess(name string, cmd *exec.Cmd) (*Process, error) {
	return c.start(name, cmd)
}

// start starts a process and keeps it for Stop.
func (c *Cluster) start(name string, cmd *exec.Cmd) (*Process, error) {
	p, err := startProcess(c.Dir, name, cmd)
	if err != nil {
		return nil, err
	}
	c.processes = append(c.processes, p)
	return p, nil
}

// waitFor polls ready until it holds, the process exits, or the start-up
// deadline passes.
func waitFor(ctx context.Context, p *Process, what string, ready func() bool) error {
	return WaitUntil(ctx, p, startupDeadline, what, ready)
}

// WaitUntil polls ready until it holds, p exits, or timeout passes; an
// error names what was awaited and ends with p's last log lines.
func WaitUntil(ctx context.Context, p *Process, timeout time.Duration, what string, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ready() {
		select {
		case <-p.Exited():
			return fmt.Errorf("%s exited before %s: %v\n%s", p.Name, what, p.Err(), p.LogTail(30))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s; last log lines of %s:\n%s", what, p.Name, p.LogTail(30))
		}
	}
	return nil
}
