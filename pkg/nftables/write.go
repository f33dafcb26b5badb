package nftables

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// elemID names one element: its set or map and its key, joined as nft
// prints it.
type elemID struct{ container, key string }

// wantedElem is who wants an element with which value: a value stays
// while one service port (or the layout) still wants it. Nearly every
// element has one value, so the values are a short list.
type wantedElem []wantedValue

type wantedValue struct {
	value  string
	owners int
	// comment is the comment to write with this value: one of the
	// owners'.
	comment *string
	// elem is that owner's element, when it asked for the value in the
	// sync being planned: written as it is. The Syncer keeps none (see
	// commit): an element is made from its set, key, value and comment
	// when written in a later sync.
	elem *knftables.Element
}

// index is where value is among the wanted ones, -1 when no one wants it.
func (we wantedElem) index(value string) int {
	return slices.IndexFunc(we, func(v wantedValue) bool { return v.value == value })
}

func idOf(e knftables.Element) elemID {
	return elemID{container: e.Set + e.Map, key: strings.Join(e.Key, " . ")}
}

// appliedElem is an element an owner asked for: its key and value, joined
// as nft prints them (the strings wanted holds), and its comment.
type appliedElem struct {
	id      elemID
	value   string
	comment *string
}

// write is one sync's transaction, gathered object by object against
// what the table holds and applied in an order that keeps every reference
// valid: new sets and chains, flushes, deletions, rules, then elements.
// Planning it reads the Syncer and changes only the write: what the table
// will hold (t), and what the Syncer will know, committed once every
// transaction went through.
type write struct {
	s    *Syncer
	t    *tableOverlay
	full bool
	// force flushes chains even when their rules are the same: a set
	// they use is being re-created.
	force bool

	table, addCounters, addSets, addChains, flushes, deleteChains, deleteSets, deleteCounters, readd, elemDeletes []knftables.Object
	// rules are the rules of the chains the table held, rewritten, and
	// elemAdds the elements whose value changes.
	rules    []ruleRef
	elemAdds []*knftables.Element
	// newRules are the rules of the regular chains added in this sync,
	// and newElems the elements added under keys the table did not hold:
	// a large sync may write them in transactions of their own. New base
	// chains, live at once, are written with their rules, in addBase.
	newRules []ruleRef
	newElems []*knftables.Element
	addBase  []knftables.Object

	// touched are the elements a partial sync changed (a full sync looks
	// at every wanted one and every one the table holds instead).
	touched map[elemID]bool
	// repair are the prints of each chain's rules as the syncs before
	// wrote them, when the watch asked this full sync to tell what it
	// restored: the chains it rewrites as they were.
	repair   map[string]rulesPrint
	restored []string
	// seen are the chains and sets this sync wants (full sync only).
	seenChains, seenSets map[string]bool

	// What the Syncer will know after the sync, over what it knows (for a
	// full sync: over nothing): the layout (nil: unchanged), each
	// changed service port's objects (empty: none), who wants each
	// changed element (empty: no one), and the chains that became stale
	// (nil: no longer).
	layout  *Layout
	applied map[state.ServicePortName]appliedObjects
	wanted  map[elemID]wantedElem
	stale   map[string]*staleChain
}

// appliedObjects is what the syncer keeps of a service port's objects
// once written: its chains by the print of their rules, not their text
// (an explanation recomputes that from ServiceObjects), its sets, and its
// elements by the strings wanted holds.
type appliedObjects struct {
	Chains   []appliedChain
	Sets     []Set
	Elements []appliedElem
}

// appliedOf is o as applied.
func appliedOf(o ServiceObjects) appliedObjects {
	a := appliedObjects{Chains: make([]appliedChain, len(o.Chains)), Sets: o.Sets, Elements: make([]appliedElem, len(o.Elements))}
	for i, c := range o.Chains {
		a.Chains[i] = appliedChain{Name: c.Name, print: printOf(c.Rules)}
	}
	for i, e := range o.Elements {
		a.Elements[i] = appliedElem{id: idOf(e), value: strings.Join(e.Value, " . "), comment: e.Comment}
	}
	return a
}

// appliedChain is a chain written, and the print of its rules.
type appliedChain struct {
	Name  string
	print rulesPrint
}

