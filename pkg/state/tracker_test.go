package state

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func service(name string, mutate func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10", "fd00::10"},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	if mutate != nil {
		mutate(svc)
	}
	return svc
}

func slice(service, name string, family discovery.AddressType, port int32, proto v1.Protocol, endpoints ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discovery.LabelServiceName: service}},
		AddressType: family,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(proto)}},
		Endpoints:   endpoints,
	}
}

func endpoint(ip string, ready bool, node string) discovery.Endpoint {
	return discovery.Endpoint{Addresses: []string{ip}, Conditions: discovery.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready)}, NodeName: ptr.To(node)}
}

func nn(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

func spn(name, port string, proto v1.Protocol) ServicePortName {
	return ServicePortName{NamespacedName: nn(name), Port: port, Protocol: proto}
}

func changed(ch Changes) string {
	var s []string
	for n := range ch.ServicePorts {
		s = append(s, n.String()+"/"+string(n.Protocol))
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func TestServicesBecomeServicePortsOfTheFamily(t *testing.T) {
	cases := []struct {
		name   string
		family v1.IPFamily
		svc    *v1.Service
		check  func(*ServicePort) string
		none   bool
	}{
		{"IPv4 cluster IP", v1.IPv4Protocol, service("a", nil), func(sp *ServicePort) string {
			return eq(sp.ClusterIP.String(), "10.96.0.10")
		}, false},
		{"IPv6 cluster IP", v1.IPv6Protocol, service("a", nil), func(sp *ServicePort) string {
			return eq(sp.ClusterIP.String(), "fd00::10")
		}, false},
		{"single-stack service gives nothing to the other family", v1.IPv6Protocol, service("a", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10"} }), nil, true},
		{"headless is skipped", v1.IPv4Protocol, service("a", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), nil, true},
		{"ExternalName is skipped", v1.IPv4Protocol, service("a", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }), nil, true},
		{"external IPs of the family", v1.IPv4Protocol, service("a", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"1.2.3.4", "2001:db8::1", "bogus"} }),
			func(sp *ServicePort) string {
				return eq(fmt.Sprint(sp.ExternalIPs, sp.Skipped), "[1.2.3.4] [{2001:db8::1 other IP family} {bogus not an IP address}]")
			}, false},
		{"LB ingress of the family, ipMode Proxy skipped", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "5.6.7.8"}, {IP: "5.6.7.9", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}, {IP: "5.6.7.10", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)}, {IP: "2001:db8::2"}}
		}), func(sp *ServicePort) string {
			return eq(fmt.Sprint(sp.LoadBalancerIPs, sp.Skipped), "[5.6.7.8 5.6.7.10] [{5.6.7.9 ipMode Proxy: the load balancer proxies it} {2001:db8::2 other IP family}]")
		}, false},
		{"source ranges from the spec", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"192.168.0.0/16", " 10.0.0.1/8", "2001:db8::/32", "junk"}
		}), func(sp *ServicePort) string {
			return eq(fmt.Sprint(sp.LoadBalancerSourceRanges), "[192.168.0.0/16 10.0.0.0/8]")
		}, false},
		{"the legacy source-ranges annotation is ignored, as upstream", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Annotations = map[string]string{"service.beta.kubernetes.io/load-balancer-source-ranges": "192.168.0.0/16"}
		}), func(sp *ServicePort) string { return eq(len(sp.LoadBalancerSourceRanges), 0) }, false},
		{"a /0 source range allows everything", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"192.168.0.0/16", "0.0.0.0/0"}
		}), func(sp *ServicePort) string { return eq(len(sp.LoadBalancerSourceRanges), 0) }, false},
		{"addresses with leading zeros parse as the API server accepted them", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"010.000.000.001"}
		}), func(sp *ServicePort) string { return eq(fmt.Sprint(sp.ExternalIPs), "[10.0.0.1]") }, false},
		{"ClientIP affinity defaults to 10800s", v1.IPv4Protocol, service("a", func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			func(sp *ServicePort) string { return eq(sp.AffinityTimeoutSeconds, int32(10800)) }, false},
		{"ClientIP affinity timeout", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		}), func(sp *ServicePort) string { return eq(sp.AffinityTimeoutSeconds, int32(60)) }, false},
		{"eTP=Local on a LoadBalancer, with its health check port", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 31000
		}), func(sp *ServicePort) string {
			return eq(fmt.Sprint(sp.ExternalPolicyLocal, sp.HealthCheckNodePort), "true 31000")
		}, false},
		{"eTP=Local on a ClusterIP service means nothing", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}), func(sp *ServicePort) string { return eq(sp.ExternalPolicyLocal, false) }, false},
		{"iTP=Local", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
		}), func(sp *ServicePort) string { return eq(sp.InternalPolicyLocal, true) }, false},
		{"trafficDistribution", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferClose)
		}), func(sp *ServicePort) string { return eq(sp.TrafficDistribution, "PreferClose") }, false},
		{"node port", v1.IPv4Protocol, service("a", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
		}), func(sp *ServicePort) string { return eq(fmt.Sprint(sp.NodePort, sp.HasExternal()), "30080 true") }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(tc.family, "node")
			st := NewState()
			tr.OnService(nn("a"), tc.svc)
			tr.Apply(st)
			sp := st.Services[spn("a", "http", v1.ProtocolTCP)]
			if tc.none {
				if len(st.Services) != 0 {
					t.Fatalf("want no service ports, got %v", st.Services)
				}
				return
			}
			if sp == nil {
				t.Fatalf("no service port; have %v", st.Services)
			}
			if msg := tc.check(sp); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func eq(got, want any) string {
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Sprintf("got %v, want %v", got, want)
	}
	return ""
}

