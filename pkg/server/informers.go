// The informers that feed the proxy: what they watch, what they keep of
// each object, and the start event.

package server

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

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
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// watch runs the informers and the proxier until the context ends.
func watch(ctx context.Context, client kubernetes.Interface, cfg *kpconfig.KubeProxyConfiguration, nodeName string, node *v1.Node, proxier proxy.Proxier, health *healthcheck.ProxyHealth) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	factory, services, endpointSlices := serviceInformers(client, cfg.ConfigSyncPeriod.Duration)
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, cfg.ConfigSyncPeriod.Duration,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}))
	// The registrations' HasSynced, not the informers': it turns true only
	// once the handler has been given every listed object, so the first
	// sync sees all of them.
	servicesHandled, err := services.AddEventHandler(handlerOf(proxier.OnCachedService))
	if err != nil {
		return err
	}
	slicesHandled, err := endpointSlices.AddEventHandler(handlerOf(proxier.OnCachedSlice))
	if err != nil {
		return err
	}
	onNode := nodeWatcher(cfg, node, proxier, health, cancel)
	_, _ = nodeFactory.Core().V1().Nodes().Informer().AddEventHandler(handlerOf(onNode))
	stopCIDRs := watchServiceCIDRs(ctx, client, cfg.ConfigSyncPeriod.Duration, proxier)
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
	stopCIDRs()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// serviceInformers are the Service and EndpointSlice informers and their
// factory: without the services another proxy serves, or headless ones,
// and with what each object keeps cut down (trimForCache).
func serviceInformers(client kubernetes.Interface, resync time.Duration) (factory informers.SharedInformerFactory, services, endpointSlices cache.SharedIndexInformer) {
	noProxyName, _ := labels.NewRequirement("service.kubernetes.io/service-proxy-name", selection.DoesNotExist, nil)
	noHeadless, _ := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	selector := labels.NewSelector().Add(*noProxyName, *noHeadless).String()
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = selector }
	factory = informers.NewSharedInformerFactoryWithOptions(client, resync, informers.WithTransform(trimForCache))
	// Without the factory's namespace index, which nothing here reads
	// (1.5 MB at 10k services).
	services = factory.InformerFor(&v1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	endpointSlices = factory.InformerFor(&discovery.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, tweak)
	})
	return factory, services, endpointSlices
}

// handlerOf passes an informer's typed objects to handle, with deleted
// set for deletions (tombstones unwrapped).
func handlerOf[T any](handle func(T, bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { onObject(o, false, handle) },
		UpdateFunc: func(_, o any) { onObject(o, false, handle) },
		DeleteFunc: func(o any) { onObject(o, true, handle) },
	}
}

// nodeWatcher handles the node's changes. The rules were built for the
// node's IPs at start ("primary" NodePort addresses, the node IP of each
// family), and with DetectLocalMode NodeCIDR for its pod CIDRs: a change
// of either, or the Node's deletion, restarts the process, as upstream
// does.
func nodeWatcher(cfg *kpconfig.KubeProxyConfiguration, node *v1.Node, proxier proxy.Proxier, health *healthcheck.ProxyHealth, cancel context.CancelCauseFunc) func(*v1.Node, bool) {
	var podCIDRs []string
	if node != nil {
		podCIDRs = node.Spec.PodCIDRs
	}
	startIPs := nodeHostIPs(node)
	return func(n *v1.Node, deleted bool) {
		if deleted {
			health.SetNode(nil)
			klog.InfoS("Node is being deleted", "node", klog.KObj(n))
			cancel(errNodeDeleted)
			return
		}
		health.SetNode(n)
		proxier.OnNode(n)
		if cfg.DetectLocalMode == config.LocalModeNodeCIDR && !slices.Equal(n.Spec.PodCIDRs, podCIDRs) {
			klog.InfoS("PodCIDRs changed for the node", "node", klog.KObj(n), "newPodCIDRs", n.Spec.PodCIDRs, "oldPodCIDRs", podCIDRs)
			cancel(errNodeCIDRChanged)
		}
		if ips := nodeHostIPs(n); !slices.Equal(ips, startIPs) {
			klog.InfoS("NodeIPs changed for the node", "node", klog.KObj(n), "newNodeIPs", ips, "oldNodeIPs", startIPs)
			cancel(errNodeIPsChanged)
		}
	}
}

