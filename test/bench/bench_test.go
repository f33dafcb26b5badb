package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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
		workers: 4, chartDir: t.TempDir(),
	}
	out := runSmoke(t, opts, 60*time.Minute)
	columns := opts.columns()
	if want := []string{"nft", "legacy", "nftables"}; !slices.Equal(columns, want) {
		t.Fatalf("columns %v, want %v", columns, want)
	}
	if got, want := len(tableRows(columns)), len(rows)-len(switchRows); got != want {
		t.Fatalf("%v measure %d rows, want every one but the switch's, %d", columns, got, want)
	}
	checkTable(t, out, columns)
	checkCharts(t, out, opts)
}

// TestSwitchSmoke runs a tiny switch, iptables (nft) -> nftables ->
// iptables, so that it keeps working: every cell of the switch's rows is
// filled, and the other rows are left out.
func TestSwitchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "nft", "iptables-nft", "xtables-nft-multi")
	backends := []framework.IPTablesBackend{framework.IPTablesNFT}
	path, err := switchPath("iptables,nftables,iptables", backends)
	if err != nil {
		t.Fatal(err)
	}
	opts := options{
		services: []int{20}, endpoints: []int{2},
		backends: backends, proxies: []string{ours, upstream},
		cap: 2 * time.Minute, workers: 4, switchPath: path,
		chartDir: t.TempDir(),
	}
	out := runSmoke(t, opts, 20*time.Minute)
	columns := opts.columns()
	if want := []string{"iptables (nft) -> nftables", "nftables -> iptables (nft)"}; !slices.Equal(columns, want) {
		t.Fatalf("columns %v, want %v", columns, want)
	}
	checkTable(t, out, columns)
	checkCharts(t, out, opts)
	if strings.Contains(out, "no switch logged") || strings.Contains(out, "old mode's chains or tables left") {
		t.Errorf("a switch did not end as it should:\n%s", out)
	}
}

// runSmoke runs the benchmark with opts and returns its tables; the log
// goes into the test's, should the test fail.
func runSmoke(t *testing.T, opts options, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, log bytes.Buffer
	if err := run(ctx, opts, &out, &log); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, log.String())
	}
	t.Logf("\n%s", out.String())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	})
	return out.String()
}

// checkCharts checks that the run wrote a chart per column, and printed
// its path, under the table.
func checkCharts(t *testing.T, out string, opts options) {
	t.Helper()
	for _, column := range opts.columns() {
		path := filepath.Join(opts.chartDir, chartFile(opts.services[0], opts.endpoints[0], column))
		if !strings.Contains(out, "Chart: "+path+"\n") {
			t.Errorf("no line \"Chart: %s\" under the table:\n%s", path, out)
		}
		if _, err := os.Stat(path); err != nil {
			t.Error(err)
		}
	}
}

// checkTable checks that the table in out has a row per measure its
// columns' modes take, and that every cell a column's mode measures is
// filled and the others are empty; never how fast anything is.
func checkTable(t *testing.T, out string, columns []string) {
	t.Helper()
	var lines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| ---") {
			lines = append(lines, line)
		}
	}
	want := tableRows(columns)
	if len(lines) != len(want)+1 { // and the header
		t.Fatalf("table has %d rows, want %d:\n%s", len(lines), len(want)+1, out)
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
	missing([]string{"nft", "legacy"}, append([]string{"nftFloor"}, switchRows...)...)
	missing([]string{"nftables"}, append([]string{"natRules", "restoreFloor"}, switchRows...)...)
	missing([]string{"ipvs"}, append([]string{"natRules", "restoreFloor", "nftFloor", "churnP50", "churnP99"}, switchRows...)...)
	missing([]string{"nft", "nftables"}, switchRows...)
	if got := keys(switchColumns([]string{"nft", "nftables"})...); !slices.Equal(got, switchRows) {
		t.Errorf("a switch's rows %v, want %v", got, switchRows)
	}
	missing([]string{"nft", "nft -> nftables"}, "nftFloor")
}

var switchRows = []string{"switchSync", "switchEnd", "switchHealthy", "switchPeakRSS"}

func TestSwitchPath(t *testing.T) {
	nft := []framework.IPTablesBackend{framework.IPTablesNFT}
	legacy := []framework.IPTablesBackend{framework.IPTablesLegacy}
	for _, tc := range []struct {
		list     string
		backends []framework.IPTablesBackend
		want     []string // the columns; none: an error
	}{
		{"iptables,nftables", nft, []string{"iptables (nft) -> nftables"}},
		{"nftables,iptables,nftables", legacy, []string{"nftables -> iptables (legacy)", "iptables (legacy) -> nftables"}},
		{"iptables,nftables", append(nft, legacy...), nil},
		{"iptables", nft, nil},
		{"nftables,nftables", nft, nil},
		{"iptables,ipvs", nft, nil},
	} {
		path, err := switchPath(tc.list, tc.backends)
		if got := (options{switchPath: path}).columns(); (err != nil) != (tc.want == nil) || (err == nil && !slices.Equal(got, tc.want)) {
			t.Errorf("-switch %s -backends %v: columns %v, error %v; want %v", tc.list, tc.backends, got, err, tc.want)
		}
		for _, c := range switchColumns(path) {
			if columnMode(c) != modeSwitch {
				t.Errorf("column %q is in mode %s, not %s", c, columnMode(c), modeSwitch)
			}
		}
	}
}
