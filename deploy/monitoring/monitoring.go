// Package monitoring holds kube-proxy's Prometheus rules (rules.yaml, and
// the same groups as a PrometheusRule for the Prometheus Operator) and its
// Grafana dashboard, with what the tests need to check them: every PromQL
// expression, and the metric names they read.
package monitoring

import (
	_ "embed"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Rules is rules.yaml, the plain Prometheus rules file.
//
//go:embed rules.yaml
var Rules []byte

// The files generated from Rules and from the dashboard's definition.
const (
	RulesFile          = "rules.yaml"
	PrometheusRuleFile = "prometheusrule.yaml"
	DashboardFile      = "dashboard.json"
)

// PrometheusRule is Rules as a PrometheusRule object: the rules file's
// groups, comments and all, under spec.
func PrometheusRule() []byte {
	var b strings.Builder
	b.WriteString("# Generated from rules.yaml (go test ./deploy/monitoring -update): edit that file.\n" +
		"apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: kube-proxy\n  namespace: kube-system\n" +
		"  labels:\n    app.kubernetes.io/name: kube-proxy\nspec:\n")
	header := true
	for _, line := range strings.SplitAfter(string(Rules), "\n") {
		// The file's own header comment describes the file, not the groups.
		if header && strings.HasPrefix(line, "#") {
			continue
		}
		header = false
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return []byte(b.String())
}

// RuleGroups are the groups of a rules file or a PrometheusRule's spec,
// decoded for comparison.
type RuleGroups struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is one group of rules.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Rule is a recording or an alerting rule.
type Rule struct {
	Record      string            `json:"record,omitempty"`
	Alert       string            `json:"alert,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ParseRules decodes a rules file.
func ParseRules(data []byte) (RuleGroups, error) {
	var g RuleGroups
	err := yaml.UnmarshalStrict(data, &g)
	return g, err
}

// Expressions are the PromQL expressions of the rules and the dashboard's
// panels, the latter with the dashboard's variables as Grafana would set
// them for every node.
func Expressions() ([]string, error) {
	groups, err := ParseRules(Rules)
	if err != nil {
		return nil, err
	}
	var exprs []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	for _, p := range Panels() {
		for _, t := range p.Targets {
			exprs = append(exprs, Substitute(t.Expr, "kube-proxy", ".*", "5m"))
		}
	}
	return exprs, nil
}

// Substitute sets the dashboard's variables in an expression.
func Substitute(expr, job, instance, rateInterval string) string {
	return strings.NewReplacer("$__rate_interval", rateInterval, "$job", job, "$instance", instance).Replace(expr)
}

var identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)

// MetricNames are the metric families an expression reads from kube-proxy:
// names with kube-proxy's prefix or the process and Go collectors', with a
// histogram's series suffix taken off. Recorded names (with a colon) and
// Prometheus' own up are not kube-proxy's.
func MetricNames(expr string) []string {
	var names []string
	for _, id := range identifier.FindAllString(expr, -1) {
		if strings.Contains(id, ":") || !(strings.HasPrefix(id, "kubeproxy_") || strings.HasPrefix(id, "process_") || strings.HasPrefix(id, "go_")) {
			continue
		}
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(id, suffix); ok && strings.HasPrefix(id, "kubeproxy_") {
				id = base
				break
			}
		}
		if !slices.Contains(names, id) {
			names = append(names, id)
		}
	}
	slices.Sort(names)
	return names
}

// ModeOf is the proxy mode that serves a metric family: "iptables",
// "nftables" or "ipvs" for a mode's own, "" for those every mode serves.
// The IPVS mode also serves the iptables restore failures (its iptables
// rules), and every mode the mode switch's gauges.
func ModeOf(name string) string {
	switch {
	case strings.HasPrefix(name, "kubeproxy_mode_switch_"):
		return ""
	case strings.Contains(name, "_iptables_"):
		return "iptables"
	case strings.Contains(name, "_nftables_"):
		return "nftables"
	case strings.Contains(name, "_ipvs_"):
		return "ipvs"
	}
	return ""
}
