package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/nfacct"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// runInNetns re-runs the calling test inside a new namespace, once per
// backend, and tells whether this is that inner run.
func runInNetns(t *testing.T) (inner bool) {
	testutil.RequireCommands(t, "iptables-legacy-restore", "iptables-nft-restore")
	var variants [][2]string
	for _, backend := range []iptableskernel.Backend{iptableskernel.NFT, iptableskernel.Legacy} {
		variants = append(variants, [2]string{string(backend) + " backend", iptableskernel.BackendEnv + "=" + string(backend)})
	}
	return testutil.RerunInNetns(t, variants)
}

// countingKernel counts what a sync asks of the kernel.
type countingKernel struct {
	iptableskernel.Kernel
	restores      int
	chainsWritten int
	saves         int
	lists         int
}

func (k *countingKernel) ListRules(table, chain string) ([]string, error) {
	k.lists++
	return k.Kernel.ListRules(table, chain)
}

func (k *countingKernel) Save(read func(io.Reader) error) error {
	k.saves++
	return k.Kernel.Save(read)
}

func (k *countingKernel) Restore(input io.Reader) error {
	text, err := io.ReadAll(input)
	if err != nil {
		return err
	}
	k.restores++
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, ":") {
			k.chainsWritten++
		}
	}
	return k.Kernel.Restore(bytes.NewReader(text))
}

// testProxier is the proxy core running the iptables mode, as the
// server wires them.
type testProxier struct {
	*proxy.Core
	*Syncer
}

func newProxier(cfg Config, nodeName string) testProxier {
	mode := New(cfg)
	return testProxier{Core: proxy.NewCore(proxy.Config{
		Family: cfg.Family, ModeName: "iptables", Node: state.Node{Name: nodeName},
		MinSyncPeriod: time.Second, SyncPeriod: cfg.SyncPeriod,
	}, mode), Syncer: mode}
}

func (p testProxier) sync() error { return p.SyncOnce() }

func newTestProxier(t testing.TB, kernel iptableskernel.Kernel) testProxier {
	t.Helper()
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16"}}, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	return newProxier(Config{
		Family: v1.IPv4Protocol, Kernel: kernel, SyncPeriod: time.Minute,
		Params: Params{MasqueradeBit: 14, LocalhostNodePorts: true, LocalDetector: detector},
	}, "node-1")
}

// feed gives the proxier n services with two endpoints each, and says
// both caches are complete.
func feed(p testProxier, n int) {
	for i := range n {
		feedService(p, i)
	}
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
}

// feedService gives the proxier service i, a NodePort with two endpoints.
func feedService(p testProxier, i int) {
	name := fmt.Sprintf("svc-%d", i)
	p.OnService(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), Type: v1.ServiceTypeNodePort,
			Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP, NodePort: int32(30000 + i)}},
		},
	}, false)
	ready := true
	p.OnEndpointSlice(&discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)}, Conditions: discovery.EndpointConditions{Ready: &ready}},
			{Addresses: []string{fmt.Sprintf("10.244.%d.%d", 100+i/250, i%250+1)}, Conditions: discovery.EndpointConditions{Ready: &ready}},
		},
	}, false)
}

// feedClusterIPs gives the proxier n ClusterIP services with the given
// number of ready endpoints each, as make bench creates them.
func feedClusterIPs(p testProxier, n, endpoints int) {
	ready := true
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		p.OnService(&v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.ServiceSpec{ClusterIP: fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&0xff, i&0xff),
				Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}},
		}, false)
		slice := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
		}
		for e := range endpoints {
			j := i*endpoints + e
			slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+j>>16, j>>8&0xff, j&0xff)},
				Conditions: discovery.EndpointConditions{Ready: &ready}})
		}
		p.OnEndpointSlice(slice, false)
	}
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
}

func ptr[T any](v T) *T { return &v }

