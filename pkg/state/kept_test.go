package state

import (
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// TestServiceOfKeepsThePortsOfEachFamily checks what the informers keep
// of a Service: each family's service ports, and the problems that left
// the service or some ports out, for the tracker of that family to log.
func TestServiceOfKeepsThePortsOfEachFamily(t *testing.T) {
	for _, tc := range []struct {
		name       string
		svc        *v1.Service
		v4, v6     int
		problems   int
		dropped    bool
		v6Problems int
	}{
		{name: "dual-stack", svc: service("a", nil), v4: 1, v6: 1},
		{name: "IPv4 only", svc: service("a", func(s *v1.Service) { s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1] }), v4: 1},
		{name: "ExternalName", svc: service("a", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName })},
		{name: "a bad port", svc: service("a", func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "bad", Port: 70000, Protocol: v1.ProtocolTCP})
		}), v4: 1, v6: 1, problems: 1, v6Problems: 1},
		{name: "a bad name", svc: service("a", func(s *v1.Service) { s.Name = "A_B" }), problems: 1, dropped: true, v6Problems: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept := ServiceOf(tc.svc)
			if got := len(kept.Ports(v1.IPv4Protocol)); got != tc.v4 {
				t.Errorf("%d IPv4 ports, want %d", got, tc.v4)
			}
			if got := len(kept.Ports(v1.IPv6Protocol)); got != tc.v6 {
				t.Errorf("%d IPv6 ports, want %d", got, tc.v6)
			}
			if f := kept.family(v1.IPv4Protocol); len(f.problems) != tc.problems || f.dropped != tc.dropped {
				t.Errorf("IPv4 problems %q (dropped %v), want %d (dropped %v)", f.problems, f.dropped, tc.problems, tc.dropped)
			}
			if f := kept.family(v1.IPv6Protocol); len(f.problems) != tc.v6Problems {
				t.Errorf("IPv6 problems %q, want %d", f.problems, tc.v6Problems)
			}
			if c := kept.DeepCopyObject().(*Service); !reflect.DeepEqual(c, kept) {
				t.Errorf("copy %+v, want %+v", c, kept)
			}
		})
	}
}

// TestSliceOfKeepsWhatMergeReads checks what the informers keep of an
// EndpointSlice: usable ports, each endpoint's first address whatever its
// family, on the first port, the conditions as the API defaults them, and
// why the rest went.
func TestSliceOfKeepsWhatMergeReads(t *testing.T) {
	s := slice("svc", "svc-1", discovery.AddressTypeIPv4, 8080, v1.ProtocolTCP,
		endpoint("10.0.0.1", true, "node-1"),
		discovery.Endpoint{Addresses: []string{"fd00::1", "10.0.0.9"}},
		discovery.Endpoint{Addresses: []string{"bogus"}},
		discovery.Endpoint{},
		discovery.Endpoint{Addresses: []string{"10.0.0.2"}, Conditions: discovery.EndpointConditions{Terminating: ptr.To(true), Ready: ptr.To(false)},
			Zone: ptr.To("z"), Hints: &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z"}}}},
	)
	s.Ports = append(s.Ports, discovery.EndpointPort{Name: ptr.To("udp"), Port: ptr.To[int32](0), Protocol: ptr.To(v1.ProtocolUDP)})
	s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-02T03:04:05Z"}
	kept := SliceOf(s)
	want := &EndpointSlice{
		Namespace: "ns", Name: "svc-1", Service: "svc", AddressType: discovery.AddressTypeIPv4,
		Ports:        []SlicePort{{Name: "http", Port: 8080, Protocol: v1.ProtocolTCP}},
		PortProblems: []string{`port 1: port "udp": 0 is not in 1-65535`},
		Endpoints: []Endpoint{
			{IP: parseAddr("10.0.0.1"), Port: 8080, NodeName: "node-1", Ready: true, Serving: true},
			{IP: parseAddr("fd00::1"), Port: 8080, Ready: true, Serving: true},
			{IP: parseAddr("10.0.0.2"), Port: 8080, Zone: "z", Hints: &Hints{Zones: []string{"z"}}, Serving: true, Terminating: true},
		},
		AddressProblems:     2,
		FirstAddressProblem: `address "bogus" is not an IP address`,
		TriggerTime:         time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	if !reflect.DeepEqual(kept, want) {
		t.Fatalf("kept\n%+v\nwant\n%+v", kept, want)
	}
	c := kept.DeepCopyObject().(*EndpointSlice)
	c.Endpoints[2].Hints.Zones[0] = "changed"
	if kept.Endpoints[2].Hints.Zones[0] != "z" {
		t.Errorf("the copy shares its hints")
	}
}

// TestMergeSharesTheSlicesEndpoints checks that the state's endpoints of a
// slice's first port are the slice's own, but for those on this node, and
// that those of its other ports are copies on their port.
func TestMergeSharesTheSlicesEndpoints(t *testing.T) {
	s := slice("svc", "svc-1", discovery.AddressTypeIPv4, 8080, v1.ProtocolTCP,
		endpoint("10.0.0.1", true, "node-1"), endpoint("10.0.0.2", true, "node-2"))
	s.Ports = append(s.Ports, discovery.EndpointPort{Name: ptr.To("dns"), Port: ptr.To[int32](53), Protocol: ptr.To(v1.ProtocolUDP)})
	kept := SliceOf(s)
	tr := NewTracker(v1.IPv4Protocol, "node-1")
	tr.OnCachedSlice(kept, false)
	eps := tr.mergeSlices(nn("svc"))
	http := eps[ServicePortName{NamespacedName: nn("svc"), Port: "http", Protocol: v1.ProtocolTCP}]
	dns := eps[ServicePortName{NamespacedName: nn("svc"), Port: "dns", Protocol: v1.ProtocolUDP}]
	if len(http) != 2 || len(dns) != 2 {
		t.Fatalf("endpoints %v", eps)
	}
	if http[0] == &kept.Endpoints[0] || !http[0].IsLocal || http[0].Port != 8080 {
		t.Errorf("the local endpoint %+v: want a copy that is local", http[0])
	}
	if http[1] != &kept.Endpoints[1] {
		t.Errorf("the remote endpoint of the first port is not the slice's own")
	}
	if dns[1] == &kept.Endpoints[1] || dns[1].Port != 53 || kept.Endpoints[1].Port != 8080 {
		t.Errorf("the second port's endpoint %+v (slice's %+v): want a copy on port 53", dns[1], kept.Endpoints[1])
	}
}
