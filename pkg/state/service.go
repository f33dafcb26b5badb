package state

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	netutils "k8s.io/utils/net"
)

const (
	// defaultAffinityTimeout is the ClientIP affinity timeout when the
	// service does not set one (3 hours, the API's default).
	defaultAffinityTimeout = 10800
)

// UsesClusterEndpoints tells whether some traffic to the service port is
// spread over the whole cluster's endpoints: with a Cluster policy, and for
// any externally reachable service, since pod- and node-originated traffic
// to its external addresses short-circuits to the cluster endpoints even
// under externalTrafficPolicy Local.
func (s *ServicePort) UsesClusterEndpoints() bool {
	return !s.InternalPolicyLocal || s.HasExternal()
}

// UsesLocalEndpoints tells whether some traffic to the service port goes
// only to this node's endpoints (a Local traffic policy).
func (s *ServicePort) UsesLocalEndpoints() bool {
	return s.InternalPolicyLocal || (s.HasExternal() && s.ExternalPolicyLocal)
}

// servicePorts turns a Service into the service ports of one IP family.
// Services kube-proxy does not handle (headless, ExternalName, or without
// a cluster IP of the family) give none. Problems are why it left out the
// whole service, or some of its ports, as invalid (see validate.go).
func servicePorts(svc *v1.Service, family v1.IPFamily) (ports []*ServicePort, problems []string) {
	if svc == nil || svc.Spec.Type == v1.ServiceTypeExternalName {
		return nil, nil
	}
	if problem := serviceProblem(svc); problem != "" {
		return nil, []string{problem}
	}
	shared, ok := serviceWide(svc, family)
	if !ok {
		return nil, nil
	}
	ports = make([]*ServicePort, 0, len(svc.Spec.Ports))
	// The API refuses two ports of one name, or of one number and
	// protocol: the first is kept.
	type number struct {
		port     int32
		protocol v1.Protocol
	}
	names, numbers := map[string]bool{}, map[number]bool{}
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		problem := servicePortProblem(p)
		switch n := (number{p.Port, p.Protocol}); {
		case problem != "":
		case names[p.Name]:
			problem = fmt.Sprintf("a second port named %q", p.Name)
		case numbers[n]:
			problem = fmt.Sprintf("a second port %d/%s", p.Port, p.Protocol)
		default:
			names[p.Name], numbers[n] = true, true
		}
		if problem != "" {
			problems = append(problems, fmt.Sprintf("port %d: %s", i, problem))
			continue
		}
		sp := shared
		sp.Name = ServicePortName{NamespacedName: shared.Name.NamespacedName, Port: p.Name, Protocol: p.Protocol}
		sp.Port, sp.Protocol, sp.NodePort = p.Port, p.Protocol, p.NodePort
		ports = append(ports, &sp)
	}
	return ports, problems
}

// serviceWide is what every service port of svc in the family shares;
// false when the service has no cluster IP of the family.
func serviceWide(svc *v1.Service, family v1.IPFamily) (ServicePort, bool) {
	clusterIP := firstOfFamily(clusterIPs(svc), family)
	if !clusterIP.IsValid() {
		return ServicePort{}, false
	}
	var affinity int32
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		affinity = defaultAffinityTimeout
		if cfg := svc.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
			affinity = *cfg.ClientIP.TimeoutSeconds
		}
	}
	externallyReachable := svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0
	externalLocal := externallyReachable && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	var healthCheckPort int32
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && externalLocal {
		healthCheckPort = svc.Spec.HealthCheckNodePort
	}
	var distribution string
	if svc.Spec.TrafficDistribution != nil {
		distribution = *svc.Spec.TrafficDistribution
	}
	return ServicePort{
		Name:                     ServicePortName{NamespacedName: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}},
		ClusterIP:                clusterIP,
		ExternalIPs:              addrsOfFamily(svc.Spec.ExternalIPs, family),
		LoadBalancerIPs:          loadBalancerIPs(svc, family),
		LoadBalancerSourceRanges: sourceRanges(svc, family),
		AffinityTimeoutSeconds:   affinity,
		ExternalPolicyLocal:      externalLocal,
		InternalPolicyLocal:      svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
		HealthCheckNodePort:      healthCheckPort,
		TrafficDistribution:      distribution,
		Skipped:                  skippedAddresses(svc, family),
	}, true
}

func clusterIPs(svc *v1.Service) []string {
	if len(svc.Spec.ClusterIPs) > 0 {
		return svc.Spec.ClusterIPs
	}
	return []string{svc.Spec.ClusterIP}
}

// loadBalancerIPs are the status ingress IPs of the family; an ingress in
// ipMode Proxy is handled by the load balancer itself, not the node.
func loadBalancerIPs(svc *v1.Service, family v1.IPFamily) []netip.Addr {
	var ips []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy {
			continue
		}
		ips = append(ips, ing.IP)
	}
	return addrsOfFamily(ips, family)
}

// skippedAddresses are the external and load-balancer IPs that
// addrsOfFamily and loadBalancerIPs leave out, with why.
func skippedAddresses(svc *v1.Service, family v1.IPFamily) []SkippedAddress {
	var out []SkippedAddress
	skip := func(s, reason string) {
		switch a := parseAddr(s); {
		case !a.IsValid():
			reason = "not an IP address"
		case familyOf(a) != family:
			reason = "other IP family"
		}
		if reason != "" {
			out = append(out, SkippedAddress{Address: s, Reason: reason})
		}
	}
	for _, ip := range svc.Spec.ExternalIPs {
		skip(ip, "")
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		// A hostname-only ingress has no address to skip.
		if ing.IP == "" {
			continue
		}
		reason := ""
		if ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy {
			reason = "ipMode Proxy: the load balancer proxies it"
		}
		skip(ing.IP, reason)
	}
	return out
}

// sourceRanges are loadBalancerSourceRanges of the family. Entries that do
// not parse are ignored, and a /0 range means no restriction at all, as
// upstream (which also ignores the legacy annotation).
func sourceRanges(svc *v1.Service, family v1.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range svc.Spec.LoadBalancerSourceRanges {
		_, ipnet, err := netutils.ParseCIDRSloppy(strings.TrimSpace(r))
		if err != nil {
			continue
		}
		addr, _ := netip.AddrFromSlice(ipnet.IP)
		bits, _ := ipnet.Mask.Size()
		p := netip.PrefixFrom(addr.Unmap(), bits)
		if familyOf(p.Addr()) != family {
			continue
		}
		if bits == 0 {
			return nil
		}
		out = append(out, p)
	}
	return out
}

func firstOfFamily(ips []string, family v1.IPFamily) netip.Addr {
	for _, a := range addrsOfFamily(ips, family) {
		return a
	}
	return netip.Addr{}
}

// addrsOfFamily parses the addresses of the family, skipping the others and
// anything that is not an address.
func addrsOfFamily(ips []string, family v1.IPFamily) []netip.Addr {
	var out []netip.Addr
	for _, s := range ips {
		a := parseAddr(s)
		if !a.IsValid() || familyOf(a) != family {
			continue
		}
		out = append(out, a)
	}
	return out
}

// parseAddr parses an address the way the API server validated it, which
// accepts IPv4 with leading zeros; the zero Addr means not an address.
func parseAddr(s string) netip.Addr {
	s = strings.TrimSpace(s)
	// The strict parser first: it allocates nothing (an address with a
	// zone is no address here).
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap()
	}
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}
