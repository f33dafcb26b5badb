// Package badinput holds the malformed Services and EndpointSlices that the
// bad-input tests feed through the change tracker and every mode's rules,
// so that one bad object never costs the others their rules: each kind the API server would refuse or the node cannot
// program, and well-formed services whose rules must survive next to
// them. The fuzz targets of pkg/state, pkg/iptables, pkg/nftables and
// pkg/ipvs take the same objects as JSON (Encode, Decode); their seed
// corpora are these cases (TestSeedCorporaAreTheCases).
package badinput

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Objects are Services and EndpointSlices as the informers deliver them.
type Objects struct {
	Services       []*v1.Service              `json:"services,omitempty"`
	EndpointSlices []*discovery.EndpointSlice `json:"endpointSlices,omitempty"`
}

// Encode is the objects as a fuzz input.
func (o Objects) Encode() []byte {
	data, err := json.Marshal(o)
	if err != nil {
		panic(err) // API types always marshal
	}
	return data
}

// Decode reads a fuzz input; ok is false when it is not such objects.
// Null entries are dropped: an informer never delivers one.
func Decode(data []byte) (o Objects, ok bool) {
	if json.Unmarshal(data, &o) != nil {
		return Objects{}, false
	}
	var out Objects
	for _, s := range o.Services {
		if s != nil {
			out.Services = append(out.Services, s)
		}
	}
	for _, s := range o.EndpointSlices {
		if s != nil {
			out.EndpointSlices = append(out.EndpointSlices, s)
		}
	}
	return out, true
}

// Tracker is what takes the objects: state.Tracker, which this package
// does not import, so that pkg/state's own tests can use it.
type Tracker interface {
	OnService(name types.NamespacedName, svc *v1.Service)
	OnEndpointSlice(slice *discovery.EndpointSlice, deleted bool)
}

// AddTo delivers the objects to a tracker as added.
func (o Objects) AddTo(t Tracker) {
	for _, s := range o.Services {
		t.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, s)
	}
	for _, s := range o.EndpointSlices {
		t.OnEndpointSlice(s, false)
	}
}

// RemoveFrom delivers the objects to a tracker as deleted.
func (o Objects) RemoveFrom(t Tracker) {
	for _, s := range o.Services {
		t.OnService(types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, nil)
	}
	for _, s := range o.EndpointSlices {
		t.OnEndpointSlice(s, true)
	}
}

// UsesGoodNames tells whether the objects name a good service or slice
// (as a fuzzer's may), so that a good service may rightly change.
func (o Objects) UsesGoodNames() bool {
	names := map[string]bool{}
	good := Good()
	for _, s := range good.Services {
		names[s.Namespace+"/"+s.Name] = true
	}
	for _, s := range good.EndpointSlices {
		names["slice "+s.Namespace+"/"+s.Name] = true
	}
	for _, s := range o.Services {
		if names[s.Namespace+"/"+s.Name] {
			return true
		}
	}
	for _, s := range o.EndpointSlices {
		if names["slice "+s.Namespace+"/"+s.Name] || names[s.Namespace+"/"+s.Labels[discovery.LabelServiceName]] {
			return true
		}
	}
	return false
}

// Case is one kind of bad input.
type Case struct {
	// Name says what is bad, as a file name: the seed corpora use it.
	Name string
	Objects
	// Skipped is the object ("namespace/name") whose skip must be logged,
	// "" when the objects are valid and must simply work.
	Skipped string
}

// Namespace is where the bad objects live; the good ones are in "good".
const Namespace = "bad"

