package proxy

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Explainer is a proxier that tells what it does with the services it
// programs (the explain endpoint's source; Core and DualStack are ones).
type Explainer interface {
	// ServicePorts summarizes every service port the proxier programs.
	ServicePorts() []ServicePortSummary
	// Explain describes each port of one service and, with verify, checks
	// the kernel objects that implement it.
	Explain(name types.NamespacedName, verify bool) Explanation
}

// RuleDifferences lists how a chain's rules as the kernel prints them
// (have) differ from those wanted, compared by key, since the kernel
// prints a rule other than it was written: each wanted rule it lacks,
// each rule it has but no one wants, or else that the order differs; nil
// when they are the same. chain names the chain in the differences.
func RuleDifferences[R ~string](chain string, want, have []R, key func(R) string) []string {
	if slices.EqualFunc(want, have, func(w, h R) bool { return w == h || key(w) == key(h) }) {
		return nil
	}
	unmatched := map[string]int{}
	for _, r := range have {
		unmatched[key(r)]++
	}
	var out []string
	for _, r := range want {
		if k := key(r); unmatched[k] > 0 {
			unmatched[k]--
		} else {
			out = append(out, fmt.Sprintf("%s lacks: %s", chain, r))
		}
	}
	for _, r := range have {
		if k := key(r); unmatched[k] > 0 {
			unmatched[k]--
			out = append(out, fmt.Sprintf("%s has an unwanted rule: %s", chain, r))
		}
	}
	if len(out) == 0 {
		out = append(out, chain+" has its rules in another order")
	}
	return out
}

// Explanation is what this node does with one service.
type Explanation struct {
	Service string `json:"service"`
	Node    string `json:"node"`
	Zone    string `json:"zone,omitempty"`
	// ServicePorts are the service's ports in each IP family this node
	// programs; none when it programs none.
	ServicePorts []ServicePortExplanation `json:"servicePorts"`
}

// ServicePortExplanation is one service port in one IP family: its
// definition, each endpoint with whether and why each path uses it, and
// the kernel objects that implement it.
type ServicePortExplanation struct {
	ServicePortID
	ExternalIPs              []string               `json:"externalIPs,omitempty"`
	LoadBalancerIPs          []string               `json:"loadBalancerIPs,omitempty"`
	LoadBalancerSourceRanges []string               `json:"loadBalancerSourceRanges,omitempty"`
	Skipped                  []state.SkippedAddress `json:"skippedAddresses,omitempty"`
	InternalTrafficPolicy    string                 `json:"internalTrafficPolicy"`
	// ExternalTrafficPolicy is set only for a service reachable from
	// outside (NodePort, external or load-balancer IPs).
	ExternalTrafficPolicy  string `json:"externalTrafficPolicy,omitempty"`
	HealthCheckNodePort    int32  `json:"healthCheckNodePort,omitempty"`
	SessionAffinity        string `json:"sessionAffinity"`
	AffinityTimeoutSeconds int32  `json:"affinityTimeoutSeconds,omitempty"`
	TrafficDistribution    string `json:"trafficDistribution,omitempty"`
	// LastChanged is when this node last took in a change of the
	// service's ports or endpoints; LastSynced when the kernel was last
	// written to hold them, nil while the syncs since have failed.
	LastChanged *time.Time `json:"lastChanged,omitempty"`
	LastSynced  *time.Time `json:"lastSynced,omitempty"`
	// Cluster and Local are the two sets of endpoints traffic can go to;
	// nil when no traffic takes that path.
	Cluster   *PathExplanation      `json:"cluster,omitempty"`
	Local     *PathExplanation      `json:"local,omitempty"`
	Endpoints []EndpointExplanation `json:"endpoints"`
	// Kernel is nil when the mode cannot name its objects.
	Kernel *KernelExplanation `json:"kernel,omitempty"`
}

// PathExplanation is one path: which traffic takes it, and how many
// endpoints it uses.
type PathExplanation struct {
	Serves    string `json:"serves"`
	Endpoints int    `json:"endpoints"`
	// Note says what else decided the path, in words: topology hints, a
	// fallback to terminating endpoints, or no usable endpoint.
	Note string `json:"note,omitempty"`
}

// EndpointExplanation is one endpoint, and whether each path uses it.
type EndpointExplanation struct {
	Address     string     `json:"address"`
	Node        string     `json:"node,omitempty"`
	Zone        string     `json:"zone,omitempty"`
	Ready       bool       `json:"ready"`
	Serving     bool       `json:"serving"`
	Terminating bool       `json:"terminating"`
	ZoneHints   []string   `json:"zoneHints,omitempty"`
	NodeHints   []string   `json:"nodeHints,omitempty"`
	Cluster     *state.Use `json:"cluster,omitempty"`
	Local       *state.Use `json:"local,omitempty"`
}

