// Over 600 lines: the HTTP servers, the modes' construction and the
// informers; issue #29 splits pkg/server by concern.

package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/metrics/prometheus/slis"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	iptablesrunner "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/conntrack"
	"github.com/rapidproxy/rapidproxy/pkg/explain"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/zpages"
)

func clientcmdServer(master string) clientcmdapi.Cluster {
	return clientcmdapi.Cluster{Server: master}
}

// servers are the HTTP servers kube-proxy runs.
type servers []*http.Server

func (s servers) close() {
	for _, srv := range s {
		_ = srv.Close()
	}
}

// startServers opens the healthz and metrics servers where configured. A
// port in use is fatal with bindAddressHardFail, else only logged.
func startServers(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration, health *healthcheck.ProxyHealth, services *explain.Handler, z *zpages.Pages) (servers, error) {
	var out servers
	listen := func(name, addr string, handler http.Handler) error {
		if addr == "" {
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("%s server on %s: %w", name, addr, err)
			if cfg.BindAddressHardFail {
				return err
			}
			klog.ErrorS(err, "Could not start server; continuing without it")
			return nil
		}
		srv := &http.Server{Handler: handler}
		out = append(out, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "Server stopped", "server", name)
			}
		}()
		return nil
	}
	if err := listen("healthz", cfg.HealthzBindAddress, health.Handler()); err != nil {
		out.close()
		return nil, err
	}
	if err := listen("metrics", cfg.MetricsBindAddress, metricsMux(cfg, services, z)); err != nil {
		out.close()
		return nil, err
	}
	go func() {
		<-ctx.Done()
		out.close()
	}()
	return out, nil
}

// metricsMux serves upstream's paths: /metrics, /metrics/slis, /healthz
// (and /healthz/ping, its one check), /configz, /proxyMode, /flagz,
// /statusz and, with
// profiling on, /debug/pprof and /debug/flags (PUT /debug/flags/v sets the
// log verbosity); and /debug/services (what the node does with each
// service: only here, on the metrics address, which is loopback unless
// configured otherwise, as /configz), and /debug/trace (where a packet goes). Every other path is 404.
func metricsMux(cfg *kpconfig.KubeProxyConfiguration, services *explain.Handler, z *zpages.Pages) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(explain.Path, services)
	mux.Handle(explain.Path+"/", services)
	mux.HandleFunc(explain.TracePath, services.ServeTrace)
	mux.Handle("/metrics", metrics.Handler())
	slis.SLIMetricsWithReset{}.Install(mux)
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/healthz/ping", ok)
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(cfg.Mode))
	})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"kubeproxy.config.k8s.io": cfg})
	})
	mux.HandleFunc("/flagz", z.Flagz)
	mux.HandleFunc("/statusz", z.Statusz)
	if cfg.EnableProfiling {
		// Upstream's set: no cmdline, which would show the command line.
		mux.Handle("/debug/pprof", http.RedirectHandler("/debug/pprof/", http.StatusFound))
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/flags", debugFlags)
		mux.HandleFunc("/debug/flags/", debugFlags)
		mux.HandleFunc("/debug/flags/v", setVerbosity)
	}
	return mux
}

// debugFlags lists the flags /debug/flags/ can set, as upstream's page.
func debugFlags(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("<html>\n<head>\n<title>/debug/flags/</title>\n</head>\n<body>\n/debug/flags/<br>\n<br>\nflags:<br>\n<table>\n" +
		"<tr>v<br>\n</table>\n<br>\nfull flags configurable<br>\n</body>\n</html>\n"))
}

// setVerbosity sets the log verbosity to a PUT's body, as upstream's
// /debug/flags/v; other methods are refused as upstream refuses them.
func setVerbosity(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodPut {
		w.WriteHeader(http.StatusNotAcceptable)
		_, _ = w.Write([]byte("unsupported http method"))
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("error reading request body: " + err.Error()))
		return
	}
	response, err := logs.GlogSetter(string(body))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(err.Error()))
		return
	}
	_, _ = w.Write([]byte(response))
}

