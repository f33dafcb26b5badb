package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/runner"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Conntrack forgets flows that would keep going to a wrong place after a
// UDP service's endpoints change.
type Conntrack interface {
	// ClearStale deletes the flows one sync's changes made stale.
	ClearStale(family v1.IPFamily, services state.ServiceMap, ch state.Changes) error
	// Reconcile deletes every stale flow, whatever made it stale.
	Reconcile(family v1.IPFamily, services state.ServiceMap, endpoints state.EndpointsMap) error
}

// Config are the core's inputs besides the API objects and the mode.
type Config struct {
	Family v1.IPFamily
	// ModeName names the mode in log lines.
	ModeName      string
	Node          state.Node
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	Health        *healthcheck.ProxyHealth
	// ServiceHealth and Conntrack are optional.
	ServiceHealth *healthcheck.ServiceHealth
	Conntrack     Conntrack
}

// Core is a proxier for one IP family: it folds API changes into the
// node's desired state and has its mode sync the kernel, only what changed
// when it can, everything after a start, a failure or a resync request.
type Core struct {
	cfg     Config
	mode    Mode
	tracker *state.Tracker
	runner  *runner.Runner

	mu             sync.Mutex
	state          *state.State
	node           state.Node
	servicesSynced bool
	slicesSynced   bool
	// ready is closed once both caches are complete: syncing starts then,
	// and not earlier, so the first sync is not held back by the minimum
	// interval after a run that had nothing to do.
	ready chan struct{}
	// firstSynced is closed by the first successful sync.
	firstSynced  chan struct{}
	needFullSync bool
	noLocal      noLocalEndpoints
	// lastReconcile is when every conntrack flow was last checked.
	lastReconcile time.Time

	// history is what explanations tell of the syncs.
	history syncHistory

	// The family's service CIDRs for a ServiceCIDRUser mode, and whether
	// the mode has yet to get them; apart from mu, which a sync holds.
	cidrMu       sync.Mutex
	serviceCIDRs []netip.Prefix
	cidrsPending bool

	// fullSyncTook is how long the mode's last successful full sync took:
	// it paces the repairs a Prober's watch asks for, without waiting for
	// mu, which a sync holds.
	fullSyncTook atomic.Int64

	// deferred asks for the sync a Deferrer mode wants next.
	deferred *time.Timer
}

// NewCore returns a proxier running mode; nothing is written before
// SyncLoop runs and both Services and EndpointSlices have synced.
func NewCore(cfg Config, mode Mode) *Core {
	c := &Core{
		cfg:          cfg,
		mode:         mode,
		tracker:      state.NewTracker(cfg.Family, cfg.Node.Name),
		state:        state.NewState(),
		node:         cfg.Node,
		needFullSync: true,
		ready:        make(chan struct{}),
		firstSynced:  make(chan struct{}),
		noLocal:      noLocalEndpoints{},
		history:      newSyncHistory(),
	}
	c.runner = runner.New(c.SyncOnce, cfg.MinSyncPeriod, cfg.SyncPeriod)
	return c
}

// OnCachedService records a Service change.
func (c *Core) OnCachedService(svc *state.Service, deleted bool) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	if deleted {
		svc = nil
	}
	c.tracker.OnCachedService(name, svc)
	c.queue()
}

// OnService records a change of the API object, as OnCachedService does.
func (c *Core) OnService(svc *v1.Service, deleted bool) {
	c.OnCachedService(state.ServiceOf(svc), deleted)
}

// OnCachedSlice records an EndpointSlice change.
func (c *Core) OnCachedSlice(slice *state.EndpointSlice, deleted bool) {
	c.tracker.OnCachedSlice(slice, deleted)
	c.queue()
}

// OnEndpointSlice records a change of the API object, as OnCachedSlice
// does.
func (c *Core) OnEndpointSlice(slice *discovery.EndpointSlice, deleted bool) {
	c.OnCachedSlice(state.SliceOf(slice), deleted)
}

// OnServicesSynced records that the Service cache is complete.
func (c *Core) OnServicesSynced() {
	c.mu.Lock()
	c.servicesSynced = true
	c.markReadyLocked()
	c.mu.Unlock()
}

// OnEndpointSlicesSynced records that the EndpointSlice cache is complete.
func (c *Core) OnEndpointSlicesSynced() {
	c.mu.Lock()
	c.slicesSynced = true
	c.markReadyLocked()
	c.mu.Unlock()
}

func (c *Core) markReadyLocked() {
	if c.servicesSynced && c.slicesSynced {
		select {
		case <-c.ready:
		default:
			close(c.ready)
		}
	}
}

// OnNode records the node's topology; a zone change re-selects every
// service's endpoints.
func (c *Core) OnNode(node *v1.Node) {
	if node == nil {
		return
	}
	zone := node.Labels[v1.LabelTopologyZone]
	c.mu.Lock()
	changed := zone != c.node.Zone
	c.node.Zone = zone
	c.mu.Unlock()
	if changed {
		c.RequestFullSync()
	}
}