// ruleRef is rule i of a chain a sync writes, made into a knftables rule
// only when its transaction is written.
type ruleRef struct {
	chain *Chain
	i     int
}

func (s *Syncer) newWrite(full bool) *write {
	return &write{s: s, t: newOverlay(s.table.kernel), full: full, touched: map[elemID]bool{}, seenChains: map[string]bool{}, seenSets: map[string]bool{},
		applied: map[state.ServicePortName]appliedObjects{}, wanted: map[elemID]wantedElem{}, stale: map[string]*staleChain{}}
}

// appliedTo is what a service port asked for in the syncs before.
func (w *write) appliedTo(name state.ServicePortName) appliedObjects {
	if objects, ok := w.applied[name]; ok || w.full {
		return objects
	}
	return w.s.applied[name]
}

// wantedOf is who wants an element, as far as planned.
func (w *write) wantedOf(id elemID) wantedElem {
	if we, ok := w.wanted[id]; ok || w.full {
		return we
	}
	return w.s.wanted[id]
}

// isStale tells whether a chain is flushed and waits for deletion.
func (w *write) isStale(name string) bool {
	if c, ok := w.stale[name]; ok {
		return c != nil
	}
	_, ok := w.s.stale[name]
	return ok
}

// replaceLayout brings the fixed part in line with l.
func (w *write) replaceLayout(l Layout) {
	if !w.t.exists {
		table := l.Table
		w.table = append(w.table, &table)
		w.t.exists = true
	}
	for _, c := range l.Counters {
		if !w.t.hasCounter(c) {
			w.addCounters = append(w.addCounters, &knftables.Counter{Name: c})
			w.t.counters[c] = true
		}
	}
	var old appliedObjects
	if !w.full {
		old = appliedOf(ServiceObjects{Chains: w.s.layout.Chains, Sets: w.s.layout.Sets, Elements: w.s.layout.Elements})
	}
	w.objects(old, ServiceObjects{Chains: l.Chains, Sets: l.Sets, Elements: l.Elements})
	w.layout = &l
}

// replace brings one service port's objects in line with updated.
func (w *write) replace(name state.ServicePortName, updated ServiceObjects) {
	w.applied[name] = w.objects(w.appliedTo(name), updated)
}

// objects changes one owner's sets, chains and elements from old to
// updated, and returns updated as applied. Sets go first: re-creating one
// forces its users' chains to be rewritten. The new chains are referred
// to, not copied, until the transaction is written: the caller keeps
// them unchanged.
func (w *write) objects(old appliedObjects, updated ServiceObjects) appliedObjects {
	w.force = false
	for _, st := range updated.Sets {
		w.set(st)
	}
	for _, st := range old.Sets {
		if !slices.ContainsFunc(updated.Sets, func(n Set) bool { return n.Name == st.Name }) {
			w.dropSet(st.Name)
		}
	}
	applied := appliedObjects{Chains: make([]appliedChain, len(updated.Chains)), Sets: updated.Sets, Elements: make([]appliedElem, len(updated.Elements))}
	for i := range updated.Chains {
		applied.Chains[i] = appliedChain{Name: updated.Chains[i].Name, print: w.chain(&updated.Chains[i])}
	}
	for _, c := range old.Chains {
		if !slices.ContainsFunc(updated.Chains, func(n Chain) bool { return n.Name == c.Name }) {
			w.dropChain(c.Name)
		}
	}
	w.force = false
	for i := range updated.Elements {
		e := &updated.Elements[i]
		applied.Elements[i] = w.want(appliedElem{id: idOf(*e), value: strings.Join(e.Value, " . "), comment: e.Comment}, e, 1)
	}
	for _, e := range old.Elements {
		w.want(e, nil, -1)
	}
	return applied
}

