package state

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The API server validates Services and EndpointSlices, but the node does
// not take that on trust: an object it would refuse (from a buggy client
// of etcd, an older server, a test) must cost only its own rules. One bad
// rule makes a whole iptables-restore or nft transaction fail, every other
// service's changes with it: a comment over 255 bytes, a port over 65535,
// a negative affinity timeout, an IPv6 address in an IPv4 table. So what
// cannot be programmed is left out here, once for every mode, and the
// tracker logs why, naming the object, once per change of it.

// maxAffinityTimeout is the API's bound on sessionAffinityConfig's
// clientIP.timeoutSeconds (one day).
const maxAffinityTimeout = 86400

// serviceProblem tells why no port of the service can be programmed, or
// "" when its ports can be judged one by one.
func serviceProblem(svc *v1.Service) string {
	if errs := validation.IsDNS1123Label(svc.Namespace); len(errs) > 0 {
		return fmt.Sprintf("namespace %q: %s", clip(svc.Namespace), errs[0])
	}
	if errs := validation.IsDNS1123Label(svc.Name); len(errs) > 0 {
		return fmt.Sprintf("name %q: %s", clip(svc.Name), errs[0])
	}
	if cfg := svc.Spec.SessionAffinityConfig; svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP &&
		cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
		if s := *cfg.ClientIP.TimeoutSeconds; s < 1 || s > maxAffinityTimeout {
			return fmt.Sprintf("sessionAffinityConfig.clientIP.timeoutSeconds %d is not in 1-%d", s, maxAffinityTimeout)
		}
	}
	if p := svc.Spec.HealthCheckNodePort; p < 0 || p > 65535 {
		return fmt.Sprintf("healthCheckNodePort %d is not a port number", p)
	}
	for _, ip := range clusterIPs(svc) {
		if ip != "" && ip != v1.ClusterIPNone && !parseAddr(ip).IsValid() {
			return fmt.Sprintf("cluster IP %q is not an IP address", clip(ip))
		}
	}
	return ""
}

// servicePortProblem tells why one port of a service cannot be programmed.
func servicePortProblem(p *v1.ServicePort) string {
	if p.Name != "" {
		// The API server checks a Service port's name as a DNS label (up
		// to 63 characters); IANA service names (up to 15) are for
		// container ports only.
		if errs := validation.IsDNS1123Label(p.Name); len(errs) > 0 {
			return fmt.Sprintf("port name %q: %s", clip(p.Name), errs[0])
		}
	}
	if !supportedProtocol(p.Protocol) {
		return fmt.Sprintf("protocol %q is not TCP, UDP or SCTP", clip(string(p.Protocol)))
	}
	if p.Port < 1 || p.Port > 65535 {
		return fmt.Sprintf("port %d is not in 1-65535", p.Port)
	}
	if p.NodePort < 0 || p.NodePort > 65535 {
		return fmt.Sprintf("nodePort %d is not in 1-65535", p.NodePort)
	}
	return ""
}

// slicePortProblem tells why an EndpointSlice port gives no endpoints.
func slicePortProblem(p *discovery.EndpointPort) string {
	switch {
	case p.Name == nil || p.Protocol == nil || p.Port == nil:
		// Upstream ignores ports it cannot name or number too.
		return "a port without a name, protocol or number"
	case !supportedProtocol(*p.Protocol):
		return fmt.Sprintf("port %q: protocol %q is not TCP, UDP or SCTP", clip(*p.Name), clip(string(*p.Protocol)))
	case *p.Port < 1 || *p.Port > 65535:
		return fmt.Sprintf("port %q: %d is not in 1-65535", clip(*p.Name), *p.Port)
	}
	return ""
}

func supportedProtocol(p v1.Protocol) bool {
	return p == v1.ProtocolTCP || p == v1.ProtocolUDP || p == v1.ProtocolSCTP
}

// clip keeps a logged value short: a name may be megabytes long.
func clip(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	return s[:most] + "..."
}