// UsesServiceCIDRs tells whether the mode acts on the service CIDRs.
func (c *Core) UsesServiceCIDRs() bool {
	_, ok := c.mode.(ServiceCIDRUser)
	return ok
}

// OnServiceCIDRs passes the ranges of every ServiceCIDR object. When the
// family's changed, the mode gets them before the next sync, a full one.
func (c *Core) OnServiceCIDRs(cidrs []netip.Prefix) {
	if !c.UsesServiceCIDRs() {
		return
	}
	var own []netip.Prefix
	for _, p := range cidrs {
		if p.IsValid() && p.Addr().Is4() == (c.cfg.Family == v1.IPv4Protocol) {
			own = append(own, p.Masked())
		}
	}
	slices.SortFunc(own, netip.Prefix.Compare)
	own = slices.Compact(own)
	c.cidrMu.Lock()
	changed := !slices.Equal(own, c.serviceCIDRs)
	if changed {
		c.serviceCIDRs, c.cidrsPending = own, true
	}
	c.cidrMu.Unlock()
	if changed {
		c.RequestFullSync()
	}
}

// passServiceCIDRs hands the mode the service CIDRs it has not had yet.
func (c *Core) passServiceCIDRs() {
	c.cidrMu.Lock()
	cidrs, pending := c.serviceCIDRs, c.cidrsPending
	c.cidrsPending = false
	c.cidrMu.Unlock()
	if user, ok := c.mode.(ServiceCIDRUser); ok && pending {
		user.SetServiceCIDRs(cidrs)
	}
}

// SyncLoop syncs until the context ends, with the mode's watch, if any,
// running beside it.
func (c *Core) SyncLoop(ctx context.Context) {
	if w, ok := c.mode.(Watcher); ok {
		go w.Watch(ctx, c.RequestFullSync)
	}
	if p, ok := c.mode.(Prober); ok {
		go WatchKernel(ctx, p, func() time.Duration { return time.Duration(c.fullSyncTook.Load()) }, c.RequestFullSync)
	}
	if p, ok := c.mode.(Preparer); ok {
		p.Prepare()
	}
	select {
	case <-ctx.Done():
		return
	case <-c.ready:
	}
	c.runner.Loop(ctx)
}

// RequestFullSync has the next sync write everything, and asks for it soon.
func (c *Core) RequestFullSync() {
	c.mu.Lock()
	c.needFullSync = true
	c.mu.Unlock()
	c.queue()
}

// FullSyncPending tells whether the next sync will be a full one.
func (c *Core) FullSyncPending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.needFullSync
}

func (c *Core) queue() {
	if c.cfg.Health != nil {
		c.cfg.Health.QueuedUpdate(c.cfg.Family)
	}
	c.runner.Run()
}

// FirstSynced is closed once the first sync has succeeded.
func (c *Core) FirstSynced() <-chan struct{} { return c.firstSynced }

// SyncOnce folds the recorded changes into the state and brings the
// kernel in line: the changed service ports only, or everything after a
// start, a failure or a resync request. The sync loop calls it.
func (c *Core) SyncOnce() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	family := string(c.cfg.Family)
	start := time.Now()
	c.passServiceCIDRs()
	pendingServices, pendingEndpoints := c.tracker.Pending()
	changes := c.tracker.Apply(c.state)
	c.history.applied(c.state, changes.ServicePorts, start)
	metrics.ServiceChangesTotal.Add(float64(pendingServices))
	metrics.EndpointChangesTotal.Add(float64(pendingEndpoints))

	view := state.View{State: c.state, Node: c.node}
	full := c.needFullSync
	if !full {
		err := c.mode.PartialSync(view, changes.ServicePorts)
		switch {
		case errors.Is(err, ErrFullSyncNeeded):
			full = true
		case err != nil:
			klog.ErrorS(err, "Partial sync failed; doing a full sync", "mode", c.cfg.ModeName, "ipFamily", family)
			c.countFailure(false, err)
			full = true
		}
	}
	if full {
		fullStart := time.Now()
		if err := c.mode.FullSync(view); err != nil {
			// The runner retries, backing off from a second to a minute.
			klog.ErrorS(err, "Full sync failed; retrying", "mode", c.cfg.ModeName, "ipFamily", family)
			c.countFailure(true, err)
			c.needFullSync = true
			return fmt.Errorf("%s %s sync: %w", c.cfg.ModeName, family, err)
		}
		c.needFullSync = false
		c.fullSyncTook.Store(int64(time.Since(fullStart)))
	}
	c.history.synced(start, full)
	elapsed := time.Since(start).Seconds()
	metrics.SyncProxyRulesLatency.WithLabelValues(family).Observe(elapsed)
	if full {
		metrics.SyncFullProxyRulesLatency.WithLabelValues(family).Observe(elapsed)
	} else {
		metrics.SyncPartialProxyRulesLatency.WithLabelValues(family).Observe(elapsed)
	}
	metrics.SyncProxyRulesLastTimestamp.WithLabelValues(family).SetToCurrentTime()
	for _, at := range changes.TriggerTimes {
		metrics.NetworkProgrammingLatency.WithLabelValues(family).Observe(metrics.SinceInSeconds(at))
	}
	svcs, eps := c.tracker.Pending()
	metrics.ServiceChangesPending.Set(float64(svcs))
	metrics.EndpointChangesPending.Set(float64(eps))
	if c.cfg.Health != nil && svcs == 0 && eps == 0 {
		c.cfg.Health.Updated(c.cfg.Family)
	}
	c.afterSync(view, changes, full)
	c.scheduleDeferred()
	select {
	case <-c.firstSynced:
	default:
		close(c.firstSynced)
	}
	klog.V(2).InfoS("Synced proxy rules", "mode", c.cfg.ModeName, "ipFamily", family, "full", full, "changedServicePorts", len(changes.ServicePorts), "elapsed", time.Since(start))
	if full {
		// A full sync's garbage (tens of MB at 10k services) is hand back
		// to the node at once instead of held until the runtime's
		// background scavenger gets there.
		debug.FreeOSMemory()
	}
	return nil
}

