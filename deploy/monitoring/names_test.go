package monitoring

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	proxymetrics "github.com/rapidproxy/rapidproxy/pkg/metrics"
)

func TestSeriesNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (job, le) (rate(kubeproxy_a_seconds_bucket{job="kube-proxy", x=~"a}b"}[5m:1m])))`:      {"kubeproxy_a_seconds_bucket"},
		`instance:kubeproxy_b:rate5m > 1e-3 or on (instance) group_left (ip_family) up unless ignoring(x) time() - c offset 5m`: {"c", "instance:kubeproxy_b:rate5m", "up"},
		"sum(process_cpu_seconds_total) by (instance) # go_comment\n + Inf * NaN and go_x_count bool > 'o\\'r'":                 {"go_x_count", "process_cpu_seconds_total"},
		`{__name__="not_a_name"} + count without(le) (kubeproxy_c)`:                                                             {"kubeproxy_c"},
	} {
		got, err := SeriesNames(expr)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("SeriesNames(%q) = %v, %v; want %v", expr, got, err, want)
		}
	}
	for _, bad := range []string{`rate(a{job="x}[5m])`, `rate(a{job="x"[5m])`, `sum by (le (a)`} {
		if got, err := SeriesNames(bad); err == nil {
			t.Errorf("SeriesNames(%q) = %v, want an error", bad, got)
		}
	}
}

// Every series the rules and the dashboard read is one kube-proxy
// registers, a histogram's by its family (test/e2e checks that a running
// proxy serves it, in its mode), and the recorded ones are left out.
func TestScrapedNamesRegistered(t *testing.T) {
	registered := map[string]bool{}
	descs := make(chan *prometheus.Desc)
	go func() {
		proxymetrics.Registry.Describe(descs)
		close(descs)
	}()
	for d := range descs {
		// A Desc shows its name only in its String form, Desc{fqName: "...", ...}.
		if quoted, err := strconv.QuotedPrefix(strings.TrimPrefix(d.String(), "Desc{fqName: ")); err == nil {
			name, _ := strconv.Unquote(quoted)
			registered[name] = true
		}
	}
	names, err := ScrapedNames()
	if err != nil {
		t.Fatal(err)
	}
	// The rules, the dashboard and the resources read at least these.
	for _, want := range []string{"kubeproxy_sync_proxy_rules_duration_seconds_bucket", "kubeproxy_network_programming_duration_seconds_bucket", "process_cpu_seconds_total", "go_memstats_heap_inuse_bytes"} {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+want+" ") {
			t.Errorf("ScrapedNames lacks %s: %v", want, names)
		}
	}
	for _, name := range names {
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && registered[base] {
				family = base
			}
		}
		if !registered[family] {
			t.Errorf("%s is read by the rules or the dashboard but kube-proxy registers no such metric", name)
		}
		if strings.Contains(name, ":") || name == "up" {
			t.Errorf("%s is recorded or Prometheus' own, not scraped", name)
		}
	}
}

// Each exception is a series the rules or the dashboard read, with its
// reason; a mode's own metrics are never excepted in that mode.
func TestNotServedIn(t *testing.T) {
	names, err := ScrapedNames()
	if err != nil {
		t.Fatal(err)
	}
	for mode, except := range NotServedIn {
		served, err := ServedIn(mode)
		if err != nil {
			t.Fatal(err)
		}
		if len(served)+len(except) != len(names) {
			t.Errorf("%s: %d served and %d excepted of %d", mode, len(served), len(except), len(names))
		}
		for name, why := range except {
			if why == "" || !strings.Contains(" "+strings.Join(names, " ")+" ", " "+name+" ") {
				t.Errorf("%s: exception %s (%q) is not read by the rules or the dashboard, or has no reason", mode, name, why)
			}
			if strings.Contains(name, "_"+mode+"_") {
				t.Errorf("%s: its own %s is excepted", mode, name)
			}
		}
	}
	if _, err := ServedIn("userspace"); err == nil {
		t.Error("ServedIn of a mode without a list succeeded")
	}
}
