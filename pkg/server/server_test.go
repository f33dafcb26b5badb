package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/explain"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/zpages"
)

func defaulted(t *testing.T) *kpconfig.KubeProxyConfiguration {
	t.Helper()
	cfg := &kpconfig.KubeProxyConfiguration{}
	config.Default(cfg)
	return cfg
}

func TestNodeNameIsTheLowercasedOverride(t *testing.T) {
	cfg := defaulted(t)
	cfg.HostnameOverride = " Node-A.Example "
	if got, err := nodeName(cfg); err != nil || got != "node-a.example" {
		t.Errorf("got %q, %v", got, err)
	}
}

func TestNodeIPs(t *testing.T) {
	node := func(addrs ...v1.NodeAddress) *v1.Node {
		return &v1.Node{Status: v1.NodeStatus{Addresses: addrs}}
	}
	internal := func(ip string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip} }
	external := func(ip string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeExternalIP, Address: ip} }
	for _, tc := range []struct {
		name        string
		bindAddress string
		node        *v1.Node
		want        map[v1.IPFamily]string
	}{
		{"bind address wins", "10.0.0.5", node(internal("10.0.0.9")), map[v1.IPFamily]string{v1.IPv4Protocol: "10.0.0.5"}},
		{"unspecified bind address uses the node", "0.0.0.0", node(internal("10.0.0.9")), map[v1.IPFamily]string{v1.IPv4Protocol: "10.0.0.9"}},
		{"dual-stack node", "", node(internal("fd00::9"), internal("10.0.0.9")),
			map[v1.IPFamily]string{v1.IPv4Protocol: "10.0.0.9", v1.IPv6Protocol: "fd00::9"}},
		{"internal before external", "", node(external("192.0.2.1"), internal("10.0.0.9")), map[v1.IPFamily]string{v1.IPv4Protocol: "10.0.0.9"}},
		{"external when no internal", "", node(external("192.0.2.1")), map[v1.IPFamily]string{v1.IPv4Protocol: "192.0.2.1"}},
		{"first of a family wins", "", node(internal("10.0.0.9"), internal("10.0.0.10")), map[v1.IPFamily]string{v1.IPv4Protocol: "10.0.0.9"}},
		{"garbage is skipped", "", node(internal("not-an-ip"), internal("10.0.0.9")), map[v1.IPFamily]string{v1.IPv4Protocol: "10.0.0.9"}},
		{"no node: loopback", "", nil, map[v1.IPFamily]string{v1.IPv4Protocol: "127.0.0.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaulted(t)
			cfg.BindAddress = tc.bindAddress
			got := nodeIPs(cfg, tc.node)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for family, ip := range tc.want {
				if got[family] != netip.MustParseAddr(ip) {
					t.Errorf("%s: got %s, want %s", family, got[family], ip)
				}
			}
		})
	}
}