// watchServiceCIDRs gives a mode that uses them (the nftables mode) the
// ServiceCIDRs' ranges as they change, and returns what stops it.
func watchServiceCIDRs(ctx context.Context, client kubernetes.Interface, resync time.Duration, proxier proxy.Proxier) (stop func()) {
	if !proxier.UsesServiceCIDRs() || !servesServiceCIDRs(client) {
		return func() {}
	}
	factory := informers.NewSharedInformerFactory(client, resync)
	cidrs := factory.Networking().V1().ServiceCIDRs().Informer()
	onCIDRs := func(any) { proxier.OnServiceCIDRs(serviceCIDRs(cidrs.GetStore().List())) }
	_, _ = cidrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onCIDRs,
		UpdateFunc: func(_, o any) { onCIDRs(o) },
		DeleteFunc: onCIDRs,
	})
	factory.Start(ctx.Done())
	return factory.Shutdown
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

// trimForCache replaces each Service and EndpointSlice the informers
// keep with what the tracker keeps of it (state.ServiceOf, state.SliceOf):
// at 10,000 services the objects, even cut down, held some 40 MB.
func trimForCache(o any) (any, error) {
	switch v := o.(type) {
	case *discovery.EndpointSlice:
		return state.SliceOf(v), nil
	case *v1.Service:
		return state.ServiceOf(v), nil
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

// servesServiceCIDRs tells whether the API server has networking.k8s.io/v1
// ServiceCIDRs (Kubernetes 1.33 and later). Against an older one the
// nftables mode runs without them, saying so once, instead of failing its
// watch forever; an API server that cannot be asked is assumed to have
// them (the watch then says what is wrong).
func servesServiceCIDRs(client kubernetes.Interface) bool {
	resources, err := client.Discovery().ServerResourcesForGroupVersion("networking.k8s.io/v1")
	if err != nil && !apierrors.IsNotFound(err) {
		return true
	}
	if err == nil && slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" }) {
		return true
	}
	version := "an older version"
	if info, err := client.Discovery().ServerVersion(); err == nil {
		version = info.GitVersion
	}
	klog.ErrorS(nil, "The API server does not serve networking.k8s.io/v1 ServiceCIDRs (Kubernetes 1.33 and later): traffic to unallocated ClusterIPs is not dropped; upgrade the control plane", "apiServerVersion", version)
	return false
}

// Upstream's words, so that alerts and searches on them keep working.
const (
	ipvsDeprecated = "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 and removed in Kubernetes 1.43. Migrate to the 'nftables' proxier instead."
	modeDefaulted  = "No kube-proxy mode specified: defaulting to 'iptables'. Note that in Kubernetes 1.40 the default mode will switch to 'nftables'. If you wish to continue using 'iptables' mode, you must explicitly specify 'mode: iptables' in the kube-proxy config file, or '--proxy-mode iptables' on the kube-proxy command line."
)

// recordStartEvent tells the cluster this node's proxy started, and warns,
// as upstream does, when the mode was left to its default (which upstream
// is to change) or is IPVS (deprecated), in the log and by a Node event.
func recordStartEvent(ctx context.Context, client kubernetes.Interface, nodeName string, mode kpconfig.ProxyMode, defaulted bool) {
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	recorder := broadcaster.NewRecorder(scheme.Scheme, "kube-proxy")
	ref := &v1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)}
	for _, w := range logModeWarnings(mode, defaulted) {
		recorder.Eventf(ref, nil, v1.EventTypeWarning, w.reason, "StartKubeProxy", w.message)
	}
	recorder.Eventf(ref, nil, v1.EventTypeNormal, "Starting", "StartKubeProxy", "")
}

type modeWarning struct{ reason, message string }

// logModeWarnings logs, and returns for events, what upstream warns of at
// every start, --init-only's included: the mode left to its default (which
// upstream is to change), or IPVS (deprecated).
func logModeWarnings(mode kpconfig.ProxyMode, defaulted bool) []modeWarning {
	var warnings []modeWarning
	if defaulted && mode == config.ModeIPTables {
		warnings = append(warnings, modeWarning{"KubeProxyDefaultMode", modeDefaulted})
	}
	if mode == config.ModeIPVS {
		warnings = append(warnings, modeWarning{"IPVSDeprecation", ipvsDeprecated})
	}
	for _, w := range warnings {
		klog.ErrorS(nil, w.message)
	}
	return warnings
}

func clientcmdServer(master string) clientcmdapi.Cluster {
	return clientcmdapi.Cluster{Server: master}
}