func TestServiceChangesAreTrackedPerPort(t *testing.T) {
	tr := NewTracker(v1.IPv4Protocol, "node")
	st := NewState()
	two := service("a", func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP})
	})
	tr.OnService(nn("a"), two)
	tr.OnService(nn("b"), service("b", nil))
	if got := changed(tr.Apply(st)); got != "ns/a:dns/UDP ns/a:http/TCP ns/b:http/TCP" {
		t.Errorf("adds: changed %q", got)
	}
	if got := changed(tr.Apply(st)); got != "" {
		t.Errorf("nothing pending, yet changed %q", got)
	}
	// Only the port whose definition changes is reported.
	updated := two.DeepCopy()
	updated.Spec.Ports[1].Port = 5353
	tr.OnService(nn("a"), updated)
	if got := changed(tr.Apply(st)); got != "ns/a:dns/UDP" {
		t.Errorf("update: changed %q", got)
	}
	// An update that changes nothing the node uses is no change.
	relabelled := updated.DeepCopy()
	relabelled.Labels = map[string]string{"x": "y"}
	tr.OnService(nn("a"), relabelled)
	if got := changed(tr.Apply(st)); got != "" {
		t.Errorf("label-only update: changed %q", got)
	}
	tr.OnService(nn("a"), nil)
	ch := tr.Apply(st)
	if got := changed(ch); got != "ns/a:dns/UDP ns/a:http/TCP" {
		t.Errorf("delete: changed %q", got)
	}
	if len(st.Services) != 1 || ch.ServiceUpdates != 1 {
		t.Errorf("after delete: %d service ports, %d updates", len(st.Services), ch.ServiceUpdates)
	}
}

