package ipvs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// fakeIPTables takes restores and holds nothing but the jump the drift
// check looks for (unless flushed): the chains' own tests run on the real
// kernel (chains_kernel_test.go).
type fakeIPTables struct {
	restores int
	// refuse, when set, is every restore's error.
	refuse error
	// flushed is set by a test while the drift check reads it, with
	// generation moved, as a flush moves the table's.
	flushed    atomic.Bool
	generation atomic.Uint64
	lists      atomic.Int32
	saves      atomic.Int32
}

// flush empties the nat table, as another program's iptables -F would.
func (k *fakeIPTables) flush() {
	k.flushed.Store(true)
	k.generation.Add(1)
}

func (k *fakeIPTables) Restore(in io.Reader) error {
	k.restores++
	if _, err := io.Copy(io.Discard, in); err != nil {
		return err
	}
	return k.refuse
}
func (k *fakeIPTables) Save(read func(io.Reader) error) error {
	k.saves.Add(1)
	return read(strings.NewReader(""))
}
func (k *fakeIPTables) ListRules(string, string) ([]string, error) {
	k.lists.Add(1)
	if k.flushed.Load() {
		return nil, nil
	}
	return []string{`-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`}, nil
}
func (k *fakeIPTables) Generation(string) (uint64, error) { return k.generation.Load(), nil }

// node is this test node: its addresses, and the kernel behind it.
type node struct {
	kernel   *ipvskernel.Fake
	iptables *fakeIPTables
	// maxSetEntries is the hash sets' maxelem (0: upstream's), and
	// restoreErrors every error of an ipset restore the mode sent.
	maxSetEntries int
	restoreErrors []error
	// afterListing, if set, runs once right after the next listing of
	// every real server has been read; duringListing once while the next
	// one is read (after its first virtual server).
	afterListing, duringListing atomic.Pointer[func()]
	// listingCPU is the CPU time each listing of every real server
	// spends (as at 10k services), set before the mode runs.
	listingCPU time.Duration
	// changed, if set, runs after each change the mode makes, with what
	// it was; an ipset restore counts as one change per line, as the
	// kernel takes them.
	changed func(what string)
}

// watchedKernel is the node's kernel as the mode sees it: it keeps the
// errors of the ipset restores.
type watchedKernel struct {
	*ipvskernel.Fake
	n *node
}

func (k watchedKernel) ChangeSets(changes []ipvskernel.SetChange) error {
	if k.n.changed != nil {
		return k.changeSetsOneByOne(changes)
	}
	err := k.Fake.ChangeSets(changes)
	if err != nil {
		k.n.restoreErrors = append(k.n.restoreErrors, err)
	}
	return err
}

func (k watchedKernel) EachVirtualServer(each func(ipvskernel.VirtualServerKey, []ipvskernel.RealServer) error) error {
	err := k.Fake.EachVirtualServer(func(key ipvskernel.VirtualServerKey, reals []ipvskernel.RealServer) error {
		err := each(key, reals)
		if f := k.n.duringListing.Swap(nil); f != nil {
			(*f)()
		}
		return err
	})
	for start := ipvs.ThreadCPU(); k.n.listingCPU > 0 && ipvs.ThreadCPU()-start < k.n.listingCPU; {
	}
	if f := k.n.afterListing.Swap(nil); f != nil {
		(*f)()
	}
	return err
}

func newNode() *node {
	k := ipvskernel.NewFake()
	k.SetNodeAddresses(netip.MustParseAddr("10.255.0.2"), netip.MustParseAddr("10.255.1.1"))
	return &node{kernel: k, iptables: &fakeIPTables{}}
}

