package framework

import (
	"context"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
)

// ManualSliceManager is the managed-by label of EndpointSlices the tests
// write themselves; the EndpointSlice controllers leave them alone.
const ManualSliceManager = "rapidproxy-test"

// ServicePortName is the name of the one port of SelectorlessService.
const ServicePortName = "tcp"

// SelectorlessService is a ClusterIP service with one TCP port and no
// selector, whose endpoints the caller writes (see ManualEndpointSlice).
func SelectorlessService(name string, port, targetPort int32) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DefaultNamespace},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{
			Name: ServicePortName, Port: port, TargetPort: intstr.FromInt32(targetPort), Protocol: v1.ProtocolTCP}}},
	}
}

// ManualEndpointSlice is the EndpointSlice of a SelectorlessService: ready
// endpoints at addresses (IPv4), all on port.
func ManualEndpointSlice(service string, port int32, addresses ...string) *discoveryv1.EndpointSlice {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: service + "-manual", Namespace: DefaultNamespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: ManualSliceManager}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(ServicePortName), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, a := range addresses {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return slice
}

// ServiceEndpointSlice is a hand-written EndpointSlice of a selectorless
// service: every port of svc, at its target port (a number), and the
// endpoints (see ReadyEndpoint), IPv4.
func ServiceEndpointSlice(svc *v1.Service, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name + "-manual", Namespace: DefaultNamespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: ManualSliceManager}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
	}
	for _, p := range svc.Spec.Ports {
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{
			Name: ptr.To(p.Name), Port: ptr.To(p.TargetPort.IntVal), Protocol: ptr.To(p.Protocol)})
	}
	return slice
}

// ReadyEndpoint is an endpoint at address on node: ready, serving, not
// terminating.
func ReadyEndpoint(address, node string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{address}, NodeName: ptr.To(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}
}

// FastClient is a cluster-admin client without client-side rate limits,
// for creating many objects quickly.
func (c *Cluster) FastClient() (kubernetes.Interface, error) {
	config, err := c.adminRESTConfig()
	if err != nil {
		return nil, err
	}
	config.QPS, config.Burst = 10000, 20000
	return kubernetes.NewForConfig(config)
}

// DynamicClient is a cluster-admin client for objects of any kind, with
// the mapper that finds a kind's resource from the API server's discovery.
func (c *Cluster) DynamicClient() (dynamic.Interface, meta.RESTMapper, error) {
	config, err := c.adminRESTConfig()
	if err != nil {
		return nil, nil, err
	}
	client, err := dynamic.NewForConfig(config)
	if err != nil {
		return nil, nil, err
	}
	return client, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery())), nil
}

// Parallel calls do for 0..n-1 from workers goroutines and returns the
// first error; after an error the remaining calls are skipped.
func Parallel(ctx context.Context, n, workers int, do func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := do(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
