package nftables

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// syncerState is what a sync's plan reads of the Syncer, deep-copied.
type syncerState struct {
	table    *table
	verified uint64
	layout   Layout
	applied  map[state.ServicePortName]appliedObjects
	wanted   map[elemID]wantedElem
	stale    map[string]staleChain
}

func stateOf(s *Syncer) syncerState {
	st := syncerState{verified: s.table.verified, layout: s.layout, applied: maps.Clone(s.applied),
		wanted: map[elemID]wantedElem{}, stale: maps.Clone(s.stale)}
	for id, we := range s.wanted {
		st.wanted[id] = slices.Clone(we)
	}
	if t := s.table.kernel; t != nil {
		st.table = &table{exists: t.exists, comment: t.comment, chains: map[string]*tableChain{}, sets: map[string]*tableSet{}, counters: maps.Clone(t.counters)}
		for name, c := range t.chains {
			ch := *c.Chain
			st.table.chains[name] = &tableChain{Chain: &ch, Rules: slices.Clone(c.Rules), print: c.print}
		}
		for name, ts := range t.sets {
			st.table.sets[name] = &tableSet{Set: ts.Set, elements: maps.Clone(ts.elements), comments: maps.Clone(ts.comments)}
		}
	}
	return st
}

// planText is what a plan's transactions write.
func planText(h *harness, w *write) string {
	var b strings.Builder
	for _, tx := range w.transactions() {
		b.WriteString(tx.transaction(h.nft).String() + "--\n")
	}
	return b.String()
}

// changedSample is the sample after a sync, with a service removed (its
// chains flushed and stale, its elements and affinity sets deleted), and
// another's endpoints changed.
func changedSample(t *testing.T) *harness {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(sampleObjects()...)
	h.full()
	h.tracker.OnService(types.NamespacedName{Namespace: "hx-conf", Name: "fid-a"}, nil)
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.11"), ep("10.244.1.15")))
	return h
}

// Planning a sync, full or partial, leaves the Syncer as it was: planning
// twice gives the same transactions.
func TestPlanningLeavesTheSyncerUnchanged(t *testing.T) {
	for name, plan := range map[string]func(h *harness) *write{
		"full":    func(h *harness) *write { return h.syncer.planFull(h.view(), h.syncer.appliedChains()) },
		"partial": func(h *harness) *write { return h.syncer.planPartial(h.view(), h.changed) },
	} {
		t.Run(name, func(t *testing.T) {
			h := changedSample(t)
			before := stateOf(h.syncer)
			first := planText(h, plan(h))
			if !strings.Contains(first, "10.244.1.15") || !strings.Contains(first, "flush chain ip kube-proxy service-DMA2WJPR-hx-conf/fid-a/tcp/http") {
				t.Fatalf("the plan lacks the changes:\n%s", first)
			}
			if !reflect.DeepEqual(stateOf(h.syncer), before) {
				t.Error("planning changed the Syncer")
			}
			if second := planText(h, plan(h)); second != first {
				t.Errorf("planned again (+) differs:\n%s", testutil.LineDiff(first, second))
			}
		})
	}
}

// A sync whose transaction fails leaves what the Syncer knows of the
// service ports as it was, the table unknown; the full sync after it
// writes the changes.
func TestAFailedSyncCommitsNothing(t *testing.T) {
	h := changedSample(t)
	before := stateOf(h.syncer)
	h.nft.failNext = true
	if err := h.syncer.PartialSync(h.view(), h.changed); err == nil {
		t.Fatal("the sync did not fail")
	}
	after := stateOf(h.syncer)
	if after.table != nil {
		t.Error("the table is still known after a failed transaction")
	}
	after.table = before.table
	if !reflect.DeepEqual(after, before) {
		t.Error("the failed sync changed what the Syncer knows")
	}
	h.full()
	if last := h.nft.last(); !strings.Contains(last, "10.244.1.15") {
		t.Errorf("the full sync after did not write the change:\n%s", last)
	}
	// The removed service's chains, flushed, are deleted by a later sync.
	h.syncer.now = func() time.Time { return time.Now().Add(staleChainDelay) }
	h.full()
	checkAgainstFreshSync(t, h)
}