// proxier is the proxy core running the IPVS mode on the node, as the
// server wires them, with drain checks every few milliseconds.
func (n *node) proxier(t testing.TB, exclude ...netip.Prefix) (*proxy.Core, *ipvs.Syncer) {
	t.Helper()
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16"}}, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	mode := ipvs.New(ipvs.Config{
		Family: v1.IPv4Protocol, Kernel: watchedKernel{n.kernel, n}, IPTables: n.iptables,
		Params: ipvs.Params{Scheduler: "rr", MasqueradeBit: 14, LocalDetector: detector,
			NodeIP: netip.MustParseAddr("10.255.0.2"), MaxSetEntries: n.maxSetEntries},
		NodePortAddresses:  func(node []netip.Addr) []netip.Addr { return node },
		ExcludeCIDRs:       exclude,
		DrainCheckInterval: 5 * time.Millisecond,
		CheckInterval:      5 * time.Millisecond,
	})
	core := proxy.NewCore(proxy.Config{Family: v1.IPv4Protocol, ModeName: "ipvs", Node: state.Node{Name: "node-1"},
		MinSyncPeriod: time.Second, SyncPeriod: time.Minute}, mode)
	return core, mode
}

func sync(t testing.TB, c *proxy.Core) {
	t.Helper()
	if err := c.SyncOnce(); err != nil {
		t.Fatal(err)
	}
}

type svcOpt func(*v1.Service)

func service(c *proxy.Core, name, clusterIP string, opts ...svcOpt) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{ClusterIP: clusterIP, Type: v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	for _, o := range opts {
		o(svc)
	}
	c.OnService(svc, false)
}

func nodePort(port int32, local bool) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = port
		if local {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = port + 1000
		}
	}
}

func udp(s *v1.Service) { s.Spec.Ports[0].Protocol = v1.ProtocolUDP }

// twoPorts gives the service a second port, q (81).
func twoPorts(s *v1.Service) {
	s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "q", Port: 81, Protocol: v1.ProtocolTCP})
}

func affinity(s *v1.Service) {
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(600))}}
}

func externalIPs(ips ...string) svcOpt {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

func loadBalancer(ip string, ranges ...string) svcOpt {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30999
		s.Spec.LoadBalancerSourceRanges = ranges
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip}}
	}
}

// endpoints gives the service these endpoints, "ip" on node-1 when it
// ends in "@local", on node-2 otherwise.
func endpoints(c *proxy.Core, name string, proto v1.Protocol, ips ...string) {
	slice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("p"), Port: ptr.To(int32(8080)), Protocol: ptr.To(proto)}},
	}
	for _, ip := range ips {
		nodeName := "node-2"
		if a, ok := strings.CutSuffix(ip, "@local"); ok {
			ip, nodeName = a, "node-1"
		}
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(nodeName),
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true)}})
	}
	c.OnEndpointSlice(slice, false)
}

// realServer tells whether the dump lists the real server with this
// weight and number of active connections.
func realServer(dump, addr string, weight, active int) bool {
	return regexp.MustCompile(`-> ` + regexp.QuoteMeta(addr) + ` +Masq +` + fmt.Sprint(weight) + ` +` + fmt.Sprint(active) + ` `).MatchString(dump)
}

func synced(c *proxy.Core) {
	c.OnServicesSynced()
	c.OnEndpointSlicesSynced()
}

// feedServices gives the proxier every kind of service port.
func feedServices(c *proxy.Core) {
	service(c, "web", "10.96.0.10")
	endpoints(c, "web", v1.ProtocolTCP, "10.244.0.5@local", "10.244.1.5")
	service(c, "dns", "10.96.0.11", udp, affinity)
	endpoints(c, "dns", v1.ProtocolUDP, "10.244.1.6")
	service(c, "local", "10.96.0.12", nodePort(30080, true))
	endpoints(c, "local", v1.ProtocolTCP, "10.244.0.7@local", "10.244.1.7")
	service(c, "lb", "10.96.0.13", loadBalancer("10.255.3.1", "10.255.1.0/24"), externalIPs("10.255.2.1"))
	endpoints(c, "lb", v1.ProtocolTCP, "10.244.1.8")
	service(c, "empty", "10.96.0.14")
	synced(c)
}

// The whole state the mode gives the kernel for every kind of service.
func TestFullSyncGolden(t *testing.T) {
	n, _, _ := fedNode(t)
	testutil.Golden(t, filepath.Join("testdata", "sync-full.golden"), n.kernel.Dump(), os.Getenv("UPDATE_GOLDEN") != "")
	if n.iptables.restores != 1 {
		t.Errorf("%d iptables restores for a first sync, want 1", n.iptables.restores)
	}
}

