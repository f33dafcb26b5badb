package monitoring

import (
	"encoding/json"
)

// Panel is one time-series panel of the dashboard.
type Panel struct {
	Title, Description string
	// Unit is Grafana's unit id (s, ops, bytes, percentunit, short).
	Unit string
	// Axis says what a unit without a name (short) counts, for the y-axis
	// of the chart in docs/img; $__rate_interval stands for the window of
	// an increase().
	Axis    string
	Targets []Target
	// Main panels are those of the chart in docs/img (test/dashboardchart).
	Main bool
}

// Target is one query of a panel.
type Target struct {
	Expr, Legend string
}

// Row is a titled group of panels.
type Row struct {
	Title  string
	Panels []Panel
}

// sel is the selector of the dashboard's variables.
const sel = `{job=~"$job", instance=~"$instance"}`

func s(name string) string { return name + sel }

func rate(name string) string { return "rate(" + s(name) + "[$__rate_interval])" }

func quantile(q, name, by string) string {
	return "histogram_quantile(" + q + ", sum by (" + by + ", le) (" + rate(name+"_bucket") + "))"
}

// Rows are the dashboard's rows: first the whole cluster, then per node
// (the instance variable picks nodes), then each mode's own metrics.
func Rows() []Row {
	return []Row{
		{Title: "Cluster", Panels: []Panel{
			{Title: "kube-proxies up", Unit: "short", Targets: []Target{
				{`sum(up{job=~"$job", instance=~"$instance"})`, "up"},
				{`count(up{job=~"$job", instance=~"$instance"})`, "targets"}}},
			{Title: "Network programming latency (cluster)", Unit: "s",
				Description: "From an endpoint's change to every selected node's rules carrying it; the Kubernetes SLO is p99 at most 30s.",
				Targets: []Target{
					{quantile("0.99", "kubeproxy_network_programming_duration_seconds", "ip_family"), "p99 {{ip_family}}"},
					{quantile("0.5", "kubeproxy_network_programming_duration_seconds", "ip_family"), "p50 {{ip_family}}"}}},
			{Title: "Syncs (cluster)", Unit: "ops", Targets: []Target{
				{"sum by (ip_family) (" + rate("kubeproxy_sync_proxy_rules_duration_seconds_count") + ")", "{{ip_family}}"}}},
		}},
		{Title: "Syncs per node", Panels: []Panel{
			{Title: "Syncs per second", Unit: "ops", Main: true, Targets: []Target{
				{"sum by (instance, ip_family) (" + rate("kubeproxy_sync_full_proxy_rules_duration_seconds_count") + ")", "full {{instance}} {{ip_family}}"},
				{"sum by (instance, ip_family) (" + rate("kubeproxy_sync_partial_proxy_rules_duration_seconds_count") + ")", "partial {{instance}} {{ip_family}}"}}},
			{Title: "Sync duration p99", Unit: "s", Main: true, Targets: []Target{
				{quantile("0.99", "kubeproxy_sync_proxy_rules_duration_seconds", "instance, ip_family"), "{{instance}} {{ip_family}}"}}},
			{Title: "Network programming latency p99", Unit: "s", Main: true, Targets: []Target{
				{quantile("0.99", "kubeproxy_network_programming_duration_seconds", "instance, ip_family"), "{{instance}} {{ip_family}}"}}},
			{Title: "Pending changes", Unit: "short", Axis: "changes waiting", Main: true,
				Description: "Changes received and not yet synced (the queue).",
				Targets: []Target{
					{"sum by (instance) (" + s("kubeproxy_sync_proxy_rules_endpoint_changes_pending") + ")", "endpoints {{instance}}"},
					{"sum by (instance) (" + s("kubeproxy_sync_proxy_rules_service_changes_pending") + ")", "services {{instance}}"}}},
			{Title: "Changes received per second", Unit: "ops", Targets: []Target{
				{"sum by (instance) (" + rate("kubeproxy_sync_proxy_rules_endpoint_changes_total") + ")", "endpoints {{instance}}"},
				{"sum by (instance) (" + rate("kubeproxy_sync_proxy_rules_service_changes_total") + ")", "services {{instance}}"}}},
			{Title: "Time since the last sync", Unit: "s",
				Description: "Unhealthy (as /healthz) when changes are queued and this passes twice the sync period.",
				Targets: []Target{
					{"time() - " + s("kubeproxy_sync_proxy_rules_last_timestamp_seconds"), "{{instance}} {{ip_family}}"},
					{"clamp_min(" + s("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds") + " - " + s("kubeproxy_sync_proxy_rules_last_timestamp_seconds") + ", 0)", "queued after it {{instance}} {{ip_family}}"}}},
			{Title: "Sync failures", Unit: "short", Axis: "failures per $__rate_interval", Main: true, Targets: []Target{
				{"sum by (instance, ip_family) (increase(" + s("kubeproxy_sync_proxy_rules_iptables_restore_failures_total") + "[$__rate_interval]))", "iptables-restore {{instance}} {{ip_family}}"},
				{"sum by (instance, ip_family) (increase(" + s("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total") + "[$__rate_interval]))", "partial iptables-restore {{instance}} {{ip_family}}"},
				{"sum by (instance, ip_family) (increase(" + s("kubeproxy_sync_proxy_rules_nftables_sync_failures_total") + "[$__rate_interval]))", "nftables {{instance}} {{ip_family}}"},
				{"sum by (instance, ip_family) (increase(" + s("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total") + "[$__rate_interval]))", "nftables cleanup {{instance}} {{ip_family}}"}}},
			{Title: "Rules restored after another program changed them", Unit: "short", Axis: "repairs per $__rate_interval", Main: true, Targets: []Target{
				{"sum by (instance, ip_family) (increase(" + s("kubeproxy_sync_proxy_rules_iptables_flush_recoveries_total") + "[$__rate_interval]))", "iptables {{instance}} {{ip_family}}"},
				{"sum by (instance, ip_family) (increase(" + s("kubeproxy_sync_proxy_rules_nftables_repairs_total") + "[$__rate_interval]))", "nftables {{instance}} {{ip_family}}"},
				{"sum by (instance, ip_family) (increase(" + s("kubeproxy_sync_proxy_rules_ipvs_repairs_total") + "[$__rate_interval]))", "IPVS {{instance}} {{ip_family}}"}}},
			{Title: "Services with a Local policy and no local endpoints", Unit: "short", Targets: []Target{
				{"sum by (instance, traffic_policy) (" + s("kubeproxy_sync_proxy_rules_no_local_endpoints_total") + ")", "{{traffic_policy}} {{instance}}"}}},
			{Title: "/healthz and /livez answers", Unit: "ops", Targets: []Target{
				{"sum by (instance, code) (" + rate("kubeproxy_proxy_healthz_total") + ")", "healthz {{code}} {{instance}}"},
				{"sum by (instance, code) (" + rate("kubeproxy_proxy_livez_total") + ")", "livez {{code}} {{instance}}"}}},
		}},
		{Title: "iptables mode", Panels: []Panel{
			{Title: "iptables rules", Unit: "short", Axis: "rules", Main: true, Targets: []Target{
				{"sum by (instance, table, ip_family) (" + s("kubeproxy_sync_proxy_rules_iptables_total") + ")", "{{table}} {{instance}} {{ip_family}}"},
				{"sum by (instance, table, ip_family) (" + s("kubeproxy_sync_proxy_rules_iptables_last") + ")", "written last sync {{table}} {{instance}} {{ip_family}}"}}},
			{Title: "Packets counted by the iptables rules", Unit: "pps", Targets: []Target{
				{"sum by (instance) (" + rate("kubeproxy_iptables_ct_state_invalid_dropped_packets_total") + ")", "conntrack INVALID dropped {{instance}}"},
				{"sum by (instance) (" + rate("kubeproxy_iptables_localhost_nodeports_accepted_packets_total") + ")", "localhost NodePorts accepted {{instance}}"}}},
		}},
		{Title: "Conntrack and mode switches", Panels: []Panel{
			{Title: "Stale conntrack flows deleted", Unit: "ops", Targets: []Target{
				{"sum by (instance, ip_family) (" + rate("kubeproxy_conntrack_reconciler_deleted_entries_total") + ")", "{{instance}} {{ip_family}}"}}},
			{Title: "Conntrack cleanup duration p99", Unit: "s", Targets: []Target{
				{quantile("0.99", "kubeproxy_conntrack_reconciler_sync_duration_seconds", "instance, ip_family"), "{{instance}} {{ip_family}}"}}},
			{Title: "Mode switch", Unit: "short",
				Description: "1 while a node removes another mode's rules; IPVS virtual servers that still carry connections stay at most 15 minutes.",
				Targets: []Target{
					{s("kubeproxy_mode_switch_in_progress"), "in progress {{instance}}"},
					{s("kubeproxy_mode_switch_draining_ipvs_virtual_servers"), "draining IPVS virtual servers {{instance}}"}}},
		}},
		{Title: "Process", Panels: []Panel{
			{Title: "CPU", Unit: "percentunit", Main: true, Targets: []Target{
				{rate("process_cpu_seconds_total"), "{{instance}}"}}},
			{Title: "Memory", Unit: "bytes", Main: true, Targets: []Target{
				{s("process_resident_memory_bytes"), "resident {{instance}}"},
				{s("go_memstats_heap_inuse_bytes"), "Go heap in use {{instance}}"}}},
			{Title: "Goroutines and open files", Unit: "short", Targets: []Target{
				{s("go_goroutines"), "goroutines {{instance}}"},
				{s("process_open_fds"), "open files {{instance}}"}}},
		}},
	}
}

