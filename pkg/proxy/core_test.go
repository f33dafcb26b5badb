package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// fakeMode records the syncs the core asks for.
type fakeMode struct {
	calls      []string
	partialErr error
	fullErr    error
}

func (m *fakeMode) FullSync(v state.View) error {
	m.calls = append(m.calls, fmt.Sprintf("full(%d)", len(v.Services)))
	return m.fullErr
}

func (m *fakeMode) PartialSync(_ state.View, changed map[state.ServicePortName]bool) error {
	var names []string
	for n := range changed {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	m.calls = append(m.calls, "partial("+strings.Join(names, ",")+")")
	return m.partialErr
}

func newTestCore(mode Mode) *Core {
	return NewCore(Config{Family: v1.IPv4Protocol, ModeName: "fake", Node: state.Node{Name: "node-1"},
		MinSyncPeriod: time.Second, SyncPeriod: time.Minute}, mode)
}

// localService is a ClusterIP service with iTP=Local whose one ready
// endpoint is on the given node.
func localService(c *Core, name, ip, node string) {
	c.OnService(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{ClusterIP: ip, Type: v1.ServiceTypeClusterIP,
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyLocal),
			Ports:                 []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}},
	}, false)
	c.OnEndpointSlice(&discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To(""), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discovery.Endpoint{{Addresses: []string{"10.244.0.5"}, NodeName: ptr.To(node),
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true)}}},
	}, false)
}

func TestCoreSyncsOnlyWhatChangedAfterAFullSync(t *testing.T) {
	mode := &fakeMode{}
	c := newTestCore(mode)
	sync := func() {
		t.Helper()
		if err := c.SyncOnce(); err != nil {
			t.Fatal(err)
		}
	}
	localService(c, "a", "10.96.0.1", "node-1")
	localService(c, "b", "10.96.0.2", "node-1")
	sync()
	localService(c, "b", "10.96.0.2", "node-2")
	sync()
	// The node's zone changing re-selects every service's endpoints.
	c.OnNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{v1.LabelTopologyZone: "z"}}})
	sync()
	sync()
	want := []string{"full(2)", "partial(b)", "full(2)", "partial()"}
	if !slices.Equal(mode.calls, want) {
		t.Errorf("syncs %v, want %v", mode.calls, want)
	}
}

func TestCoreFallsBackToAFullSync(t *testing.T) {
	mode := &fakeMode{}
	c := newTestCore(mode)
	localService(c, "a", "10.96.0.1", "node-1")
	if err := c.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	// A mode that asks for a full sync gets one; a failing partial sync is
	// followed by a full one in the same run; a failing full sync is
	// reported and the next run is full again.
	mode.partialErr = ErrFullSyncNeeded
	_ = c.SyncOnce()
	mode.partialErr = errors.New("restore failed")
	_ = c.SyncOnce()
	mode.partialErr, mode.fullErr = ErrFullSyncNeeded, errors.New("kernel said no")
	if err := c.SyncOnce(); err == nil || !strings.Contains(err.Error(), "kernel said no") {
		t.Errorf("a failed full sync returned %v", err)
	}
	if !c.FullSyncPending() {
		t.Error("after a failed full sync the next one is not full")
	}
	mode.fullErr = nil
	_ = c.SyncOnce()
	want := []string{"full(1)", "partial()", "full(1)", "partial()", "full(1)", "partial()", "full(1)", "full(1)"}
	if !slices.Equal(mode.calls, want) {
		t.Errorf("syncs %v, want %v", mode.calls, want)
	}
}

// FirstSynced is closed by the first sync that succeeds, not by a failed one.
func TestCoreFirstSyncedAfterTheFirstSuccessfulSync(t *testing.T) {
	mode := &fakeMode{fullErr: errors.New("kernel said no")}
	c := newTestCore(mode)
	localService(c, "a", "10.96.0.1", "node-1")
	_ = c.SyncOnce()
	select {
	case <-c.FirstSynced():
		t.Fatal("first synced after a failed sync")
	default:
	}
	mode.fullErr = nil
	if err := c.SyncOnce(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.FirstSynced():
	default:
		t.Fatal("not first synced after a successful sync")
	}
	_ = c.SyncOnce() // closing twice would panic
}

// The no-local-endpoints gauge counts service ports whose Local policy
// finds no endpoint on this node while the service has some elsewhere,
// kept up to date by partial syncs.
func TestCoreCountsServicesWithoutLocalEndpoints(t *testing.T) {
	c := newTestCore(&fakeMode{})
	internal := func() float64 {
		var m dto.Metric
		if err := metrics.NoLocalEndpointsTotal.WithLabelValues("internal", "IPv4").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	localService(c, "a", "10.96.0.1", "node-1")
	localService(c, "b", "10.96.0.2", "node-2")
	localService(c, "c", "10.96.0.3", "node-2")
	for step, want := range []float64{2, 1, 0} {
		if err := c.SyncOnce(); err != nil {
			t.Fatal(err)
		}
		if got := internal(); got != want {
			t.Errorf("step %d: internal no-local-endpoints %v, want %v", step, got, want)
		}
		switch step {
		case 0:
			localService(c, "b", "10.96.0.2", "node-1")
		case 1:
			c.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}, true)
		}
	}
}

// cidrMode is a mode that uses the service CIDRs.
type cidrMode struct {
	fakeMode
	cidrs [][]netip.Prefix
}