// A one-endpoint change costs a few netlink requests for that service
// only: no process start, no set change, nothing of the other services.
func TestOneEndpointChangeTouchesOneService(t *testing.T) {
	n := newNode()
	core, _ := n.proxier(t)
	for i := range 200 {
		name := fmt.Sprintf("svc-%d", i)
		service(core, name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1))
		endpoints(core, name, v1.ProtocolTCP, fmt.Sprintf("10.244.1.%d", i%250+1))
	}
	synced(core)
	sync(t, core)
	n.kernel.ResetCalls()
	restores := n.iptables.restores
	endpoints(core, "svc-7", v1.ProtocolTCP, "10.244.1.8", "10.244.2.1")
	sync(t, core)
	want := map[string]int{"NodeAddresses": 1, "RealServers": 1, "AddRealServer": 1}
	if got := n.kernel.Calls(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("one added endpoint made the calls %v, want %v", got, want)
	}
	if n.iptables.restores != restores {
		t.Errorf("one added endpoint started %d iptables-restore processes, want none", n.iptables.restores-restores)
	}
}

// fedNode is a node whose proxier has synced feedServices's services.
func fedNode(t *testing.T) (*node, *proxy.Core, *ipvs.Syncer) {
	n := newNode()
	core, mode := n.proxier(t)
	feedServices(core)
	sync(t, core)
	return n, core, mode
}

// A restart over what a previous run (ours or upstream's) left in place
// reads the kernel once and changes nothing.
func TestRestartOverStateInPlaceChangesNothing(t *testing.T) {
	n, _, _ := fedNode(t)
	before := n.kernel.Dump()
	n.kernel.ResetCalls()

	second, _ := n.proxier(t)
	feedServices(second)
	sync(t, second)
	// Each read is one call, whatever the number of virtual servers.
	reads := []string{"VirtualServers", "EachVirtualServer", "BoundAddresses", "NodeAddresses", "SetEntries"}
	for method, count := range n.kernel.Calls() {
		if !strings.HasPrefix(method, "Ensure") && (!slices.Contains(reads, method) || count > 1) {
			t.Errorf("the restart called %s %d times", method, count)
		}
	}
	if after := n.kernel.Dump(); after != before {
		t.Errorf("the restart changed the kernel:\n%s\nwas:\n%s", after, before)
	}
}

