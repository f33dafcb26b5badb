// Package server is the ProxyServer: it connects to the API server, finds
// out about its node, sets up the kernel, serves health and metrics, and
// feeds Services, EndpointSlices and the node's own Node to a proxier.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/conntrack"
	"github.com/rapidproxy/rapidproxy/pkg/explain"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/zpages"
)

// Options are the inputs of a run that are not part of the configuration file.
type Options struct {
	// Master overrides the API server address of the kubeconfig (--master).
	Master string
	// Flags are the command line's flags and their values, which /flagz
	// shows.
	Flags map[string]string
	// ModeDefaulted says that neither the file nor --proxy-mode chose the
	// mode: upstream warns then that its default is to change.
	ModeDefaulted bool
}

// nodeWait bounds how long start-up waits for the Node object to exist.
const nodeWait = 30 * time.Second

// gcPercent is the Go collector's heap growth target, unless GOGC sets
// one. kube-proxy allocates in bursts (the first list of every Service and
// EndpointSlice, a full sync) and little in between, so a tighter target
// costs a little CPU in those bursts and lowers the node's memory peak by
// about a quarter at 10k services.
const gcPercent = 50

// Run runs kube-proxy until ctx is cancelled or a fatal error occurs.
func Run(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration, opts Options) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	allClients, err := explain.ParseAccess(os.Getenv(explain.AccessEnv))
	if err != nil {
		return err
	}
	client, err := newClient(cfg, opts.Master)
	if err != nil {
		return err
	}
	nodeName, err := nodeName(cfg)
	if err != nil {
		return err
	}
	node := waitForNode(ctx, client, nodeName)
	nodeIPs := nodeIPs(cfg, node)
	klog.InfoS("Node", "name", nodeName, "primaryIPs", nodeIPs)
	// From here on nodePortAddresses holds only CIDRs, as upstream's
	// /configz then shows it too.
	cfg.NodePortAddresses = config.ExpandNodePortAddresses(cfg.NodePortAddresses, []netip.Addr{nodeIPs[v1.IPv4Protocol], nodeIPs[v1.IPv6Protocol]})

	setOOMScoreAdj(cfg.OOMScoreAdj)
	// Upstream exits here, and restarts in a loop on a node whose
	// /proc/sys is read-only; the limits only matter under load, so the
	// rules are served regardless (--init-only still fails).
	if err := conntrack.SetSysctls(sysctl.Proc{}, cfg.Conntrack); err != nil {
		klog.ErrorS(err, "Could not apply the conntrack settings; serving without them")
	}

	var periods syncPeriods
	periods.sync, periods.minSync = config.SyncPeriods(cfg)
	health := healthcheck.NewProxyHealth(2 * periods.sync)
	health.SetNode(node)
	retire := switchOver(cfg, health)
	services := &explain.Handler{AllClients: allClients}
	servers, err := startServers(ctx, cfg, health, services, zpages.New(opts.Flags))
	if err != nil {
		return err
	}
	defer servers.close()

	proxier, err := newProxier(cfg, nodeName, node, nodeIPs, health, periods)
	if err != nil {
		return err
	}
	services.SetSource(proxier)
	retire(ctx, proxier.FirstSynced())
	recordStartEvent(ctx, client, nodeName, cfg.Mode, opts.ModeDefaulted)
	return watch(ctx, client, cfg, nodeName, node, proxier, health)
}

// InitOnly does the node set-up that needs write access to /proc/sys, as
// upstream's --init-only does, and returns, so that the long-running
// process needs only CAP_NET_ADMIN, and CAP_NET_RAW for the legacy
// iptables backend (it reads each sysctl before writing it, and finds
// them set): the conntrack limits and timeouts; in iptables
// mode route_localnet when NodePorts answer on 127.0.0.1; in IPVS mode
// ip_vs loaded, its sysctls and its connection timeouts. It needs no API
// server.
func InitOnly(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration, modeDefaulted bool) error {
	logModeWarnings(cfg.Mode, modeDefaulted)
	if err := conntrack.SetSysctls(sysctl.Proc{}, cfg.Conntrack); err != nil {
		return fmt.Errorf("conntrack settings: %w", err)
	}
	switch cfg.Mode {
	case config.ModeIPTables:
		// The node's IP is not known without the API server; any
		// non-loopback one (here a documentation address) gives the
		// answer of every real node.
		expanded := *cfg
		expanded.NodePortAddresses = config.ExpandNodePortAddresses(cfg.NodePortAddresses, []netip.Addr{netip.MustParseAddr("192.0.2.1")})
		if localhostNodePorts(&expanded) {
			if err := (routeLocalnet{}).enable(); err != nil {
				return fmt.Errorf("enabling route_localnet for NodePorts on localhost: %w", err)
			}
		}
	case config.ModeIPVS:
		kernel, err := ipvskernel.New(false)
		if err != nil {
			return fmt.Errorf("ipvs mode: %w", err)
		}
		kernel.Close()
		if err := setIPVSParams(cfg); err != nil {
			return err
		}
	}
	klog.InfoS("System initialized and --init-only specified", "mode", cfg.Mode)
	return nil
}

