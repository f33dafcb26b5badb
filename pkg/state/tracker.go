package state

import (
	"bytes"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
)

// Tracker records Service and EndpointSlice changes for one IP family as
// the informers report them, and folds them into a State when the proxier
// syncs, telling exactly which service ports changed. Recording is O(1)
// per event and folding is proportional to what changed, never to the
// number of services, so a sync at 30k services costs what the change costs.
//
// The event methods may be called from any goroutine.
type Tracker struct {
	family   v1.IPFamily
	nodeName string
	// logger says why an object, or part of one, is left out.
	logger klog.Logger

	mu sync.Mutex
	// pendingServices holds the latest object of each changed service (nil
	// once deleted) since the last Apply.
	pendingServices map[types.NamespacedName]*Service
	// slices are the current EndpointSlices of each service, sorted by
	// name: nearly every service has one, and a map per service held some
	// 3 MB more at 10k services.
	slices map[types.NamespacedName][]*EndpointSlice
	// sliceOwners is the service each slice in slices is held under: a
	// slice relabelled to another service, or no longer usable, leaves
	// the one it was held under.
	sliceOwners      map[types.NamespacedName]string
	pendingEndpoints map[types.NamespacedName]bool
	triggerTimes     []time.Time
}

// NewTracker returns a tracker for one IP family on the named node.
func NewTracker(family v1.IPFamily, nodeName string) *Tracker {
	return &Tracker{
		family:           family,
		nodeName:         nodeName,
		logger:           klog.Background().WithValues("ipFamily", family),
		pendingServices:  map[types.NamespacedName]*Service{},
		slices:           map[types.NamespacedName][]*EndpointSlice{},
		sliceOwners:      map[types.NamespacedName]string{},
		pendingEndpoints: map[types.NamespacedName]bool{},
	}
}

// OnService records a service's new state; nil means deleted.
func (t *Tracker) OnService(name types.NamespacedName, svc *v1.Service) {
	var kept *Service
	if svc != nil {
		kept = ServiceOf(svc)
	}
	t.OnCachedService(name, kept)
}

// OnCachedService records a service's new state as ServiceOf keeps it;
// nil means deleted.
func (t *Tracker) OnCachedService(name types.NamespacedName, svc *Service) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pendingServices[name] = svc
}

// OnEndpointSlice records a slice added or updated, or deleted when
// deleted is true, as OnCachedSlice does.
func (t *Tracker) OnEndpointSlice(slice *discovery.EndpointSlice, deleted bool) {
	t.OnCachedSlice(SliceOf(slice), deleted)
}

// OnCachedSlice records a slice added or updated, or deleted when deleted is
// true. Slices of the other IP family and slices not owned by a service
// are ignored, and so are, with a logged reason, the endpoints and ports
// of a slice that cannot be programmed.
func (t *Tracker) OnCachedSlice(slice *EndpointSlice, deleted bool) {
	service := slice.Service
	usable := !deleted && service != "" && t.sliceFamilyMatches(slice.AddressType)
	if usable {
		if errs := validation.IsDNS1123Label(service); len(errs) > 0 {
			t.logger.Info("Skipping EndpointSlice", "endpointSlice", klog.KRef(slice.Namespace, slice.Name), "reason", fmt.Sprintf("service name %q: %s", clip(service), errs[0]))
			usable = false
		} else {
			t.logSliceProblems(slice)
		}
	}
	if !deleted && !usable && slice.AddressType != discovery.AddressTypeIPv4 && slice.AddressType != discovery.AddressTypeIPv6 {
		t.logger.V(2).Info("Skipping EndpointSlice", "endpointSlice", klog.KRef(slice.Namespace, slice.Name), "reason", fmt.Sprintf("addressType %q: only IP addresses are proxied", clip(string(slice.AddressType))))
	}
	key := types.NamespacedName{Namespace: slice.Namespace, Name: slice.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	if owner, held := t.sliceOwners[key]; held && (!usable || owner != service) {
		t.dropSlice(types.NamespacedName{Namespace: slice.Namespace, Name: owner}, slice.Name)
		delete(t.sliceOwners, key)
	}
	if !usable {
		return
	}
	name := types.NamespacedName{Namespace: slice.Namespace, Name: service}
	held := t.slices[name]
	if i, found := sliceIndex(held, slice.Name); found {
		held[i] = slice
	} else {
		t.slices[name] = slices.Insert(held, i, slice)
	}
	t.sliceOwners[key] = service
	if !slice.TriggerTime.IsZero() {
		t.triggerTimes = append(t.triggerTimes, slice.TriggerTime)
	}
	t.pendingEndpoints[name] = true
}

// dropSlice forgets a slice held under a service. Called with t.mu held.
func (t *Tracker) dropSlice(service types.NamespacedName, sliceName string) {
	held := t.slices[service]
	if i, found := sliceIndex(held, sliceName); found {
		held = slices.Delete(held, i, i+1)
	}
	if len(held) == 0 {
		delete(t.slices, service)
	} else {
		t.slices[service] = held
	}
	t.pendingEndpoints[service] = true
}

// sliceIndex is where the slice named name is in held, sorted by name, or
// where it would go.
func sliceIndex(held []*EndpointSlice, name string) (int, bool) {
	return slices.BinarySearchFunc(held, name, func(s *EndpointSlice, name string) int { return strings.Compare(s.Name, name) })
}

// logSliceProblems logs what of a slice mergeSlices will leave out: once
// per slice change, never per sync.
func (t *Tracker) logSliceProblems(slice *EndpointSlice) {
	for _, problem := range slice.PortProblems {
		t.logger.Info("Skipping EndpointSlice port", "endpointSlice", klog.KRef(slice.Namespace, slice.Name), "reason", problem)
	}
	bad, first := slice.AddressProblems, slice.FirstAddressProblem
	for i := range slice.Endpoints {
		if problem := t.familyProblem(slice.Endpoints[i].IP); problem != "" {
			if bad++; first == "" {
				first = problem
			}
		}
	}
	if bad > 0 {
		t.logger.Info("Skipping EndpointSlice endpoints", "endpointSlice", klog.KRef(slice.Namespace, slice.Name), "endpoints", bad, "reason", first)
	}
}

// familyProblem says why an endpoint's address is not of the tracker's
// family; "" when it is.
func (t *Tracker) familyProblem(ip netip.Addr) string {
	if familyOf(ip) != t.family {
		return fmt.Sprintf("address %q is not %s", ip, t.family)
	}
	return ""
}

func (t *Tracker) sliceFamilyMatches(at discovery.AddressType) bool {
	return (at == discovery.AddressTypeIPv4 && t.family == v1.IPv4Protocol) ||
		(at == discovery.AddressTypeIPv6 && t.family == v1.IPv6Protocol)
}

// Pending counts the services and the endpoint sets changed since the last Apply.
func (t *Tracker) Pending() (services, endpoints int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pendingServices), len(t.pendingEndpoints)
}

