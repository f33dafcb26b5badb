package ipvs

import (
	"iter"
	"maps"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
)

// objectCounts counts how many service ports want each set entry: an
// entry stays while one still does (the snapshot counts the addresses and
// owns the virtual servers).
type objectCounts struct {
	entries map[SetEntry]int
	// setSizes count each set's entries in the kernel, and waiting the
	// entries wanted but not there because their set was full (by the
	// order they came in: seq), waitingIn by set.
	setSizes  map[string]int
	waiting   map[SetEntry]uint64
	waitingIn map[string]int
	seq       uint64
	outFilter map[iptables.Rule]int
}

func newObjectCounts() objectCounts {
	return objectCounts{
		entries: map[SetEntry]int{}, setSizes: map[string]int{}, outFilter: map[iptables.Rule]int{},
		waiting: map[SetEntry]uint64{}, waitingIn: map[string]int{},
	}
}

// countsEdit is the next objectCounts as a diff decides it, read through
// to the counts it starts from, which it never changes: the syncer's stay
// as they are until commit.
type countsEdit struct {
	entries   mapEdit[SetEntry, int]
	setSizes  mapEdit[string, int]
	waiting   mapEdit[SetEntry, uint64]
	waitingIn mapEdit[string, int]
	outFilter mapEdit[iptables.Rule, int]
	seq       uint64
}

// edit starts the next counts from o.
func (o *objectCounts) edit() countsEdit {
	return countsEdit{
		entries: overlay(o.entries), setSizes: overlay(o.setSizes), waiting: overlay(o.waiting),
		waitingIn: overlay(o.waitingIn), outFilter: overlay(o.outFilter), seq: o.seq,
	}
}

// freshCounts starts counts from none (a full sync).
func freshCounts() countsEdit {
	o := newObjectCounts()
	return countsEdit{
		entries: fresh(o.entries), setSizes: fresh(o.setSizes), waiting: fresh(o.waiting),
		waitingIn: fresh(o.waitingIn), outFilter: fresh(o.outFilter),
	}
}

// done writes the edit into the counts it started from and returns them;
// only commit calls it.
func (e *countsEdit) done() objectCounts {
	emptied := e.waiting.len() == 0 && len(e.waiting.gone) > 0
	o := objectCounts{
		entries: e.entries.done(), setSizes: e.setSizes.done(), waiting: e.waiting.done(),
		waitingIn: e.waitingIn.done(), outFilter: e.outFilter.done(), seq: e.seq,
	}
	if emptied {
		o.waiting = map[SetEntry]uint64{} // a map keeps its largest size
	}
	return o
}

func (e *countsEdit) isWaiting(s SetEntry) bool {
	_, ok := e.waiting.get(s)
	return ok
}

func (e *countsEdit) wait(s SetEntry) {
	e.seq++
	e.waiting.set(s, e.seq)
	addCount(&e.waitingIn, s.Set, 1)
}

func (e *countsEdit) unwait(s SetEntry) {
	e.waiting.delete(s)
	addCount(&e.waitingIn, s.Set, -1)
}

func (e *countsEdit) resize(set string, by int) { addCount(&e.setSizes, set, by) }

// addCount adds by to k's count and returns it; a count of 0 is no entry.
func addCount[K comparable](m *mapEdit[K, int], k K, by int) int {
	n, _ := m.get(k)
	if n += by; n == 0 {
		m.delete(k)
	} else {
		m.set(k, n)
	}
	return n
}

// mapEdit is the next version of a map: its reads fall through to base,
// which it leaves alone until done writes the changes in. A fresh one
// owns its base and writes into it directly (a full sync at 10,000
// services would otherwise hold every entry twice).
type mapEdit[K comparable, V any] struct {
	base map[K]V
	own  bool
	// changed and gone are the keys set and deleted, made at the first
	// of each: a partial sync leaves most counts alone.
	changed map[K]V
	gone    map[K]bool
	n       int
}

// overlay starts an edit of base.
func overlay[K comparable, V any](base map[K]V) mapEdit[K, V] {
	return mapEdit[K, V]{base: base, n: len(base)}
}

// fresh starts an edit of the empty map base, which it owns.
func fresh[K comparable, V any](base map[K]V) mapEdit[K, V] {
	return mapEdit[K, V]{base: base, own: true}
}

func (m *mapEdit[K, V]) get(k K) (V, bool) {
	if !m.own {
		if v, ok := m.changed[k]; ok || m.gone[k] {
			return v, ok
		}
	}
	v, ok := m.base[k]
	return v, ok
}

func (m *mapEdit[K, V]) set(k K, v V) {
	if m.own {
		m.base[k] = v
		return
	}
	if _, ok := m.get(k); !ok {
		m.n++
	}
	delete(m.gone, k)
	if m.changed == nil {
		m.changed = map[K]V{}
	}
	m.changed[k] = v
}

func (m *mapEdit[K, V]) delete(k K) {
	if m.own {
		delete(m.base, k)
		return
	}
	if _, ok := m.get(k); !ok {
		return
	}
	m.n--
	delete(m.changed, k)
	if _, ok := m.base[k]; ok {
		if m.gone == nil {
			m.gone = map[K]bool{}
		}
		m.gone[k] = true
	}
}

func (m *mapEdit[K, V]) len() int {
	if m.own {
		return len(m.base)
	}
	return m.n
}

// keys yields the edited map's keys, in no order.
func (m *mapEdit[K, V]) keys() iter.Seq[K] {
	return func(yield func(K) bool) {
		for k := range m.all() {
			if !yield(k) {
				return
			}
		}
	}
}

// all yields the edited map's entries, in no order.
func (m *mapEdit[K, V]) all() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for k, v := range m.base {
			if !m.own {
				if _, ok := m.changed[k]; ok || m.gone[k] {
					continue
				}
			}
			if !yield(k, v) {
				return
			}
		}
		for k, v := range m.changed {
			if !yield(k, v) {
				return
			}
		}
	}
}

// copied is a copy of the edited map, sized once.
func (m *mapEdit[K, V]) copied() map[K]V {
	out := maps.Clone(m.base)
	if out == nil {
		out = map[K]V{}
	}
	for k := range m.gone {
		delete(out, k)
	}
	maps.Copy(out, m.changed)
	return out
}

// done writes the changes into base and returns it; the edit must not be
// used after.
func (m *mapEdit[K, V]) done() map[K]V {
	for k := range m.gone {
		delete(m.base, k)
	}
	for k, v := range m.changed {
		m.base[k] = v
	}
	return m.base
}