// A restart that read the kernel while the informers listed (Prepare)
// takes that read in its first sync when it still holds: the sync reads
// only the sets' headers and the node's addresses, and changes nothing.
// A set or iptables table another program changed in between is read
// again, and the set repaired.
func TestRestartTakesWhatItReadWhileTheInformersListed(t *testing.T) {
	n, _, _ := fedNode(t)
	before := n.kernel.Dump()

	second, mode := n.proxier(t)
	mode.Prepare()
	n.kernel.ResetCalls()
	saves := n.iptables.saves.Load()
	feedServices(second)
	sync(t, second)
	for method, count := range n.kernel.Calls() {
		if !strings.HasPrefix(method, "Ensure") && method != "SetSizes" && method != "NodeAddresses" {
			t.Errorf("the restart's sync called %s %d times after Prepare", method, count)
		}
	}
	if got := n.iptables.saves.Load() - saves; got != 0 {
		t.Errorf("the restart's sync read the iptables tables %d times after Prepare, want none", got)
	}
	if after := n.kernel.Dump(); after != before {
		t.Errorf("the restart changed the kernel:\n%s\nwas:\n%s", after, before)
	}

	third, mode := n.proxier(t)
	mode.Prepare()
	if err := n.kernel.ChangeSets([]ipvskernel.SetChange{{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.10,tcp:80", Delete: true}}); err != nil {
		t.Fatal(err)
	}
	n.iptables.generation.Add(1)
	n.kernel.ResetCalls()
	saves = n.iptables.saves.Load()
	feedServices(third)
	sync(t, third)
	if calls := n.kernel.Calls(); calls["SetEntries"] != 1 || calls["EachVirtualServer"] != 1 {
		t.Errorf("after another program's change the sync read the sets %d and the real servers %d times, want once each", calls["SetEntries"], calls["EachVirtualServer"])
	}
	if got := n.iptables.saves.Load() - saves; got != 1 {
		t.Errorf("after the nat table's generation moved the sync read the tables %d times, want once", got)
	}
	if after := n.kernel.Dump(); after != before {
		t.Errorf("the restart did not repair the set:\n%s\nwant:\n%s", after, before)
	}
}

// A removed TCP real server with connections goes to weight 0 and is
// deleted when they end; a UDP one is deleted at once.
func TestRemovedRealServersDrain(t *testing.T) {
	n := newNode()
	core, mode := n.proxier(t)
	service(core, "web", "10.96.0.10")
	endpoints(core, "web", v1.ProtocolTCP, "10.244.1.5", "10.244.1.6")
	service(core, "dns", "10.96.0.11", udp)
	endpoints(core, "dns", v1.ProtocolUDP, "10.244.1.5", "10.244.1.6")
	synced(core)
	sync(t, core)
	web := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	gone := netip.MustParseAddrPort("10.244.1.6:8080")
	if err := n.kernel.SetConnections(web, gone, 1, 0); err != nil {
		t.Fatal(err)
	}
	endpoints(core, "web", v1.ProtocolTCP, "10.244.1.5")
	endpoints(core, "dns", v1.ProtocolUDP, "10.244.1.5")
	sync(t, core)
	dump := n.kernel.Dump()
	if !realServer(dump, "10.244.1.6:8080", 0, 1) {
		t.Errorf("the TCP real server with a connection is not draining at weight 0:\n%s", dump)
	}
	if strings.Count(dump, "10.244.1.6:8080") != 1 {
		t.Errorf("the UDP real server was not deleted at once:\n%s", dump)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drains := n.kernel.Calls()["RealServers"]
	go mode.Watch(ctx, nil)
	// Until a whole drain check ran (each reads the real servers once, while
	// any drain) or the real server went.
	deadline := time.Now().Add(time.Minute)
	for n.kernel.Calls()["RealServers"] < drains+2 && strings.Contains(n.kernel.Dump(), "10.244.1.6:8080") {
		if time.Now().After(deadline) {
			t.Fatal("no drain check ran in a minute")
		}
		time.Sleep(time.Millisecond)
	}
	if !strings.Contains(n.kernel.Dump(), "10.244.1.6:8080") {
		t.Error("the draining real server was deleted while its connection lasted")
	}
	if err := n.kernel.SetConnections(web, gone, 0, 0); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Minute)
	for strings.Contains(n.kernel.Dump(), "10.244.1.6:8080") {
		if time.Now().After(deadline) {
			t.Fatalf("the drained real server is still there after a minute:\n%s", n.kernel.Dump())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A previous run's real servers left at weight 0 are wanted again: the
// first sync sets them back to 1. Virtual servers inside excludeCIDRs
// belong to other programs and stay; others no service wants go.
func TestFirstSyncRepairsWeightsAndKeepsExcludedServers(t *testing.T) {
	n := newNode()
	web := ipvskernel.VirtualServer{VirtualServerKey: ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}, Scheduler: "rr"}
	other := ipvskernel.VirtualServer{VirtualServerKey: ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("192.0.2.1"), Port: 80, Protocol: v1.ProtocolTCP}, Scheduler: "rr"}
	stale := ipvskernel.VirtualServer{VirtualServerKey: ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.9.9"), Port: 80, Protocol: v1.ProtocolTCP}, Scheduler: "rr"}
	for _, vs := range []ipvskernel.VirtualServer{web, other, stale} {
		if err := n.kernel.AddVirtualServer(vs); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.kernel.AddRealServer(web.VirtualServerKey, ipvskernel.RealServer{Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080, Weight: 0}); err != nil {
		t.Fatal(err)
	}
	core, _ := n.proxier(t, netip.MustParsePrefix("192.0.2.0/24"))
	service(core, "web", "10.96.0.10")
	endpoints(core, "web", v1.ProtocolTCP, "10.244.1.5")
	synced(core)
	sync(t, core)
	dump := n.kernel.Dump()
	if !realServer(dump, "10.244.1.5:8080", 1, 0) {
		t.Errorf("the real server left at weight 0 was not set back to 1:\n%s", dump)
	}
	if !strings.Contains(dump, "192.0.2.1:80") || strings.Contains(dump, "10.96.9.9:80") {
		t.Errorf("want the excluded virtual server kept and the stale one deleted:\n%s", dump)
	}
}

// An address two services use stays bound until the last one goes.
func TestSharedAddressStaysUntilTheLastServiceGoes(t *testing.T) {
	n := newNode()
	core, _ := n.proxier(t)
	service(core, "a", "10.96.0.10", externalIPs("10.255.2.1"))
	service(core, "b", "10.96.0.11", externalIPs("10.255.2.1"), func(s *v1.Service) { s.Spec.Ports[0].Port = 81 })
	synced(core)
	sync(t, core)
	bound := func() bool { return strings.Contains(n.kernel.Dump(), "inet 10.255.2.1/32") }
	core.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}}, true)
	sync(t, core)
	if !bound() {
		t.Error("the shared external IP was unbound while service b still uses it")
	}
	core.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}}, true)
	sync(t, core)
	if bound() {
		t.Errorf("the external IP is still bound after both services went:\n%s", n.kernel.Dump())
	}
}