// savedText is iptables-save output of every table, whole, for checks.
func savedText(t *testing.T, k iptableskernel.Kernel) string {
	t.Helper()
	var text strings.Builder
	if err := k.Save(func(save io.Reader) error {
		_, err := io.Copy(&text, save)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return text.String()
}

// syncedProxier is a proxier that has synced n services into this
// namespace's kernel with the backend chosen for the run.
func syncedProxier(t *testing.T, n int) (testProxier, iptableskernel.Kernel, iptableskernel.Backend) {
	t.Helper()
	backend, _, err := iptableskernel.DetectBackend()
	if err != nil {
		t.Fatal(err)
	}
	kernel := iptableskernel.New(false, backend)
	p := newTestProxier(t, kernel)
	feed(p, n)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	return p, kernel, backend
}

// A restarted proxier over the rules its predecessor wrote writes nothing,
// and one that finds a change made while it was down writes only that.
func TestRestartOverRulesInPlaceWritesOnlyWhatDiffers(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	_, real, backend := syncedProxier(t, 50)

	restarted := &countingKernel{Kernel: real}
	second := newTestProxier(t, restarted)
	feed(second, 50)
	if err := second.sync(); err != nil {
		t.Fatal(err)
	}
	if restarted.restores != 0 || restarted.lists != 0 {
		t.Errorf("%s: restart over identical rules: %d restores (%d chains), %d chains listed; want none",
			backend, restarted.restores, restarted.chainsWritten, restarted.lists)
	}

	// While down, one service went away: the next start removes only it.
	changed := &countingKernel{Kernel: real}
	third := newTestProxier(t, changed)
	feed(third, 49)
	if err := third.sync(); err != nil {
		t.Fatal(err)
	}
	save := savedText(t, real)
	gone := chainsFor(state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "svc-49"}, Port: "p", Protocol: v1.ProtocolTCP})
	if strings.Contains(save, string(gone.cluster)) || strings.Contains(save, "ns/svc-49:p") {
		t.Errorf("%s: the removed service's rules are still there", backend)
	}
	if changed.restores != 1 {
		t.Errorf("%s: removing one service took %d restores, want 1", backend, changed.restores)
	}
	// Declared chains: the removed service's SVC, EXT and two SEP chains (flushed, then deleted).
	if changed.chainsWritten != 4 {
		t.Errorf("%s: removing one service declared %d chains, want 4", backend, changed.chainsWritten)
	}
}

// A restart reads the kernel while the informers list (Prepare): with the
// tables unchanged since, its first sync reads and writes nothing more;
// when another program changed them in between, the sync reads them again
// and repairs the change.
func TestTheReadBeforeTheFirstSyncIsUsedOnlyWhileTheKernelIsUnchanged(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	_, real, backend := syncedProxier(t, 20)

	unchanged := &countingKernel{Kernel: real}
	second := newTestProxier(t, unchanged)
	second.Prepare()
	feed(second, 20)
	if err := second.sync(); err != nil {
		t.Fatal(err)
	}
	if unchanged.saves != 1 || unchanged.restores != 0 {
		t.Errorf("%s: restart over unchanged rules: %d dumps and %d restores, want 1 and none", backend, unchanged.saves, unchanged.restores)
	}

	changed := &countingKernel{Kernel: real}
	third := newTestProxier(t, changed)
	third.Prepare()
	flushed := chainsFor(state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "svc-3"}, Port: "p", Protocol: v1.ProtocolTCP}).cluster
	tamper := exec.Command("iptables-"+string(backend)+"-restore", "--noflush")
	tamper.Stdin = strings.NewReader(fmt.Sprintf("*nat\n-F %s\nCOMMIT\n", flushed))
	if out, err := tamper.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	feed(third, 20)
	if err := third.sync(); err != nil {
		t.Fatal(err)
	}
	if changed.saves != 2 || changed.restores != 1 {
		t.Errorf("%s: restart over a change made after the first read: %d dumps and %d restores, want 2 and 1", backend, changed.saves, changed.restores)
	}
	if rules, err := real.ListRules("nat", string(flushed)); err != nil || len(rules) == 0 {
		t.Errorf("%s: %s is still empty (%v)", backend, flushed, err)
	}
}