// KernelExplanation is what the mode keeps in the kernel for a service
// port, and, when asked for, how the kernel differs from it.
type KernelExplanation struct {
	Mode    string         `json:"mode"`
	Objects []KernelObject `json:"objects"`
	Verify  *Verification  `json:"verify,omitempty"`
}

// Verification is what one check of the kernel found.
type Verification struct {
	// Differences is empty when the kernel holds what this node wants.
	Differences []string `json:"differences"`
	Error       string   `json:"error,omitempty"`
}

// ServicePortID names a service port of one IP family and where it is
// reached.
type ServicePortID struct {
	Family    v1.IPFamily `json:"family"`
	Name      string      `json:"name"`
	Protocol  v1.Protocol `json:"protocol"`
	ClusterIP string      `json:"clusterIP"`
	Port      int32       `json:"port"`
	NodePort  int32       `json:"nodePort,omitempty"`
}

func idOf(family v1.IPFamily, svc *state.ServicePort) ServicePortID {
	return ServicePortID{Family: family, Name: svc.Name.String(), Protocol: svc.Protocol,
		ClusterIP: svc.ClusterIP.String(), Port: svc.Port, NodePort: svc.NodePort}
}

// ServicePortSummary is one line of the list of service ports.
type ServicePortSummary struct {
	ServicePortID
	Endpoints int `json:"endpoints"`
	// ClusterEndpoints and LocalEndpoints count the endpoints each path
	// uses; nil when no traffic takes the path.
	ClusterEndpoints *int `json:"clusterEndpoints,omitempty"`
	LocalEndpoints   *int `json:"localEndpoints,omitempty"`
}

// verifyAttempts bounds how often a verification is redone because a sync
// ran while it read the kernel, which can show a passing difference.
const verifyAttempts = 3

// Explain describes each port of one service in this core's IP family.
func (c *Core) Explain(name types.NamespacedName, verify bool) Explanation {
	for attempt := 1; ; attempt++ {
		e, checks, syncs := c.explain(name)
		if !verify {
			return e
		}
		for i, check := range checks {
			if check == nil {
				continue
			}
			differences, err := check()
			v := &Verification{Differences: differences}
			if err != nil {
				v.Error = err.Error()
			}
			e.ServicePorts[i].Kernel.Verify = v
		}
		c.mu.Lock()
		again := c.history.syncs != syncs && attempt < verifyAttempts
		c.mu.Unlock()
		if !again {
			return e
		}
	}
}

// explain builds the explanation under the lock, with the checks of the
// mode's objects (nil where there are none) and the count of syncs so far.
func (c *Core) explain(name types.NamespacedName) (Explanation, []func() ([]string, error), int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := Explanation{Service: name.String(), Node: c.node.Name, Zone: c.node.Zone, ServicePorts: []ServicePortExplanation{}}
	view := state.View{State: c.state, Node: c.node}
	describer, _ := c.mode.(Describer)
	var checks []func() ([]string, error)
	ports := slices.SortedFunc(slices.Values(c.state.PortsOf(name)), func(a, b *state.ServicePort) int { return a.Name.Compare(b.Name) })
	for _, port := range ports {
		spn := port.Name
		svc, ex, _ := view.Explain(spn)
		sp := describeServicePort(c.cfg.Family, svc, view.Endpoints[spn], ex)
		sp.LastChanged, sp.LastSynced = c.history.times(name)
		var check func() ([]string, error)
		if describer != nil {
			objects, verify := describer.Describe(view, spn)
			sp.Kernel = &KernelExplanation{Mode: c.cfg.ModeName, Objects: objects}
			check = verify
		}
		e.ServicePorts = append(e.ServicePorts, sp)
		checks = append(checks, check)
	}
	return e, checks, c.history.syncs
}

// ServicePorts summarizes every service port of this core's IP family.
func (c *Core) ServicePorts() []ServicePortSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	view := state.View{State: c.state, Node: c.node}
	out := make([]ServicePortSummary, 0, len(c.state.Services))
	for name, svc := range c.state.Services {
		_, sel, _ := view.Select(name)
		s := ServicePortSummary{ServicePortID: idOf(c.cfg.Family, svc), Endpoints: len(view.Endpoints[name])}
		if svc.UsesClusterEndpoints() {
			s.ClusterEndpoints = ptrTo(len(sel.Cluster))
		}
		if svc.UsesLocalEndpoints() {
			s.LocalEndpoints = ptrTo(len(sel.Local))
		}
		out = append(out, s)
	}
	sortSummaries(out)
	return out
}

func ptrTo[T any](v T) *T { return &v }

func sortSummaries(s []ServicePortSummary) {
	slices.SortFunc(s, func(a, b ServicePortSummary) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Family, b.Family))
	})
}