// newProxier builds one proxier per IP family the node can serve: the
// proxy core, running the configured mode.
func newProxier(cfg *kpconfig.KubeProxyConfiguration, nodeName string, node *v1.Node, nodeIPs map[v1.IPFamily]netip.Addr, health *healthcheck.ProxyHealth) (proxy.DualStack, error) {
	var newMode modeFactory
	switch cfg.Mode {
	case config.ModeIPTables:
		newMode = newIPTablesMode
	case config.ModeIPVS:
		newMode = newIPVSMode
	case config.ModeNFTables:
		newMode = newNFTablesMode
	default:
		return nil, fmt.Errorf("proxy mode %q is not available in this build; use iptables, ipvs or nftables", cfg.Mode)
	}
	// The nftables mode needs no iptables tools.
	iptablesBased := cfg.Mode != config.ModeNFTables
	var backend iptablesrunner.Backend
	var err error
	if iptablesBased {
		if backend, err = iptablesrunner.DetectBackend(); err != nil {
			return nil, err
		}
		if legacyErr := iptablesrunner.LegacyPermitted(); legacyErr != nil && os.Getenv(iptablesrunner.BackendEnv) == "" {
			klog.InfoS("Picked the iptables backend without seeing the legacy one's tables; on a node whose other programs use iptables-legacy, grant CAP_NET_RAW or set "+iptablesrunner.BackendEnv+"=legacy",
				"backend", backend, "err", legacyErr)
		}
	}
	sync, minSync := config.SyncPeriods(cfg)
	var nodePortAddrs []netip.Addr
	if len(cfg.NodePortAddresses) > 0 {
		if nodePortAddrs, err = localAddresses(cfg.NodePortAddresses, nodeIPs); err != nil {
			return nil, err
		}
	}
	zone := ""
	var podCIDRs []string
	if node != nil {
		zone = node.Labels[v1.LabelTopologyZone]
		podCIDRs = node.Spec.PodCIDRs
	}
	detect := localdetect.Settings{Mode: string(cfg.DetectLocalMode), BridgeInterface: cfg.DetectLocal.BridgeInterface, InterfaceNamePrefix: cfg.DetectLocal.InterfaceNamePrefix}
	switch cfg.DetectLocalMode {
	case config.LocalModeClusterCIDR:
		if cfg.ClusterCIDR != "" {
			detect.CIDRs = strings.Split(cfg.ClusterCIDR, ",")
		}
	case config.LocalModeNodeCIDR:
		detect.CIDRs = podCIDRs
	}

	var healthAddrs []string
	for _, a := range nodePortAddrs {
		healthAddrs = append(healthAddrs, a.String())
	}
	serviceHealth := healthcheck.NewServiceHealth(healthAddrs, health)

	primary := v1.IPv4Protocol
	if _, ok := nodeIPs[v1.IPv4Protocol]; !ok {
		primary = v1.IPv6Protocol
	}
	var proxiers proxy.DualStack
	for _, family := range []v1.IPFamily{primary, otherFamily(primary)} {
		var ipt *iptablesrunner.Runner
		if iptablesBased {
			ipt = iptablesrunner.New(family == v1.IPv6Protocol, backend)
		}
		if err := familyUsable(cfg.Mode, family, ipt); err != nil {
			if family == primary {
				return nil, err
			}
			klog.InfoS("Not serving the secondary IP family", "ipFamily", family, "err", err)
			continue
		}
		detector, err := localdetect.New(detect, family)
		if err != nil {
			return nil, err
		}
		nodeIP, familyNodePortAddrs := familyNodePorts(cfg.NodePortAddresses, nodeIPs, nodePortAddrs, family)
		mode, err := newMode(cfg, familySetup{
			family: family, iptables: ipt, detector: detector, nodeIP: nodeIP, syncPeriod: sync,
			nodePortAddrs: familyNodePortAddrs,
		})
		if err != nil {
			if family == primary {
				return nil, err
			}
			klog.InfoS("Not serving the secondary IP family", "ipFamily", family, "err", err)
			continue
		}
		// Only one family runs the health-check node port servers.
		var sh *healthcheck.ServiceHealth
		if family == primary {
			sh = serviceHealth
		}
		var syncFailures prometheus.Counter
		if cfg.Mode == config.ModeNFTables {
			syncFailures = metrics.NFTablesSyncFailuresTotal.WithLabelValues(string(family))
		}
		proxiers = append(proxiers, proxy.NewCore(proxy.Config{
			Family: family, ModeName: string(cfg.Mode),
			Node:          state.Node{Name: nodeName, Zone: zone},
			MinSyncPeriod: minSync, SyncPeriod: sync,
			Health: health, ServiceHealth: sh, Conntrack: conntrack.Cleaner{},
			SyncFailures: syncFailures,
		}, mode))
		using := []any{"mode", cfg.Mode, "ipFamily", family}
		if iptablesBased {
			using = append(using, "backend", backend)
		}
		klog.InfoS("Using proxier", using...)
	}
	return proxiers, nil
}