func TestWaitForNodeReturnsTheNode(t *testing.T) {
	withIP := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.2"}}}}
	client := fake.NewClientset(withIP, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "no-ip"}})
	if n := waitForNode(context.Background(), client, "node-1"); n == nil || n.Name != "node-1" {
		t.Errorf("got %v", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n := waitForNode(ctx, client, "missing"); n != nil {
		t.Errorf("a missing node gave %v", n)
	}
	// A Node without IPs yet is waited for (here: until the context
	// ends), then taken as it is.
	if n := waitForNode(ctx, client, "no-ip"); n == nil || n.Name != "no-ip" {
		t.Errorf("a node without IPs gave %v", n)
	}
}

func TestMetricsServerPaths(t *testing.T) {
	cfg := defaulted(t)
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = "127.0.0.1:40000"
		h.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, string(body)
	}
	mux := metricsMux(cfg, &explain.Handler{}, zpages.New(map[string]string{"v": "2"}))
	for path, want := range map[string]string{
		"/metrics":      "# HELP",
		"/healthz":      "ok",
		"/healthz/ping": "ok",
		"/metrics/slis": "",
		"/proxyMode":    "iptables",
		"/flagz":        "kube-proxy flagz",
		"/statusz":      "Emulation version",
		"/configz":      `"kubeproxy.config.k8s.io"`,
	} {
		if code, body := get(mux, path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("%s: %d %q, want 200 with %q", path, code, body, want)
		}
	}
	for _, path := range []string{"/nope", "/debug/pprof/", "/debug/flags/v"} {
		if code, _ := get(mux, path); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, code)
		}
	}
	// What the node does with each service is served on the metrics
	// address only (here before the proxier exists), never on healthz.
	if code, _ := get(mux, "/debug/services/default/web"); code != http.StatusServiceUnavailable {
		t.Errorf("/debug/services/default/web: %d, want 503", code)
	}
	// To another host: refused by default, whatever it asks.
	for _, path := range []string{"/debug/services", "/debug/services/default/web?verify=1", "/debug/trace?verify=1"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusForbidden {
			t.Errorf("%s from another host: %d, want 403", path, rec.Code)
		}
	}
	if code, _ := get(healthcheck.NewProxyHealth(time.Minute).Handler(), "/debug/services"); code != http.StatusNotFound {
		t.Errorf("/debug/services on the healthz port: %d, want 404", code)
	}
	cfg.EnableProfiling = true
	mux = metricsMux(cfg, &explain.Handler{}, zpages.New(map[string]string{"v": "2"}))
	if code, _ := get(mux, "/debug/pprof/"); code != http.StatusOK {
		t.Errorf("/debug/pprof/ with profiling: %d", code)
	}
	// As upstream's: GET refused, PUT sets the verbosity.
	if code, _ := get(mux, "/debug/flags/v"); code != http.StatusNotAcceptable {
		t.Errorf("GET /debug/flags/v with profiling: %d, want 406", code)
	}
	defer func() { _, _ = logs.GlogSetter("0") }()
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/debug/flags/v", strings.NewReader("4")))
	if rec.Code != http.StatusOK || !klog.V(4).Enabled() {
		t.Errorf("PUT /debug/flags/v 4: %d %q; verbosity 4 enabled: %v", rec.Code, rec.Body.String(), klog.V(4).Enabled())
	}
}

// /configz shows the kubeconfig's path, as upstream's, never what the
// file holds.
func TestConfigzShowsTheKubeconfigPathOnly(t *testing.T) {
	cfg := defaulted(t)
	const secret = "c2VjcmV0LXRva2VuLXZhbHVl"
	path := t.TempDir() + "/kubeconfig"
	if err := os.WriteFile(path, []byte("users:\n- name: x\n  user:\n    token: "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ClientConnection.Kubeconfig = path
	rec := httptest.NewRecorder()
	metricsMux(cfg, &explain.Handler{}, zpages.New(map[string]string{"v": "2"})).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/configz", nil))
	body := rec.Body.String()
	if !strings.Contains(body, `"kubeconfig":"`+path+`"`) || strings.Contains(body, secret) {
		t.Errorf("/configz: %s; want the kubeconfig's path %s and nothing of its content", body, path)
	}
}

func TestPortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := defaulted(t)
	cfg.HealthzBindAddress = taken.Addr().String()
	cfg.MetricsBindAddress = ""
	health := healthcheck.NewProxyHealth(time.Minute)

	cfg.BindAddressHardFail = true
	if _, err := startServers(context.Background(), cfg, health, &explain.Handler{}, zpages.New(nil)); err == nil || !strings.Contains(err.Error(), "healthz server on "+taken.Addr().String()) {
		t.Errorf("hard fail: got %v, want an error naming the healthz address", err)
	}
	cfg.BindAddressHardFail = false
	srv, err := startServers(context.Background(), cfg, health, &explain.Handler{}, zpages.New(nil))
	if err != nil {
		t.Errorf("soft fail: got %v", err)
	}
	srv.close()
}

// recordingProxier remembers what the informers handed it.
type recordingProxier struct {
	mu             sync.Mutex
	services       []string
	slices         []string
	servicesSynced bool
	slicesSynced   bool
	nodes          int
	usesCIDRs      bool
	cidrs          []netip.Prefix
}

func (r *recordingProxier) UsesServiceCIDRs() bool { return r.usesCIDRs }

func (r *recordingProxier) FirstSynced() <-chan struct{} { return nil }

func (r *recordingProxier) OnServiceCIDRs(cidrs []netip.Prefix) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cidrs = cidrs
}