// A full sync split into small inputs writes them so that each one holds
// on its own (the kernel refuses a jump to a chain not yet there), and
// leaves the same rules as one input does: an unsplit restart over them
// writes nothing.
func TestSplitFullSyncGivesTheSameRules(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	backend, _, err := iptableskernel.DetectBackend()
	if err != nil {
		t.Fatal(err)
	}
	real := iptableskernel.New(false, backend)
	split := &countingKernel{Kernel: real}
	p := newTestProxier(t, split)
	p.cfg.ChainRefsPerRestore = 7
	feed(p, 30)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	// 30 services: 60 SEP, 30 SVC and 30 EXT chains, 7 chain names a batch
	// at most.
	if split.restores < 120/7 {
		t.Errorf("%s: the split sync took %d restores, want at least %d", backend, split.restores, 120/7)
	}
	whole := &countingKernel{Kernel: real}
	again := newTestProxier(t, whole)
	feed(again, 30)
	if err := again.sync(); err != nil {
		t.Fatal(err)
	}
	if whole.restores != 0 {
		t.Errorf("%s: an unsplit sync over the split one wrote %d chains", backend, whole.chainsWritten)
	}
}

// A partial sync touches only what changed: one endpoint replaced rewrites
// its service's policy chain and the two endpoint chains, nothing shared;
// a new service adds its chains and inserts its rules into the shared
// chains without rewriting them.
func TestPartialSyncWritesOnlyTheChange(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	backend, _, err := iptableskernel.DetectBackend()
	if err != nil {
		t.Fatal(err)
	}
	kernel := &countingKernel{Kernel: iptableskernel.New(false, backend)}
	p := newTestProxier(t, kernel)
	feed(p, 20)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	var lastInput string
	record := &inputRecorder{countingKernel: kernel, last: &lastInput}
	p.cfg.Kernel = record

	ready := true
	p.OnEndpointSlice(&discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "svc-3-x", Labels: map[string]string{discovery.LabelServiceName: "svc-3"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.244.0.4"}, Conditions: discovery.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"10.244.200.4"}, Conditions: discovery.EndpointConditions{Ready: &ready}},
		},
	}, false)
	kernel.restores, kernel.chainsWritten = 0, 0
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	if kernel.restores != 1 || kernel.chainsWritten != 3 || strings.Contains(lastInput, ":KUBE-SERVICES") {
		t.Errorf("%s: one endpoint replaced: %d restores, %d chains declared:\n%s", backend, kernel.restores, kernel.chainsWritten, lastInput)
	}

	feedService(p, 20)
	kernel.restores, kernel.chainsWritten = 0, 0
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	// svc-20: KUBE-SVC, KUBE-EXT and two KUBE-SEP chains.
	if kernel.restores != 1 || kernel.chainsWritten != 4 || strings.Contains(lastInput, ":KUBE-SERVICES") || strings.Contains(lastInput, ":KUBE-NODEPORTS") {
		t.Errorf("%s: one service added: %d restores, %d chains declared:\n%s", backend, kernel.restores, kernel.chainsWritten, lastInput)
	}
}

// inputRecorder keeps the last restore input.
type inputRecorder struct {
	*countingKernel
	last *string
}

func (r *inputRecorder) Restore(input io.Reader) error {
	text, err := io.ReadAll(input)
	if err != nil {
		return err
	}
	*r.last = string(text)
	return r.countingKernel.Restore(bytes.NewReader(text))
}