// familyUsable tells whether the node can serve a family in the mode: the
// iptables-based modes need the family's iptables tools (ipt), the
// nftables mode an IPv6-enabled kernel for IPv6 (its nft serves both).
func familyUsable(mode kpconfig.ProxyMode, family v1.IPFamily, ipt *iptablesrunner.Runner) error {
	if ipt != nil {
		if err := ipt.Available(); err != nil {
			return fmt.Errorf("%s mode needs the iptables tools: %w", mode, err)
		}
		return nil
	}
	if family == v1.IPv6Protocol {
		return ipv6Usable(sysctl.Proc{}, "/proc/net")
	}
	return nil
}

// familySetup is what every mode is built from for one IP family.
type familySetup struct {
	family v1.IPFamily
	// iptables is nil in the nftables mode.
	iptables   *iptablesrunner.Runner
	detector   localdetect.Detector
	nodeIP     netip.Addr
	syncPeriod time.Duration
	// nodePortAddrs are nodePortAddresses' addresses of the family; nil
	// when it is unset (every address).
	nodePortAddrs []netip.Addr
}

// modeFactory builds one proxy mode for one IP family.
type modeFactory func(cfg *kpconfig.KubeProxyConfiguration, f familySetup) (proxy.Mode, error)

func newIPTablesMode(cfg *kpconfig.KubeProxyConfiguration, f familySetup) (proxy.Mode, error) {
	// Before the first sync: the rules that count packets in nfacct
	// objects cannot be written until the objects exist.
	nfacctErr := iptables.EnsureNFAcctObjects()
	if nfacctErr != nil {
		klog.InfoS("nfacct is not usable here: the rules count no packets, and the nfacct metrics are not served", "ipFamily", f.family, "err", nfacctErr)
	} else {
		metrics.ServeNFAcctCounters()
	}
	params := iptables.Params{
		IPv6:               f.family == v1.IPv6Protocol,
		MasqueradeBit:      int(*cfg.IPTables.MasqueradeBit),
		MasqueradeAll:      config.MasqueradeAll(cfg),
		LocalhostNodePorts: f.family == v1.IPv4Protocol && localhostNodePorts(cfg, f.nodeIP),
		LocalDetector:      f.detector,
		NodeIP:             f.nodeIP,
		NodePortAddresses:  f.nodePortAddrs,
		RandomFully:        f.iptables.RandomFullySupported(),
		TCPBeLiberal:       cfg.Conntrack.TCPBeLiberal,
		NFAcct:             nfacctErr == nil,
	}
	if params.LocalhostNodePorts && f.family == v1.IPv4Protocol {
		if err := (routeLocalnet{}).enable(); err != nil {
			klog.ErrorS(err, "Could not enable route_localnet; NodePorts on localhost will not work")
		}
	}
	return iptables.New(iptables.Config{
		Family: f.family, Kernel: f.iptables, Params: params, SyncPeriod: f.syncPeriod,
		ChainRefsPerRestore: chainRefsPerRestore(f.iptables.Backend()),
		EnsureNFAcct:        iptables.EnsureNFAcctObjects,
	}), nil
}