func (r *recordingProxier) OnCachedService(svc *state.Service, deleted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.services = append(r.services, svc.Name)
}

func (r *recordingProxier) OnCachedSlice(s *state.EndpointSlice, deleted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slices = append(r.slices, s.Name)
}

func (r *recordingProxier) OnServicesSynced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.servicesSynced = true
}

func (r *recordingProxier) OnEndpointSlicesSynced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slicesSynced = true
}

func (r *recordingProxier) OnNode(*v1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes++
}

func (r *recordingProxier) SyncLoop(ctx context.Context) { <-ctx.Done() }

func (r *recordingProxier) done() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.servicesSynced && r.slicesSynced && r.nodes > 0
}

// The informers skip services another proxy handles and headless slices,
// and a pod CIDR change in NodeCIDR mode ends the run.
func TestInformersFeedTheProxier(t *testing.T) {
	withLabels := func(l map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "default", Name: "x", Labels: l}
	}
	mine, other := withLabels(nil), withLabels(map[string]string{"service.kubernetes.io/service-proxy-name": "other"})
	mine.Name, other.Name = "mine", "other"
	slice, headless := withLabels(map[string]string{discovery.LabelServiceName: "mine"}),
		withLabels(map[string]string{discovery.LabelServiceName: "h", v1.IsHeadlessService: ""})
	slice.Name, headless.Name = "mine-abc", "h-abc"
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}}
	client := fake.NewClientset(
		&v1.Service{ObjectMeta: mine}, &v1.Service{ObjectMeta: other},
		&discovery.EndpointSlice{ObjectMeta: slice}, &discovery.EndpointSlice{ObjectMeta: headless},
		node)

	cfg := defaulted(t)
	cfg.DetectLocalMode = config.LocalModeNodeCIDR
	proxier := &recordingProxier{}
	result := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		result <- watch(ctx, client, cfg, "node-1", node, proxier, healthcheck.NewProxyHealth(time.Minute))
	}()
	for !proxier.done() {
		if ctx.Err() != nil {
			t.Fatal("the caches never synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	proxier.mu.Lock()
	if strings.Join(proxier.services, ",") != "mine" || strings.Join(proxier.slices, ",") != "mine-abc" {
		t.Errorf("services %v, slices %v; want only mine and mine-abc", proxier.services, proxier.slices)
	}
	proxier.mu.Unlock()

	changed := node.DeepCopy()
	changed.Spec.PodCIDRs = []string{"10.244.2.0/24"}
	if _, err := client.CoreV1().Nodes().Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-result; !errors.Is(err, errNodeCIDRChanged) {
		t.Errorf("after a pod CIDR change: %v, want errNodeCIDRChanged", err)
	}
}

// The informers keep what the tracker keeps of each object.
func TestTrimForCacheKeepsWhatTheTrackerKeeps(t *testing.T) {
	ready, node, zone := true, "node-1", "z1"
	slice := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "s",
			Labels:          map[string]string{discovery.LabelServiceName: "svc", discovery.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations:     map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z", "big": strings.Repeat("x", 1000)},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "svc"}},
		},
		Endpoints: []discovery.Endpoint{{
			Addresses: []string{"10.244.0.5"}, Conditions: discovery.EndpointConditions{Ready: &ready},
			NodeName: &node, Zone: &zone, Hostname: &node,
			TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "web-1"},
		}},
	}
	got, err := trimForCache(slice)
	if err != nil {
		t.Fatal(err)
	}
	want := &state.EndpointSlice{Name: "s", Service: "svc", Ports: []state.SlicePort{}, Endpoints: []state.Endpoint{{
		IP: netip.MustParseAddr("10.244.0.5"), NodeName: node, Zone: zone, Ready: true, Serving: true}},
		TriggerTime: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("slice kept as %+v, want %+v", got, want)
	}

	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "svc", Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"}},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": "web"}, ClusterIP: "10.96.0.10",
			Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	got, err = trimForCache(svc)
	if err != nil {
		t.Fatal(err)
	}
	kept, ok := got.(*state.Service)
	if !ok || kept.Name != "svc" {
		t.Fatalf("service kept as %#v", got)
	}
	if ports := kept.Ports(v1.IPv4Protocol); len(ports) != 1 || ports[0].ClusterIP.String() != "10.96.0.10" || ports[0].Port != 80 {
		t.Errorf("service ports kept: %+v", ports)
	}

	if _, err := trimForCache(cache.DeletedFinalStateUnknown{Key: "x"}); err != nil {
		t.Errorf("a tombstone: %v", err)
	}
}

