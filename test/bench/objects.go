// A shape's objects: its services and endpoint slices, created once and
// changed one endpoint at a time.

package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// bench holds one shape's cluster and objects across every run.
type bench struct {
	cluster *framework.Cluster
	client  kubernetes.Interface
	opts    options
	n, e    int
	logf    func(string, ...any)

	slices []*discoveryv1.EndpointSlice // the current object of each service's slice
	fresh  int                          // fresh addresses handed out
	runs   int                          // runs so far, to spread changes over the services
}

func newBench(cluster *framework.Cluster, opts options, n, e int, logf func(string, ...any)) (*bench, error) {
	client, err := cluster.FastClient()
	if err != nil {
		return nil, err
	}
	return &bench{cluster: cluster, client: client, opts: opts, n: n, e: e, logf: logf,
		slices: make([]*discoveryv1.EndpointSlice, n)}, nil
}

func serviceName(i int) string { return fmt.Sprintf("bench-%05d", i) }

func address(i int) string { return fmt.Sprintf("10.244.%d.%d", i/256, i%256) }

// addresses are service i's initial endpoints.
func (b *bench) addresses(i int) []string {
	out := make([]string, b.e)
	for k := range out {
		out[k] = address((i*b.e + k) % initialAddresses)
	}
	return out
}

// freshAddress is an endpoint address no rule has held yet.
func (b *bench) freshAddress() (string, error) {
	if b.fresh >= freshAddresses {
		return "", errors.New("out of fresh endpoint addresses")
	}
	b.fresh++
	return address(initialAddresses + b.fresh - 1), nil
}

// createObjects creates every selector-less Service and its EndpointSlice,
// logging the rate at each tenth: the apiserver's ClusterIP allocator counts
// every allocated address at each allocation, so the rate falls as N grows.
func (b *bench) createObjects(ctx context.Context) error {
	var created atomic.Int64
	start, tenth := time.Now(), max(b.n/10, 1)
	return framework.Parallel(ctx, b.n, b.opts.workers, func(ctx context.Context, i int) error {
		defer func() {
			if done := int(created.Add(1)); done%tenth == 0 {
				b.logf("  created %d of %d services after %s", done, b.n, time.Since(start).Round(time.Second))
			}
		}()
		name := serviceName(i)
		slice, err := b.client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Create(ctx,
			framework.ManualEndpointSlice(name, endpointPort, b.addresses(i)...), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		b.slices[i] = slice
		_, err = b.client.CoreV1().Services(framework.DefaultNamespace).Create(ctx,
			framework.SelectorlessService(name, servicePort, endpointPort), metav1.CreateOptions{})
		return err
	})
}

// replaceEndpoint gives service i a fresh first endpoint and returns its
// DNAT destination; written, if set, learns the destination just before
// the API write.
func (b *bench) replaceEndpoint(ctx context.Context, i int, written func(dest string)) error {
	addr, err := b.freshAddress()
	if err != nil {
		return err
	}
	slice := b.slices[i].DeepCopy()
	slice.Endpoints[0].Addresses = []string{addr}
	if written != nil {
		written(fmt.Sprintf("%s:%d", addr, endpointPort))
	}
	updated, err := b.client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Update(ctx, slice, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	b.slices[i] = updated
	return nil
}
