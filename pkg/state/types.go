// Package state holds the node's desired service state: for one IP family,
// which service ports exist and which endpoints each of them may send
// traffic to. It is built from API objects by the change trackers and read
// by the proxiers (iptables, IPVS), which turn it into kernel rules.
package state

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName names one port of one Service. Its String form,
// "namespace/name:port" (":port" omitted for an unnamed port), is the key
// upstream hashes into chain names, so it must not change.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol v1.Protocol
}

func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.NamespacedName.String()
	}
	return n.NamespacedName.String() + ":" + n.Port
}

// ServicePort is what the node must program for one service port in one IP
// family. Addresses of the other family are not in it.
type ServicePort struct {
	Name      ServicePortName
	ClusterIP netip.Addr
	Port      int32
	Protocol  v1.Protocol
	// NodePort is 0 when the service has none.
	NodePort    int32
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are the status ingress IPs of this family; ingress
	// with ipMode Proxy is left out, as upstream does.
	LoadBalancerIPs          []netip.Addr
	LoadBalancerSourceRanges []netip.Prefix
	// AffinityTimeoutSeconds is above 0 exactly when sessionAffinity is ClientIP.
	AffinityTimeoutSeconds int32
	// ExternalPolicyLocal is true for externalTrafficPolicy Local on a
	// service that has external entry points (NodePort, externalIPs, LB).
	ExternalPolicyLocal bool
	InternalPolicyLocal bool
	// HealthCheckNodePort is the eTP=Local health-check port, 0 when none.
	HealthCheckNodePort int32
	// TrafficDistribution is spec.trafficDistribution, "" when unset.
	TrafficDistribution string
	// Skipped are the service's external and load-balancer IPs this
	// family leaves out, and why; only explanations read them.
	Skipped []SkippedAddress
}

// SkippedAddress is an address of a service that gets no rules here.
type SkippedAddress struct {
	Address string `json:"address"`
	Reason  string `json:"reason"`
}

// HasExternal tells whether the service port can be reached from outside
// the cluster network (NodePort, external IPs or load-balancer IPs).
func (s *ServicePort) HasExternal() bool {
	return s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
}

// Endpoint is one backend of a service port, as seen from this node.
type Endpoint struct {
	IP netip.Addr
	// NodeName and Zone come from the EndpointSlice; IsLocal is NodeName
	// equal to this node's name.
	NodeName string
	Zone     string
	// Hints are the slice's topology hints, nil when the endpoint carries
	// none (nearly all do not: held apart, they cost an endpoint 8 bytes,
	// not 48; at 10k services x 5 endpoints 2.4 MB).
	Hints       *Hints
	Port        int32
	IsLocal     bool
	Ready       bool
	Serving     bool
	Terminating bool
}

// Hints are an endpoint's topology hints: the zones and nodes it is
// meant for.
type Hints struct {
	Zones, Nodes []string
}

// ZoneHints are the zones the endpoint is hinted for; nil when none.
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints are the nodes the endpoint is hinted for; nil when none.
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// String is "ip:port" ("[ip]:port" for IPv6), the form upstream hashes
// into KUBE-SEP chain names.
func (e *Endpoint) String() string {
	return netip.AddrPortFrom(e.IP, uint16(e.Port)).String()
}

// AddrPort is the endpoint's address and port.
func (e *Endpoint) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(e.IP, uint16(e.Port))
}

// ServiceMap is every service port of one IP family.
type ServiceMap map[ServicePortName]*ServicePort

// EndpointsMap is the endpoints of each service port of one IP family,
// each list sorted by Endpoint.String so output built from it is stable.
type EndpointsMap map[ServicePortName][]*Endpoint
