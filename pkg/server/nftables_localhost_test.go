package server

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// The nftables mode as the server builds it, with the gate
// KubeProxyNFTablesLocalhostNodePorts on and nodePortAddresses
// [localhost], on the real kernel of a fresh network namespace: a TCP
// NodePort answers on 127.0.0.1 with its endpoint (an address on the
// namespace's loopback device), a UDP one is rejected, and the three
// metrics are served.
func TestKernelNFTablesLocalhostNodePorts(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "nft", "ip")
	if !testutil.RerunInNetns(t, [][2]string{{"fresh namespace", ""}}) {
		return
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", "10.244.1.5/32", "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ln, err := net.Listen("tcp", "10.244.1.5:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "pong\n")
			c.Close()
		}
	}()

	cfg := defaultedMode(t, config.ModeNFTables)
	cfg.FeatureGates = map[string]bool{string(config.GateNFTablesLocalhostNodePorts): true}
	cfg.NodePortAddresses = config.ExpandNodePortAddresses([]string{config.NodePortAddressesLocalhost}, nil)
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatalf("the gate is refused: %v", errs)
	}
	detector, err := localdetect.New(localdetect.Settings{}, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	mode, err := newNFTablesMode(cfg, familySetup{family: v1.IPv4Protocol, detector: detector,
		nodeIP: netip.MustParseAddr("127.0.0.1"), nodePortAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}

	tracker, st := state.NewTracker(v1.IPv4Protocol, "node-1"), state.NewState()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "np"}, Spec: v1.ServiceSpec{
		Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
		Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30020}, {Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053}},
	}}
	tracker.OnService(types.NamespacedName{Namespace: "ns", Name: "np"}, svc)
	yes, node := true, "node-1"
	tracker.OnEndpointSlice(&discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "np-1", Labels: map[string]string{discovery.LabelServiceName: "np"}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{"10.244.1.5"}, NodeName: &node, Conditions: discovery.EndpointConditions{Ready: &yes, Serving: &yes}}},
		Ports: []discovery.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(8080)), Protocol: ptrTo(v1.ProtocolTCP)},
			{Name: ptrTo("dns"), Port: ptrTo(int32(5353)), Protocol: ptrTo(v1.ProtocolUDP)}},
	}, false)
	tracker.Apply(st)
	if err := mode.FullSync(state.View{State: st, Node: state.Node{Name: node}}); err != nil {
		t.Fatal(err)
	}

	c, err := net.DialTimeout("tcp", "127.0.0.1:30020", time.Second)
	if err != nil {
		t.Fatalf("TCP to 127.0.0.1:30020: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(got) != "pong\n" {
		t.Errorf("TCP to 127.0.0.1:30020 read %q, %v: want the endpoint's pong", got, err)
	}
	u, err := net.Dial("udp", "127.0.0.1:30053")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	_, _ = u.Write([]byte("ping"))
	_ = u.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := u.Read(make([]byte, 8)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to 127.0.0.1:30053: %v, want it refused", err)
	}

	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]float64{}
	for _, f := range families {
		if strings.Contains(f.GetName(), "localhost_nodeport") {
			for _, m := range f.GetMetric() {
				labels := []string{}
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				served[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	for _, want := range []string{
		"kubeproxy_nftables_localhost_nodeport_listeners{ip_family=IPv4}",
		"kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=IPv4,protocol=UDP}",
	} {
		if served[want] <= 0 {
			t.Errorf("%s not served above zero; served: %v", want, served)
		}
	}
	if _, ok := served["kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=IPv4,protocol=TCP}"]; ok {
		t.Errorf("a TCP rejection counter with the proxy serving TCP: %v", served)
	}
}

func ptrTo[T any](v T) *T { return &v }
