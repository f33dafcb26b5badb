package nftables

import (
	"errors"
	"fmt"
	"testing"
)

// Each row runs events on a fresh state and names where it ends: the
// phase, the generation the table is known in place at, and whether a
// repair is due. Events: "read@G" (a full sync read the table at G;
// "read-absent@G" found none, "read@?" could not read the generation),
// "lost", "wrote G>H" (a transaction of ours moved the generation from G
// to H; "wrote ?>H" could not read it before), "confirmed G@H" (the watch
// saw G, then found the table in place at H), "ask" and "take" (a repair
// asked for, and taken by a full sync).
func TestTableStateTransitions(t *testing.T) {
	tests := []struct {
		name     string
		events   []string
		want     phase
		verified uint64
		repair   bool
	}{
		{"fresh", nil, phaseUnknown, 0, false},
		{"read", []string{"read@5"}, phaseInPlace, 5, false},
		{"read without a table", []string{"read-absent@5"}, phaseAbsent, 5, false},
		{"read without the generation", []string{"read@?"}, phaseInPlace, 0, false},
		{"our transaction", []string{"read@5", "wrote 5>6"}, phaseInPlace, 6, false},
		{"our transaction after another's change", []string{"read@5", "wrote 6>7"}, phaseInPlace, 5, false},
		{"a transaction interleaved with another's", []string{"read@5", "wrote 5>7"}, phaseInPlace, 5, false},
		{"a transaction without the generation before it", []string{"read@5", "wrote ?>6"}, phaseInPlace, 5, false},
		{"the generation wraps at 32 bits", []string{"read@4294967295", "wrote 4294967295>4294967296"}, phaseInPlace, 4294967296, false},
		{"the watch finds the table in place", []string{"read@5", "confirmed 5@9"}, phaseInPlace, 9, false},
		{"a sync moved the generation while the watch looked", []string{"read@5", "confirmed 5@9", "wrote 9>10", "confirmed 9@12"}, phaseInPlace, 10, false},
		{"a failed transaction", []string{"read@5", "lost"}, phaseUnknown, 5, false},
		{"read again after a failure", []string{"read@5", "lost", "read@8"}, phaseInPlace, 8, false},
		{"a repair asked for", []string{"read@5", "ask"}, phaseInPlace, 5, true},
		{"a repair taken", []string{"read@5", "ask", "take"}, phaseInPlace, 5, false},
		{"a failure keeps the repair due", []string{"read@5", "ask", "lost"}, phaseUnknown, 5, true},
		{"a repair asked for while unknown", []string{"ask", "take", "read@3"}, phaseInPlace, 3, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s tableState
			for _, e := range tc.events {
				applyEvent(t, &s, e)
			}
			if got := s.phase(); got != tc.want {
				t.Errorf("phase %q, want %q", got, tc.want)
			}
			if s.verified != tc.verified {
				t.Errorf("verified at %d, want %d", s.verified, tc.verified)
			}
			if s.repairDue != tc.repair {
				t.Errorf("repair due: %v, want %v", s.repairDue, tc.repair)
			}
		})
	}
}

// Only a full sync that takes the request is a repair, once.
func TestTakeRepairOnce(t *testing.T) {
	var s tableState
	if s.takeRepair() {
		t.Error("a repair without a request")
	}
	s.askRepair()
	s.askRepair()
	if !s.takeRepair() || s.takeRepair() {
		t.Error("a request is not taken exactly once")
	}
}

// The watch looks for a table of ours only once one is in place.
func TestWatchedOnlyInPlace(t *testing.T) {
	var s tableState
	if _, written := s.watched(); written {
		t.Error("an unknown table is watched")
	}
	applyEvent(t, &s, "read-absent@2")
	if _, written := s.watched(); written {
		t.Error("an absent table is watched")
	}
	s.kernel.exists = true // as the first transaction makes it
	if gen, written := s.watched(); !written || gen != 2 {
		t.Errorf("watched at %d (%v), want 2", gen, written)
	}
}

// applyEvent runs one event of TestTableStateTransitions.
func applyEvent(t *testing.T, s *tableState, event string) {
	t.Helper()
	var a, b uint64
	noGen := errors.New("no generation")
	switch {
	case event == "lost":
		s.lost()
	case event == "ask":
		s.askRepair()
	case event == "take":
		s.takeRepair()
	case event == "read@?":
		s.read(inPlaceTable(), 0, noGen)
	case scan(event, "read@%d", &a):
		s.read(inPlaceTable(), a, nil)
	case scan(event, "read-absent@%d", &a):
		s.read(newTable(), a, nil)
	case scan(event, "wrote ?>%d", &b):
		s.wrote(0, noGen, b, nil)
	case scan(event, "wrote %d>%d", &a, &b):
		s.wrote(a, nil, b, nil)
	case scan(event, "confirmed %d@%d", &a, &b):
		s.confirmed(a, b)
	default:
		t.Fatalf("unknown event %q", event)
	}
}

func scan(event, format string, args ...any) bool {
	n, err := fmt.Sscanf(event, format, args...)
	return err == nil && n == len(args)
}

func inPlaceTable() *table {
	t := newTable()
	t.exists = true
	return t
}
