package state

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Service is what the tracker keeps of a v1 Service: its service ports of
// each IP family, decided once (servicePorts) when the informer gets the
// object. The informers keep this instead of the object (ServiceOf is
// their transform), and the state holds the same ServicePorts: one copy
// of each service on the node, not the object, the tracker's and the
// state's.
type Service struct {
	Namespace, Name, ResourceVersion string
	ipv4, ipv6                       familyPorts
}

// familyPorts are a service's ports in one family, and the problems that
// left out the whole service (dropped) or some of its ports.
type familyPorts struct {
	ports    []*ServicePort
	problems []string
	dropped  bool
}

// ServiceOf is what the tracker keeps of svc.
func ServiceOf(svc *v1.Service) *Service {
	s := &Service{Namespace: svc.Namespace, Name: svc.Name, ResourceVersion: svc.ResourceVersion}
	for _, f := range []struct {
		family v1.IPFamily
		into   *familyPorts
	}{{v1.IPv4Protocol, &s.ipv4}, {v1.IPv6Protocol, &s.ipv6}} {
		ports, problems := servicePorts(svc, f.family)
		*f.into = familyPorts{ports: ports, problems: problems, dropped: ports == nil && len(problems) > 0}
	}
	return s
}

// Ports are the service's ports in the family.
func (s *Service) Ports(f v1.IPFamily) []*ServicePort { return s.family(f).ports }

func (s *Service) family(f v1.IPFamily) *familyPorts {
	if f == v1.IPv6Protocol {
		return &s.ipv6
	}
	return &s.ipv4
}

// The informers store a Service as they would the object: by its
// namespace and name (GetObjectMeta), and as a runtime.Object.

// GetObjectMeta gives the store its key and the informer its version.
func (s *Service) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}
}

// GetObjectKind is that of an object without a kind: the informer knows
// what it watches.
func (s *Service) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies s. Its ServicePorts are shared: nothing changes
// one once made.
func (s *Service) DeepCopyObject() runtime.Object {
	c := *s
	for _, f := range []*familyPorts{&c.ipv4, &c.ipv6} {
		f.ports = append([]*ServicePort(nil), f.ports...)
		f.problems = append([]string(nil), f.problems...)
	}
	return &c
}