// NodePorts answer on localhost only where nodePortAddresses lets them, as
// upstream decides it (and with it the KUBE-FIREWALL guard and the counted
// localhost NodePort rules).
func TestLocalhostNodePorts(t *testing.T) {
	nodeIP := netip.MustParseAddr("10.255.0.2")
	for _, tc := range []struct {
		addresses []string
		nodeIP    netip.Addr
		want      bool
	}{
		{nil, nodeIP, true},
		{[]string{"127.0.0.0/8", "10.0.0.0/8"}, nodeIP, true},
		{[]string{"0.0.0.0/0"}, nodeIP, true},
		{[]string{"10.0.0.0/8"}, nodeIP, false},
		{[]string{"fd00::/8"}, nodeIP, true}, // no IPv4 CIDR: every IPv4 address
		{[]string{"primary"}, nodeIP, false},
		{[]string{"primary"}, netip.Addr{}, true}, // no IPv4 node IP: every IPv4 address
		{[]string{"primary"}, netip.MustParseAddr("127.0.0.1"), true},
		{[]string{"primary", "localhost"}, nodeIP, true},
		{[]string{"all"}, nodeIP, true},
		{[]string{"10.0.0.0/8", "all"}, nodeIP, true},
	} {
		cfg := defaulted(t)
		cfg.NodePortAddresses = config.ExpandNodePortAddresses(tc.addresses, []netip.Addr{tc.nodeIP})
		if got := localhostNodePorts(cfg); got != tc.want {
			t.Errorf("nodePortAddresses %v, node IP %v: %v, want %v", tc.addresses, tc.nodeIP, got, tc.want)
		}
	}
	cfg := defaulted(t)
	*cfg.IPTables.LocalhostNodePorts = false
	if localhostNodePorts(cfg) {
		t.Error("iptables.localhostNodePorts false: still on")
	}
}

// The start warns with upstream's events: in IPVS mode that the mode is
// deprecated, and when the mode was left unset that its default is to
// change.
func TestStartEventsWarnAsUpstreams(t *testing.T) {
	for _, tc := range []struct {
		mode      kpconfig.ProxyMode
		defaulted bool
		want      []string
	}{
		{config.ModeIPTables, false, []string{"Starting"}},
		{config.ModeIPTables, true, []string{"KubeProxyDefaultMode", "Starting"}},
		{config.ModeIPVS, false, []string{"IPVSDeprecation", "Starting"}},
		{config.ModeNFTables, false, []string{"Starting"}},
	} {
		client := fake.NewClientset()
		ctx, cancel := context.WithCancel(context.Background())
		recordStartEvent(ctx, client, "node-1", tc.mode, tc.defaulted)
		// The recorder sends all three in order; "Starting" is always
		// last, so once it is there every event of the start is.
		var got []string
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Contains(got, "Starting") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			list, err := client.EventsV1().Events("").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got = nil
			for _, e := range list.Items {
				got = append(got, e.Reason)
				if e.Reason != "Starting" && (e.Type != v1.EventTypeWarning || e.Regarding.Kind != "Node" || !strings.Contains(e.Note, "1.40")) {
					t.Errorf("%s event: type %s on %s, note %q", e.Reason, e.Type, e.Regarding.Kind, e.Note)
				}
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s mode (defaulted %v): events %v, want %v", tc.mode, tc.defaulted, got, tc.want)
		}
		cancel()
	}
}