func TestEndpointSlicesAreMergedPerServicePort(t *testing.T) {
	tr := NewTracker(v1.IPv4Protocol, "node-1")
	st := NewState()
	// Slices may arrive before their service.
	tr.OnEndpointSlice(slice("a", "a-1", discovery.AddressTypeIPv4, 8080, v1.ProtocolTCP,
		endpoint("10.244.0.2", true, "node-1"), endpoint("10.244.0.1", false, "node-2")), false)
	tr.OnEndpointSlice(slice("a", "a-2", discovery.AddressTypeIPv4, 8080, v1.ProtocolTCP,
		endpoint("10.244.0.3", true, "node-2"), endpoint("10.244.0.1", true, "node-2")), false)
	tr.OnEndpointSlice(slice("a", "a-v6", discovery.AddressTypeIPv6, 8080, v1.ProtocolTCP,
		endpoint("fd00::1", true, "node-1")), false)
	ch := tr.Apply(st)
	if got := changed(ch); got != "ns/a:http/TCP" {
		t.Errorf("changed %q", got)
	}
	eps := st.Endpoints[spn("a", "http", v1.ProtocolTCP)]
	var desc []string
	for _, e := range eps {
		desc = append(desc, fmt.Sprintf("%s ready=%v local=%v", e, e.Ready, e.IsLocal))
	}
	want := "10.244.0.1:8080 ready=true local=false, 10.244.0.2:8080 ready=true local=true, 10.244.0.3:8080 ready=true local=false"
	if got := strings.Join(desc, ", "); got != want {
		t.Errorf("endpoints:\n got %s\nwant %s", got, want)
	}

	// Deleting one slice removes only its endpoints.
	tr.OnEndpointSlice(slice("a", "a-2", discovery.AddressTypeIPv4, 8080, v1.ProtocolTCP), true)
	tr.Apply(st)
	if got := len(st.Endpoints[spn("a", "http", v1.ProtocolTCP)]); got != 2 {
		t.Errorf("after deleting a slice: %d endpoints, want 2", got)
	}
	tr.OnEndpointSlice(slice("a", "a-1", discovery.AddressTypeIPv4, 8080, v1.ProtocolTCP), true)
	tr.Apply(st)
	if len(st.Endpoints) != 0 {
		t.Errorf("after deleting every slice: %v", st.Endpoints)
	}
}

func TestEndpointConditions(t *testing.T) {
	tr := NewTracker(v1.IPv4Protocol, "node-1")
	st := NewState()
	tr.OnEndpointSlice(slice("a", "a-1", discovery.AddressTypeIPv4, 80, v1.ProtocolTCP,
		discovery.Endpoint{Addresses: []string{"10.0.0.1"}}, // nil conditions: ready and serving
		discovery.Endpoint{Addresses: []string{"10.0.0.2"}, Conditions: discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
		discovery.Endpoint{Addresses: []string{"10.0.0.3"}, Zone: ptr.To("z"), Hints: &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z"}}, ForNodes: []discovery.ForNode{{Name: "n"}}}},
		discovery.Endpoint{}, // no address: ignored
	), false)
	tr.Apply(st)
	eps := st.Endpoints[spn("a", "http", v1.ProtocolTCP)]
	got := fmt.Sprintf("%v/%v %v/%v/%v %v/%v/%v", eps[0].Ready, eps[0].Serving, eps[1].Ready, eps[1].Serving, eps[1].Terminating, eps[2].Zone, eps[2].ZoneHints(), eps[2].NodeHints())
	if want := "true/true false/true/true z/[z]/[n]"; got != want || len(eps) != 3 {
		t.Errorf("got %s (%d endpoints), want %s", got, len(eps), want)
	}
}

func TestStaleUDPEndpoints(t *testing.T) {
	tr := NewTracker(v1.IPv4Protocol, "node-1")
	st := NewState()
	udp := func(eps ...discovery.Endpoint) {
		tr.OnEndpointSlice(slice("dns", "dns-1", discovery.AddressTypeIPv4, 53, v1.ProtocolUDP, eps...), false)
	}
	udp(endpoint("10.0.0.1", false, "n"))
	if ch := tr.Apply(st); len(ch.NewlyActiveUDP) != 0 {
		t.Errorf("a not-ready endpoint does not activate: %v", ch.NewlyActiveUDP)
	}
	udp(endpoint("10.0.0.1", true, "n"), endpoint("10.0.0.2", true, "n"))
	if ch := tr.Apply(st); len(ch.NewlyActiveUDP) != 1 || len(ch.StaleEndpoints) != 0 {
		t.Errorf("first serving endpoints: newly active %v, stale %v", ch.NewlyActiveUDP, ch.StaleEndpoints)
	}
	udp(endpoint("10.0.0.2", true, "n"))
	ch := tr.Apply(st)
	want := []StaleEndpoint{{Service: spn("dns", "http", v1.ProtocolUDP), Endpoint: netip.MustParseAddrPort("10.0.0.1:53")}}
	if fmt.Sprint(ch.StaleEndpoints) != fmt.Sprint(want) || len(ch.NewlyActiveUDP) != 0 {
		t.Errorf("removed endpoint: stale %v, newly active %v", ch.StaleEndpoints, ch.NewlyActiveUDP)
	}
	// TCP endpoints never need conntrack clean-up.
	tr.OnEndpointSlice(slice("web", "web-1", discovery.AddressTypeIPv4, 80, v1.ProtocolTCP, endpoint("10.0.0.9", true, "n")), false)
	tr.Apply(st)
	tr.OnEndpointSlice(slice("web", "web-1", discovery.AddressTypeIPv4, 80, v1.ProtocolTCP), true)
	if ch := tr.Apply(st); len(ch.StaleEndpoints) != 0 {
		t.Errorf("TCP: stale %v", ch.StaleEndpoints)
	}
}

func TestTriggerTimesAndPendingCounts(t *testing.T) {
	tr := NewTracker(v1.IPv4Protocol, "node-1")
	s := slice("a", "a-1", discovery.AddressTypeIPv4, 80, v1.ProtocolTCP, endpoint("10.0.0.1", true, "n"))
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339)}
	tr.OnEndpointSlice(s, false)
	tr.OnService(nn("a"), service("a", nil))
	if svcs, eps := tr.Pending(); svcs != 1 || eps != 1 {
		t.Errorf("pending %d services, %d endpoint sets", svcs, eps)
	}
	ch := tr.Apply(NewState())
	if len(ch.TriggerTimes) != 1 || !ch.TriggerTimes[0].Equal(at) {
		t.Errorf("trigger times %v", ch.TriggerTimes)
	}
	if svcs, eps := tr.Pending(); svcs != 0 || eps != 0 {
		t.Errorf("after Apply: pending %d, %d", svcs, eps)
	}
}