// chain makes the table hold c with exactly its rules, and returns their
// print. What the table holds compares by prints (see rulesPrint): its
// rules as written, or upstream's form of them, which stays.
func (w *write) chain(c *Chain) rulesPrint {
	w.seenChains[c.Name] = true
	if w.isStale(c.Name) {
		w.stale[c.Name] = nil
	}
	want := printOf(c.Rules)
	have, ok := w.t.chain(c.Name)
	rules := &w.rules
	switch {
	case !ok && c.Hook != nil:
		w.addBase = append(w.addBase, &c.Chain)
	case !ok:
		w.addChains = append(w.addChains, &c.Chain)
		rules = &w.newRules
	case !sameHook(*have.Chain, c.Chain):
		// A base chain's hook or priority cannot be changed in place.
		w.deleteChains = append(w.deleteChains, &knftables.Chain{Name: c.Name})
		w.readd = append(w.readd, &c.Chain)
	case !w.force && (have.print == want || c.Upstream != nil && have.print == printOf(c.Upstream)):
		w.t.shareChainName(c.Name)
		return want
	default:
		w.flushes = append(w.flushes, &knftables.Chain{Name: c.Name})
	}
	if p, ok := w.repair[c.Name]; ok && p == want {
		w.restored = append(w.restored, c.Name)
	}
	for i := range c.Rules {
		*rules = append(*rules, ruleRef{c, i})
	}
	w.t.chains[c.Name] = mirrored(c.Chain, want)
	return want
}

// dropChain flushes a chain no one wants; a later sync deletes it.
func (w *write) dropChain(name string) {
	have, ok := w.t.chain(name)
	if !ok {
		return
	}
	if have.print.n > 0 {
		w.flushes = append(w.flushes, &knftables.Chain{Name: name})
		w.t.chains[name] = mirrored(*have.Chain, rulesPrint{})
	}
	if !w.isStale(name) {
		w.stale[name] = &staleChain{flushed: w.s.now()}
	}
}

// set makes the table hold st; one with another type, flags or timeout is
// re-created, emptied.
func (w *write) set(st Set) {
	w.seenSets[st.Name] = true
	have := w.t.set(st.Name)
	switch {
	case have == nil:
		w.addSets = append(w.addSets, st.object())
	case !sameSet(have.Set, st):
		w.deleteSets = append(w.deleteSets, st.object())
		w.readd = append(w.readd, st.object())
		w.force = true
	default:
		return
	}
	w.t.sets[st.Name] = &tableSet{Set: st, elements: map[string]string{}}
}

func (w *write) dropSet(name string) {
	have := w.t.set(name)
	if have == nil {
		return
	}
	w.deleteSets = append(w.deleteSets, have.Set.object())
	w.t.sets[name] = nil
}

// want counts one owner more (delta 1) or less (-1) for e's value, and
// returns e as applied: its value the string wanted holds. elem is the
// owner's element, nil for one that goes.
func (w *write) want(e appliedElem, elem *knftables.Element, delta int) appliedElem {
	we, planned := w.wanted[e.id]
	if !planned && !w.full {
		// A copy: the Syncer's stays as it is until the commit.
		we = slices.Clone(w.s.wanted[e.id])
	}
	i := slices.IndexFunc(we, func(wv wantedValue) bool { return wv.value == e.value })
	if i < 0 {
		i = len(we)
		we = append(we, wantedValue{value: e.value})
	}
	e.value = we[i].value
	we[i].owners += delta
	if we[i].owners <= 0 {
		we = slices.Delete(we, i, i+1)
	} else {
		we[i].comment, we[i].elem = e.comment, elem
	}
	w.wanted[e.id] = we
	if !w.full {
		w.touched[e.id] = true
	}
	return e
}

// element makes the table hold what is wanted of one element: the value
// it has if still wanted (two services claiming one address keep the
// first), else any wanted one, else none.
func (w *write) element(id elemID) {
	ts := w.t.set(id.container)
	if ts == nil {
		return
	}
	have, exists := w.t.element(id)
	we := w.wantedOf(id)
	if len(we) == 0 {
		if exists {
			w.elemDeletes = append(w.elemDeletes, ts.element(id.key))
			w.t.deleteElement(id)
		}
		return
	}
	adds := &w.newElems
	if exists {
		if i := we.index(have); i >= 0 {
			w.t.shareElement(id, we[i].value)
			return
		}
		// Deleted and added again in one transaction: never missing.
		w.elemDeletes = append(w.elemDeletes, ts.element(id.key))
		adds = &w.elemAdds
	}
	first := slices.MinFunc(we, func(a, b wantedValue) int { return strings.Compare(a.value, b.value) })
	if first.elem == nil {
		first.elem = ts.elementOf(id.key, first)
	}
	*adds = append(*adds, first.elem)
	w.t.setElement(id, first.value)
}

