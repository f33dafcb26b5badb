package iptables

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	v1 "k8s.io/api/core/v1"
)

// Each row runs events on a fresh state and names where it ends: the
// phase, whether the probes look for our rules, and whether a repair is
// due. Events: "wrote" and "lost" (a full sync wrote everything, or
// failed), "ask" (the watch asked for a repair) and "take" (a full sync
// took the request as it started; "lost" tells the state whether the
// last take found one).
func TestRuleStateTransitions(t *testing.T) {
	tests := []struct {
		name    string
		events  []string
		want    phase
		watched bool
		repair  bool
	}{
		{"fresh", nil, phaseUnknown, false, false},
		{"the first full sync", []string{"take", "wrote"}, phaseInPlace, true, false},
		{"a failed first full sync", []string{"take", "lost"}, phaseUnknown, false, false},
		{"a flush or change reported", []string{"take", "wrote", "ask"}, phaseDrifted, false, true},
		{"a repair under way", []string{"take", "wrote", "ask", "take"}, phaseUnknown, false, false},
		{"a repair written", []string{"take", "wrote", "ask", "take", "wrote"}, phaseInPlace, true, false},
		{"a failed repair keeps the request", []string{"take", "wrote", "ask", "take", "lost"}, phaseDrifted, false, true},
		{"the full sync after a failed repair is the repair", []string{"take", "wrote", "ask", "take", "lost", "take", "wrote"}, phaseInPlace, true, false},
		{"a failed repair, retried and failed again, still keeps it", []string{"ask", "take", "lost", "take", "lost"}, phaseDrifted, false, true},
		{"a repair asked for before anything was written", []string{"ask", "take", "wrote"}, phaseInPlace, true, false},
		{"asked twice, repaired once", []string{"ask", "ask", "take", "wrote"}, phaseInPlace, true, false},
		// The watch runs beside the syncs: a request while a full sync
		// writes is for the next one, and the probes look meanwhile.
		{"a request during a full sync", []string{"take", "ask", "wrote"}, phaseDrifted, true, true},
		{"a request during a failed full sync", []string{"take", "ask", "lost"}, phaseDrifted, false, true},
		{"a full sync fails after one wrote everything", []string{"take", "wrote", "take", "lost"}, phaseUnknown, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s ruleState
			took := false
			for _, e := range tc.events {
				applyRuleEvent(t, &s, e, &took)
			}
			if got := s.phase(); got != tc.want {
				t.Errorf("phase %q, want %q", got, tc.want)
			}
			if got := s.watched(); got != tc.watched {
				t.Errorf("watched: %v, want %v", got, tc.watched)
			}
			if s.repairDue != tc.repair {
				t.Errorf("repair due: %v, want %v", s.repairDue, tc.repair)
			}
		})
	}
}

// Only the full sync that takes the request is a repair, once.
func TestRuleStateTakeRepairOnce(t *testing.T) {
	var s ruleState
	if s.takeRepair() {
		t.Error("a repair without a request")
	}
	s.askRepair()
	s.askRepair()
	if !s.takeRepair() || s.takeRepair() {
		t.Error("a request is not taken exactly once")
	}
}

// The syncer goes through the phases as its full syncs and the watch move
// it: the probes wait until a full sync wrote everything, a repair request
// stops them until a full sync has written everything again, a failed
// repair leaves the next full sync a repair, and any other failed full
// sync leaves the rules unknown.
func TestSyncerPhases(t *testing.T) {
	kernel := &refusingKernel{}
	p := newTestProxier(t, kernel)
	expect := func(when string, want phase) {
		t.Helper()
		if got := p.ruleState.phase(); got != want {
			t.Errorf("%s: phase %q, want %q", when, got, want)
		}
	}
	fullSync := func() error {
		t.Helper()
		p.RequestFullSync()
		return p.sync()
	}
	expect("fresh", phaseUnknown)
	feed(p, 3)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	expect("after the first full sync", phaseInPlace)
	p.RepairNext()
	expect("after a repair request", phaseDrifted)
	if gone, changed := p.Probe(t.Context()); gone != "" || changed {
		t.Errorf("a probe during a repair reported %q, %v", gone, changed)
	}
	kernel.refusals = 1
	if err := fullSync(); err == nil {
		t.Fatal("the refused full sync succeeded")
	}
	expect("after a failed repair", phaseDrifted)
	if err := fullSync(); err != nil {
		t.Fatal(err)
	}
	expect("after the next full sync", phaseInPlace)
	kernel.refusals = 1
	if err := fullSync(); err == nil {
		t.Fatal("the refused full sync succeeded")
	}
	expect("after a failed full sync that was no repair", phaseUnknown)
}

// A repair the watch asked for survives a failed full sync: the full sync
// the core retries is the repair, counted once. With no services, what a
// full sync rewrites over the fake kernel (which lists nothing) is the
// fixed chains and jumps, repairs only in a repair.
func TestFailedRepairIsRetriedAsRepair(t *testing.T) {
	kernel := &refusingKernel{}
	p := newTestProxier(t, kernel)
	feed(p, 0)
	fullSync := func() error {
		t.Helper()
		p.RequestFullSync()
		return p.sync()
	}
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	before := flushRecoveries(t)
	p.RepairNext()
	kernel.refusals = 1
	if err := fullSync(); err == nil {
		t.Fatal("the refused full sync succeeded")
	}
	if got := flushRecoveries(t) - before; got != 0 {
		t.Errorf("the failed repair counted %v recoveries, want 0", got)
	}
	if err := fullSync(); err != nil {
		t.Fatal(err)
	}
	if p.repairs == 0 {
		t.Errorf("the full sync after the failed repair repaired nothing (rewrote %v)", p.rewritten)
	}
	if got := flushRecoveries(t) - before; got != 1 {
		t.Errorf("the retried repair counted %v recoveries, want 1", got)
	}
	if err := fullSync(); err != nil {
		t.Fatal(err)
	}
	if got := flushRecoveries(t) - before; got != 1 || p.repairs != 0 {
		t.Errorf("a full sync after the repair: %v recoveries in all, %d repairs; want 1 and 0", got, p.repairs)
	}
}

// flushRecoveries is the IPv4 family's count of repairs.
func flushRecoveries(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.IPTablesFlushRecoveriesTotal.WithLabelValues(string(v1.IPv4Protocol)).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// applyRuleEvent runs one event of TestRuleStateTransitions; took is
// what the last take found.
func applyRuleEvent(t *testing.T, s *ruleState, event string, took *bool) {
	t.Helper()
	switch event {
	case "wrote":
		s.wrote()
	case "lost":
		s.lost(*took)
	case "ask":
		s.askRepair()
	case "take":
		*took = s.takeRepair()
	default:
		t.Fatalf("unknown event %q", event)
	}
}
