package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// TestBenchSmoke runs a tiny benchmark so the command keeps working; it
// checks that every cell of the table is filled, never how fast anything is.
func TestBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "nft", "iptables-nft", "xtables-nft-multi", "iptables-legacy", "xtables-legacy-multi")
	opts := options{
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
	var tableRows []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| ---") {
			tableRows = append(tableRows, line)
		}
	}
	if len(tableRows) != len(rows)+1 { // and the header
		t.Fatalf("table has %d rows, want %d:\n%s", len(tableRows), len(rows)+1, out.String())
	}
	for _, line := range tableRows[1:] {
		// measure, then per backend: ours, upstream, ratio (which is "-"
		// when upstream's value is 0).
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 1+3*len(opts.backends) {
			t.Fatalf("row %q has %d cells, want %d", line, len(cells), 1+3*len(opts.backends))
		}
		for b := range opts.backends {
			for _, c := range cells[1+3*b : 3+3*b] {
				if c == "-" || c == "" || strings.Contains(c, "NaN") {
					t.Errorf("empty cell in row %q", line)
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