// removeUnwanted flushes every service port's chain, deletes every set a
// full sync did not ask for: other services', or an older layout's (run
// deletes the elements).
func (w *write) removeUnwanted() {
	for _, name := range w.t.chainNames() {
		// As upstream: only a service port's chains, named with a "/",
		// are ours to remove; another program's chain in the table (one
		// jumping to ours, say) stays.
		if !w.seenChains[name] && strings.Contains(name, "/") {
			w.dropChain(name)
		}
	}
	for _, name := range w.t.setNames() {
		if !w.seenSets[name] {
			w.dropSet(name)
		}
	}
	// The localhost NodePort rejection chains and counters of another
	// setting (the gate, or loopback in nodePortAddresses, changed), as
	// upstream removes them. A counter goes once the rules using it are
	// flushed, in the same transaction.
	for _, name := range w.t.chainNames() {
		if !w.seenChains[name] && strings.HasPrefix(name, prefixLocalhostRejectChain) {
			w.dropChain(name)
		}
	}
	for _, name := range w.t.counterNames() {
		if !slices.Contains(w.layout.Counters, name) && strings.HasPrefix(name, prefixLocalhostRejectedCounter) {
			w.deleteCounters = append(w.deleteCounters, &knftables.Counter{Name: name})
			w.t.counters[name] = false
		}
	}
}

// planElements decides the elements, once every owner said what it
// wants.
func (w *write) planElements() {
	for _, id := range w.elementIDs() {
		w.element(id)
	}
	// Held no longer than needed: a first sync's run is its peak.
	w.touched, w.seenChains, w.seenSets = nil, nil, nil
}

// run sends the planned transaction: one, or none when nothing differs.
// Once all went through, the Syncer knows what they wrote.
func (w *write) run() error {
	for _, plan := range w.transactions() {
		if err := w.s.run(plan, w.t); err != nil {
			// nft -f applies all or nothing, but earlier transactions of
			// a split sync went through: what we think the table holds
			// is wrong now, and the next sync reads it again.
			w.s.table.lost()
			return fmt.Errorf("nftables transaction of %d operations: %w", plan.len(), err)
		}
	}
	w.commit()
	w.s.deleteStaleChains()
	return nil
}

// commit has the Syncer know what the sync wrote.
func (w *write) commit() {
	s := w.s
	w.t.commit()
	if w.layout != nil {
		s.layout = *w.layout
	}
	applied, wanted := s.applied, s.wanted
	if w.full {
		applied, wanted = nil, nil
	}
	s.applied = merged(applied, w.applied, noObjects)
	for _, we := range w.wanted {
		for i := range we {
			we[i].elem = nil // not kept: the strings are
		}
	}
	s.wanted = merged(wanted, w.wanted, func(we wantedElem) bool { return len(we) == 0 })
	for name, c := range w.stale {
		if c == nil {
			delete(s.stale, name)
		} else {
			s.stale[name] = *c
		}
	}
}

// merged is m with changes written over it, less the keys whose change
// is gone: changes itself when m is nil (a full sync's, over nothing).
func merged[K comparable, V any](m, changes map[K]V, gone func(V) bool) map[K]V {
	if m == nil {
		maps.DeleteFunc(changes, func(_ K, v V) bool { return gone(v) })
		return changes
	}
	for k, v := range changes {
		if gone(v) {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

// noObjects tells whether a service port asks for nothing.
func noObjects(o appliedObjects) bool { return len(o.Chains) == 0 && len(o.Elements) == 0 }

// elementIDs are the elements this sync looks at, sorted: those a partial
// sync touched; in a full sync every wanted one and every one the table
// holds.
func (w *write) elementIDs() []elemID {
	var ids []elemID
	if w.full {
		ids = make([]elemID, 0, len(w.wanted))
		for id, we := range w.wanted {
			if len(we) > 0 {
				ids = append(ids, id)
			}
		}
		for _, id := range w.t.elementIDs() {
			if len(w.wanted[id]) == 0 {
				ids = append(ids, id)
			}
		}
	} else {
		ids = slices.AppendSeq(make([]elemID, 0, len(w.touched)), maps.Keys(w.touched))
	}
	slices.SortFunc(ids, func(a, b elemID) int {
		return cmp.Or(strings.Compare(a.container, b.container), strings.Compare(a.key, b.key))
	})
	return ids
}