// localhostNodePorts is whether IPv4 NodePorts answer on 127.0.0.0/8,
// decided as upstream does: iptables.localhostNodePorts is set, and
// nodePortAddresses has no IPv4 CIDR (all addresses) or one that holds a
// loopback address; "primary" stands for the node's IPv4 address nodeIP
// (invalid when it has none), unless that is loopback.
func localhostNodePorts(cfg *kpconfig.KubeProxyConfiguration, nodeIP netip.Addr) bool {
	if !*cfg.IPTables.LocalhostNodePorts {
		return false
	}
	if len(cfg.NodePortAddresses) == 1 && cfg.NodePortAddresses[0] == config.NodePortAddressesPrimary {
		return !nodeIP.IsValid() || nodeIP.IsLoopback()
	}
	anyIPv4 := false
	for _, c := range cfg.NodePortAddresses {
		p, err := netip.ParsePrefix(c)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		anyIPv4 = true
		if p.Addr().IsLoopback() || p.Contains(netip.AddrFrom4([4]byte{127})) {
			return true
		}
	}
	return !anyIPv4
}

// chainRefsPerRestore is how a full sync splits its work for the backend.
func chainRefsPerRestore(b iptablesrunner.Backend) int {
	if b == iptablesrunner.NFT {
		return iptables.ChainRefsPerRestoreNFT
	}
	return 0
}

