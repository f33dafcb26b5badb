package nftables

import (
	"maps"
	"slices"
)

// tableOverlay is the table as a sync's plan leaves it: base, which
// planning never changes, under the plan's changes, which commit writes
// into base once every transaction went through. A partial sync's
// changes are few: nothing of base is copied.
type tableOverlay struct {
	base   *table
	exists bool
	// chains are the chains added, rewritten or flushed: their prints,
	// as base's (see table.printed).
	chains map[string]*tableChain
	// sets are the sets and maps added or re-created (empty, and the
	// overlay's to change), nil for those deleted.
	sets map[string]*tableSet
	// counters are the counters added (true) or deleted (false).
	counters map[string]bool
	// elements are the changed elements of base's sets: the value, nil
	// for one deleted.
	elements map[elemID]*string
}

// tableSets finds a set or map the table holds (nil when none), as a
// transaction leaves it: the netlink writer types elements by it.
type tableSets interface {
	set(name string) *tableSet
}

func (t *table) set(name string) *tableSet { return t.sets[name] }

func newOverlay(base *table) *tableOverlay {
	return &tableOverlay{base: base, exists: base.exists, chains: map[string]*tableChain{}, sets: map[string]*tableSet{},
		counters: map[string]bool{}, elements: map[elemID]*string{}}
}

func (o *tableOverlay) chain(name string) (*tableChain, bool) {
	if c, ok := o.chains[name]; ok {
		return c, true
	}
	c, ok := o.base.chains[name]
	return c, ok
}

// chainNames are the names of every chain, sorted.
func (o *tableOverlay) chainNames() []string {
	return mergedNames(o.base.chains, o.chains, func(*tableChain) bool { return true })
}

func (o *tableOverlay) set(name string) *tableSet {
	if ts, ok := o.sets[name]; ok {
		return ts
	}
	return o.base.sets[name]
}

// setNames are the names of every set and map, sorted.
func (o *tableOverlay) setNames() []string {
	return mergedNames(o.base.sets, o.sets, func(ts *tableSet) bool { return ts != nil })
}

func (o *tableOverlay) hasCounter(name string) bool {
	if has, ok := o.counters[name]; ok {
		return has
	}
	return o.base.counters[name]
}

// counterNames are the names of every counter, sorted.
func (o *tableOverlay) counterNames() []string {
	return mergedNames(o.base.counters, o.counters, func(has bool) bool { return has })
}

// mergedNames are the keys of base and changes, sorted, less those whose
// change is not kept.
func mergedNames[V any](base, changes map[string]V, kept func(V) bool) []string {
	var names []string
	for name := range base {
		if v, ok := changes[name]; !ok || kept(v) {
			names = append(names, name)
		}
	}
	for name, v := range changes {
		if _, ok := base[name]; !ok && kept(v) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// owned tells whether the set is the overlay's own (added or
// re-created), whose elements it changes in place.
func (o *tableOverlay) owned(name string) bool { return o.sets[name] != nil }

// element is the value of an element of a set the table holds.
func (o *tableOverlay) element(id elemID) (string, bool) {
	if v, ok := o.elements[id]; ok && !o.owned(id.container) {
		if v == nil {
			return "", false
		}
		return *v, true
	}
	ts := o.set(id.container)
	if ts == nil {
		return "", false
	}
	v, ok := ts.elements[id.key]
	return v, ok
}

// setElement has the set hold the element with value; deleteElement
// drops it.
func (o *tableOverlay) setElement(id elemID, value string) {
	if o.owned(id.container) {
		o.sets[id.container].elements[id.key] = value
		return
	}
	o.elements[id] = &value
}

// shareChainName and shareElement have base hold a chain's name, or an
// element's key and value, as the strings the syncer keeps (in applied
// and wanted) and not as equal ones of its own: after a full sync read
// the table, base's are the reader's copies, which would stay beside
// ours. Base holds what it held, so it is changed in place (a map
// assignment to a key present stores the new key).
func (o *tableOverlay) shareChainName(name string) {
	if _, changed := o.chains[name]; !changed {
		if c, ok := o.base.chains[name]; ok {
			o.base.chains[name] = c
		}
	}
}

func (o *tableOverlay) shareElement(id elemID, value string) {
	if _, changed := o.elements[id]; changed || o.owned(id.container) {
		return
	}
	if ts := o.base.sets[id.container]; ts != nil {
		if v, ok := ts.elements[id.key]; ok && v == value {
			ts.elements[id.key] = value
		}
	}
}

func (o *tableOverlay) deleteElement(id elemID) {
	if o.owned(id.container) {
		delete(o.sets[id.container].elements, id.key)
		return
	}
	o.elements[id] = nil
}

// elementIDs are the elements of every set and map, unsorted.
func (o *tableOverlay) elementIDs() []elemID {
	var ids []elemID
	for _, name := range o.setNames() {
		for key := range o.set(name).elements {
			if id := (elemID{name, key}); !o.deleted(id) {
				ids = append(ids, id)
			}
		}
	}
	for id, v := range o.elements {
		if ts := o.set(id.container); v != nil && ts != nil && !o.owned(id.container) {
			if _, inBase := ts.elements[id.key]; !inBase {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// deleted tells whether the plan deleted an element of one of base's
// sets.
func (o *tableOverlay) deleted(id elemID) bool {
	v, ok := o.elements[id]
	return ok && v == nil && !o.owned(id.container)
}

// commit writes the changes into base.
func (o *tableOverlay) commit() {
	t := o.base
	t.exists = o.exists
	maps.Copy(t.chains, o.chains)
	for name, ts := range o.sets {
		if ts == nil {
			delete(t.sets, name)
		} else {
			t.sets[name] = ts
		}
	}
	for name, has := range o.counters {
		if has {
			t.counters[name] = true
		} else {
			delete(t.counters, name)
		}
	}
	for id, v := range o.elements {
		ts := t.sets[id.container]
		switch {
		// A set the plan made anew holds its elements itself: one noted
		// before it was made went with the set it replaced.
		case ts == nil, o.owned(id.container):
		case v == nil:
			delete(ts.elements, id.key)
		default:
			ts.elements[id.key] = *v
		}
	}
}