// With the nfacct objects in place, the rules that count packets in them
// are accepted by the kernel and read back equal (a restart writes
// nothing), the metrics serve the counts, and cleanup removes the objects
// once the rules are gone. Without nfacct, the plain rules are written,
// checked, and the test skipped (failed under CI).
func TestNFAcctCountersOnTheRealKernel(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	backend, _, err := iptableskernel.DetectBackend()
	if err != nil {
		t.Fatal(err)
	}
	real := iptableskernel.New(false, backend)
	nfacctErr := EnsureNFAcctObjects()
	if nfacctErr != nil {
		t.Logf("%s: no nfacct here, checking the plain rules: %v", backend, nfacctErr)
	} else {
		metrics.ServeNFAcctCounters()
	}
	start := func(kernel iptableskernel.Kernel) testProxier {
		p := newTestProxier(t, kernel)
		p.Syncer.cfg.Params.NFAcct = nfacctErr == nil
		feed(p, 3)
		return p
	}
	if err := start(real).sync(); err != nil {
		t.Fatalf("%s: %v", backend, err)
	}
	save := savedText(t, real)
	counted := map[string]int{}
	for _, line := range strings.Split(save, "\n") {
		if _, name, ok := strings.Cut(line, "--nfacct-name"); ok {
			counted[strings.Fields(name)[0]]++
		}
	}
	want := map[string]int{}
	if nfacctErr == nil {
		want = map[string]int{"ct_state_invalid_dropped_pkts": 1, "localhost_nps_accepted_pkts": 3}
	}
	if !maps.Equal(counted, want) {
		t.Errorf("%s: rules per nfacct object %v, want %v", backend, counted, want)
	}
	restarted := &countingKernel{Kernel: real}
	if err := start(restarted).sync(); err != nil {
		t.Fatal(err)
	}
	if restarted.restores != 0 {
		t.Errorf("%s: a restart over the rules wrote %d chains", backend, restarted.chainsWritten)
	}
	if nfacctErr != nil {
		testutil.Skip(t, fmt.Sprintf("%s: no nfacct here, so its counters were not checked: %v", backend, nfacctErr))
	}

	// A connection to a NodePort on localhost: its first packet is counted
	// on its way to an endpoint this namespace has no route to.
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:30000", 300*time.Millisecond); err == nil {
		conn.Close()
	}
	served := map[string]float64{}
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "kubeproxy_iptables_") && len(f.GetMetric()) == 1 {
			served[f.GetName()] = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if v, ok := served["kubeproxy_iptables_localhost_nodeports_accepted_packets_total"]; !ok || v < 1 {
		t.Errorf("%s: localhost NodePort packets served as %v (%v), want at least 1", backend, v, ok)
	}
	if _, ok := served["kubeproxy_iptables_ct_state_invalid_dropped_packets_total"]; !ok {
		t.Errorf("%s: the conntrack INVALID drops are not served: %v", backend, served)
	}

	if _, err := iptableskernel.Cleanup(real); err != nil {
		t.Fatal(err)
	}
	removed, err := CleanupNFAcctObjects()
	if err != nil || len(removed) != 2 {
		t.Errorf("%s: cleanup removed nfacct objects %v, %v; want both", backend, removed, err)
	}
	for _, name := range nfacctObjects {
		if _, err := nfacct.Get(name); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s: after cleanup, %s: %v", backend, name, err)
		}
	}

	// With the rules and the objects gone (a flush, then someone deleting
	// the objects), a full sync creates the objects again, as upstream's.
	again := newTestProxier(t, real)
	again.Syncer.cfg.Params.NFAcct = true
	again.Syncer.cfg.EnsureNFAcct = EnsureNFAcctObjects
	feed(again, 3)
	if err := again.sync(); err != nil {
		t.Fatalf("%s: a full sync after the objects were deleted: %v", backend, err)
	}
	for _, name := range nfacctObjects {
		if _, err := nfacct.Get(name); err != nil {
			t.Errorf("%s: the full sync did not create %s again: %v", backend, name, err)
		}
	}
}
