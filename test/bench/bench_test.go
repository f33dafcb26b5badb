package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// TestBenchSmoke runs a tiny benchmark so the command keeps working, in
// modes iptables (both backends) and nftables, which share one cluster; it
// checks that every cell a column's mode measures is filled and the others
// are empty, never how fast anything is.
func TestBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "nft", "iptables-nft", "xtables-nft-multi", "iptables-legacy", "xtables-legacy-multi")
	opts := options{
		modes:    []string{modeIPTables, modeNFTables},
		services: []int{20}, endpoints: []int{2},
		backends: []framework.IPTablesBackend{framework.IPTablesNFT, framework.IPTablesLegacy},
		proxies:  []string{ours, upstream},
		cap:      2 * time.Minute, idle: 2 * time.Second,
		changes: 2, churnRate: 5, churnFor: 2 * time.Second,
		workers: 4,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	if err := run(ctx, opts, &out, &log); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, log.String())
	}
	t.Logf("\n%s", out.String())
	defer func() {
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	}()
	var lines []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| ---") {
			lines = append(lines, line)
		}
	}
	columns := opts.columns()
	if want := []string{"nft", "legacy", "nftables"}; !slices.Equal(columns, want) {
		t.Fatalf("columns %v, want %v", columns, want)
	}
	want := tableRows(columns)
	if len(want) != len(rows) || len(lines) != len(want)+1 { // and the header
		t.Fatalf("table has %d rows, want %d:\n%s", len(lines), len(rows)+1, out.String())
	}
	for k, line := range lines[1:] {
		// measure, then per column group: ours, upstream, ratio (which is
		// "-" when upstream's value is 0).
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 1+3*len(columns) || cells[0] != want[k].title {
			t.Fatalf("row %q has %d cells, want %d, or is not %q", line, len(cells), 1+3*len(columns), want[k].title)
		}
		for b, column := range columns {
			filled := measured(want[k].key, columnMode(column))
			for _, c := range cells[1+3*b : 3+3*b] {
				empty := c == "-" || c == "" || strings.Contains(c, "NaN")
				if empty == filled {
					t.Errorf("row %q, column %s: cell %q, measured in mode %s: %v", line, column, c, columnMode(column), filled)
				}
			}
		}
	}
}

func TestQuantile(t *testing.T) {
	values := []float64{5, 1, 4, 2, 3}
	for _, tc := range []struct{ q, want float64 }{{0.5, 3}, {0.99, 5}, {0.2, 1}, {0, 1}, {1, 5}} {
		if got := quantile(values, tc.q); got != tc.want {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		ours, upstream cell
		want           string
	}{
		{cell{value: 1}, cell{value: 4}, "0.25"},
		{cell{value: 1}, cell{value: 600, capped: true}, "<= 0.00167"},
		{cell{value: 600, capped: true}, cell{value: 2}, ">= 300"},
		{cell{value: 600, capped: true}, cell{value: 600, capped: true}, "-"},
		{cell{value: 1}, cell{value: 0}, "-"},
	} {
		if got := ratio(tc.ours, tc.upstream, true, true); got != tc.want {
			t.Errorf("ratio(%v, %v) = %q, want %q", tc.ours, tc.upstream, got, tc.want)
		}
	}
}

func TestTableRows(t *testing.T) {
	keys := func(columns ...string) []string {
		var out []string
		for _, r := range tableRows(columns) {
			out = append(out, r.key)
		}
		return out
	}
	missing := func(columns []string, want ...string) {
		t.Helper()
		got := keys(columns...)
		if len(got) != len(rows)-len(want) {
			t.Errorf("%v: rows %v, want all but %v", columns, got, want)
		}
		for _, k := range want {
			if slices.Contains(got, k) {
				t.Errorf("%v: row %s, measured in none of these modes", columns, k)
			}
		}
	}
	missing([]string{"nft", "legacy"}, "nftFloor")
	missing([]string{"nftables"}, "natRules", "restoreFloor")
	missing([]string{"ipvs"}, "natRules", "restoreFloor", "nftFloor", "churnP50", "churnP99")
	missing([]string{"nft", "nftables"})
}