// Panels are every row's panels, in order.
func Panels() []Panel {
	var ps []Panel
	for _, r := range Rows() {
		ps = append(ps, r.Panels...)
	}
	return ps
}

type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

var datasource = map[string]string{"type": "prometheus", "uid": "${datasource}"}

// Dashboard is the Grafana dashboard's JSON model.
func Dashboard() ([]byte, error) {
	var panels []any
	id, y := 1, 0
	for _, r := range Rows() {
		panels = append(panels, map[string]any{"id": id, "type": "row", "title": r.Title, "collapsed": false, "gridPos": gridPos{1, 24, 0, y}, "panels": []any{}})
		id, y = id+1, y+1
		for i, p := range r.Panels {
			var targets []any
			for j, t := range p.Targets {
				targets = append(targets, map[string]any{"refId": string(rune('A' + j)), "expr": t.Expr, "legendFormat": t.Legend, "datasource": datasource})
			}
			panels = append(panels, map[string]any{
				"id": id, "type": "timeseries", "title": p.Title, "description": p.Description, "datasource": datasource,
				"gridPos":     gridPos{8, 8, 8 * (i % 3), y + 8*(i/3)},
				"fieldConfig": map[string]any{"defaults": map[string]any{"unit": p.Unit}, "overrides": []any{}},
				"options":     map[string]any{"legend": map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true}, "tooltip": map[string]any{"mode": "multi", "sort": "desc"}},
				"targets":     targets,
			})
			id++
		}
		y += 8 * ((len(r.Panels) + 2) / 3)
	}
	variable := func(name, label, query string, multi bool) map[string]any {
		v := map[string]any{"name": name, "label": label, "type": "query", "datasource": datasource,
			"query": map[string]any{"query": query, "refId": name}, "definition": query, "refresh": 2, "sort": 1,
			"multi": multi, "includeAll": multi, "current": map[string]any{}}
		if multi {
			v["allValue"] = ".*"
		}
		return v
	}
	d := map[string]any{
		"uid": "rapidproxy-kube-proxy", "title": "kube-proxy", "tags": []string{"kube-proxy", "rapidproxy"},
		"description":   "kube-proxy across the cluster and per node: syncs, network programming latency, queue, failures, repairs, rules, resources. Alerts and runbooks: docs/monitoring.md.",
		"schemaVersion": 39, "editable": true, "graphTooltip": 1, "refresh": "30s",
		"time": map[string]string{"from": "now-3h", "to": "now"},
		"templating": map[string]any{"list": []any{
			map[string]any{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": map[string]any{}},
			variable("job", "Job", "label_values(kubeproxy_sync_proxy_rules_last_timestamp_seconds, job)", false),
			variable("instance", "Node", `label_values(kubeproxy_sync_proxy_rules_last_timestamp_seconds{job=~"$job"}, instance)`, true),
		}},
		"annotations": map[string]any{"list": []any{}},
		"panels":      panels,
	}
	out, err := json.MarshalIndent(d, "", "  ")
	return append(out, '\n'), err
}