// nodePortAddresses restricts a family's NodePorts as upstream's does:
// with "primary" when the node has an IP of the family that is not
// loopback, else with a CIDR of that family unless one is /0. The IPVS
// mode picks from the node's addresses.
func TestNodePortAddressesPerFamily(t *testing.T) {
	node := []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("192.168.1.2"), netip.MustParseAddr("fd00::2")}
	all := fmt.Sprint(node)
	v4IP, v6IP := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("fd00::9")
	for _, tc := range []struct {
		setting []string
		family  v1.IPFamily
		nodeIP  netip.Addr
		want    string
	}{
		{nil, v1.IPv4Protocol, v4IP, all},
		{[]string{"10.0.0.0/24"}, v1.IPv4Protocol, v4IP, "[10.0.0.2]"},
		{[]string{"10.0.0.0/24"}, v1.IPv6Protocol, v6IP, all},
		{[]string{"10.0.0.0/24", "0.0.0.0/0"}, v1.IPv4Protocol, v4IP, all},
		{[]string{"fd00::/64", "::/0"}, v1.IPv6Protocol, v6IP, all},
		{[]string{"::/0"}, v1.IPv4Protocol, v4IP, all},
		{[]string{"primary"}, v1.IPv4Protocol, netip.MustParseAddr("10.0.0.2"), "[10.0.0.2]"},
		{[]string{"localhost"}, v1.IPv4Protocol, v4IP, "[]"},
		{[]string{"all"}, v1.IPv6Protocol, v6IP, all},
		// No node IP of the family: it stands in as loopback.
		{[]string{"primary"}, v1.IPv6Protocol, familyNodeIP(nil, v1.IPv6Protocol), all},
		{[]string{"primary"}, v1.IPv4Protocol, familyNodeIP(nil, v1.IPv4Protocol), all},
	} {
		setting := config.ExpandNodePortAddresses(tc.setting, []netip.Addr{tc.nodeIP})
		restricted := restrictsFamily(setting, tc.family)
		if restricted != (tc.want != all) {
			t.Errorf("%v, %s, node IP %s: restricts %v", tc.setting, tc.family, tc.nodeIP, restricted)
		}
		pick := nodePortAddresses(setting, ofFamily(node, tc.family, restricted))
		if got := fmt.Sprint(pick(node)); got != tc.want {
			t.Errorf("%v, %s, node IP %s: %s, want %s", tc.setting, tc.family, tc.nodeIP, got, tc.want)
		}
	}
}

// In the nftables mode (nodePortAddresses defaults to "primary"), a family
// the node has no IP of answers NodePorts on all its local addresses, as
// upstream's: its proxier gets nil and the family's loopback as node IP.
func TestFamilyNodePortsWithoutANodeIPOfTheFamily(t *testing.T) {
	cfg := defaultedMode(t, config.ModeNFTables)
	v4, v6 := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("fd00::9")
	for _, tc := range []struct {
		name    string
		nodeIPs map[v1.IPFamily]netip.Addr
		family  v1.IPFamily
		wantIP  string
		want    []netip.Addr
	}{
		{"IPv4-only node, IPv4", map[v1.IPFamily]netip.Addr{v1.IPv4Protocol: v4}, v1.IPv4Protocol, "10.0.0.9", []netip.Addr{v4}},
		{"IPv4-only node, IPv6", map[v1.IPFamily]netip.Addr{v1.IPv4Protocol: v4}, v1.IPv6Protocol, "::1", nil},
		{"IPv6-only node, IPv6", map[v1.IPFamily]netip.Addr{v1.IPv6Protocol: v6}, v1.IPv6Protocol, "fd00::9", []netip.Addr{v6}},
		{"IPv6-only node, IPv4", map[v1.IPFamily]netip.Addr{v1.IPv6Protocol: v6}, v1.IPv4Protocol, "127.0.0.1", nil},
		{"dual-stack node, IPv6", map[v1.IPFamily]netip.Addr{v1.IPv4Protocol: v4, v1.IPv6Protocol: v6}, v1.IPv6Protocol, "fd00::9", []netip.Addr{v6}},
		{"no node IP, IPv4", map[v1.IPFamily]netip.Addr{v1.IPv4Protocol: netip.MustParseAddr("127.0.0.1")}, v1.IPv4Protocol, "127.0.0.1", nil},
	} {
		// The node's IPs stand in for its local addresses.
		setting := config.ExpandNodePortAddresses(cfg.NodePortAddresses, []netip.Addr{tc.nodeIPs[v1.IPv4Protocol], tc.nodeIPs[v1.IPv6Protocol]})
		var addrs []netip.Addr
		for _, ip := range tc.nodeIPs {
			if slices.Contains(setting, netip.PrefixFrom(ip, ip.BitLen()).String()) {
				addrs = append(addrs, ip)
			}
		}
		nodeIP, got := familyNodePorts(setting, tc.nodeIPs, addrs, tc.family)
		if nodeIP.String() != tc.wantIP || (got == nil) != (tc.want == nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%s: node IP %s, NodePorts on %#v; want %s, %#v", tc.name, nodeIP, got, tc.wantIP, tc.want)
		}
	}
}