func otherFamily(f v1.IPFamily) v1.IPFamily {
	if f == v1.IPv4Protocol {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

// familyNodePorts is what a family's proxier is built with: the node's IP
// of the family (familyNodeIP), and the addresses its NodePorts answer on
// out of nodePortAddrs, those nodePortAddresses (setting) selects, nil
// for every local address when it does not restrict the family.
func familyNodePorts(setting []string, nodeIPs map[v1.IPFamily]netip.Addr, nodePortAddrs []netip.Addr, family v1.IPFamily) (netip.Addr, []netip.Addr) {
	nodeIP := familyNodeIP(nodeIPs, family)
	return nodeIP, ofFamily(nodePortAddrs, family, restrictsFamily(setting, family, nodeIP))
}

// familyNodeIP is the node's primary IP of the family, or the family's
// loopback address when the node has none, as upstream passes it to each
// family's proxier.
func familyNodeIP(nodeIPs map[v1.IPFamily]netip.Addr, family v1.IPFamily) netip.Addr {
	if a, ok := nodeIPs[family]; ok {
		return a
	}
	if family == v1.IPv6Protocol {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// restrictsFamily tells whether nodePortAddresses limits the NodePorts of
// a family, as upstream decides it: it does when it holds a CIDR of the
// family and none of them is /0 (a family without any answers on all its
// addresses); "primary" stands for the family's node IP nodeIP, so a
// family whose node IP is loopback (the node has none) is not limited.
func restrictsFamily(setting []string, family v1.IPFamily, nodeIP netip.Addr) bool {
	if len(setting) == 1 && setting[0] == config.NodePortAddressesPrimary {
		return nodeIP.IsValid() && !nodeIP.IsLoopback()
	}
	restricted := false
	for _, c := range setting {
		p, err := netip.ParsePrefix(c)
		if err != nil || familyOf(p.Addr()) != family {
			continue
		}
		if p.Bits() == 0 {
			return false
		}
		restricted = true
	}
	return restricted
}

// ofFamily keeps the addresses of one family; nil (all local addresses)
// unless restricted is set.
func ofFamily(addrs []netip.Addr, family v1.IPFamily, restricted bool) []netip.Addr {
	if !restricted {
		return nil
	}
	out := []netip.Addr{}
	for _, a := range addrs {
		if familyOf(a) == family {
			out = append(out, a)
		}
	}
	return out
}

// routeLocalnet lets IPv4 NodePorts answer on 127.0.0.1; the KUBE-FIREWALL
// guard keeps others from using that to reach local services.
type routeLocalnet struct{}

func (routeLocalnet) enable() error {
	const name = "net/ipv4/conf/all/route_localnet"
	s := sysctl.Proc{}
	if v, err := s.Get(name); err == nil && v == 1 {
		return nil
	}
	return s.Set(name, 1)
}

// watch runs the informers and the proxier until the context ends.
func watch(ctx context.Context, client kubernetes.Interface, cfg *kpconfig.KubeProxyConfiguration, nodeName string, node *v1.Node, proxier proxy.Proxier, health *healthcheck.ProxyHealth) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	noProxyName, _ := labels.NewRequirement("service.kubernetes.io/service-proxy-name", selection.DoesNotExist, nil)
	noHeadless, _ := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	selector := labels.NewSelector().Add(*noProxyName, *noHeadless).String()
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = selector }
	factory := informers.NewSharedInformerFactoryWithOptions(client, cfg.ConfigSyncPeriod.Duration,
		informers.WithTransform(trimForCache))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, cfg.ConfigSyncPeriod.Duration,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}))

	// Without the factory's namespace index, which nothing here reads
	// (1.5 MB at 10k services).
	services := factory.InformerFor(&v1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	slices_ := factory.InformerFor(&discovery.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	nodes := nodeFactory.Core().V1().Nodes().Informer()
	// The registrations' HasSynced, not the informers': it turns true only
	// once the handler has been given every listed object, so the first
	// sync sees all of them.
	servicesHandled, err := services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { onObject(o, false, proxier.OnService) },
		UpdateFunc: func(_, o any) { onObject(o, false, proxier.OnService) },
		DeleteFunc: func(o any) { onObject(o, true, proxier.OnService) },
	})
	if err != nil {
		return err
	}
	slicesHandled, err := slices_.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { onObject(o, false, proxier.OnEndpointSlice) },
		UpdateFunc: func(_, o any) { onObject(o, false, proxier.OnEndpointSlice) },
		DeleteFunc: func(o any) { onObject(o, true, proxier.OnEndpointSlice) },
	})
	if err != nil {
		return err
	}
	var podCIDRs []string
	if node != nil {
		podCIDRs = node.Spec.PodCIDRs
	}
	onNode := func(o any, deleted bool) {
		n, ok := o.(*v1.Node)
		if !ok {
			return
		}
		if deleted {
			health.SetNode(nil)
			return
		}
		health.SetNode(n)
		proxier.OnNode(n)
		if cfg.DetectLocalMode == config.LocalModeNodeCIDR && !slices.Equal(n.Spec.PodCIDRs, podCIDRs) {
			cancel(errNodeCIDRChanged)
		}
	}
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { onNode(o, false) },
		UpdateFunc: func(_, o any) { onNode(o, false) },
		DeleteFunc: func(o any) { onNode(o, true) },
	})

	// ServiceCIDRs only for a mode that uses them (the nftables mode).
	var cidrFactory informers.SharedInformerFactory
	if proxier.UsesServiceCIDRs() {
		cidrFactory = informers.NewSharedInformerFactory(client, cfg.ConfigSyncPeriod.Duration)
		cidrs := cidrFactory.Networking().V1().ServiceCIDRs().Informer()
		onCIDRs := func(any) { proxier.OnServiceCIDRs(serviceCIDRs(cidrs.GetStore().List())) }
		_, _ = cidrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    onCIDRs,
			UpdateFunc: func(_, o any) { onCIDRs(o) },
			DeleteFunc: onCIDRs,
		})
		cidrFactory.Start(ctx.Done())
	}
	factory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	go func() {
		if cache.WaitForNamedCacheSync("service config", ctx.Done(), servicesHandled.HasSynced) {
			proxier.OnServicesSynced()
		}
	}()
	go func() {
		if cache.WaitForNamedCacheSync("endpoint slice config", ctx.Done(), slicesHandled.HasSynced) {
			proxier.OnEndpointSlicesSynced()
		}
	}()
	proxier.SyncLoop(ctx)
	factory.Shutdown()
	nodeFactory.Shutdown()
	if cidrFactory != nil {
		cidrFactory.Shutdown()
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// serviceCIDRs are the ranges of every ServiceCIDR object (the API server
// makes "kubernetes" from --service-cluster-ip-range; others add more).
func serviceCIDRs(objects []any) []netip.Prefix {
	var out []netip.Prefix
	for _, o := range objects {
		sc, ok := o.(*networkingv1.ServiceCIDR)
		if !ok {
			continue
		}
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// trimForCache drops what kube-proxy never reads from the Services and
// EndpointSlices it caches (a third or more of each object, at 10k
// services tens of megabytes): managed fields, owner references, every
// annotation but the trigger time that network programming latency is
// measured from, the labels (the informers' selectors are applied by the
// API server; a slice keeps the one naming its service), a Service's pod
// selector, and each endpoint's target reference, hostname and deprecated
// topology.
func trimForCache(o any) (any, error) {
	obj, ok := o.(metav1.Object)
	if !ok {
		return o, nil
	}
	obj.SetManagedFields(nil)
	obj.SetOwnerReferences(nil)
	if annotations := obj.GetAnnotations(); len(annotations) > 0 {
		trigger, found := annotations[v1.EndpointsLastChangeTriggerTime]
		obj.SetAnnotations(nil)
		if found {
			obj.SetAnnotations(map[string]string{v1.EndpointsLastChangeTriggerTime: trigger})
		}
	}
	switch v := o.(type) {
	case *v1.Service:
		v.Labels = nil
		v.Spec.Selector = nil
	case *discovery.EndpointSlice:
		service, found := v.Labels[discovery.LabelServiceName]
		switch {
		case !found:
			v.Labels = nil
		case len(v.Labels) > 1:
			v.Labels = map[string]string{discovery.LabelServiceName: service}
		}
		for i := range v.Endpoints {
			ep := &v.Endpoints[i]
			ep.TargetRef, ep.Hostname, ep.DeprecatedTopology = nil, nil, nil
		}
	}
	return o, nil
}

// onObject unwraps informer deletions (tombstones) and passes typed objects on.
func onObject[T any](o any, deleted bool, handle func(T, bool)) {
	if tomb, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = tomb.Obj
	}
	if obj, ok := o.(T); ok {
		handle(obj, deleted)
	}
}

// recordStartEvent tells the cluster this node's proxy started (and, in
// IPVS mode, that the mode is deprecated, as upstream does).
func recordStartEvent(ctx context.Context, client kubernetes.Interface, nodeName string, mode kpconfig.ProxyMode) {
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	recorder := broadcaster.NewRecorder(scheme.Scheme, "kube-proxy")
	ref := &v1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)}
	if mode == config.ModeIPVS {
		// Upstream's words, so that alerts on them keep working.
		const deprecated = "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead."
		klog.ErrorS(nil, deprecated)
		recorder.Eventf(ref, nil, v1.EventTypeWarning, "IPVSDeprecation", "StartKubeProxy", deprecated)
	}
	recorder.Eventf(ref, nil, v1.EventTypeNormal, "Starting", "StartKubeProxy", "")
}
