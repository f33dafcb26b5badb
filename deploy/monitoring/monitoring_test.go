package monitoring

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml and dashboard.json")

// The generated files are what the code generates, and the PrometheusRule
// holds exactly the rules file's groups.
func TestGeneratedFiles(t *testing.T) {
	dashboard, err := Dashboard()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{PrometheusRuleFile: PrometheusRule(), DashboardFile: dashboard} {
		if *update {
			if err := os.WriteFile(name, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is out of date (go test ./deploy/monitoring -update):\n%s", name, testutil.LineDiff(string(want), string(got)))
		}
	}

	data, err := os.ReadFile(PrometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	var object struct {
		APIVersion string     `json:"apiVersion"`
		Kind       string     `json:"kind"`
		Metadata   any        `json:"metadata"`
		Spec       RuleGroups `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &object); err != nil {
		t.Fatal(err)
	}
	groups, err := ParseRules(Rules)
	if err != nil {
		t.Fatal(err)
	}
	if object.APIVersion != "monitoring.coreos.com/v1" || object.Kind != "PrometheusRule" {
		t.Errorf("%s is a %s %s", PrometheusRuleFile, object.APIVersion, object.Kind)
	}
	if len(groups.Groups) == 0 || !reflect.DeepEqual(object.Spec, groups) {
		t.Errorf("%s's groups differ from %s's", PrometheusRuleFile, RulesFile)
	}
}

// Every alert has a runbook in docs/monitoring.md, under a heading its
// runbook_url's anchor names, and a row in the table of alerts.
func TestRunbooks(t *testing.T) {
	docs, err := os.ReadFile("../../docs/monitoring.md")
	if err != nil {
		t.Fatal(err)
	}
	groups, err := ParseRules(Rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if want := "docs/monitoring.md#" + strings.ToLower(r.Alert); !strings.HasSuffix(r.Annotations["runbook_url"], want) {
				t.Errorf("%s: runbook_url %q, want one ending in %s", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !bytes.Contains(docs, []byte("\n### "+r.Alert+"\n")) || !bytes.Contains(docs, []byte("| ["+r.Alert+"](#"+strings.ToLower(r.Alert)+") |")) {
				t.Errorf("%s: no runbook heading or table row in docs/monitoring.md", r.Alert)
			}
			if r.Labels["severity"] == "" {
				t.Errorf("%s has no severity", r.Alert)
			}
		}
	}
}

func promtool(t *testing.T, args ...string) {
	t.Helper()
	testutil.RequireCommands(t, "promtool")
	out, err := exec.Command("promtool", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool(t, "check", "rules", RulesFile)
}

// Each alert fires and clears in tests/*.yaml.
func TestPromtoolTestRules(t *testing.T) {
	tests, err := filepath.Glob("tests/*.yaml")
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests/*.yaml: %v", err)
	}
	all, err := os.ReadFile(tests[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, rest := range tests[1:] {
		b, err := os.ReadFile(rest)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	groups, err := ParseRules(Rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && bytes.Count(all, []byte("alertname: "+r.Alert+",")) < 2 {
				t.Errorf("%s: the tests do not check it both firing and cleared", r.Alert)
			}
		}
	}
	promtool(t, append([]string{"test", "rules"}, tests...)...)
}

// Every dashboard expression parses: promtool checks them as recording
// rules.
func TestDashboardExpressionsParse(t *testing.T) {
	rules := RuleGroups{Groups: []RuleGroup{{Name: "dashboard"}}}
	for i, p := range Panels() {
		for j, target := range p.Targets {
			rules.Groups[0].Rules = append(rules.Groups[0].Rules, Rule{
				Record: fmt.Sprintf("panel_%d_target_%d", i, j), Expr: Substitute(target.Expr, "kube-proxy", ".*", "5m")})
		}
	}
	data, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", file)
}