// A family the node has no IP of gets its loopback address as node IP, as
// upstream passes it; the node's own IP otherwise.
func TestFamilyNodeIP(t *testing.T) {
	ips := map[v1.IPFamily]netip.Addr{v1.IPv4Protocol: netip.MustParseAddr("10.0.0.9")}
	for family, want := range map[v1.IPFamily]string{v1.IPv4Protocol: "10.0.0.9", v1.IPv6Protocol: "::1"} {
		if got := familyNodeIP(ips, family); got.String() != want {
			t.Errorf("%s: %s, want %s", family, got, want)
		}
	}
	if got := familyNodeIP(map[v1.IPFamily]netip.Addr{v1.IPv6Protocol: netip.MustParseAddr("fd00::9")}, v1.IPv4Protocol); got.String() != "127.0.0.1" {
		t.Errorf("IPv4 on an IPv6-only node: %s, want 127.0.0.1", got)
	}
}

// The process ends, as upstream's, when the Node's own IPs change or the
// Node is deleted: the rules were made for the IPs it had at start.
func TestNodeIPChangeOrDeletionEndsTheWatch(t *testing.T) {
	addresses := func(ips ...string) []v1.NodeAddress {
		out := []v1.NodeAddress{{Type: v1.NodeHostName, Address: "node-1"}}
		for _, ip := range ips {
			out = append(out, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		change func(ctx context.Context, client *fake.Clientset, node *v1.Node) error
		want   error
	}{
		{"an IP changed", func(ctx context.Context, client *fake.Clientset, node *v1.Node) error {
			node.Status.Addresses = addresses("10.0.0.3", "fd00::2")
			_, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
			return err
		}, errNodeIPsChanged},
		{"an IPv6 address added", func(ctx context.Context, client *fake.Clientset, node *v1.Node) error {
			node.Status.Addresses = addresses("10.0.0.2", "fd00::2", "fd00::3")
			_, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
			return err
		}, nil},
		{"the Node deleted", func(ctx context.Context, client *fake.Clientset, node *v1.Node) error {
			return client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{})
		}, errNodeDeleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: v1.NodeStatus{Addresses: addresses("10.0.0.2", "fd00::2")}}
			client := fake.NewClientset(node)
			proxier := &recordingProxier{}
			result := make(chan error, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			go func() {
				result <- watch(ctx, client, defaulted(t), "node-1", node, proxier, healthcheck.NewProxyHealth(time.Minute))
			}()
			for !proxier.done() {
				if ctx.Err() != nil {
					t.Fatal("the caches never synced")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := tc.change(ctx, client, node.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				// A second address of a family changes no primary IP: the
				// watch goes on until its context ends.
				select {
				case err := <-result:
					t.Fatalf("the watch ended: %v", err)
				case <-time.After(time.Second):
				}
				return
			}
			if err := <-result; !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// The node IP per family is the Node's own; bindAddress replaces only its
// own family's, as upstream's.
func TestNodeIPsWithBindAddress(t *testing.T) {
	node := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeExternalIP, Address: "192.0.2.9"},
		{Type: v1.NodeInternalIP, Address: "fd00::2"},
		{Type: v1.NodeInternalIP, Address: "10.0.0.2"},
		{Type: v1.NodeInternalIP, Address: "10.0.0.3"},
	}}}
	if got := fmt.Sprint(nodeHostIPs(node)); got != "[fd00::2 10.0.0.2]" {
		t.Errorf("the Node's own IPs: %s", got)
	}
	cfg := defaulted(t)
	cfg.BindAddress = "10.0.0.7"
	got := nodeIPs(cfg, node)
	if got[v1.IPv4Protocol].String() != "10.0.0.7" || got[v1.IPv6Protocol].String() != "fd00::2" {
		t.Errorf("with bindAddress 10.0.0.7: %v", got)
	}
}
