package state

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// EndpointSlice is what the tracker keeps of a discovery/v1 EndpointSlice,
// which is all any mode reads of it: its service, its usable ports, and
// of each endpoint the first address, the conditions, node, zone and
// hints. The informers keep this instead of the object (SliceOf is their
// transform), and the tracker holds the informers' copy: at 10,000
// services of five endpoints the objects, even cut down, held some 40 MB
// with their Services (BenchmarkInformerCache in pkg/server).
type EndpointSlice struct {
	Namespace, Name, ResourceVersion string
	// Service is the kubernetes.io/service-name label, "" when absent.
	Service     string
	AddressType discovery.AddressType
	// Ports are the usable ports; PortProblems say why the others were
	// left out, for the tracker to log.
	Ports        []SlicePort
	PortProblems []string
	// Endpoints are those with an address (the first: only the first
	// counts, as upstream), whatever its family, on the first usable port
	// (0 when none) and not local: the state's endpoints of that port are
	// these, but for those on this node, so that a slice's endpoints are
	// held once. AddressProblems counts those left out and
	// FirstAddressProblem says why the first was.
	Endpoints           []Endpoint
	AddressProblems     int
	FirstAddressProblem string
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation, zero when absent or not a time.
	TriggerTime time.Time
}

// SlicePort is a usable port of an EndpointSlice.
type SlicePort struct {
	Name     string
	Port     int32
	Protocol v1.Protocol
}

// SliceOf is what the tracker keeps of slice.
func SliceOf(slice *discovery.EndpointSlice) *EndpointSlice {
	s := &EndpointSlice{
		Namespace:       slice.Namespace,
		Name:            slice.Name,
		ResourceVersion: slice.ResourceVersion,
		Service:         slice.Labels[discovery.LabelServiceName],
		AddressType:     slice.AddressType,
		Ports:           make([]SlicePort, 0, len(slice.Ports)),
		Endpoints:       make([]Endpoint, 0, len(slice.Endpoints)),
	}
	for i := range slice.Ports {
		p := &slice.Ports[i]
		if problem := slicePortProblem(p); problem != "" {
			s.PortProblems = append(s.PortProblems, fmt.Sprintf("port %d: %s", i, problem))
			continue
		}
		s.Ports = append(s.Ports, SlicePort{Name: *p.Name, Port: *p.Port, Protocol: *p.Protocol})
	}
	for i := range slice.Endpoints {
		e := &slice.Endpoints[i]
		ip, problem := endpointAddr(e)
		if problem != "" {
			if s.AddressProblems++; s.AddressProblems == 1 {
				s.FirstAddressProblem = problem
			}
			continue
		}
		s.Endpoints = append(s.Endpoints, sliceEndpoint(e, ip))
	}
	if len(s.Ports) > 0 {
		for i := range s.Endpoints {
			s.Endpoints[i].Port = s.Ports[0].Port
		}
	}
	if at, err := time.Parse(time.RFC3339, slice.Annotations[v1.EndpointsLastChangeTriggerTime]); err == nil {
		s.TriggerTime = at
	}
	return s
}

func sliceEndpoint(e *discovery.Endpoint, ip netip.Addr) Endpoint {
	ep := Endpoint{
		IP:          ip,
		Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
		Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
		Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
	}
	if e.NodeName != nil {
		ep.NodeName = *e.NodeName
	}
	if e.Zone != nil {
		ep.Zone = *e.Zone
	}
	if h := e.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
		ep.Hints = &Hints{}
		for _, z := range h.ForZones {
			ep.Hints.Zones = append(ep.Hints.Zones, z.Name)
		}
		for _, n := range h.ForNodes {
			ep.Hints.Nodes = append(ep.Hints.Nodes, n.Name)
		}
	}
	return ep
}

// endpointAddr is the first address of a slice endpoint, or why it has
// none usable.
func endpointAddr(e *discovery.Endpoint) (netip.Addr, string) {
	if len(e.Addresses) == 0 {
		return netip.Addr{}, "an endpoint without an address"
	}
	ip := parseAddr(e.Addresses[0])
	if !ip.IsValid() {
		return ip, fmt.Sprintf("address %q is not an IP address", clip(e.Addresses[0]))
	}
	return ip, ""
}

// The informers store an EndpointSlice as they would the object: by its
// namespace and name (GetObjectMeta), and as a runtime.Object.

// GetObjectMeta gives the store its key and the informer its version.
func (s *EndpointSlice) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}
}

// GetObjectKind is that of an object without a kind: the informer knows
// what it watches.
func (s *EndpointSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies s.
func (s *EndpointSlice) DeepCopyObject() runtime.Object {
	c := *s
	c.Ports = slices.Clone(s.Ports)
	c.PortProblems = slices.Clone(s.PortProblems)
	c.Endpoints = slices.Clone(s.Endpoints)
	for i := range c.Endpoints {
		if h := c.Endpoints[i].Hints; h != nil {
			c.Endpoints[i].Hints = &Hints{Zones: slices.Clone(h.Zones), Nodes: slices.Clone(h.Nodes)}
		}
	}
	return &c
}