// Cases is every kind of bad input the tests feed in.
func Cases() []Case {
	ready := endpoint("10.244.1.1", true)
	return []Case{
		{Name: "invalid-cluster-ip", Skipped: "bad/bad-ip", Objects: objects(
			service("bad-ip", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.2.300", []string{"10.96.2.300"} }),
			slice("bad-ip", "bad-ip-1", discovery.AddressTypeIPv4, port("http", 8080), ready))},
		{Name: "mixed-family-ips", Skipped: "bad/mixed-v4", Objects: objects(
			service("mixed", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00:96::2", []string{"fd00:96::2", "10.96.2.2"}
				s.Spec.ExternalIPs = []string{"2001:db8::7", "10.255.2.7", "::ffff:10.255.2.8", "bogus", ""}
				s.Spec.LoadBalancerSourceRanges = []string{"fd00::/8", "10.0.0.0/8", "junk", "10.0.0.1/99"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.255.3.7"}, {IP: "2001:db8::8"}, {IP: "bogus"}, {Hostname: "lb.example.com"}}
			}),
			slice("mixed", "mixed-v4", discovery.AddressTypeIPv4, port("http", 8080), ready, endpoint("fd00:244::1", true)),
			slice("mixed", "mixed-v6", discovery.AddressTypeIPv6, port("http", 8080), endpoint("fd00:244::2", true), endpoint("10.244.1.2", true)))},
		{Name: "ipv6-endpoints-in-an-ipv4-slice", Skipped: "bad/v6-in-v4-1", Objects: objects(
			service("v6-in-v4", nil),
			slice("v6-in-v4", "v6-in-v4-1", discovery.AddressTypeIPv4, port("http", 8080), endpoint("fd00:244::3", true), endpoint("10.244.1.3", true)))},
		{Name: "port-0", Skipped: "bad/port-zero", Objects: objects(
			service("port-zero", func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "zero", Port: 0, Protocol: v1.ProtocolTCP})
			}),
			slice("port-zero", "port-zero-1", discovery.AddressTypeIPv4, []discovery.EndpointPort{
				{Name: ptr.To("http"), Port: ptr.To[int32](0), Protocol: ptr.To(v1.ProtocolTCP)},
				{Name: ptr.To("zero"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}}, ready))},
		{Name: "port-65536", Skipped: "bad/port-big", Objects: objects(
			service("port-big", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = []v1.ServicePort{
					{Name: "http", Port: 65536, Protocol: v1.ProtocolTCP},
					{Name: "np", Port: 81, NodePort: 65536, Protocol: v1.ProtocolTCP},
					{Name: "neg", Port: -1, Protocol: v1.ProtocolUDP},
				}
			}),
			slice("port-big", "port-big-1", discovery.AddressTypeIPv4, []discovery.EndpointPort{
				{Name: ptr.To("http"), Port: ptr.To[int32](65536), Protocol: ptr.To(v1.ProtocolTCP)},
				{Name: ptr.To("np"), Port: ptr.To[int32](-8080), Protocol: ptr.To(v1.ProtocolTCP)}}, ready))},
		{Name: "duplicate-ports", Skipped: "bad/dup", Objects: objects(
			service("dup", func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{
					{Name: "http", Port: 80, Protocol: v1.ProtocolTCP},
					{Name: "http", Port: 81, Protocol: v1.ProtocolTCP},
					{Name: "other", Port: 80, Protocol: v1.ProtocolTCP},
					{Name: "udp", Port: 80, Protocol: v1.ProtocolUDP},
				}
			}),
			slice("dup", "dup-1", discovery.AddressTypeIPv4, append(port("http", 8080), port("http", 8081)...), ready))},
		{Name: "hundreds-of-ports", Objects: objects(
			service("many-ports", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = nil
				for i := range 300 {
					s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(1000 + i), NodePort: int32(31000 + i), Protocol: v1.ProtocolTCP})
				}
			}),
			slice("many-ports", "many-ports-1", discovery.AddressTypeIPv4, func() []discovery.EndpointPort {
				var ps []discovery.EndpointPort
				for i := range 300 {
					ps = append(ps, port(fmt.Sprintf("p%d", i), int32(2000+i))...)
				}
				return ps
			}(), ready, endpoint("10.244.1.4", true)))},
		{Name: "1000-endpoints-in-one-slice", Objects: objects(
			service("many-endpoints", func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			slice("many-endpoints", "many-endpoints-1", discovery.AddressTypeIPv4, port("http", 8080), func() []discovery.Endpoint {
				var eps []discovery.Endpoint
				for i := range 1000 {
					eps = append(eps, discovery.Endpoint{Addresses: []string{fmt.Sprintf("10.245.%d.%d", i/250, 1+i%250)}})
				}
				return eps
			}()...))},
		{Name: "huge-names", Skipped: "bad/" + strings.Repeat("n", 300), Objects: objects(
			service(strings.Repeat("n", 300), nil),
			slice(strings.Repeat("n", 300), "huge-1", discovery.AddressTypeIPv4, port("http", 8080), ready))},
		{Name: "longest-valid-names", Objects: inNamespace(strings.Repeat("s", 63), objects(
			service(strings.Repeat("n", 63), func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.Ports[0].Name, s.Spec.Ports[0].NodePort = strings.Repeat("p", 15), 30999
			}),
			slice(strings.Repeat("n", 63), "longest-1", discovery.AddressTypeIPv4, port(strings.Repeat("p", 15), 8080), ready)))},
		{Name: "huge-namespace", Skipped: strings.Repeat("s", 300) + "/svc", Objects: objects(
			inNamespace(strings.Repeat("s", 300), service("svc", nil)))},
		{Name: "huge-port-name", Skipped: "bad/long-port", Objects: objects(
			service("long-port", func(s *v1.Service) { s.Spec.Ports[0].Name = strings.Repeat("p", 300) }),
			slice("long-port", "long-port-1", discovery.AddressTypeIPv4, port(strings.Repeat("p", 300), 8080), ready))},
		{Name: "name-with-newline", Skipped: "bad/a\nb", Objects: objects(
			service("a\nb", nil))},
		{Name: "missing-fields", Skipped: "bad/missing-1", Objects: objects(
			service("missing", func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "noproto", Port: 82})
			}),
			&discovery.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: Namespace, Name: "missing-1", Labels: map[string]string{discovery.LabelServiceName: "missing"}},
				AddressType: discovery.AddressTypeIPv4,
				Ports:       []discovery.EndpointPort{{Name: ptr.To("http")}, {Port: ptr.To[int32](8080)}, {Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
				Endpoints:   []discovery.Endpoint{{}, {Addresses: []string{}}, {Addresses: []string{"10.244.1.5"}}},
			},
			&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "unlabelled"}, AddressType: discovery.AddressTypeIPv4,
				Endpoints: []discovery.Endpoint{{Addresses: []string{"10.244.1.6"}}}},
			service("no-ports", func(s *v1.Service) { s.Spec.Ports = nil }))},
		{Name: "slice-for-an-unknown-service", Objects: objects(
			slice("nosuch", "nosuch-1", discovery.AddressTypeIPv4, port("http", 8080), ready))},
		{Name: "slice-of-the-wrong-family", Objects: objects(
			service("v4-only", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.2.10"} }),
			slice("v4-only", "v4-only-1", discovery.AddressTypeIPv6, port("http", 8080), endpoint("fd00:244::4", true)))},
		{Name: "fqdn-slice", Skipped: "bad/fqdn-1", Objects: objects(
			service("fqdn", nil),
			slice("fqdn", "fqdn-1", discovery.AddressTypeFQDN, port("http", 8080), endpoint("example.com", true)),
			slice("fqdn", "bogus-type-1", "Bogus", port("http", 8080), ready))},
		{Name: "conflicting-slices", Objects: objects(
			service("conflict", nil),
			slice("conflict", "conflict-1", discovery.AddressTypeIPv4, port("http", 8080), endpoint("10.244.1.7", true), endpoint("10.244.1.8", false)),
			slice("conflict", "conflict-2", discovery.AddressTypeIPv4, port("http", 9090), endpoint("10.244.1.7", false), endpoint("10.244.1.8", true)),
			slice("conflict", "conflict-3", discovery.AddressTypeIPv4, port("http", 8080), endpoint("10.244.1.7", true), endpoint("10.244.1.7", true)))},
		{Name: "unsupported-protocol", Skipped: "bad/icmp", Objects: objects(
			service("icmp", func(s *v1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }),
			slice("icmp", "icmp-1", discovery.AddressTypeIPv4, []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.Protocol("ICMP"))}}, ready))},
		{Name: "negative-affinity-timeout", Skipped: "bad/affinity", Objects: objects(
			service("affinity", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](-5)}}
			}),
			slice("affinity", "affinity-1", discovery.AddressTypeIPv4, port("http", 8080), ready))},
		{Name: "health-check-port-out-of-range", Skipped: "bad/health", Objects: objects(
			service("health", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 70000
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.255.3.9"}}
			}),
			slice("health", "health-1", discovery.AddressTypeIPv4, port("http", 8080), ready))},
	}
}

