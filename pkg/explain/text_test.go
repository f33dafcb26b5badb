package explain

import (
	"errors"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

var update = flag.Bool("update", false, "rewrite the golden files of pkg/explain/testdata")

// fakeIPTables holds chains by "table chain"; restores and saves hold
// nothing, so that what a test puts in is what verification reads.
type fakeIPTables struct{ chains map[string][]string }

func (k *fakeIPTables) Restore(in io.Reader) error {
	_, err := io.Copy(io.Discard, in)
	return err
}
func (k *fakeIPTables) Save(read func(io.Reader) error) error { return read(strings.NewReader("")) }
func (k *fakeIPTables) Generation(string) (uint64, error)     { return 0, nil }
func (k *fakeIPTables) ListRules(table, chain string) ([]string, error) {
	rules, ok := k.chains[table+" "+chain]
	if !ok {
		return nil, errors.New("no chain by that name")
	}
	return rules, nil
}

// webService is a load-balanced service with eTP=Local on node-1 in
// zone-a, synced by the iptables mode, whose endpoints show every reason
// a path leaves one out: on other nodes, hinted for another zone,
// terminating while others are ready, not ready.
func webService(t *testing.T, kernel iptableskernel.Kernel) *proxy.Core {
	t.Helper()
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16"}}, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	mode := iptables.New(iptables.Config{Family: v1.IPv4Protocol, Kernel: kernel,
		Params: iptables.Params{MasqueradeBit: 14, LocalDetector: detector, NodeIP: netip.MustParseAddr("10.255.0.2")}})
	core := proxy.NewCore(proxy.Config{Family: v1.IPv4Protocol, ModeName: "iptables", Node: state.Node{Name: "node-1", Zone: "zone-a"},
		MinSyncPeriod: time.Second, SyncPeriod: time.Minute}, mode)
	core.OnService(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ExternalIPs: []string{"10.255.2.10", "fd00::10"},
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 31080,
			TrafficDistribution: ptr.To(v1.ServiceTrafficDistributionPreferClose),
			Ports:               []v1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}},
		},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
			{IP: "10.255.3.10"}, {IP: "10.255.3.9", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}}}},
	}, false)
	endpoint := func(ip, node, zone string, ready, serving, terminating bool) discovery.Endpoint {
		return discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(node), Zone: ptr.To(zone),
			Conditions: discovery.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)},
			Hints:      &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: zone}}}}
	}
	core.OnEndpointSlice(&discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discovery.Endpoint{
			endpoint("10.244.0.5", "node-1", "zone-a", true, true, false),
			endpoint("10.244.0.6", "node-1", "zone-a", false, true, true),
			endpoint("10.244.0.7", "node-1", "zone-a", false, false, false),
			endpoint("10.244.1.5", "node-2", "zone-b", true, true, false),
			endpoint("10.244.1.6", "node-2", "zone-a", true, true, false),
		},
	}, false)
	core.OnServicesSynced()
	core.OnEndpointSlicesSynced()
	if err := core.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	return core
}

// TestExplanationText is the text a person reads, checked whole: it must
// fit an 80-column terminal. The kernel holds what the mode wants except
// one rule deleted by hand, which verification finds.
func TestExplanationText(t *testing.T) {
	kernel := &fakeIPTables{chains: map[string][]string{}}
	core := webService(t, kernel)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	for _, o := range core.Explain(web, false).ServicePorts[0].Kernel.Objects {
		kernel.chains[o.Name] = append(kernel.chains[o.Name], o.Content...)
	}
	sep := endpointChain(t, core.Explain(web, false), "10.244.0.5:8080")
	kernel.chains[sep] = kernel.chains[sep][1:]

	e := core.Explain(web, true)
	at := time.Date(2026, 5, 4, 3, 2, 1, 0, time.UTC)
	e.ServicePorts[0].LastChanged, e.ServicePorts[0].LastSynced = &at, &at
	var b strings.Builder
	WriteExplanation(&b, e)
	got := b.String()
	for _, line := range strings.Split(got, "\n") {
		if len(line) > width {
			t.Errorf("line longer than %d columns: %q", width, line)
		}
	}
	golden(t, "explanation.golden", got)

	b.Reset()
	WriteServicePorts(&b, core.ServicePorts())
	golden(t, "service-ports.golden", b.String())
}

// endpointChain is the name of the endpoint chain that leads to address.
func endpointChain(t *testing.T, e proxy.Explanation, address string) string {
	t.Helper()
	for _, o := range e.ServicePorts[0].Kernel.Objects {
		if o.Kind == "chain" && strings.HasSuffix(o.Summary, "to "+address) {
			return o.Name
		}
	}
	t.Fatalf("no endpoint chain for %s", address)
	return ""
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if string(want) != got {
		t.Errorf("text differs from %s (go test -update rewrites it after review):\n%s", path, testutil.LineDiff(string(want), got))
	}
}

func TestVerifyText(t *testing.T) {
	cases := []struct {
		verify *proxy.Verification
		want   string
	}{
		{nil, ""},
		{&proxy.Verification{}, "  verify: the kernel holds what this node wants\n"},
		{&proxy.Verification{Error: "netlink said no"}, "  verify: could not read the kernel: netlink said no\n"},
		{&proxy.Verification{Error: "listing failed", Differences: []string{"a", "b"}},
			"  verify: could not read the kernel: listing failed\n  verify: 2 differences from what this node wants\n    - a\n    - b\n"},
	}
	for _, tc := range cases {
		var b strings.Builder
		writeKernel(&b, &proxy.KernelExplanation{Mode: "ipvs", Verify: tc.verify})
		if got := strings.TrimPrefix(b.String(), "  kernel objects (ipvs)\n"); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.verify, got, tc.want)
		}
	}
}
