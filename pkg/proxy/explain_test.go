package proxy

import (
	"errors"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// describingMode names one object per service port; its check runs
// onCheck first, so a test can have a sync happen during it.
type describingMode struct {
	fakeMode
	checks  int
	onCheck func()
}

func (m *describingMode) Describe(_ state.View, name state.ServicePortName) ([]KernelObject, func() ([]string, error)) {
	return []KernelObject{{Kind: "thing", Name: name.String()}}, func() ([]string, error) {
		m.checks++
		if m.onCheck != nil {
			m.onCheck()
		}
		return []string{"a difference"}, nil
	}
}

func nsName(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "ns", Name: name}
}

// A service's last change is the sync that took it in; it counts as
// synced once a sync from then on succeeded, the full syncs included.
func TestExplainChangeAndSyncTimes(t *testing.T) {
	mode := &fakeMode{}
	c := newTestCore(mode)
	times := func(name string) (changed, synced string) {
		t.Helper()
		sp := c.Explain(nsName(name), false).ServicePorts[0]
		changed, synced = "nil", "nil"
		if sp.LastChanged != nil {
			changed = sp.LastChanged.String()
		}
		if sp.LastSynced != nil {
			synced = sp.LastSynced.String()
		}
		return changed, synced
	}
	localService(c, "a", "10.96.0.1", "node-1")
	_ = c.SyncOnce()
	if changed, synced := times("a"); changed == "nil" || synced != changed {
		t.Errorf("after a good sync: changed %s, synced %s", changed, synced)
	}
	aChanged, _ := times("a")

	mode.partialErr, mode.fullErr = errors.New("no"), errors.New("no")
	localService(c, "b", "10.96.0.2", "node-1")
	_ = c.SyncOnce()
	if _, synced := times("b"); synced != "nil" {
		t.Errorf("after a failed sync: synced %s, want nil", synced)
	}

	mode.partialErr, mode.fullErr = nil, nil
	_ = c.SyncOnce()
	bChanged, bSynced := times("b")
	if bSynced == "nil" || bSynced == bChanged {
		t.Errorf("after the full sync that followed: changed %s, synced %s", bChanged, bSynced)
	}
	if changed, synced := times("a"); changed != aChanged || synced != bSynced {
		t.Errorf("an unchanged service after a full sync: changed %s (was %s), synced %s (want %s)", changed, aChanged, synced, bSynced)
	}

	c.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}}, true)
	_ = c.SyncOnce()
	if _, kept := c.history.changed[nsName("a")]; kept || len(c.Explain(nsName("a"), false).ServicePorts) != 0 {
		t.Error("a deleted service is still explained or remembered")
	}
}

// A check that a sync overlapped is done again, a bounded number of times.
func TestExplainVerifiesAgainWhenASyncRanMeanwhile(t *testing.T) {
	mode := &describingMode{}
	c := newTestCore(mode)
	localService(c, "a", "10.96.0.1", "node-1")
	_ = c.SyncOnce()

	if e := c.Explain(nsName("a"), false); mode.checks != 0 || e.ServicePorts[0].Kernel.Verify != nil {
		t.Errorf("checked %d times without verify", mode.checks)
	}
	syncsLeft := 1
	mode.onCheck = func() {
		if syncsLeft > 0 {
			syncsLeft--
			_ = c.SyncOnce()
		}
	}
	e := c.Explain(nsName("a"), true)
	if mode.checks != 2 {
		t.Errorf("checked %d times with one sync in between, want 2", mode.checks)
	}
	k := e.ServicePorts[0].Kernel
	if k.Mode != "fake" || len(k.Objects) != 1 || k.Verify == nil || !slices.Equal(k.Verify.Differences, []string{"a difference"}) {
		t.Errorf("kernel: %+v", k)
	}

	mode.checks, syncsLeft = 0, 100
	c.Explain(nsName("a"), true)
	if mode.checks != verifyAttempts {
		t.Errorf("checked %d times with syncs all along, want %d", mode.checks, verifyAttempts)
	}
}

// A dual-stack proxier explains and lists both families.
func TestDualStackExplainsBothFamilies(t *testing.T) {
	v4 := newTestCore(&fakeMode{})
	v6 := NewCore(Config{Family: v1.IPv6Protocol, ModeName: "fake", Node: state.Node{Name: "node-1"}}, &fakeMode{})
	d := DualStack{v4, v6}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"},
		Spec: v1.ServiceSpec{ClusterIPs: []string{"10.96.0.1", "fd00::1"}, Type: v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	d.OnCachedService(state.ServiceOf(svc), false)
	for _, c := range []*Core{v4, v6} {
		if err := c.SyncOnce(); err != nil {
			t.Fatal(err)
		}
	}
	var families []v1.IPFamily
	for _, sp := range d.Explain(nsName("a"), false).ServicePorts {
		families = append(families, sp.Family)
	}
	if !slices.Equal(families, []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}) {
		t.Errorf("explained families %v", families)
	}
	lines := d.ServicePorts()
	if len(lines) != 2 || lines[0].ClusterIP != "10.96.0.1" || lines[1].ClusterIP != "fd00::1" || lines[0].ClusterEndpoints == nil || lines[0].LocalEndpoints != nil {
		t.Errorf("service ports %+v", lines)
	}
}
