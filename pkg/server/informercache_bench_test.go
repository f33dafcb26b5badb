package server

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/testutil"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// BenchmarkInformerCache reports the bytes of heap the informers' caches
// keep per service (its Service plus its one EndpointSlice of five
// endpoints, as make bench creates them), after the objects are decoded
// from protobuf as a watch delivers them and cut down by the informers'
// transform: the largest copy of the cluster's state a kube-proxy holds.
// "untrimmed" is the same without the transform.
func BenchmarkInformerCache(b *testing.B) {
	const services = 10000
	for _, trim := range []bool{true, false} {
		name := "trimmed"
		if !trim {
			name = "untrimmed"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				base := testutil.HeapInUse()
				store := cache.NewStore(cache.MetaNamespaceKeyFunc)
				for i := range services {
					for _, o := range []interface {
						Marshal() ([]byte, error)
					}{benchService(i), benchSlice(i)} {
						obj := decoded(b, o)
						if trim {
							obj, _ = trimForCache(obj)
						}
						if err := store.Add(obj); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(testutil.HeapInUse()-base)/services, "B/service")
				runtime.KeepAlive(store)
			}
		})
	}
}

// decoded is o after a protobuf round trip: separately allocated, as an
// informer's objects are.
func decoded(b *testing.B, o interface{ Marshal() ([]byte, error) }) any {
	data, err := o.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	switch o.(type) {
	case *v1.Service:
		out := &v1.Service{}
		if err = out.Unmarshal(data); err != nil {
			b.Fatal(err)
		}
		return out
	default:
		out := &discovery.EndpointSlice{}
		if err = out.Unmarshal(data); err != nil {
			b.Fatal(err)
		}
		return out
	}
}

// serverMeta is the metadata the API server gives an object it created.
func serverMeta(name, manager string, i int) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: name, Namespace: "default", UID: types.UID(fmt.Sprintf("0c6f9a3e-2b1d-4f7a-9c1e-%012d", i)),
		ResourceVersion:   fmt.Sprint(100000 + i),
		CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0)),
		ManagedFields: []metav1.ManagedFieldsEntry{{
			Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
			Time: ptr.To(metav1.NewTime(time.Unix(1700000000, 0))), FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{".":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}}},"f:spec":{"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:sessionAffinity":{},"f:type":{}}}`)},
		}},
	}
}

// benchService is make bench's service i as the API server returns it.
func benchService(i int) *v1.Service {
	ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
	return &v1.Service{
		ObjectMeta: serverMeta(fmt.Sprintf("bench-%05d", i), "bench", i),
		Spec: v1.ServiceSpec{
			Ports:     []v1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP}},
			ClusterIP: ip, ClusterIPs: []string{ip}, Type: v1.ServiceTypeClusterIP,
			SessionAffinity: v1.ServiceAffinityNone, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			IPFamilyPolicy:        ptr.To(v1.IPFamilyPolicySingleStack),
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
		},
	}
}

// benchSlice is service i's EndpointSlice of five ready endpoints.
func benchSlice(i int) *discovery.EndpointSlice {
	name := fmt.Sprintf("bench-%05d", i)
	meta := serverMeta(name+"-manual", "bench", i)
	meta.Labels = map[string]string{discovery.LabelServiceName: name, discovery.LabelManagedBy: "bench"}
	slice := &discovery.EndpointSlice{
		ObjectMeta:  meta,
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("tcp"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for j := range 5 {
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+j*8, i/250, i%250+1)},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		})
	}
	return slice
}