// Good is well-formed services with their slices, in namespace "good":
// every kind of rule, in both families.
func Good() Objects {
	local := endpoint("10.244.0.2", true)
	local.NodeName = ptr.To("node-1")
	return inNamespace("good", objects(
		service("web", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalIPs = []string{"10.255.2.1", "2001:db8::1"}
			s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "fd00::/8"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.255.3.1"}, {IP: "2001:db8::3"}}
		}),
		slice("web", "web-v4", discovery.AddressTypeIPv4, port("http", 8080), local, endpoint("10.244.0.3", true)),
		slice("web", "web-v6", discovery.AddressTypeIPv6, port("http", 8080), endpoint("fd00:244::10", true)),
		service("dns", func(s *v1.Service) {
			s.Spec.Ports = []v1.ServicePort{{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}, {Name: "dns-tcp", Port: 53, Protocol: v1.ProtocolTCP}}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}),
		slice("dns", "dns-v4", discovery.AddressTypeIPv4, append(port("dns", 53), discovery.EndpointPort{Name: ptr.To("dns-tcp"), Port: ptr.To[int32](53), Protocol: ptr.To(v1.ProtocolTCP)}),
			endpoint("10.244.0.4", true), endpoint("10.244.0.5", false)),
		service("empty", nil),
	))
}