// BenchmarkOneEndpointChangeAt10kServices measures folding one endpoint
// change into a state of 10,000 services with 5 endpoints each.
func BenchmarkOneEndpointChangeAt10kServices(b *testing.B) {
	tr := NewTracker(v1.IPv4Protocol, "node-1")
	st := NewState()
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("svc-%d", i)
		tr.OnService(nn(name), service(name, func(s *v1.Service) {
			s.Spec.ClusterIP = fmt.Sprintf("10.96.%d.%d", i/256, i%256)
			s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
		}))
		var eps []discovery.Endpoint
		for j := 0; j < 5; j++ {
			eps = append(eps, endpoint(fmt.Sprintf("10.%d.%d.%d", 1+i/65536, (i/256)%256, j), true, "n"))
		}
		tr.OnEndpointSlice(slice(name, name+"-1", discovery.AddressTypeIPv4, 80, v1.ProtocolTCP, eps...), false)
	}
	tr.Apply(st)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		eps := []discovery.Endpoint{endpoint("10.1.0.1", true, "n"), endpoint(fmt.Sprintf("10.2.0.%d", i%250), true, "n")}
		tr.OnEndpointSlice(slice("svc-0", "svc-0-1", discovery.AddressTypeIPv4, 80, v1.ProtocolTCP, eps...), false)
		if ch := tr.Apply(st); len(ch.ServicePorts) != 1 {
			b.Fatalf("changed %v", ch.ServicePorts)
		}
	}
}

// Endpoints are ordered as their text compares, as upstream orders them
// (10.0.0.10 before 10.0.0.9), without the text being built.
func TestEndpointsCompareAsText(t *testing.T) {
	addrs := []string{"10.0.0.9:80", "10.0.0.10:80", "10.0.0.10:8080", "10.0.0.1:9", "[fd00::a]:80", "[fd00::10]:80", "[fd00::a]:443"}
	var eps []*Endpoint
	for _, a := range addrs {
		ap := netip.MustParseAddrPort(a)
		eps = append(eps, &Endpoint{IP: ap.Addr(), Port: int32(ap.Port())})
	}
	for _, a := range eps {
		for _, b := range eps {
			if got, want := compareAsText(a, b), strings.Compare(a.String(), b.String()); got != want {
				t.Errorf("compareAsText(%s, %s) = %d, want %d", a, b, got, want)
			}
		}
	}
}
