// Package proxy is the proxy core: it defines what every proxy mode
// implements (mode.go), runs one proxier per IP family with its mode, and
// drives them as one on a dual-stack node.
package proxy

import (
	"context"
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Proxier turns API changes into kernel rules for one node.
type Proxier interface {
	// OnCachedService and OnCachedSlice record a change of a Service or
	// an EndpointSlice as the informers keep them (state.ServiceOf,
	// state.SliceOf); deleted is true for removals.
	OnCachedService(svc *state.Service, deleted bool)
	OnCachedSlice(slice *state.EndpointSlice, deleted bool)
	// OnServicesSynced and OnEndpointSlicesSynced say the caches are
	// complete; no rule is written before both.
	OnServicesSynced()
	OnEndpointSlicesSynced()
	// OnNode passes the node's own object (topology labels).
	OnNode(node *v1.Node)
	// UsesServiceCIDRs tells whether the proxier acts on the ServiceCIDR
	// objects' ranges; OnServiceCIDRs passes all of them, of both families.
	UsesServiceCIDRs() bool
	OnServiceCIDRs(cidrs []netip.Prefix)
	// SyncLoop programs the kernel until the context ends.
	SyncLoop(ctx context.Context)
	// FirstSynced is closed once the first sync has put every rule in
	// place: what another mode left may go then.
	FirstSynced() <-chan struct{}
}

// DualStack drives one proxier per IP family as one.
type DualStack []Proxier

func (d DualStack) OnCachedService(svc *state.Service, deleted bool) {
	for _, p := range d {
		p.OnCachedService(svc, deleted)
	}
}

func (d DualStack) OnCachedSlice(slice *state.EndpointSlice, deleted bool) {
	for _, p := range d {
		p.OnCachedSlice(slice, deleted)
	}
}

func (d DualStack) OnServicesSynced() {
	for _, p := range d {
		p.OnServicesSynced()
	}
}

func (d DualStack) OnEndpointSlicesSynced() {
	for _, p := range d {
		p.OnEndpointSlicesSynced()
	}
}

func (d DualStack) OnNode(node *v1.Node) {
	for _, p := range d {
		p.OnNode(node)
	}
}

func (d DualStack) UsesServiceCIDRs() bool {
	return slices.ContainsFunc(d, Proxier.UsesServiceCIDRs)
}

func (d DualStack) OnServiceCIDRs(cidrs []netip.Prefix) {
	for _, p := range d {
		p.OnServiceCIDRs(cidrs)
	}
}

// FirstSynced is closed once every family's first sync is done.
func (d DualStack) FirstSynced() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for _, p := range d {
			<-p.FirstSynced()
		}
		close(done)
	}()
	return done
}

// SyncLoop runs every family's loop and returns when all have ended.
func (d DualStack) SyncLoop(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range d {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.SyncLoop(ctx)
		}()
	}
	wg.Wait()
}
