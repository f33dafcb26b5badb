package iptables

import (
	"errors"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
)

// drain plans a full sync over a fresh read of the kernel and renders its
// inputs as recordingKernel records them, without restoring any.
func drain(t *testing.T, p testProxier, verifying bool) (string, *fullSyncPlan) {
	t.Helper()
	kernel, err := p.saveKernel()
	if err != nil {
		t.Fatal(err)
	}
	plan := p.planFullSync(kernel, verifying)
	var text strings.Builder
	for step := range plan.inputs {
		text.WriteString("# restore\n")
		io.Copy(&text, step.reader())
	}
	if plan.err != nil {
		t.Fatal(plan.err)
	}
	return text.String(), plan
}

// A full sync's plan is a function of the state and the kernel as read:
// planned twice over the same kernel it gives the same inputs, the ones
// the sync wrote, and the same accounting, and planning changes nothing
// in the syncer. (A plan drains once: its read of the kernel forgets the
// service chains it claims, to keep a restart's memory down.)
func TestPlanningAFullSyncTwiceGivesTheSameInputs(t *testing.T) {
	for _, refs := range []int{0, 50} {
		kernel := &recordingKernel{}
		p := newTestProxier(t, kernel)
		p.cfg.ChainRefsPerRestore = refs
		feed(p, 30)
		if err := p.sync(); err != nil {
			t.Fatal(err)
		}
		applied, counts, rewritten := maps.Clone(p.applied), maps.Clone(p.ruleCounts), slices.Clone(p.rewritten)

		first, firstPlan := drain(t, p, false)
		second, secondPlan := drain(t, p, false)
		if first != second {
			t.Errorf("refs %d: two plans over the same kernel differ", refs)
		}
		if first != kernel.written.String() {
			t.Errorf("refs %d: the plan's inputs:\n%s\nare not what the sync wrote:\n%s", refs, first, kernel.written.String())
		}
		if !reflect.DeepEqual(firstPlan.applied, secondPlan.applied) || !reflect.DeepEqual(firstPlan.rewrites, secondPlan.rewrites) {
			t.Errorf("refs %d: two plans account differently", refs)
		}
		if !reflect.DeepEqual(firstPlan.applied, applied) {
			t.Errorf("refs %d: the plan applies other rules than the sync did", refs)
		}
		if !reflect.DeepEqual(applied, p.applied) || !maps.Equal(counts, p.ruleCounts) || !slices.Equal(rewritten, p.rewritten) {
			t.Errorf("refs %d: planning changed the syncer", refs)
		}
	}
}

// stoppingKernel counts its restores and fails them all.
type stoppingKernel struct {
	recordingKernel
	restores int
}

func (k *stoppingKernel) Restore(input io.Reader) error {
	k.restores++
	return errors.New("iptables-restore: line 2 failed")
}

// A split full sync whose first restore fails plans no further: the
// plan's inputs are pulled one at a time, and the first failure ends the
// pull. The sync accounts for nothing.
func TestSplitFullSyncStopsPlanningAtTheFirstFailedRestore(t *testing.T) {
	kernel := &stoppingKernel{}
	p := newTestProxier(t, kernel)
	p.cfg.ChainRefsPerRestore = 50
	feed(p, 100)
	if err := p.sync(); err == nil || !strings.Contains(err.Error(), "line 2 failed") {
		t.Errorf("sync returned %v, want the restore's error", err)
	}
	if kernel.restores != 1 {
		t.Errorf("%d restores tried, want 1", kernel.restores)
	}
	if len(p.applied) != 0 || len(p.ruleCounts) != 0 {
		t.Errorf("a failed full sync recorded %d services applied and rule counts %v", len(p.applied), p.ruleCounts)
	}
}

// A full sync's tally names its first ten rewritten chains and counts
// every repair.
func TestRewriteTally(t *testing.T) {
	var tally rewriteTally
	for i := range 12 {
		tally.note(iptableskernel.Chain("KUBE-SEP-"+strings.Repeat("A", i+1)), i%3 == 0)
	}
	if len(tally.names) != 10 || tally.names[0] != "KUBE-SEP-A" || tally.repairs != 4 {
		t.Errorf("tally %v, %d repairs; want the first ten names and 4 repairs", tally.names, tally.repairs)
	}
}
