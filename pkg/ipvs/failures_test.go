package ipvs_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// ipv4Count is a counter's value for the IPv4 family.
func ipv4Count(t *testing.T, counter *prometheus.CounterVec) float64 {
	t.Helper()
	var m dto.Metric
	if err := counter.WithLabelValues(string(v1.IPv4Protocol)).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// restoreFailures is the IPv4 family's count of failed iptables-restores.
func restoreFailures(t *testing.T) float64 {
	return ipv4Count(t, metrics.IPTablesRestoreFailuresTotal)
}

// As upstream, the IPVS mode counts a sync whose iptables-restore failed,
// and no other failure of a sync.
func TestOnlyFailedRestoresAreCounted(t *testing.T) {
	n := newNode()
	core, _ := n.proxier(t)
	feedServices(core)
	sync(t, core)
	before := restoreFailures(t)

	// The partial sync fails to add the virtual server; the full sync
	// after it adds it.
	n.kernel.FailNext("AddVirtualServer", errors.New("file exists"))
	service(core, "new", "10.96.0.20")
	sync(t, core)
	if got := restoreFailures(t); got != before {
		t.Errorf("a failed virtual server counted as a failed restore: %v, want %v", got, before)
	}

	n.iptables.refuse = errors.New("iptables-restore: line 3 failed")
	core.RequestFullSync()
	if err := core.SyncOnce(); err == nil {
		t.Fatal("a full sync whose restore was refused succeeded")
	}
	if got := restoreFailures(t); got != before+1 {
		t.Errorf("%v restore failures after a refused restore, want %v", got, before+1)
	}
	n.iptables.refuse = nil
	sync(t, core)
}