// A kernel refusing one service's virtual server fails the sync, with
// an error naming it, but the other services are programmed, and the
// next (full) sync repairs it.
func TestOneFailingServiceDoesNotStopTheOthers(t *testing.T) {
	n := newNode()
	core, _ := n.proxier(t)
	feedServices(core)
	refused := errors.New("refused by the test")
	n.kernel.FailNext("AddVirtualServer", refused)
	err := core.SyncOnce()
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), "adding virtual server") {
		t.Fatalf("sync returned %v, want the refusal naming the virtual server", err)
	}
	servers := strings.Count(n.kernel.Dump(), "rr")
	if servers < 8 {
		t.Errorf("only %d virtual servers after one was refused:\n%s", servers, n.kernel.Dump())
	}
	sync(t, core)
	requireAsFirstSyncLeavesIt(t, n, "after the repairing sync")
}

// A service address is bound only while a virtual server is on it: when
// the kernel refuses the only one, the address stays unbound (bound, it
// would take the service's traffic to the node's own sockets) until the
// repairing sync adds both; when it refuses one of two, the other's
// traffic needs the address, and it is bound.
func TestRefusedVirtualServerLeavesItsAddressUnbound(t *testing.T) {
	refused := errors.New("refused by the test")
	bound := func(n *node, a string) bool { return strings.Contains(n.kernel.Dump(), "inet "+a+"/32") }

	n := newNode()
	core, _ := n.proxier(t)
	service(core, "web", "10.96.0.10")
	synced(core)
	n.kernel.FailNext("AddVirtualServer", refused)
	if err := core.SyncOnce(); !errors.Is(err, refused) {
		t.Fatalf("sync returned %v, want the refusal", err)
	}
	if bound(n, "10.96.0.10") {
		t.Errorf("the address of the refused virtual server is bound:\n%s", n.kernel.Dump())
	}
	sync(t, core)
	if !bound(n, "10.96.0.10") || !strings.Contains(n.kernel.Dump(), "TCP  10.96.0.10:80") {
		t.Errorf("the repairing sync left the service unprogrammed:\n%s", n.kernel.Dump())
	}

	n = newNode()
	core, _ = n.proxier(t)
	service(core, "two", "10.96.0.20", func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP})
	})
	synced(core)
	n.kernel.FailNext("AddVirtualServer", refused)
	if err := core.SyncOnce(); !errors.Is(err, refused) {
		t.Fatalf("sync returned %v, want the refusal", err)
	}
	if !bound(n, "10.96.0.20") {
		t.Errorf("the address is unbound though one of its two virtual servers was added:\n%s", n.kernel.Dump())
	}

	// The other way round: the kernel holds one virtual server on the
	// address already and refuses the other.
	n = newNode()
	core, _ = n.proxier(t)
	service(core, "three", "10.96.0.30", func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP})
	})
	synced(core)
	there := ipvskernel.VirtualServer{VirtualServerKey: ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.30"), Port: 53, Protocol: v1.ProtocolUDP}, Scheduler: "rr"}
	if err := n.kernel.AddVirtualServer(there); err != nil {
		t.Fatal(err)
	}
	n.kernel.FailNext("AddVirtualServer", refused)
	if err := core.SyncOnce(); !errors.Is(err, refused) {
		t.Fatalf("sync returned %v, want the refusal", err)
	}
	if !bound(n, "10.96.0.30") {
		t.Errorf("the address is unbound though one of its virtual servers is in place:\n%s", n.kernel.Dump())
	}
}

