// What the iptables mode knows of its rules between full syncs, and how
// the syncs and the watch change it.

package iptables

import "sync"

// ruleState is what the syncer knows of its rules in the kernel. The full
// syncs and the watch (Probe, RepairNext), which run on goroutines of
// their own, change and read it only through the methods below.
type ruleState struct {
	mu sync.Mutex
	// written is set once a full sync has written everything, and cleared
	// when one fails or the watch asks for a repair: until a full sync
	// has written everything again, the probes have nothing to look for.
	written bool
	// repairDue is set when the watch asked for a full sync because it
	// found our rules flushed or changed by another program: that sync
	// compares our chains with the kernel, and logs and counts those it
	// restores. The next full sync takes the request as it starts, and
	// one that fails keeps it, so that the full sync that follows (the
	// core retries) is the repair, logged and counted.
	repairDue bool
}

// phase names where the rules stand, for the tests of the transitions.
type phase string

const (
	// phaseUnknown: no full sync has written everything yet, or the last
	// one failed (and was no repair) or a repair is under way.
	phaseUnknown phase = "unknown"
	// phaseInPlace: a full sync wrote everything, and the watch has
	// reported nothing since.
	phaseInPlace phase = "in place"
	// phaseDrifted: the watch reported another program's flush or change,
	// or a repair failed, and the next full sync is a repair.
	phaseDrifted phase = "drifted"
)

func (s *ruleState) phase() phase {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.repairDue:
		return phaseDrifted
	case s.written:
		return phaseInPlace
	}
	return phaseUnknown
}

// watched tells whether the probes have rules of ours to look for.
func (s *ruleState) watched() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written
}

// askRepair records that the watch found our rules flushed or changed:
// the probes wait, and the next full sync is a repair.
func (s *ruleState) askRepair() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written, s.repairDue = false, true
}

// takeRepair tells a full sync, as it starts, whether it is a repair, and
// clears the request.
func (s *ruleState) takeRepair() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	due := s.repairDue
	s.repairDue = false
	return due
}

// wrote records that a full sync wrote everything.
func (s *ruleState) wrote() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written = true
}

// lost records that a full sync failed: what it had written of its inputs
// is not all. A repair (the sync took a request) keeps the request for
// the next full sync.
func (s *ruleState) lost(repair bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written = false
	s.repairDue = s.repairDue || repair
}
