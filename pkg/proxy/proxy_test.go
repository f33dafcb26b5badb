package proxy

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/pkg/state"
	v1 "k8s.io/api/core/v1"
)

type recorder struct {
	mu        sync.Mutex
	events    []string
	usesCIDRs bool
	synced    chan struct{}
}

func (r *recorder) add(e string) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }

func (r *recorder) OnCachedService(*state.Service, bool)     { r.add("service") }
func (r *recorder) OnCachedSlice(*state.EndpointSlice, bool) { r.add("slice") }
func (r *recorder) OnServicesSynced()                        { r.add("services-synced") }
func (r *recorder) OnEndpointSlicesSynced()                  { r.add("slices-synced") }
func (r *recorder) OnNode(*v1.Node)                          { r.add("node") }
func (r *recorder) SyncLoop(ctx context.Context)             { r.add("loop"); <-ctx.Done() }
func (r *recorder) UsesServiceCIDRs() bool                   { return r.usesCIDRs }
func (r *recorder) OnServiceCIDRs([]netip.Prefix)            { r.add("cidrs") }
func (r *recorder) FirstSynced() <-chan struct{}             { return r.synced }

func TestDualStackFansOut(t *testing.T) {
	a, b := &recorder{}, &recorder{}
	d := DualStack{a, b}
	d.OnCachedService(&state.Service{}, false)
	d.OnCachedSlice(&state.EndpointSlice{}, true)
	d.OnServicesSynced()
	d.OnEndpointSlicesSynced()
	d.OnNode(&v1.Node{})
	d.OnServiceCIDRs(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.SyncLoop(ctx); close(done) }()
	cancel()
	<-done
	for _, r := range []*recorder{a, b} {
		if len(r.events) != 7 {
			t.Errorf("events %v", r.events)
		}
	}
	if d.UsesServiceCIDRs() || !(DualStack{a, &recorder{usesCIDRs: true}}).UsesServiceCIDRs() {
		t.Error("UsesServiceCIDRs is not whether any family uses them")
	}
}

// A node's first sync is done once every family's is.
func TestDualStackFirstSyncedWaitsForEveryFamily(t *testing.T) {
	a, b := &recorder{synced: make(chan struct{})}, &recorder{synced: make(chan struct{})}
	synced := DualStack{a, b}.FirstSynced()
	close(a.synced)
	select {
	case <-synced:
		t.Fatal("synced with one family of two")
	case <-time.After(50 * time.Millisecond):
	}
	close(b.synced)
	select {
	case <-synced:
	case <-time.After(5 * time.Second):
		t.Fatal("not synced once both families were")
	}
}
