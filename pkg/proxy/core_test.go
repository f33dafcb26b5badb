package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

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
