package iptables

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
)

var update = flag.Bool("update", false, "rewrite the golden files of pkg/iptables/testdata")

// recordingKernel is an empty kernel that records what a sync writes.
type recordingKernel struct {
	written strings.Builder
}

func (k *recordingKernel) Restore(input io.Reader) error {
	k.written.WriteString("# restore\n")
	_, err := io.Copy(&k.written, input)
	return err
}

func (k *recordingKernel) Save(read func(io.Reader) error) error { return read(strings.NewReader("")) }

func (k *recordingKernel) ListRules(table, chain string) ([]string, error) { return nil, nil }

func (k *recordingKernel) Generation(string) (uint64, error) { return 0, nil }

// goldenCase is one feature: its services and endpoints, and what differs
// from the default node settings.
type goldenCase struct {
	name     string
	family   v1.IPFamily
	params   func(*Params)
	services []*v1.Service
	slices   []*discovery.EndpointSlice
	// chainRefsPerRestore splits the sync as on the nft backend.
	chainRefsPerRestore int
}

const nodeName = "node-1"

func svc(name string, mutate func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

// endpoint is one endpoint of a slice; node "" means this node.
type endpoint struct {
	ip, node           string
	ready, terminating bool
}

func slice(service string, protocol v1.Protocol, eps ...endpoint) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: service + "-1", Labels: map[string]string{discovery.LabelServiceName: service}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(protocol)}},
	}
	for _, ep := range eps {
		if netip.MustParseAddr(ep.ip).Is6() {
			s.AddressType = discovery.AddressTypeIPv6
		}
		node := ep.node
		if node == "" {
			node = nodeName
		}
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses: []string{ep.ip}, NodeName: ptr(node),
			Conditions: discovery.EndpointConditions{Ready: ptr(ep.ready), Serving: ptr(ep.ready || ep.terminating), Terminating: ptr(ep.terminating)},
		})
	}
	return s
}

var (
	local1  = endpoint{ip: "10.244.0.5", ready: true}
	local2  = endpoint{ip: "10.244.0.6", ready: true}
	remote1 = endpoint{ip: "10.244.1.7", node: "node-2", ready: true}
)

var goldenCases = []goldenCase{
	{name: "clusterip", services: []*v1.Service{
		svc("web", nil),
		svc("dns", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
			s.Spec.Ports[0].Protocol, s.Spec.Ports[0].Port = v1.ProtocolUDP, 53
		}),
		svc("assoc", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.12", []string{"10.96.0.12"}
			s.Spec.Ports[0].Protocol = v1.ProtocolSCTP
		}),
	}, slices: []*discovery.EndpointSlice{
		slice("web", v1.ProtocolTCP, local1, local2, remote1),
		slice("dns", v1.ProtocolUDP, local1),
		slice("assoc", v1.ProtocolSCTP, remote1),
	}},
	{name: "nodeport", services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1, remote1)}},
	{name: "nodeport-split-as-on-nft", chainRefsPerRestore: ChainRefsPerRestoreNFT, services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeLoadBalancer, 30080
		s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.20"}}
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1, remote1)}},
	{name: "nodeport-addresses", params: func(p *Params) {
		p.NodePortAddresses = []netip.Addr{netip.MustParseAddr("10.255.0.2"), netip.MustParseAddr("127.0.0.1")}
	}, services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	{name: "no-localhost-nodeports", params: func(p *Params) { p.LocalhostNodePorts = false },
		services: []*v1.Service{svc("web", func(s *v1.Service) {
			s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
		})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	{name: "external-ips", services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.ExternalIPs = []string{"192.0.2.10"}
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	{name: "loadbalancer", services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeLoadBalancer, 30080
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.20"}, {IP: "192.0.2.21", IPMode: ptr(v1.LoadBalancerIPModeProxy)}}
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	{name: "loadbalancer-source-ranges", services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeLoadBalancer, 30080
		s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "10.255.0.0/16"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.20"}}
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	{name: "session-affinity", services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(600))}}
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1, local2)}},
	{name: "internal-policy-local", services: []*v1.Service{
		svc("web", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal) }),
		svc("remote-only", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
		}),
	}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1, remote1), slice("remote-only", v1.ProtocolTCP, remote1)}},
	{name: "external-policy-local", services: []*v1.Service{
		svc("web", func(s *v1.Service) {
			s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeLoadBalancer, 30080
			s.Spec.ExternalTrafficPolicy, s.Spec.HealthCheckNodePort = v1.ServiceExternalTrafficPolicyLocal, 32000
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.20"}}
		}),
		svc("remote-only", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
			s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30081
			s.Spec.ExternalTrafficPolicy, s.Spec.HealthCheckNodePort = v1.ServiceExternalTrafficPolicyLocal, 32001
		}),
	}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1, remote1), slice("remote-only", v1.ProtocolTCP, remote1)}},
	{name: "no-endpoints", services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeLoadBalancer, 30080
		s.Spec.ExternalIPs = []string{"192.0.2.10"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.20"}}
	})}},
	{name: "terminating-only", services: []*v1.Service{svc("web", nil)},
		slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, endpoint{ip: "10.244.0.5", terminating: true}, endpoint{ip: "10.244.0.6"})}},
	{name: "masquerade-all-bit-5", params: func(p *Params) { p.MasqueradeAll, p.MasqueradeBit = true, 5 },
		services: []*v1.Service{svc("web", nil)}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	{name: "no-local-detection", params: func(p *Params) { p.LocalDetector = localdetect.Detector{} },
		services: []*v1.Service{svc("web", func(s *v1.Service) {
			s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	// With the nfacct objects in place: the conntrack INVALID drop and each
	// NodePort with endpoints on localhost count their packets.
	{name: "nfacct", params: func(p *Params) { p.NFAcct = true }, services: []*v1.Service{
		svc("web", func(s *v1.Service) { s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080 }),
		svc("dns", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
			s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30053
			s.Spec.Ports[0].Protocol, s.Spec.Ports[0].Port = v1.ProtocolUDP, 53
		}),
		svc("empty", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.12", []string{"10.96.0.12"}
			s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30081
		}),
	}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1, remote1), slice("dns", v1.ProtocolUDP, local1)}},
	{name: "nfacct-no-localhost-nodeports", params: func(p *Params) { p.NFAcct, p.LocalhostNodePorts = true, false },
		services: []*v1.Service{svc("web", func(s *v1.Service) {
			s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
		})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, local1)}},
	{name: "nfacct-ipv6", family: v1.IPv6Protocol, params: func(p *Params) { p.NFAcct = true }, services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00:10:96::a", []string{"fd00:10:96::a"}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, endpoint{ip: "fd00:244::5", ready: true})}},
	{name: "ipv6", family: v1.IPv6Protocol, services: []*v1.Service{svc("web", func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00:10:96::a", []string{"fd00:10:96::a"}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
		s.Spec.Type, s.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
	})}, slices: []*discovery.EndpointSlice{slice("web", v1.ProtocolTCP, endpoint{ip: "fd00:244::5", ready: true}, endpoint{ip: "fd00:244:1::7", node: "node-2", ready: true})}},
}

