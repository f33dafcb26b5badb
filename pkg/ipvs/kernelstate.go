// What the IPVS mode knows of its kernel state between syncs, and how the
// syncs and the drift check change it.

package ipvs

import "sync/atomic"

// kernelState is what the syncer knows of what it wrote. The syncs change
// it under the syncer's mu, through the methods below; the drift check,
// which never takes mu, reads the snapshot and records what it found.
type kernelState struct {
	// written is set once a full sync succeeded, until one fails: from
	// then on the kernel should hold what the counts say, and each sync
	// publishes its snapshot.
	written bool
	// snapshot is the one the drift check compares the kernel with: nil
	// until a full sync publishes one, and after one failed (the kernel
	// holds an unknown part of it).
	snapshot atomic.Pointer[appliedSnapshot]
	// drifted is what the last drift check found changed by another
	// program, until a full sync has put it back.
	drifted atomic.Pointer[string]
}

// phase names where the kernel state stands, for the tests of the
// transitions.
type phase string

const (
	// phaseUnknown: no full sync succeeded yet, or one failed since.
	phaseUnknown phase = "unknown"
	// phaseInPlace: the kernel holds what we wrote, as far as we know.
	phaseInPlace phase = "in place"
	// phaseDrifted: the drift check found another program's change,
	// which the next full sync puts back.
	phaseDrifted phase = "drifted"
)

func (s *kernelState) phase() phase {
	switch {
	case !s.written:
		return phaseUnknown
	case s.drifted.Load() != nil:
		return phaseDrifted
	}
	return phaseInPlace
}

// publish gives the drift check a sync's snapshot: a full sync's always
// (it is read back only if the sync succeeds), a partial one's once the
// kernel is known.
func (s *kernelState) publish(next *appliedSnapshot, full bool) {
	if full || s.written {
		s.snapshot.Store(next)
	}
}

// published is the snapshot the drift check compares with; nil when
// there is none to compare with.
func (s *kernelState) published() *appliedSnapshot { return s.snapshot.Load() }

// fullSyncEnded records a full sync's outcome. A successful one puts back
// what the drift check found, which it returns (nil if nothing).
func (s *kernelState) fullSyncEnded(err error) (repaired *string) {
	s.written = err == nil
	if err != nil {
		s.snapshot.Store(nil)
		return nil
	}
	return s.drifted.Swap(nil)
}

// found records a drift check's finding, for the full sync that repairs
// it.
func (s *kernelState) found(drift string) { s.drifted.Store(&drift) }

// jumpCache spares the drift check a listing of nat PREROUTING: the jump
// into KUBE-SERVICES is there while the table's generation is the one it
// was last seen at. Only the drift check uses it.
type jumpCache struct {
	seenAt uint64
	seen   bool
}

// stillThere tells whether the jump is known to be there at generation
// gen (read without error).
func (c *jumpCache) stillThere(gen uint64, genErr error) bool {
	return genErr == nil && c.seen && gen == c.seenAt
}

// listed records what a listing found: the jump there or not, at gen
// (remembered only if it could be read).
func (c *jumpCache) listed(found bool, gen uint64, genErr error) {
	c.seen, c.seenAt = found && genErr == nil, gen
}
