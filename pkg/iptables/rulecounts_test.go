package iptables

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// The rule metrics count all our rules per table, and the rules the last
// sync wrote: all of them after a full sync, what a partial sync's input
// adds or inserts after one.
func TestRuleCountMetrics(t *testing.T) {
	kernel := &recordingKernel{}
	p := newTestProxier(t, kernel)
	feed(p, 3)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	tables := []iptableskernel.Table{iptableskernel.TableFilter, iptableskernel.TableNAT}
	for _, tb := range tables {
		total, last := ruleGauges(t, tb)
		if total != p.ruleCounts[tb] || last != p.ruleCounts[tb] {
			t.Errorf("after a full sync, %s: %d rules in all and %d written, want %d both", tb, total, last, p.ruleCounts[tb])
		}
	}
	if p.ruleCounts[iptableskernel.TableNAT] == 0 {
		t.Fatal("a full sync counted no nat rules")
	}

	kernel.written.Reset()
	feedService(p, 3)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	written := rulesPerTable(kernel.written.String())
	for _, tb := range tables {
		total, last := ruleGauges(t, tb)
		if total != p.ruleCounts[tb] || last != written[tb] {
			t.Errorf("after a partial sync, %s: %d rules in all and %d written, want %d and %d", tb, total, last, p.ruleCounts[tb], written[tb])
		}
	}
	if written[iptableskernel.TableNAT] == 0 || written[iptableskernel.TableNAT] >= p.ruleCounts[iptableskernel.TableNAT] {
		t.Errorf("the partial sync wrote %d nat rules of %d, want some, not all", written[iptableskernel.TableNAT], p.ruleCounts[iptableskernel.TableNAT])
	}
}

// ruleGauges reads the IPv4 family's rule metrics of a table.
func ruleGauges(t *testing.T, table iptableskernel.Table) (total, lastSync int) {
	t.Helper()
	read := func(g *prometheus.GaugeVec) int {
		var m dto.Metric
		if err := g.WithLabelValues(string(table), "IPv4").Write(&m); err != nil {
			t.Fatal(err)
		}
		return int(m.GetGauge().GetValue())
	}
	return read(metrics.IPTablesRulesTotal), read(metrics.IPTablesRulesLastSync)
}

// rulesPerTable counts the rules restore text adds or inserts, per table.
func rulesPerTable(text string) map[iptableskernel.Table]int {
	counts := map[iptableskernel.Table]int{}
	var table iptableskernel.Table
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = iptableskernel.Table(line[1:])
		case strings.HasPrefix(line, "-A "), strings.HasPrefix(line, "-I "):
			counts[table]++
		}
	}
	return counts
}
