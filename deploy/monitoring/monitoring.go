// Package monitoring holds kube-proxy's Prometheus rules (rules.yaml, and
// the same groups as a PrometheusRule for the Prometheus Operator) and its
// Grafana dashboard, with what the tests need to check them: every PromQL
// expression, and the metric names they read.
package monitoring

import (
	_ "embed"
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
