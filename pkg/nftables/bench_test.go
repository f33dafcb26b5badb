package nftables

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"
)

// nullNFT takes every transaction and keeps nothing: what is measured is
// the syncer's own work.
type nullNFT struct {
	knftables.Interface
	ops int
}

func (n *nullNFT) Run(_ context.Context, tx *knftables.Transaction) error {
	n.ops = tx.NumOperations()
	return nil
}

// A first sync of n services (two endpoints each) into an empty table, and
// one endpoint change after it.
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		h := newHarness(&testing.T{}, v1.IPv4Protocol, v4(nil)(&testing.T{}))
		var objs []any
		for i := range n {
			name := fmt.Sprintf("svc-%d", i)
			objs = append(objs, service("ns", name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), http80, nil),
				endpointSlice("ns", name, ep8080, ep(fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)), ep(fmt.Sprintf("10.245.%d.%d", i/250, i%250+1), "node=node-2")))
		}
		h.apply(objs...)
		null := &nullNFT{Interface: knftables.NewFake(knftables.IPv4Family, TableName)}
		b.Run(fmt.Sprintf("full-%d", n), func(b *testing.B) {
			for b.Loop() {
				s, _ := New(Config{Family: v1.IPv4Protocol, Kernel: listingKernel(v1.IPv4Protocol, null, listFake(knftables.NewFake(knftables.IPv4Family, TableName))), Params: h.syncer.cfg.Params})
				if err := s.FullSync(h.view()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(null.ops), "ops")
		})
		b.Run(fmt.Sprintf("one-change-%d", n), func(b *testing.B) {
			s, _ := New(Config{Family: v1.IPv4Protocol, Kernel: listingKernel(v1.IPv4Protocol, null, listFake(knftables.NewFake(knftables.IPv4Family, TableName))), Params: h.syncer.cfg.Params})
			if err := s.FullSync(h.view()); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				i++
				h.apply(endpointSlice("ns", "svc-7", ep8080, ep("10.244.0.8"), ep(fmt.Sprintf("10.246.0.%d", i%200+1))))
				if err := s.PartialSync(h.view(), h.changed); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(null.ops), "ops")
		})
	}
}
