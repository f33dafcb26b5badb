package proxy

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// syncHistory is what an explanation tells of a service's syncs: when the
// service last changed in the state and when a successful sync last wrote
// that change. It also counts the syncs, so that a check of the kernel can
// tell that one ran while it read. The core's lock guards it.
type syncHistory struct {
	changed                map[types.NamespacedName]time.Time
	lastSync, lastFullSync time.Time
	syncs                  int
}

func newSyncHistory() syncHistory {
	return syncHistory{changed: map[types.NamespacedName]time.Time{}}
}

// applied records the changes folded into st by the sync that started at
// start, before it writes anything.
func (h *syncHistory) applied(st *state.State, changed map[state.ServicePortName]bool, start time.Time) {
	h.syncs++
	for name := range changed {
		if len(st.PortsOf(name.NamespacedName)) == 0 {
			delete(h.changed, name.NamespacedName)
		} else {
			h.changed[name.NamespacedName] = start
		}
	}
}

// synced records that the sync that started at start succeeded.
func (h *syncHistory) synced(start time.Time, full bool) {
	if full {
		h.lastFullSync = start
	}
	h.lastSync = start
}

// times are when the service last changed and when that change was last
// written (nil if a sync since has yet to succeed); both nil when the
// history has no change of it.
func (h *syncHistory) times(name types.NamespacedName) (changed, synced *time.Time) {
	at, ok := h.changed[name]
	if !ok {
		return nil, nil
	}
	// Every successful sync writes every change made before it.
	if !h.lastSync.Before(at) {
		written := at
		if h.lastFullSync.After(at) {
			written = h.lastFullSync
		}
		synced = &written
	}
	return &at, synced
}