// The first sync of each feature into an empty kernel, compared with
// testdata/<name>.golden (go test -update rewrites them).
func TestGoldenRuleSets(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			family := tc.family
			if family == "" {
				family = v1.IPv4Protocol
			}
			params := fuzzParams(t, family, false)
			if tc.params != nil {
				tc.params(&params)
			}
			kernel := &recordingKernel{}
			p := newProxier(Config{Family: family, Kernel: kernel, Params: params,
				SyncPeriod: time.Minute, ChainRefsPerRestore: tc.chainRefsPerRestore}, nodeName)
			for _, s := range tc.services {
				p.OnService(s, false)
			}
			for _, s := range tc.slices {
				p.OnEndpointSlice(s, false)
			}
			p.OnServicesSynced()
			p.OnEndpointSlicesSynced()
			if err := p.sync(); err != nil {
				t.Fatal(err)
			}
			testutil.Golden(t, filepath.Join("testdata", tc.name+".golden"), kernel.written.String(), *update)
		})
	}
}

// failingKernel is a recordingKernel whose next restore fails.
type failingKernel struct {
	recordingKernel
	failNext bool
}

func (k *failingKernel) Restore(input io.Reader) error {
	if k.failNext {
		k.failNext = false
		return fmt.Errorf("iptables-restore: line 3 failed")
	}
	return k.recordingKernel.Restore(input)
}

// A partial sync that fails is followed at once by a full sync, which
// writes the whole rule set again.
func TestFailedPartialSyncFallsBackToAFullSync(t *testing.T) {
	kernel := &failingKernel{}
	p := newProxier(Config{Family: v1.IPv4Protocol, Kernel: kernel, Params: Params{MasqueradeBit: 14},
		SyncPeriod: time.Minute}, nodeName)
	p.OnService(svc("web", nil), false)
	p.OnEndpointSlice(slice("web", v1.ProtocolTCP, local1), false)
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	p.OnEndpointSlice(slice("web", v1.ProtocolTCP, local1, local2), false)
	kernel.written.Reset()
	kernel.failNext = true
	if err := p.sync(); err != nil {
		t.Fatalf("the fallback full sync failed: %v", err)
	}
	for _, want := range []string{":KUBE-PROXY-CANARY", ":KUBE-SVC-7X3VEG6HU4XBR2VS", "10.244.0.6:8080", "-I PREROUTING 1"} {
		if !strings.Contains(kernel.written.String(), want) {
			t.Errorf("after the failed partial sync, the full sync did not write %q:\n%s", want, kernel.written.String())
		}
	}
	if p.FullSyncPending() {
		t.Error("a full sync is still pending after the fallback succeeded")
	}
}
