package ipvs

import (
	"errors"
	"testing"
)

// Each row runs events on a fresh state and names where it ends: the
// phase, whether the drift check has a snapshot (the last event's), and
// what the last full sync repaired. Events: "full" (a full sync that
// succeeds), "full-failed", "partial" (a partial sync) and "found" (the
// drift check finds another program's change).
func TestKernelStateTransitions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    []string
		want      phase
		published bool
		repaired  string
	}{
		{"fresh", nil, phaseUnknown, false, ""},
		{"a partial sync before any full one publishes nothing", []string{"partial"}, phaseUnknown, false, ""},
		{"a full sync", []string{"full"}, phaseInPlace, true, ""},
		{"a failed full sync", []string{"full-failed"}, phaseUnknown, false, ""},
		{"a failed full sync after a good one", []string{"full", "full-failed"}, phaseUnknown, false, ""},
		{"a partial sync after a full one", []string{"full", "partial"}, phaseInPlace, true, ""},
		{"a change found", []string{"full", "found"}, phaseDrifted, true, ""},
		{"a partial sync does not repair", []string{"full", "found", "partial"}, phaseDrifted, true, ""},
		{"the next full sync repairs it", []string{"full", "found", "full"}, phaseInPlace, true, "ipset KUBE-CLUSTER-IP"},
		{"a failed full sync leaves it to the next", []string{"full", "found", "full-failed"}, phaseUnknown, false, ""},
		{"repaired after a failure", []string{"full", "found", "full-failed", "full"}, phaseInPlace, true, "ipset KUBE-CLUSTER-IP"},
		{"repaired once", []string{"full", "found", "full", "full"}, phaseInPlace, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s kernelState
			var last *appliedSnapshot
			repaired := ""
			for _, e := range tc.events {
				switch e {
				case "full", "full-failed":
					last = emptySnapshot()
					s.publish(last, true)
					var err error
					if e == "full-failed" {
						err = errors.New("refused")
					}
					repaired = ""
					if r := s.fullSyncEnded(err); r != nil {
						repaired = *r
					}
				case "partial":
					last = emptySnapshot()
					s.publish(last, false)
				case "found":
					s.found("ipset KUBE-CLUSTER-IP")
				default:
					t.Fatalf("unknown event %q", e)
				}
			}
			if got := s.phase(); got != tc.want {
				t.Errorf("phase %q, want %q", got, tc.want)
			}
			if got := s.published(); (got != nil) != tc.published || (got != nil && got != last) {
				t.Errorf("published %p, want one: %v (the last event's, %p)", got, tc.published, last)
			}
			if repaired != tc.repaired {
				t.Errorf("repaired %q, want %q", repaired, tc.repaired)
			}
		})
	}
}

// The jump is taken to be there, without a listing, only at the
// generation a listing found it at.
func TestJumpCache(t *testing.T) {
	unreadable := errors.New("no generation")
	for _, tc := range []struct {
		name   string
		found  bool
		genErr error
		// at5 and at6: whether it is still there at generations 5 and 6.
		at5, at6 bool
	}{
		{"found at 5", true, nil, true, false},
		{"missing at 5", false, nil, false, false},
		{"found, the generation unreadable", true, unreadable, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c jumpCache
			if c.stillThere(0, nil) {
				t.Fatal("a jump never listed is taken to be there")
			}
			c.listed(tc.found, 5, tc.genErr)
			if got := c.stillThere(5, nil); got != tc.at5 {
				t.Errorf("at 5: %v, want %v", got, tc.at5)
			}
			if got := c.stillThere(6, nil); got != tc.at6 {
				t.Errorf("at 6: %v, want %v", got, tc.at6)
			}
			if c.stillThere(5, unreadable) {
				t.Error("there at a generation that could not be read")
			}
		})
	}
}