// scheduleDeferred asks for a sync when a Deferrer mode's deferred work
// is due (one timer, reset by every sync).
func (c *Core) scheduleDeferred() {
	d, ok := c.mode.(Deferrer)
	if !ok {
		return
	}
	if c.deferred != nil {
		c.deferred.Stop()
	}
	if at := d.NextSync(); !at.IsZero() {
		c.deferred = time.AfterFunc(time.Until(at), c.runner.Run)
	}
}

// countFailure has a FailureCounter mode count a failed sync.
func (c *Core) countFailure(full bool, err error) {
	if f, ok := c.mode.(FailureCounter); ok {
		f.CountFailure(full, err)
	}
}

// afterSync updates what depends on a successful sync: health-check
// servers, the no-local-endpoints metric and conntrack.
func (c *Core) afterSync(v state.View, changes state.Changes, full bool) {
	family := string(c.cfg.Family)
	if full {
		c.noLocal = noLocalEndpoints{}
		for name := range v.Services {
			c.noLocal.update(v, name)
		}
	} else {
		for name := range changes.ServicePorts {
			c.noLocal.update(v, name)
		}
	}
	internal, external := c.noLocal.counts()
	metrics.NoLocalEndpointsTotal.WithLabelValues("internal", family).Set(float64(internal))
	metrics.NoLocalEndpointsTotal.WithLabelValues("external", family).Set(float64(external))
	if c.cfg.ServiceHealth != nil {
		ports := map[types.NamespacedName]int32{}
		local := map[types.NamespacedName]int{}
		for name, svc := range v.Services {
			if svc.HealthCheckNodePort == 0 {
				continue
			}
			ports[name.NamespacedName] = svc.HealthCheckNodePort
			for _, ep := range v.Endpoints[name] {
				if ep.IsLocal && ep.Ready {
					local[name.NamespacedName]++
				}
			}
		}
		if err := c.cfg.ServiceHealth.SyncServices(ports); err != nil {
			klog.ErrorS(err, "Health check node ports")
		}
		c.cfg.ServiceHealth.SyncEndpoints(local)
	}
	if c.cfg.Conntrack == nil {
		return
	}
	if len(changes.StaleEndpoints) > 0 || len(changes.NewlyActiveUDP) > 0 {
		if err := c.cfg.Conntrack.ClearStale(c.cfg.Family, v.Services, changes); err != nil {
			klog.ErrorS(err, "Clearing stale conntrack entries", "ipFamily", family)
		}
	}
	// A full pass reads the whole conntrack table: once per sync period,
	// starting with the first sync, which catches what changed while
	// kube-proxy was not running.
	if time.Since(c.lastReconcile) >= c.cfg.SyncPeriod {
		if err := c.cfg.Conntrack.Reconcile(c.cfg.Family, v.Services, v.Endpoints); err != nil {
			klog.ErrorS(err, "Reconciling conntrack entries", "ipFamily", family)
		}
		c.lastReconcile = time.Now()
	}
}

// noLocalEndpoints are the service ports whose Local traffic policy finds
// no local endpoint while the service has endpoints elsewhere (traffic of
// that kind is dropped), per policy, as upstream counts them.
type noLocalEndpoints map[state.ServicePortName]noLocalPolicies

type noLocalPolicies struct{ internal, external bool }

// update re-decides one service port.
func (n noLocalEndpoints) update(v state.View, name state.ServicePortName) {
	svc, sel, ok := v.Select(name)
	if !ok || !sel.HasAny {
		delete(n, name)
		return
	}
	// With endpoints somewhere, only a Local path can go unserved.
	paths := state.PathsOf(svc, sel)
	p := noLocalPolicies{internal: !paths.Internal.Served, external: !paths.External.Served}
	if p == (noLocalPolicies{}) {
		delete(n, name)
		return
	}
	n[name] = p
}

func (n noLocalEndpoints) counts() (internal, external int) {
	for _, p := range n {
		if p.internal {
			internal++
		}
		if p.external {
			external++
		}
	}
	return internal, external
}