// requireAsFirstSyncLeavesIt fails unless n's kernel holds what a first
// sync of feedServices leaves in a fresh one.
func requireAsFirstSyncLeavesIt(t *testing.T, n *node, when string) {
	t.Helper()
	fresh := newNode()
	core, _ := fresh.proxier(t)
	feedServices(core)
	sync(t, core)
	if got, want := n.kernel.Dump(), fresh.kernel.Dump(); got != want {
		t.Errorf("%s the kernel holds:\n%s\nwant:\n%s", when, got, want)
	}
}

// Another program's address on kube-ipvs0 stays; one a previous run bound
// (KUBE-IPVS-IPS lists it) goes once no service wants it.
func TestUnrelatedAddressesOnTheLinkStay(t *testing.T) {
	n := newNode()
	first, _ := n.proxier(t)
	service(first, "old", "10.96.0.20")
	synced(first)
	sync(t, first)
	if err := n.kernel.Bind(netip.MustParseAddr("192.0.2.7")); err != nil {
		t.Fatal(err)
	}
	second, _ := n.proxier(t)
	service(second, "web", "10.96.0.10")
	synced(second)
	sync(t, second)
	dump := n.kernel.Dump()
	if !strings.Contains(dump, "inet 192.0.2.7/32") {
		t.Errorf("another program's address was removed from kube-ipvs0:\n%s", dump)
	}
	if strings.Contains(dump, "inet 10.96.0.20/32") {
		t.Errorf("the previous run's address no service wants is still bound:\n%s", dump)
	}
}

// An address that moves from one service port to another in one sync
// stays bound and in KUBE-IPVS-IPS: the removal by one and the addition by
// the other cancel out, whichever of the two is handled first.
func TestAddressMovingBetweenServicesStays(t *testing.T) {
	for range 20 {
		n := newNode()
		core, _ := n.proxier(t)
		service(core, "a", "10.96.0.10", externalIPs("10.255.2.1"))
		service(core, "b", "10.96.0.11", func(s *v1.Service) { s.Spec.Ports[0].Port = 81 })
		synced(core)
		sync(t, core)
		service(core, "a", "10.96.0.10")
		service(core, "b", "10.96.0.11", externalIPs("10.255.2.1"), func(s *v1.Service) { s.Spec.Ports[0].Port = 81 })
		sync(t, core)
		dump := n.kernel.Dump()
		for _, want := range []string{"inet 10.255.2.1/32", "add KUBE-IPVS-IPS 10.255.2.1\n", "add KUBE-EXTERNAL-IP 10.255.2.1,tcp:81\n"} {
			if !strings.Contains(dump, want) {
				t.Fatalf("the external IP moved from a to b, and the kernel lacks %q:\n%s", want, dump)
			}
		}
	}
}

// fullSetNode is a node whose hash sets take 8 entries, with the
// services svc-<i> (10.96.0.<i+1>, ports p and q) for each i: two entries
// each in KUBE-CLUSTER-IP, one in KUBE-IPVS-IPS.