// newClient builds the API client from the kubeconfig (or the in-cluster
// service account when there is none), with --master overriding the server.
func newClient(cfg *kpconfig.KubeProxyConfiguration, master string) (kubernetes.Interface, error) {
	cc := cfg.ClientConnection
	var restConfig *rest.Config
	var err error
	if cc.Kubeconfig == "" && master == "" {
		restConfig, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig, no --master, and not in a cluster: %w", err)
		}
	} else {
		restConfig, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: cc.Kubeconfig},
			&clientcmd.ConfigOverrides{ClusterInfo: clientcmdServer(master)}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %q: %w", cc.Kubeconfig, err)
		}
	}
	restConfig.AcceptContentTypes = cc.AcceptContentTypes
	restConfig.ContentType = cc.ContentType
	restConfig.QPS = cc.QPS
	restConfig.Burst = int(cc.Burst)
	restConfig.UserAgent = "kube-proxy"
	return kubernetes.NewForConfig(restConfig)
}

// nodeName is the hostname override, or the host's name, lowercased.
func nodeName(cfg *kpconfig.KubeProxyConfiguration) (string, error) {
	if cfg.HostnameOverride != "" {
		return strings.ToLower(strings.TrimSpace(cfg.HostnameOverride)), nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("finding the node name: %w", err)
	}
	return strings.ToLower(strings.TrimSpace(host)), nil
}

// waitForNode fetches the node's object, retrying for a while because the
// kubelet may not have registered it yet; nil if it never shows up.
func waitForNode(ctx context.Context, client kubernetes.Interface, name string) *v1.Node {
	deadline := time.Now().Add(nodeWait)
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(nodeHostIPs(node)) > 0 {
			return node
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				klog.ErrorS(err, "Could not get this node's Node object; continuing without it", "node", name)
				return nil
			}
			klog.ErrorS(nil, "Timed out waiting for node to be assigned IPs", "node", name)
			return node
		}
		if err != nil {
			klog.InfoS("Waiting for this node's Node object", "node", name, "err", err)
		} else {
			klog.InfoS("Waiting for this node's Node object to have IPs", "node", name)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// nodeHostIPs are the Node's own primary IPs, bindAddress aside: the first
// InternalIP (else ExternalIP), then the first address of the other family,
// as the kubelet reports them.
func nodeHostIPs(node *v1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var ips []netip.Addr
	for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, addr := range node.Status.Addresses {
			a, err := netip.ParseAddr(addr.Address)
			if err != nil || addr.Type != t {
				continue
			}
			a = a.Unmap()
			if len(ips) == 0 || len(ips) == 1 && familyOf(ips[0]) != familyOf(a) {
				ips = append(ips, a)
			}
		}
	}
	return ips
}

// nodeIPs are the node's primary IP per family: the Node's own, with
// bindAddress, when it is set to a specific address, in place of its
// family's; a node with none at all is taken to be 127.0.0.1.
func nodeIPs(cfg *kpconfig.KubeProxyConfiguration, node *v1.Node) map[v1.IPFamily]netip.Addr {
	ips := map[v1.IPFamily]netip.Addr{}
	for _, a := range nodeHostIPs(node) {
		ips[familyOf(a)] = a
	}
	if a, err := netip.ParseAddr(cfg.BindAddress); err == nil && !a.IsUnspecified() {
		ips[familyOf(a.Unmap())] = a.Unmap()
	}
	if len(ips) == 0 {
		klog.InfoS("Warning: no node IP found; assuming 127.0.0.1")
		ips[v1.IPv4Protocol] = netip.MustParseAddr("127.0.0.1")
	}
	return ips
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// setOOMScoreAdj makes the kernel kill kube-proxy last when memory runs out.
func setOOMScoreAdj(score *int32) {
	if score == nil {
		return
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(fmt.Sprint(*score)), 0o644); err != nil {
		klog.InfoS("Could not set oom_score_adj", "value", *score, "err", err)
	}
}

// localAddresses are the node's addresses in the given CIDRs, for
// nodePortAddresses (keywords already expanded).
func localAddresses(cidrs []string) ([]netip.Addr, error) {
	var prefixes []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("nodePortAddresses: %q is not a CIDR", c)
		}
		prefixes = append(prefixes, p)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := []netip.Addr{}
	for _, a := range addrs {
		ipnet, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, _ := netip.AddrFromSlice(ipnet.IP)
		ip = ip.Unmap()
		for _, p := range prefixes {
			if p.Contains(ip) {
				out = append(out, ip)
				break
			}
		}
	}
	return out, nil
}

// errNodeCIDRChanged ends the process when the node's pod CIDRs change in
// NodeCIDR mode, as upstream does: the rules built on them are wrong now.
var errNodeCIDRChanged = errors.New("the node's podCIDRs changed, and detect-local-mode is NodeCIDR: restarting to use the new ones")

// errNodeIPsChanged and errNodeDeleted end the process as upstream's: the
// rules follow the node's IPs as they were at start.
var (
	errNodeIPsChanged = errors.New("the node's IPs changed: restarting to use the new ones")
	errNodeDeleted    = errors.New("the node's Node object was deleted")
)