func objects(items ...any) Objects {
	var o Objects
	for _, item := range items {
		switch x := item.(type) {
		case *v1.Service:
			o.Services = append(o.Services, x)
		case *discovery.EndpointSlice:
			o.EndpointSlices = append(o.EndpointSlices, x)
		case Objects:
			o.Services = append(o.Services, x.Services...)
			o.EndpointSlices = append(o.EndpointSlices, x.EndpointSlices...)
		}
	}
	return o
}

func inNamespace(ns string, items ...any) Objects {
	o := objects(items...)
	for _, s := range o.Services {
		s.Namespace = ns
	}
	for _, s := range o.EndpointSlices {
		s.Namespace = ns
	}
	return o
}

// service is a ClusterIP service with one TCP port, its dual-stack
// cluster IPs derived from its name.
func service(name string, mutate func(*v1.Service)) *v1.Service {
	h := fnv.New32a()
	h.Write([]byte(name))
	n := h.Sum32() % 60000
	v4, v6 := fmt.Sprintf("10.96.%d.%d", 10+n/250, 1+n%250), fmt.Sprintf("fd00:96::%x", 1+n)
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  v4,
			ClusterIPs: []string{v4, v6},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	if mutate != nil {
		mutate(svc)
	}
	return svc
}

func port(name string, number int32) []discovery.EndpointPort {
	return []discovery.EndpointPort{{Name: ptr.To(name), Port: ptr.To(number), Protocol: ptr.To(v1.ProtocolTCP)}}
}

func slice(service, name string, family discovery.AddressType, ports []discovery.EndpointPort, endpoints ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: Namespace, Name: name, Labels: map[string]string{discovery.LabelServiceName: service}},
		AddressType: family,
		Ports:       ports,
		Endpoints:   endpoints,
	}
}

func endpoint(addr string, ready bool) discovery.Endpoint {
	return discovery.Endpoint{Addresses: []string{addr}, Conditions: discovery.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready)}, NodeName: ptr.To("node-2")}
}

// CheckPlan is the body of a mode's plan fuzz target: the objects of data
// next to the good ones through plan, in each family, leave nothing that
// problems names, and the good service ports' objects are as without them.
func CheckPlan[K comparable, T any](t *testing.T, data []byte, plan func(t *testing.T, family v1.IPFamily, objs ...Objects) map[K]T, problems func(family v1.IPFamily, objects T) []string) {
	objs, ok := Decode(data)
	if !ok {
		return
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		all := plan(t, family, Good(), objs)
		for name, o := range all {
			if bad := problems(family, o); len(bad) > 0 {
				t.Errorf("%s %v: %s", family, name, strings.Join(bad, "; "))
			}
		}
		if objs.UsesGoodNames() {
			continue
		}
		for name, o := range plan(t, family, Good()) {
			if !reflect.DeepEqual(all[name], o) {
				t.Errorf("%s: good service port %v changed next to bad objects", family, name)
			}
		}
	}
}