// State is the node's desired service state for one IP family.
type State struct {
	Services  ServiceMap
	Endpoints EndpointsMap
	// Which keys each service owns, so one service is replaced without a
	// scan of the maps: its ports (the tracker's slice, not a copy) and
	// the ports of its endpoints.
	servicePorts  map[types.NamespacedName][]*ServicePort
	endpointPorts map[types.NamespacedName][]ServicePortName
}

// NewState returns an empty state.
func NewState() *State {
	return &State{
		Services:      ServiceMap{},
		Endpoints:     EndpointsMap{},
		servicePorts:  map[types.NamespacedName][]*ServicePort{},
		endpointPorts: map[types.NamespacedName][]ServicePortName{},
	}
}

// StaleEndpoint is a UDP endpoint that no longer serves a service port:
// conntrack entries towards it must go, or clients keep sending there.
type StaleEndpoint struct {
	Service  ServicePortName
	Endpoint netip.AddrPort
}

// Changes is what one Apply changed.
type Changes struct {
	// ServicePorts are the service ports whose definition or endpoints
	// changed, including those added and deleted.
	ServicePorts map[ServicePortName]bool
	// StaleEndpoints are UDP endpoints that stopped serving.
	StaleEndpoints []StaleEndpoint
	// NewlyActiveUDP are UDP service ports that went from no serving
	// endpoint to some: flows that were rejected before must be forgotten.
	NewlyActiveUDP []ServicePortName
	// ServiceUpdates and EndpointUpdates count the services and endpoint
	// sets folded in.
	ServiceUpdates, EndpointUpdates int
	// TriggerTimes are the API-side times of the endpoint changes folded in,
	// for the network-programming latency metric.
	TriggerTimes []time.Time
}

// Apply folds every change recorded since the last call into st.
func (t *Tracker) Apply(st *State) Changes {
	t.mu.Lock()
	services := t.pendingServices
	t.pendingServices = map[types.NamespacedName]*Service{}
	endpoints := t.pendingEndpoints
	t.pendingEndpoints = map[types.NamespacedName]bool{}
	ch := Changes{
		ServicePorts:    map[ServicePortName]bool{},
		ServiceUpdates:  len(services),
		EndpointUpdates: len(endpoints),
		TriggerTimes:    t.triggerTimes,
	}
	t.triggerTimes = nil
	t.mu.Unlock()

	for name, svc := range services {
		var ports []*ServicePort
		if svc != nil {
			f := svc.family(t.family)
			for _, problem := range f.problems {
				msg := "Skipping Service port"
				if f.dropped {
					msg = "Skipping Service"
				}
				t.logger.Info(msg, "service", name, "reason", problem)
			}
			ports = f.ports
		}
		st.replaceService(name, ports, &ch)
	}
	// Each service's slices are merged just before they replace its
	// endpoints, not all first: at a first sync of 10k services the
	// merged copies of all of them would be held at once, on top of the
	// state they become. A slice changed meanwhile is merged here and
	// again at the next Apply, which finds nothing new.
	for name := range endpoints {
		t.mu.Lock()
		eps := t.mergeSlices(name)
		t.mu.Unlock()
		st.replaceEndpoints(name, eps, &ch)
	}
	return ch
}

