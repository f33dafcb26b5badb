package nftables

import (
	"fmt"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"
)

// BenchmarkHeapAt syncs N ClusterIP services of 5 endpoints each (make
// bench's shape, as pkg/iptables' BenchmarkHeapAt) into a kernel that keeps
// nothing, then makes 100 partial syncs of one endpoint change each, and
// reports the heap kept after the first sync and after the changes, and per
// service: what the tracker, the state and the mode hold. Run with
// -memprofile -memprofilerate 4096 to see each part's share.
func BenchmarkHeapAt(b *testing.B) {
	const changes = 100
	for _, n := range []int{10000, 50000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			for range b.N {
				base := testutil.HeapInUse()
				h := newHarness(&testing.T{}, v1.IPv4Protocol, v4(nil)(&testing.T{}))
				null := &nullNFT{Interface: knftables.NewFake(knftables.IPv4Family, TableName)}
				empty := listFake(knftables.NewFake(knftables.IPv4Family, TableName))
				s, err := New(Config{Family: v1.IPv4Protocol, Kernel: listingKernel(v1.IPv4Protocol, null, empty), Params: h.syncer.cfg.Params})
				if err != nil {
					b.Fatal(err)
				}
				h.syncer = s
				feedClusterIPs(h, n, 5)
				if err := s.FullSync(h.view()); err != nil {
					b.Fatal(err)
				}
				first := testutil.HeapInUse() - base
				for c := range changes {
					changeFirstEndpoint(h, c*(n/changes), c)
					if err := s.PartialSync(h.view(), h.changed); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(first)/1e6, "MB-after-first-sync")
				b.ReportMetric(float64(testutil.HeapInUse()-base)/1e6, "MB-after-changes")
				b.ReportMetric(float64(first)/float64(n), "B/service")
				keptHarness = h
			}
		})
	}
}

// keptHarness holds the last run's harness, so that -memprofile, written
// after the benchmark, shows what it holds.
var keptHarness *harness

// feedClusterIPs gives the harness n ClusterIP services with the given
// number of ready endpoints each, as make bench creates them.
func feedClusterIPs(h *harness, n, endpoints int) {
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svc := service("ns", name, fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&0xff, i&0xff), []port{{"p", v1.ProtocolTCP, 80, 0}}, nil)
		h.tracker.OnService(types.NamespacedName{Namespace: "ns", Name: name}, svc)
		h.tracker.OnEndpointSlice(clusterIPSlice(i, endpoints, -1), false)
	}
	h.changed = h.tracker.Apply(h.state).ServicePorts
}

// changeFirstEndpoint gives service i of feedClusterIPs a new first
// endpoint.
func changeFirstEndpoint(h *harness, i, generation int) {
	h.tracker.OnEndpointSlice(clusterIPSlice(i, 5, generation), false)
	h.changed = h.tracker.Apply(h.state).ServicePorts
}

// clusterIPSlice is the endpoints of service i of feedClusterIPs; with a
// generation >= 0, its first endpoint is that generation's.
func clusterIPSlice(i, endpoints, generation int) *discovery.EndpointSlice {
	ready := true
	name := fmt.Sprintf("svc-%d", i)
	slice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for e := range endpoints {
		j := i*endpoints + e
		address := fmt.Sprintf("10.%d.%d.%d", 128+j>>16, j>>8&0xff, j&0xff)
		if e == 0 && generation >= 0 {
			address = fmt.Sprintf("10.%d.%d.%d", 200+generation%50, j>>8&0xff, j&0xff)
		}
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{address}, Conditions: discovery.EndpointConditions{Ready: &ready}})
	}
	return slice
}
