package proxy

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// TestSyncHistoryTimes checks what an explanation says of a change: when
// it was made, and when a successful sync last wrote it, a full sync
// since counting as the later write.
func TestSyncHistoryTimes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	timeAt := func(s int) *time.Time { t := at(s); return &t }
	name := types.NamespacedName{Namespace: "ns", Name: "svc"}
	st := state.NewState()
	tr := state.NewTracker(v1.IPv4Protocol, "node")
	tr.OnService(name, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name},
		Spec:       v1.ServiceSpec{ClusterIP: "10.0.0.1", Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}},
	})
	changes := tr.Apply(st)

	for _, tc := range []struct {
		name          string
		steps         func(h *syncHistory)
		changed, sync *time.Time
	}{
		{"never changed", func(h *syncHistory) {}, nil, nil},
		{"changed, not yet synced", func(h *syncHistory) { h.applied(st, changes.ServicePorts, at(1)) }, timeAt(1), nil},
		{"changed and synced", func(h *syncHistory) {
			h.applied(st, changes.ServicePorts, at(1))
			h.synced(at(1), false)
		}, timeAt(1), timeAt(1)},
		{"a later failed sync", func(h *syncHistory) {
			h.applied(st, changes.ServicePorts, at(1))
			h.synced(at(1), false)
			h.applied(st, changes.ServicePorts, at(2))
		}, timeAt(2), nil},
		{"rewritten by a later full sync", func(h *syncHistory) {
			h.applied(st, changes.ServicePorts, at(1))
			h.synced(at(1), false)
			h.applied(st, nil, at(5))
			h.synced(at(5), true)
		}, timeAt(1), timeAt(5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newSyncHistory()
			tc.steps(&h)
			changed, synced := h.times(name)
			if !sameTime(changed, tc.changed) || !sameTime(synced, tc.sync) {
				t.Fatalf("times %v, %v; want %v, %v", changed, synced, tc.changed, tc.sync)
			}
		})
	}
}

func sameTime(a, b *time.Time) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Equal(*b))
}
