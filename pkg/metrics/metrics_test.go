package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every metric name upstream documents must be served, with its labels.
func TestUpstreamMetricNames(t *testing.T) {
	SyncProxyRulesLatency.WithLabelValues("IPv4").Observe(0.1)
	SyncFullProxyRulesLatency.WithLabelValues("IPv4").Observe(0.1)
	SyncPartialProxyRulesLatency.WithLabelValues("IPv4").Observe(0.1)
	SyncProxyRulesLastTimestamp.WithLabelValues("IPv4").SetToCurrentTime()
	SyncProxyRulesLastQueued.WithLabelValues("IPv4").SetToCurrentTime()
	NetworkProgrammingLatency.WithLabelValues("IPv4").Observe(1)
	IPTablesRestoreFailuresTotal.WithLabelValues("IPv4")
	IPTablesPartialRestoreFailuresTotal.WithLabelValues("IPv4")
	IPTablesRulesTotal.WithLabelValues("nat", "IPv4")
	IPTablesRulesLastSync.WithLabelValues("filter", "IPv4")
	NFTablesSyncFailuresTotal.WithLabelValues("IPv4")
	NFTablesCleanupFailuresTotal.WithLabelValues("IPv6")
	NoLocalEndpointsTotal.WithLabelValues("internal", "IPv4")
	ProxyHealthzTotal.WithLabelValues("200")
	ProxyLivezTotal.WithLabelValues("200")
	ConntrackReconcilerSyncDuration.WithLabelValues("IPv4").Observe(0.01)
	ConntrackReconcilerDeleted.WithLabelValues("IPv4")

	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, name := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4"`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4"`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{ip_family="IPv4"`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"}`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending `,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total `,
		`kubeproxy_sync_proxy_rules_service_changes_pending `,
		`kubeproxy_sync_proxy_rules_service_changes_total `,
		`kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}`,
		`kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv4",table="filter"}`,
		`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0`,
		`kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv6"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}`,
		`kubeproxy_proxy_healthz_total{code="200"}`,
		`kubeproxy_proxy_livez_total{code="200"}`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4"`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}