func (m *cidrMode) SetServiceCIDRs(cidrs []netip.Prefix) {
	m.cidrs = append(m.cidrs, cidrs)
	m.calls = append(m.calls, fmt.Sprint("cidrs", cidrs))
}

// A mode using the service CIDRs gets its family's, once per change,
// before a full sync; other modes ignore them.
func TestCorePassesTheFamilysServiceCIDRs(t *testing.T) {
	mode := &cidrMode{}
	c := newTestCore(mode)
	if !c.UsesServiceCIDRs() || newTestCore(&fakeMode{}).UsesServiceCIDRs() {
		t.Fatal("UsesServiceCIDRs is not whether the mode is a ServiceCIDRUser")
	}
	newTestCore(&fakeMode{}).OnServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")})
	sync := func() {
		t.Helper()
		if err := c.SyncOnce(); err != nil {
			t.Fatal(err)
		}
	}
	localService(c, "a", "10.96.0.1", "node-1")
	sync()
	c.OnServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("fd00::/112"), netip.MustParsePrefix("10.97.0.0/16"), netip.MustParsePrefix("10.96.0.1/16")})
	sync()
	// The same ranges again (another object holding one of them): nothing to do.
	c.OnServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.97.0.0/16"), netip.MustParsePrefix("10.96.0.0/16")})
	sync()
	c.OnServiceCIDRs(nil)
	sync()
	want := []string{"full(1)", "cidrs[10.96.0.0/16 10.97.0.0/16]", "full(1)", "partial()", "cidrs[]", "full(1)"}
	if !slices.Equal(mode.calls, want) {
		t.Errorf("calls %v, want %v", mode.calls, want)
	}
}

// countingMode counts the failed syncs the core reports in a metric of
// its own, as a FailureCounter, and records which kind each was.
type countingMode struct {
	fakeMode
	failures prometheus.Counter
	kinds    []string
}

func (m *countingMode) CountFailure(full bool, err error) {
	m.failures.Inc()
	m.kinds = append(m.kinds, fmt.Sprintf("full=%v %v", full, err))
}

// A FailureCounter mode is told of every failed partial or full sync.
func TestCoreCountsSyncFailures(t *testing.T) {
	failures := prometheus.NewCounter(prometheus.CounterOpts{Name: "failures"})
	counting := &countingMode{failures: failures}
	mode := &counting.fakeMode
	c := newTestCore(counting)
	_ = c.SyncOnce()
	mode.partialErr = ErrFullSyncNeeded
	_ = c.SyncOnce()
	mode.partialErr = errors.New("transaction failed")
	_ = c.SyncOnce()
	mode.fullErr = errors.New("transaction failed")
	_ = c.SyncOnce()
	var m dto.Metric
	if err := failures.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 3 {
		t.Errorf("%v failures counted, want 3 (a partial, then a full and a partial sync)", got)
	}
	want := []string{"full=false transaction failed", "full=false transaction failed", "full=true transaction failed"}
	if !slices.Equal(counting.kinds, want) {
		t.Errorf("failures reported %q, want %q", counting.kinds, want)
	}
}

// deferMode leaves work to the sync after the first, due shortly after it.
type deferMode struct {
	fakeMode
	syncs chan string
	next  time.Time
}

func (m *deferMode) FullSync(state.View) error {
	m.next = time.Now().Add(50 * time.Millisecond)
	m.syncs <- "full"
	return nil
}

func (m *deferMode) PartialSync(state.View, map[state.ServicePortName]bool) error {
	m.next = time.Time{}
	m.syncs <- "partial"
	return nil
}

func (m *deferMode) NextSync() time.Time { return m.next }

// A Deferrer's work is synced when it is due, with nothing changed and
// long before the sync period; then nothing more runs.
func TestCoreSyncsWhenDeferredWorkIsDue(t *testing.T) {
	mode := &deferMode{syncs: make(chan string, 10)}
	c := NewCore(Config{Family: v1.IPv4Protocol, ModeName: "fake", Node: state.Node{Name: "node-1"},
		MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour}, mode)
	c.OnServicesSynced()
	c.OnEndpointSlicesSynced()
	go c.SyncLoop(t.Context())
	for _, want := range []string{"full", "partial"} {
		select {
		case got := <-mode.syncs:
			if got != want {
				t.Fatalf("sync %q, want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s sync", want)
		}
	}
	select {
	case got := <-mode.syncs:
		t.Errorf("a %s sync with nothing due", got)
	case <-time.After(200 * time.Millisecond):
	}
}

// prepareMode records Prepare among the syncs.
type prepareMode struct {
	deferMode
}

func (m *prepareMode) Prepare() { m.syncs <- "prepare" }

// A Preparer prepares once, before the informers have listed, and its
// first sync follows once they have.
func TestCorePreparesAModeBeforeTheInformersHaveListed(t *testing.T) {
	mode := &prepareMode{deferMode{syncs: make(chan string, 10)}}
	c := NewCore(Config{Family: v1.IPv4Protocol, ModeName: "fake", Node: state.Node{Name: "node-1"},
		MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour}, mode)
	go c.SyncLoop(t.Context())
	next := func() string {
		select {
		case got := <-mode.syncs:
			return got
		case <-time.After(5 * time.Second):
			return "nothing"
		}
	}
	if got := next(); got != "prepare" {
		t.Fatalf("first %s, want prepare", got)
	}
	c.OnServicesSynced()
	c.OnEndpointSlicesSynced()
	if got := next(); got != "full" {
		t.Errorf("after prepare: %s, want the full sync", got)
	}
}
