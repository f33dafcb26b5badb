package e2e

import (
	"flag"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	proxymetrics "github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// unservedMetrics are the kube-proxy metric families registered in
// pkg/metrics that none of our kube-proxy processes served during a run
// of every test: a metric declared and never fed is worse than none.
// Runs limited by -run or -skip say nothing (nil). The IPVS mode's own
// metrics are left out: that mode runs only in the VM (test/vm), whose
// fault test reads them.
func unservedMetrics() []string {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return nil
		}
	}
	descs := make(chan *prometheus.Desc)
	go func() {
		proxymetrics.Registry.Describe(descs)
		close(descs)
	}()
	var missing []string
	for d := range descs {
		// A Desc shows its name only in its String form, Desc{fqName: "...", ...}.
		quoted, err := strconv.QuotedPrefix(strings.TrimPrefix(d.String(), "Desc{fqName: "))
		if err != nil {
			missing = append(missing, d.String())
			continue
		}
		name, _ := strconv.Unquote(quoted)
		// The Go and process collectors' families are always served.
		if strings.HasPrefix(name, "kubeproxy_") && !strings.Contains(name, "_ipvs_") && !servedMetrics[name] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	return missing
}
