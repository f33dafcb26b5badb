package iptables

import (
	"fmt"
	"io"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/internal/iptables/iptablestest"
)

// discardingKernel is an empty kernel that takes every restore and keeps
// nothing: the heap measured is the proxy's own.
type discardingKernel struct{ iptablestest.SavedKernel }

func (k *discardingKernel) Restore(input io.Reader) error {
	_, err := io.Copy(io.Discard, input)
	return err
}

// BenchmarkHeapAt syncs N ClusterIP services of 5 endpoints each (make
// bench's shape) into a kernel that keeps nothing, then makes 100 partial
// syncs of one endpoint change each, and reports the heap kept after the
// first sync and after the changes, and per service: what the tracker, the
// state and the mode hold (the informers hold the tracker's copy of each
// object; client-go's own memory is not in it). Run with -memprofile
// -memprofilerate 4096 to see each part's share.
func BenchmarkHeapAt(b *testing.B) {
	const changes = 100
	for _, n := range []int{10000, 50000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			for range b.N {
				base := testutil.HeapInUse()
				p := newTestProxier(b, &discardingKernel{})
				feedClusterIPs(p, n, 5)
				if err := p.sync(); err != nil {
					b.Fatal(err)
				}
				first := testutil.HeapInUse() - base
				for c := range changes {
					changeFirstEndpoint(p, c*(n/changes), c)
					if err := p.sync(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(first)/1e6, "MB-after-first-sync")
				b.ReportMetric(float64(testutil.HeapInUse()-base)/1e6, "MB-after-changes")
				b.ReportMetric(float64(first)/float64(n), "B/service")
				keptProxier = p
			}
		})
	}
}

// keptProxier holds the last run's proxy, so that -memprofile, written
// after the benchmark, shows what it holds.
var keptProxier any

// changeFirstEndpoint gives service i of feedClusterIPs a new first
// endpoint.
func changeFirstEndpoint(p testProxier, i, generation int) {
	ready := true
	name := fmt.Sprintf("svc-%d", i)
	slice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for e := range 5 {
		j := i*5 + e
		address := fmt.Sprintf("10.%d.%d.%d", 128+j>>16, j>>8&0xff, j&0xff)
		if e == 0 {
			address = fmt.Sprintf("10.%d.%d.%d", 200+generation%50, j>>8&0xff, j&0xff)
		}
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{address}, Conditions: discovery.EndpointConditions{Ready: &ready}})
	}
	p.OnEndpointSlice(slice, false)
}
