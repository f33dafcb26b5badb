// Package metrics holds kube-proxy's Prometheus metrics, with upstream's
// names, labels and buckets, so existing dashboards and alerts keep working.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/rapidproxy/rapidproxy/internal/nfacct"
)

const subsystem = "kubeproxy"

func histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: subsystem, Name: name, Help: help, Buckets: buckets}, labels)
}

func gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: subsystem, Name: name, Help: help}, labels)
}

func counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: subsystem, Name: name, Help: help}, labels)
}

var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// networkProgrammingBuckets: 0.25s, 0.5s, then every second to 59s, every
// 5s to 115s, every 30s to 5 minutes, as upstream.
func networkProgrammingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// The metrics; per-family ones carry the ip_family label ("IPv4"/"IPv6").
var (
	SyncProxyRulesLatency        = histogram("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets, "ip_family")
	SyncFullProxyRulesLatency    = histogram("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets, "ip_family")
	SyncPartialProxyRulesLatency = histogram("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets, "ip_family")
	SyncProxyRulesLastTimestamp  = gauge("sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced", "ip_family")
	SyncProxyRulesLastQueued     = gauge("sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued", "ip_family")
	NetworkProgrammingLatency    = histogram("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", networkProgrammingBuckets(), "ip_family")

	EndpointChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_pending", Help: "Pending proxy rules Endpoint changes"})
	EndpointChangesTotal   = prometheus.NewCounter(prometheus.CounterOpts{Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_total", Help: "Cumulative proxy rules Endpoint changes"})
	ServiceChangesPending  = prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_pending", Help: "Pending proxy rules Service changes"})
	ServiceChangesTotal    = prometheus.NewCounter(prometheus.CounterOpts{Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_total", Help: "Cumulative proxy rules Service changes"})

	IPTablesRestoreFailuresTotal        = counter("sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures", "ip_family")
	IPTablesPartialRestoreFailuresTotal = counter("sync_proxy_rules_iptables_partial_restore_failures_total", "Cumulative proxy iptables partial restore failures", "ip_family")
	IPTablesRulesTotal                  = gauge("sync_proxy_rules_iptables_total", "Total number of iptables rules owned by kube-proxy", "table", "ip_family")
	IPTablesRulesLastSync               = gauge("sync_proxy_rules_iptables_last", "Number of iptables rules written by kube-proxy in last sync", "table", "ip_family")
	// IPTablesFlushRecoveriesTotal is ours, not upstream's: how often another
	// program flushed the rules and they were restored.
	IPTablesFlushRecoveriesTotal = counter("sync_proxy_rules_iptables_flush_recoveries_total", "Times kube-proxy's iptables rules were found flushed by another program and restored", "ip_family")
	// The nftables mode's: failed sync transactions, and failed deletions of
	// stale chains (done after the sync that stopped using them).
	NFTablesSyncFailuresTotal    = counter("sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures", "ip_family")
	NFTablesCleanupFailuresTotal = counter("sync_proxy_rules_nftables_cleanup_failures_total", "Cumulative proxy nftables cleanup failures", "ip_family")
	// NFTablesRepairsTotal is ours, not upstream's: how often another
	// program changed the nftables mode's table and it was restored.
	NFTablesRepairsTotal = counter("sync_proxy_rules_nftables_repairs_total", "Times kube-proxy's nftables table was found changed by another program and restored", "ip_family")
	// IPVSRepairsTotal is ours, not upstream's: how often another program
	// changed what the IPVS mode keeps in the kernel (virtual or real
	// servers, kube-ipvs0's addresses, ipset entries, its iptables rules)
	// and a full sync restored it.
	IPVSRepairsTotal      = counter("sync_proxy_rules_ipvs_repairs_total", "Times the IPVS mode's kernel state was found changed by another program and restored", "ip_family")
	NoLocalEndpointsTotal = gauge("sync_proxy_rules_no_local_endpoints_total", "Number of services with a Local traffic policy and no endpoints", "traffic_policy", "ip_family")

	// ModeSwitchInProgress and ModeSwitchDrainingVirtualServers are ours,
	// not upstream's: a node that started in one mode over another mode's
	// rules is switching until it has removed them (after its own first
	// sync), and IPVS virtual servers that still carry connections stay
	// until those end.
	ModeSwitchInProgress             = prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: subsystem, Name: "mode_switch_in_progress", Help: "1 while kube-proxy is switching from another proxy mode's rules to its own, 0 otherwise"})
	ModeSwitchDrainingVirtualServers = prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: subsystem, Name: "mode_switch_draining_ipvs_virtual_servers", Help: "IPVS virtual servers a node that left the IPVS mode keeps until their connections end"})

	ProxyHealthzTotal = counter("proxy_healthz_total", "Cumulative proxy healthz HTTP status", "code")
	ProxyLivezTotal   = counter("proxy_livez_total", "Cumulative proxy livez HTTP status", "code")

	ConntrackReconcilerSyncDuration = histogram("conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds", syncBuckets, "ip_family")
	ConntrackReconcilerDeleted      = counter("conntrack_reconciler_deleted_entries_total", "Cumulative conntrack flows deleted by conntrack reconciler", "ip_family")

	IPTablesCTStateInvalidDropped = nfacctCounter{
		object: NFAcctCTStateInvalidDropped,
		desc:   prometheus.NewDesc(prometheus.BuildFQName(subsystem, "", "iptables_ct_state_invalid_dropped_packets_total"), "packets dropped by iptables to work around conntrack problems", nil, nil),
	}
	IPTablesLocalhostNodePortsAccepted = nfacctCounter{
		object: NFAcctLocalhostNodePortsAccepted,
		desc:   prometheus.NewDesc(prometheus.BuildFQName(subsystem, "", "iptables_localhost_nodeports_accepted_packets_total"), "Number of packets accepted on nodeports of loopback interface", nil, nil),
	}
)

// The nfacct objects the iptables rules count packets in, named as
// upstream's, so the counts carry over when a node switches.
const (
	NFAcctCTStateInvalidDropped      = "ct_state_invalid_dropped_pkts"
	NFAcctLocalhostNodePortsAccepted = "localhost_nps_accepted_pkts"
)

// nfacctCounter serves the packet count of an nfacct object, read from the
// kernel at each scrape as upstream does; nothing where the object does
// not exist (the kernel has no nfacct, or the rules do not use it).
type nfacctCounter struct {
	object string
	desc   *prometheus.Desc
}

func (c nfacctCounter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// nfacctServed is set by the iptables mode once it counts packets in the
// nfacct objects; the other modes serve no such counter, as upstream's.
var nfacctServed atomic.Bool

// ServeNFAcctCounters has the nfacct counters served from now on.
func ServeNFAcctCounters() { nfacctServed.Store(true) }

func (c nfacctCounter) Collect(ch chan<- prometheus.Metric) {
	if !nfacctServed.Load() {
		return
	}
	counter, err := nfacct.Get(c.object)
	if err != nil {
		// Not an error log: without nfacct this fails at every scrape,
		// and start-up already said nfacct is not used.
		klog.V(2).InfoS("Not serving an nfacct counter", "object", c.object, "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(counter.Packets))
}

// Registry holds every metric above plus the process and Go collectors.
var Registry = func() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		SyncProxyRulesLatency, SyncFullProxyRulesLatency, SyncPartialProxyRulesLatency,
		SyncProxyRulesLastTimestamp, SyncProxyRulesLastQueued, NetworkProgrammingLatency,
		EndpointChangesPending, EndpointChangesTotal, ServiceChangesPending, ServiceChangesTotal,
		IPTablesRestoreFailuresTotal, IPTablesPartialRestoreFailuresTotal, IPTablesRulesTotal, IPTablesRulesLastSync, IPTablesFlushRecoveriesTotal,
		NFTablesSyncFailuresTotal, NFTablesCleanupFailuresTotal, NFTablesRepairsTotal, IPVSRepairsTotal,
		NoLocalEndpointsTotal, ProxyHealthzTotal, ProxyLivezTotal,
		ModeSwitchInProgress, ModeSwitchDrainingVirtualServers,
		ConntrackReconcilerSyncDuration, ConntrackReconcilerDeleted,
		IPTablesCTStateInvalidDropped, IPTablesLocalhostNodePortsAccepted,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return r
}()

// Handler serves the registry in the Prometheus text format.
func Handler() http.Handler {
	return promhttp.HandlerFor(Registry, promhttp.HandlerOpts{})
}

// SinceInSeconds is the time since start, in seconds.
func SinceInSeconds(start time.Time) float64 { return time.Since(start).Seconds() }

// The nftables mode's localhost NodePorts (gate
// KubeProxyNFTablesLocalhostNodePorts), as upstream's: userspace listeners
// bound on the loopback address, those that could not be bound, and the
// packets the table rejected, read from its named counters at each
// scrape. Registered only with the gate on (RegisterLocalhostNodePorts),
// as upstream registers them.
var (
	LocalhostNodePortListeners                     = gauge("nftables_localhost_nodeport_listeners", "Number of active localhost NodePort userspace proxy listeners.", "ip_family")
	LocalhostNodePortListenerCreationFailuresTotal = counter("nftables_localhost_nodeport_listener_creation_failures_total", "Number of localhost NodePort userspace proxy listener creation failures.", "ip_family")
	LocalhostNodePortRejected                      = &nftCounters{
		desc: prometheus.NewDesc(prometheus.BuildFQName(subsystem, "", "nftables_localhost_nodeport_rejected_packets_total"),
			"Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
			[]string{"ip_family", "protocol"}, nil),
		read: map[string]func(context.Context) (map[string]uint64, error){},
	}
)

// nftCounters serves packet counts of named nftables counters, read from
// the kernel at each scrape: per IP family, each protocol's count.
type nftCounters struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	read map[string]func(context.Context) (map[string]uint64, error)
}

// AddFamily has a family's counts served, as read returns them (by
// protocol); an error is logged, its family left out of that scrape.
func (c *nftCounters) AddFamily(family string, read func(context.Context) (map[string]uint64, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read[family] = read
}

func (c *nftCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *nftCounters) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for family, read := range c.read {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		counts, err := read(ctx)
		cancel()
		if err != nil {
			klog.ErrorS(err, "Failed to list nftables counters", "ipFamily", family)
			continue
		}
		for protocol, packets := range counts {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(packets), family, protocol)
		}
	}
}

var registerLocalhostNodePorts sync.Once

// RegisterLocalhostNodePorts adds the localhost NodePort metrics to the
// registry; with the gate off they are not served.
func RegisterLocalhostNodePorts() {
	registerLocalhostNodePorts.Do(func() {
		Registry.MustRegister(LocalhostNodePortListeners, LocalhostNodePortListenerCreationFailuresTotal, LocalhostNodePortRejected)
	})
}