func (st *State) replaceService(name types.NamespacedName, ports []*ServicePort, ch *Changes) {
	for _, old := range st.servicePorts[name] {
		if !slices.ContainsFunc(ports, func(sp *ServicePort) bool { return sp.Name == old.Name }) {
			delete(st.Services, old.Name)
			ch.ServicePorts[old.Name] = true
		}
	}
	for _, sp := range ports {
		if old, ok := st.Services[sp.Name]; !ok || !reflect.DeepEqual(old, sp) {
			ch.ServicePorts[sp.Name] = true
		}
		// The informers' copy even when nothing changed, so that the
		// state holds no copy of its own.
		st.Services[sp.Name] = sp
	}
	if len(ports) == 0 {
		delete(st.servicePorts, name)
	} else {
		st.servicePorts[name] = ports
	}
}

func (st *State) replaceEndpoints(name types.NamespacedName, eps EndpointsMap, ch *Changes) {
	for _, spn := range st.endpointPorts[name] {
		if _, kept := eps[spn]; !kept {
			ch.noteEndpointChange(spn, st.Endpoints[spn], nil)
			delete(st.Endpoints, spn)
		}
	}
	keys := make([]ServicePortName, 0, len(eps))
	for spn, list := range eps {
		keys = append(keys, spn)
		if old := st.Endpoints[spn]; !reflect.DeepEqual(old, list) {
			ch.noteEndpointChange(spn, old, list)
		}
		// The new list even when nothing changed: its endpoints are the
		// informers' copies, and the old ones' slice would stay held.
		st.Endpoints[spn] = list
	}
	if len(keys) == 0 {
		delete(st.endpointPorts, name)
	} else {
		st.endpointPorts[name] = keys
	}
}

// noteEndpointChange records a changed endpoint list and, for UDP, what
// conntrack must forget.
func (ch *Changes) noteEndpointChange(spn ServicePortName, old, updated []*Endpoint) {
	ch.ServicePorts[spn] = true
	if spn.Protocol != v1.ProtocolUDP {
		return
	}
	stillServing := make(map[netip.AddrPort]bool, len(updated))
	for _, ep := range updated {
		if ep.Serving {
			stillServing[ep.AddrPort()] = true
		}
	}
	wasServing := false
	for _, ep := range old {
		if !ep.Serving {
			continue
		}
		wasServing = true
		if !stillServing[ep.AddrPort()] {
			ch.StaleEndpoints = append(ch.StaleEndpoints, StaleEndpoint{Service: spn, Endpoint: ep.AddrPort()})
		}
	}
	if !wasServing && len(stillServing) > 0 {
		ch.NewlyActiveUDP = append(ch.NewlyActiveUDP, spn)
	}
}

// mergeSlices builds a service's endpoints per port from all its slices.
// An address listed by several slices counts once.
// Called with t.mu held.
func (t *Tracker) mergeSlices(name types.NamespacedName) EndpointsMap {
	byPort := map[ServicePortName]map[netip.AddrPort]*Endpoint{}
	// In name order: a stable choice among duplicates.
	for _, slice := range t.slices[name] {
		for _, port := range slice.Ports {
			spn := ServicePortName{NamespacedName: name, Port: port.Name, Protocol: port.Protocol}
			set := byPort[spn]
			if set == nil {
				set = map[netip.AddrPort]*Endpoint{}
				byPort[spn] = set
			}
			for i := range slice.Endpoints {
				ep := t.endpoint(&slice.Endpoints[i], port.Port)
				if ep == nil {
					continue
				}
				// A duplicate replaces the earlier copy unless it is terminating.
				if existing := set[ep.AddrPort()]; existing == nil || !ep.Terminating {
					set[ep.AddrPort()] = ep
				}
			}
		}
	}
	out := make(EndpointsMap, len(byPort))
	for spn, set := range byPort {
		list := make([]*Endpoint, 0, len(set))
		for _, ep := range set {
			list = append(list, ep)
		}
		// Sorted as text, as upstream does: the order decides the load
		// spreading rules, which should read the same as upstream's.
		slices.SortFunc(list, compareAsText)
		out[spn] = list
	}
	return out
}

// compareAsText orders endpoints as their String forms compare, without
// building them: a first sync at 10k services sorts some 50k endpoints.
func compareAsText(a, b *Endpoint) int {
	var bufA, bufB [64]byte // "[IPv6]:port" fits
	return bytes.Compare(a.AddrPort().AppendTo(bufA[:0]), b.AddrPort().AppendTo(bufB[:0]))
}

// endpoint is a slice's endpoint for one of its ports: the slice's own
// for the port it was made for, unless it is on this node; nil when its
// address is of the other family.
func (t *Tracker) endpoint(e *Endpoint, port int32) *Endpoint {
	if t.familyProblem(e.IP) != "" {
		return nil
	}
	local := e.NodeName != "" && e.NodeName == t.nodeName
	if e.Port == port && !local {
		return e
	}
	c := *e
	c.Port, c.IsLocal = port, local
	return &c
}
