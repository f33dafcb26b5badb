// What the nftables mode knows of its table between syncs, and how the
// syncs and the watch change it.

package nftables

// tableState is what the syncer knows of its table. The syncs and the
// watch change it only through the methods below, under the syncer's mu.
type tableState struct {
	// kernel mirrors the table: read by a full sync and kept up to date
	// by each sync once all its transactions went through. It is nil while the table is unknown: before
	// the first full sync, and after a failed one or a failed
	// transaction (earlier transactions of a split sync went through), so
	// that no partial sync writes until a full sync has read it again.
	kernel *table
	// verified is the ruleset generation at which the table last held
	// what we wrote, as far as we know: read before a full sync's
	// listing, moved on by each transaction of ours that alone moved it,
	// and by the watch when it found the table in place. The watch lists
	// the table only when the generation is another.
	verified uint64
	// repairDue is set when the watch asked for a full sync because
	// another program changed the ruleset: that sync compares the whole
	// table with what was applied, and logs and counts the chains it
	// restores. A failed sync keeps the request for the next full one.
	repairDue bool
}

// phase names where the table stands, for logs and tests.
type phase string

const (
	// phaseUnknown: not read yet, or a sync failed since.
	phaseUnknown phase = "unknown"
	// phaseAbsent: read, and there is no table: nothing of ours to watch.
	phaseAbsent phase = "absent"
	// phaseInPlace: the table holds what we wrote, as far as we know.
	phaseInPlace phase = "in place"
)

func (s *tableState) phase() phase {
	switch {
	case s.kernel == nil:
		return phaseUnknown
	case !s.kernel.exists:
		return phaseAbsent
	}
	return phaseInPlace
}

// read records a full sync's reading of the table, at generation gen
// when it could be read (genErr nil). The mirror keeps the prints of the
// rules read, not their text.
func (s *tableState) read(t *table, gen uint64, genErr error) {
	t.printed()
	s.kernel = t
	if genErr == nil {
		s.verified = gen
	}
}

// lost records that the table is unknown: a full sync could not read it,
// or a transaction failed.
func (s *tableState) lost() { s.kernel = nil }

// wrote records one transaction of ours, with the generation before and
// after it (nil errors when they could be read): when it alone moved the
// generation from one the table was in place at, the table is in place
// at the new one. A change that slipped in before it is not taken for
// ours.
func (s *tableState) wrote(before uint64, beforeErr error, after uint64, afterErr error) {
	if beforeErr == nil && afterErr == nil && before == s.verified && uint32(after) == uint32(before)+1 {
		s.verified = after
	}
}

// watched is what the watch compares the generation with, and whether
// there is a table of ours to watch.
func (s *tableState) watched() (verified uint64, written bool) {
	return s.verified, s.phase() == phaseInPlace
}

// confirmed records that the watch found the table in place at gen,
// having seen verified before it looked; unless a sync moved verified on
// meanwhile, the table is in place at gen.
func (s *tableState) confirmed(verified, gen uint64) {
	if s.verified == verified {
		s.verified = gen
	}
}

// askRepair has the next full sync compare and count as a repair.
func (s *tableState) askRepair() { s.repairDue = true }

// takeRepair tells a full sync whether it is a repair, and clears the
// request.
func (s *tableState) takeRepair() bool {
	due := s.repairDue
	s.repairDue = false
	return due
}