// describeServicePort is the mode-independent part of a service port's
// explanation.
func describeServicePort(family v1.IPFamily, svc *state.ServicePort, endpoints []*state.Endpoint, ex state.Explanation) ServicePortExplanation {
	sp := ServicePortExplanation{
		ServicePortID: idOf(family, svc),
		ExternalIPs:   texts(svc.ExternalIPs), LoadBalancerIPs: texts(svc.LoadBalancerIPs),
		LoadBalancerSourceRanges: texts(svc.LoadBalancerSourceRanges), Skipped: svc.Skipped,
		InternalTrafficPolicy: policy(svc.InternalPolicyLocal), HealthCheckNodePort: svc.HealthCheckNodePort,
		SessionAffinity: string(v1.ServiceAffinityNone), AffinityTimeoutSeconds: svc.AffinityTimeoutSeconds,
		TrafficDistribution: svc.TrafficDistribution,
		Endpoints:           make([]EndpointExplanation, len(endpoints)),
	}
	if svc.HasExternal() {
		sp.ExternalTrafficPolicy = policy(svc.ExternalPolicyLocal)
	}
	if svc.AffinityTimeoutSeconds > 0 {
		sp.SessionAffinity = string(v1.ServiceAffinityClientIP)
	}
	if ex.Cluster != nil {
		sp.Cluster = &PathExplanation{Serves: clusterServes(svc), Endpoints: len(ex.Selection.Cluster), Note: clusterNote(ex)}
	}
	if ex.Local != nil {
		sp.Local = &PathExplanation{Serves: localServes(svc), Endpoints: len(ex.Selection.Local), Note: localNote(ex)}
	}
	for i, ep := range endpoints {
		e := EndpointExplanation{
			Address: ep.String(), Node: ep.NodeName, Zone: ep.Zone,
			Ready: ep.Ready, Serving: ep.Serving, Terminating: ep.Terminating,
			ZoneHints: ep.ZoneHints(), NodeHints: ep.NodeHints(),
		}
		if ex.Cluster != nil {
			e.Cluster = &ex.Cluster[i]
		}
		if ex.Local != nil {
			e.Local = &ex.Local[i]
		}
		sp.Endpoints[i] = e
	}
	return sp
}

func policy(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

// clusterServes and localServes say which traffic takes each path, as
// the traffic policies decide (see ServicePort.UsesClusterEndpoints).
func clusterServes(svc *state.ServicePort) string {
	var kinds []string
	if !svc.InternalPolicyLocal {
		kinds = append(kinds, "internal traffic")
	}
	switch {
	case svc.HasExternal() && !svc.ExternalPolicyLocal:
		kinds = append(kinds, "external traffic")
	case svc.HasExternal():
		kinds = append(kinds, "external traffic from this node and its pods")
	}
	return strings.Join(kinds, ", ")
}

func localServes(svc *state.ServicePort) string {
	var kinds []string
	if svc.InternalPolicyLocal {
		kinds = append(kinds, "internal traffic")
	}
	if svc.HasExternal() && svc.ExternalPolicyLocal {
		kinds = append(kinds, "external traffic")
	}
	return strings.Join(kinds, ", ")
}

func clusterNote(ex state.Explanation) string {
	switch {
	case ex.ClusterFallback:
		return "no endpoint is ready: using the serving terminating ones"
	case len(ex.Selection.Cluster) == 0:
		return "no usable endpoint"
	case ex.Topology == v1.ServiceTrafficDistributionPreferSameZone:
		return "following the zone hints for this node's zone"
	case ex.Topology == v1.ServiceTrafficDistributionPreferSameNode:
		return "following the node hints for this node"
	}
	return ""
}

func localNote(ex state.Explanation) string {
	switch {
	case ex.LocalFallback:
		return "no local endpoint is ready: using the serving terminating ones"
	case len(ex.Selection.Local) == 0 && ex.HasAny:
		return "no usable endpoint on this node, though the service has some elsewhere"
	case len(ex.Selection.Local) == 0:
		return "no usable endpoint"
	}
	return ""
}

// texts writes addresses or prefixes as text.
func texts[T interface{ String() string }](values []T) []string {
	var out []string
	for _, v := range values {
		out = append(out, v.String())
	}
	return out
}

// ServicePorts summarizes every family's service ports.
func (d DualStack) ServicePorts() []ServicePortSummary {
	out := []ServicePortSummary{}
	for _, p := range d {
		if e, ok := p.(Explainer); ok {
			out = append(out, e.ServicePorts()...)
		}
	}
	sortSummaries(out)
	return out
}

// Explain describes the service in every family.
func (d DualStack) Explain(name types.NamespacedName, verify bool) Explanation {
	out := Explanation{Service: name.String(), ServicePorts: []ServicePortExplanation{}}
	for _, p := range d {
		if e, ok := p.(Explainer); ok {
			family := e.Explain(name, verify)
			out.Node, out.Zone = family.Node, family.Zone
			out.ServicePorts = append(out.ServicePorts, family.ServicePorts...)
		}
	}
	return out
}
