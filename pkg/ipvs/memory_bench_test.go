package ipvs_test

import (
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

// BenchmarkHeapAt10k syncs 10,000 ClusterIP services of 5 endpoints each
// (make bench's shape) into the fake kernel, then 100 partial syncs of one
// endpoint change each, and reports the heap the proxy keeps after the
// first sync and after the changes, the fake kernel's share included (run
// with -memprofile -memprofilerate 4096 to see each part's).
func BenchmarkHeapAt10k(b *testing.B) {
	const services, changes = 10000, 100
	for range b.N {
		n := newNode()
		core, _ := n.proxier(b)
		base := heapAlloc()
		syncServices(b, core, services)
		b.ReportMetric(float64(heapAlloc()-base)/1e6, "MB-after-first-sync")
		for c := range changes {
			i := c * (services / changes)
			name := fmt.Sprintf("svc-%d", i)
			endpoints(core, name, v1.ProtocolTCP, fiveEndpoints(i, 1)...)
			sync(b, core)
		}
		b.ReportMetric(float64(heapAlloc()-base)/1e6, "MB-after-changes")
		kept = core
	}
}

// kept holds the last run's proxy, so that -memprofile, written after the
// benchmark, shows what it holds.
var kept any

// BenchmarkEndpointChangeAt10k is one partial sync of an endpoint change
// among 10,000 ClusterIP services of 5 endpoints each, into the fake
// kernel.
func BenchmarkEndpointChangeAt10k(b *testing.B) {
	const services = 10000
	n := newNode()
	core, _ := n.proxier(b)
	syncServices(b, core, services)
	b.ReportAllocs()
	b.ResetTimer()
	for c := range b.N {
		i := c * 7919 % services
		endpoints(core, fmt.Sprintf("svc-%d", i), v1.ProtocolTCP, fiveEndpoints(i, c%2+1)...)
		sync(b, core)
	}
}

// syncServices gives the proxy n ClusterIP services svc-0... of five
// endpoints each, and syncs them.
func syncServices(b *testing.B, core *proxy.Core, n int) {
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		service(core, name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1))
		endpoints(core, name, v1.ProtocolTCP, fiveEndpoints(i, 0)...)
	}
	synced(core)
	sync(b, core)
}

// fiveEndpoints are service i's endpoints; another generation moves the
// first.
func fiveEndpoints(i, generation int) []string {
	ips := make([]string, 5)
	for j := range ips {
		ips[j] = fmt.Sprintf("10.%d.%d.%d", 128+j*8, i/250, i%250+1)
	}
	ips[0] = fmt.Sprintf("10.%d.%d.%d", 128+40+generation, i/250, i%250+1)
	return ips
}

// heapAlloc is the bytes of live objects after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
