// Over 600 lines: the transaction built from the differences with the table,
// for partial and full syncs alike, in one file so their order of operations
// reads in one place.

package nftables

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/metrics"
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
	// elem is the element to write for this value (its comment): one of
	// the owners', not a copy.
	elem *knftables.Element
}

// has tells whether someone wants value.
func (we wantedElem) has(value string) bool {
	return slices.ContainsFunc(we, func(v wantedValue) bool { return v.value == value })
}

func idOf(e knftables.Element) elemID {
	return elemID{container: e.Set + e.Map, key: strings.Join(e.Key, " . ")}
}

// write is one sync's transaction, gathered object by object against
// what the table holds and applied in an order that keeps every reference
// valid: new sets and chains, flushes, deletions, rules, then elements.
type write struct {
	s    *Syncer
	t    *table
	full bool
	// force flushes chains even when their rules are the same: a set
	// they use is being re-created.
	force bool

	table, addSets, addChains, flushes, deleteChains, deleteSets, readd, elemDeletes []knftables.Object
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
	// applied are the rules of each chain as the syncs before wrote
	// them, when the watch asked this full sync to tell what it
	// restored: the chains it rewrites as they were.
	applied  map[string][]string
	restored []string
	// seen are the chains and sets this sync wants (full sync only).
	seenChains, seenSets map[string]bool
}

// ruleRef is rule i of a chain a sync writes, made into a knftables rule
// only when its transaction is written.
type ruleRef struct {
	chain *Chain
	i     int
}

func (s *Syncer) newWrite(full bool) *write {
	return &write{s: s, t: s.kernel, full: full, touched: map[elemID]bool{}, seenChains: map[string]bool{}, seenSets: map[string]bool{}}
}

// replaceLayout brings the fixed part in line with l.
func (w *write) replaceLayout(l Layout) {
	if !w.t.exists {
		table := l.Table
		w.table = append(w.table, &table)
		w.t.exists = true
	}
	old := w.s.layout
	w.objects(old.Sets, l.Sets, old.Chains, l.Chains, old.Elements, l.Elements)
	w.s.layout = l
}

// replace brings one service port's objects in line with updated.
func (w *write) replace(name state.ServicePortName, updated ServiceObjects) {
	old := w.s.applied[name]
	w.objects(old.Sets, updated.Sets, old.Chains, updated.Chains, old.Elements, updated.Elements)
	if len(updated.Chains) == 0 && len(updated.Elements) == 0 {
		delete(w.s.applied, name)
	} else {
		w.s.applied[name] = updated
	}
}

// objects changes one owner's sets, chains and elements from old to new.
// Sets go first: re-creating one forces its users' chains to be rewritten.
// The new chains and elements are referred to, not copied, until the
// transaction is written: the caller keeps them unchanged.
func (w *write) objects(oldSets, newSets []Set, oldChains, newChains []Chain, oldElems, newElems []knftables.Element) {
	w.force = false
	for _, st := range newSets {
		w.set(st)
	}
	for _, st := range oldSets {
		if !slices.ContainsFunc(newSets, func(n Set) bool { return n.Name == st.Name }) {
			w.dropSet(st.Name)
		}
	}
	for i := range newChains {
		w.chain(&newChains[i])
	}
	for _, c := range oldChains {
		if !slices.ContainsFunc(newChains, func(n Chain) bool { return n.Name == c.Name }) {
			w.dropChain(c.Name)
		}
	}
	w.force = false
	for i := range newElems {
		w.want(&newElems[i], 1)
	}
	for i := range oldElems {
		w.want(&oldElems[i], -1)
	}
}

// chain makes the table hold c with exactly its rules.
func (w *write) chain(c *Chain) {
	w.seenChains[c.Name] = true
	delete(w.s.stale, c.Name)
	have, ok := w.t.chains[c.Name]
	rules := &w.rules
	switch {
	case !ok && c.Hook != nil:
		w.addBase = append(w.addBase, &c.Chain)
	case !ok:
		w.addChains = append(w.addChains, &c.Chain)
		rules = &w.newRules
	case !sameHook(have.Chain, c.Chain):
		// A base chain's hook or priority cannot be changed in place.
		w.deleteChains = append(w.deleteChains, &knftables.Chain{Name: c.Name})
		w.readd = append(w.readd, &c.Chain)
	case !w.force && sameRules(have.Rules, c.Rules):
		// The table's copy of the text gives way to applied's: after a
		// restart, one copy of every rule is kept, not two.
		have.Rules = c.Rules
		return
	case !w.force && c.Upstream != nil && sameRules(have.Rules, c.Upstream):
		return
	default:
		w.flushes = append(w.flushes, &knftables.Chain{Name: c.Name})
	}
	if rules, ok := w.applied[c.Name]; ok && slices.Equal(rules, c.Rules) {
		w.restored = append(w.restored, c.Name)
	}
	for i := range c.Rules {
		*rules = append(*rules, ruleRef{c, i})
	}
	w.t.chains[c.Name] = &Chain{Chain: c.Chain, Rules: c.Rules}
}

// dropChain flushes a chain no one wants; a later sync deletes it.
func (w *write) dropChain(name string) {
	have, ok := w.t.chains[name]
	if !ok {
		return
	}
	if len(have.Rules) > 0 {
		w.flushes = append(w.flushes, &knftables.Chain{Name: name})
		have.Rules = nil
	}
	if _, ok := w.s.stale[name]; !ok {
		w.s.stale[name] = staleChain{flushed: w.s.now()}
	}
}

// set makes the table hold st; one with another type, flags or timeout is
// re-created, emptied.
func (w *write) set(st Set) {
	w.seenSets[st.Name] = true
	have, ok := w.t.sets[st.Name]
	switch {
	case !ok:
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
	have, ok := w.t.sets[name]
	if !ok {
		return
	}
	w.deleteSets = append(w.deleteSets, have.Set.object())
	delete(w.t.sets, name)
}

// want counts one owner more (delta 1) or less (-1) for e's value.
func (w *write) want(e *knftables.Element, delta int) {
	id := idOf(*e)
	we := w.s.wanted[id]
	v := strings.Join(e.Value, " . ")
	i := slices.IndexFunc(we, func(wv wantedValue) bool { return wv.value == v })
	if i < 0 {
		i = len(we)
		we = append(we, wantedValue{value: v})
	}
	we[i].owners += delta
	if we[i].owners <= 0 {
		we = slices.Delete(we, i, i+1)
	} else {
		we[i].elem = e
	}
	if len(we) == 0 {
		delete(w.s.wanted, id)
	} else {
		w.s.wanted[id] = we
	}
	if !w.full {
		w.touched[id] = true
	}
}

// element makes the table hold what is wanted of one element: the value
// it has if still wanted (two services claiming one address keep the
// first), else any wanted one, else none.
func (w *write) element(id elemID) {
	ts := w.t.sets[id.container]
	if ts == nil {
		return
	}
	have, exists := ts.elements[id.key]
	we := w.s.wanted[id]
	if len(we) == 0 {
		if exists {
			w.elemDeletes = append(w.elemDeletes, ts.element(id.key))
			delete(ts.elements, id.key)
		}
		return
	}
	adds := &w.newElems
	if exists {
		if we.has(have) {
			return
		}
		// Deleted and added again in one transaction: never missing.
		w.elemDeletes = append(w.elemDeletes, ts.element(id.key))
		adds = &w.elemAdds
	}
	first := slices.MinFunc(we, func(a, b wantedValue) int { return strings.Compare(a.value, b.value) })
	*adds = append(*adds, first.elem)
	ts.elements[id.key] = first.value
}

// removeUnwanted flushes every service port's chain, deletes every set a
// full sync did not ask for: other services', or an older layout's (run
// deletes the elements).
func (w *write) removeUnwanted() {
	for _, name := range slices.Sorted(maps.Keys(w.t.chains)) {
		// As upstream: only a service port's chains, named with a "/",
		// are ours to remove; another program's chain in the table (one
		// jumping to ours, say) stays.
		if !w.seenChains[name] && strings.Contains(name, "/") {
			w.dropChain(name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(w.t.sets)) {
		if !w.seenSets[name] {
			w.dropSet(name)
		}
	}
}

// run sends the transaction: one, or none when nothing differs.
func (w *write) run() error {
	for _, id := range w.elementIDs() {
		w.element(id)
	}
	// Held no longer than needed: a first sync's run is its peak.
	w.touched, w.seenChains, w.seenSets = nil, nil, nil
	for _, plan := range w.transactions() {
		if err := w.s.run(func() error { return w.s.send(plan) }); err != nil {
			// nft -f applies all or nothing, but earlier transactions of
			// a split sync went through: what we think the table holds
			// is wrong now, and the next sync reads it again.
			w.s.kernel = nil
			return fmt.Errorf("nftables transaction of %d operations: %w", plan.len(), err)
		}
	}
	w.s.deleteStaleChains()
	return nil
}

// elementIDs are the elements this sync looks at, sorted: those a partial
// sync touched; in a full sync every wanted one and every one the table
// holds.
func (w *write) elementIDs() []elemID {
	var ids []elemID
	if w.full {
		ids = slices.AppendSeq(make([]elemID, 0, len(w.s.wanted)), maps.Keys(w.s.wanted))
		for name, ts := range w.t.sets {
			for key := range ts.elements {
				if id := (elemID{name, key}); w.s.wanted[id] == nil {
					ids = append(ids, id)
				}
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

// maxTxOps bounds the operations of one transaction of a large sync (a
// first sync, mostly): a long one holds the kernel's nftables mutex all
// along. Each transaction costs a process that first reads the table, so
// fewer, larger ones keep the first sync near linear: at 100k services,
// 94 transactions of 10k operations took 44 s, 22 of 50k 32 s, 13 of 100k
// 24 s (see docs/performance.md). Syncer.maxTxOps is this but in tests.
const maxTxOps = 50000

// ops are the objects one verb writes, each made only when its
// transaction is: a large sync holds one transaction's objects at a time,
// and only what the table and applied hold until then.
type ops struct {
	verb verb
	n    int
	at   func(i int) knftables.Object
	// line, if set, writes operation i as knftables writes it, without
	// making its object: the bulk of a large sync (rules and elements),
	// streamed with no garbage but the line.
	line func(w *bufio.Writer, i int)
}

// verb is what an operation does with its object.
type verb int

const (
	addOp verb = iota
	flushOp
	deleteOp
)

func (v verb) String() string { return [...]string{"add", "flush", "delete"}[v] }

// apply adds the operation to a knftables transaction.
func (v verb) apply(tx *knftables.Transaction, obj knftables.Object) {
	[...]func(*knftables.Transaction, knftables.Object){(*knftables.Transaction).Add, (*knftables.Transaction).Flush, (*knftables.Transaction).Delete}[v](tx, obj)
}

func objectOps(verb verb, objs []knftables.Object) ops {
	return ops{verb: verb, n: len(objs), at: func(i int) knftables.Object { return objs[i] }}
}

// ruleOps add the rules of a table of family fam.
func ruleOps(fam string, refs []ruleRef) ops {
	rule := func(i int) (string, string) { return refs[i].chain.Name, writable(refs[i].chain.Rules[refs[i].i]) }
	return ops{verb: addOp, n: len(refs),
		at: func(i int) knftables.Object {
			chain, r := rule(i)
			return &knftables.Rule{Chain: chain, Rule: r}
		},
		line: func(w *bufio.Writer, i int) {
			chain, r := rule(i)
			for _, s := range []string{"add rule ", fam, " ", TableName, " ", chain, " ", r, "\n"} {
				w.WriteString(s)
			}
		}}
}

// elementOps add the elements of a table of family fam.
func elementOps(fam string, elems []*knftables.Element) ops {
	return ops{verb: addOp, n: len(elems),
		at: func(i int) knftables.Object { return elems[i] },
		line: func(w *bufio.Writer, i int) {
			e := elems[i]
			for _, s := range []string{"add element ", fam, " ", TableName, " ", e.Set, e.Map, " { "} {
				w.WriteString(s)
			}
			joined(w, e.Key)
			if e.Comment != nil {
				w.WriteString(" comment " + strconv.Quote(*e.Comment))
			}
			if len(e.Value) > 0 {
				w.WriteString(" : ")
				joined(w, e.Value)
			}
			w.WriteString(" }\n")
		}}
}

// joined writes parts joined with " . ", as nft lists them.
func joined(w *bufio.Writer, parts []string) {
	for i, p := range parts {
		if i > 0 {
			w.WriteString(" . ")
		}
		w.WriteString(p)
	}
}

// opsRange is operations from to to of some ops.
type opsRange struct {
	ops
	from, to int
}

// txPlan is one transaction's operations, in order.
type txPlan []opsRange

func (p txPlan) len() int {
	n := 0
	for _, r := range p {
		n += r.to - r.from
	}
	return n
}

// transaction makes the whole transaction's objects.
func (p txPlan) transaction(nft knftables.Interface) *knftables.Transaction {
	tx := nft.NewTransaction()
	for _, r := range p {
		for i := r.from; i < r.to; i++ {
			r.verb.apply(tx, r.at(i))
		}
	}
	return tx
}

// partOps is how many operations without a line of their own are made and
// written at a time, by knftables.
const partOps = 1000

// write writes the transaction's text, as knftables writes it: each
// operation's line, or its object's made and written by knftables with up
// to partOps others. An invalid object fails it.
func (p txPlan) write(w *bufio.Writer, nft knftables.Interface) error {
	var part *knftables.Transaction
	count := 0
	flush := func() error {
		if count == 0 {
			return nil
		}
		text := part.String()
		part, count = nil, 0
		// knftables writes an object's validation error as a last
		// comment line, and leaves out the operations from it on.
		if i := strings.Index(text, "# ERROR: "); i >= 0 && (i == 0 || text[i-1] == '\n') {
			return errors.New(text[i+len("# ERROR: "):])
		}
		_, err := w.WriteString(text)
		return err
	}
	for _, r := range p {
		for i := r.from; i < r.to; i++ {
			if r.line != nil {
				if err := flush(); err != nil {
					return err
				}
				r.line(w, i)
				continue
			}
			if part == nil {
				part = nft.NewTransaction()
			}
			r.verb.apply(part, r.at(i))
			if count++; count == partOps {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}

// maxNetlinkOps bounds the transactions sent over netlink (Config.Send):
// a batch is held whole until it is sent (28 MB for 50k rules), where
// nft's input is streamed, so larger ones (a first sync's, beyond a few
// thousand services) go to nft. Over netlink alone, a first sync at 100k
// services took 12 s instead of 42 (see docs/performance.md).
const maxNetlinkOps = 10000

// send runs one transaction: over netlink when Config.Send is set and the
// writer encodes every operation (else logged once, at -v=2); else
// written to nft as it is made when NFT takes it so (a Streamer), or made
// whole and run.
func (s *Syncer) send(p txPlan) error {
	if s.cfg.Send != nil && p.len() <= maxNetlinkOps {
		w, err := s.netlinkTx(p)
		if err == nil {
			return s.cfg.Send(w)
		}
		if !s.encodeFailed {
			klog.V(2).InfoS("Cannot write the nftables transaction over netlink; writing it with nft instead", "ipFamily", s.cfg.Family, "err", err)
			s.encodeFailed = true
		}
	}
	if st, ok := s.cfg.NFT.(streamRunner); ok {
		return st.runStream(context.TODO(), func(w *bufio.Writer) error { return p.write(w, s.cfg.NFT) })
	}
	return s.cfg.NFT.Run(context.TODO(), p.transaction(s.cfg.NFT))
}

// transactions are the sync's operations in an order that keeps every
// reference valid: new sets and chains, flushes, deletions, rules, then
// elements. One transaction, or none when nothing differs. Beyond
// maxTxOps (and unless a set or base chain is re-created), in several,
// such that every state in between is valid: first the new sets and
// regular chains, then their rules (nothing reaches a new chain yet, so a
// half-written one does no harm), then, atomically, new base chains with
// their rules and everything that changes what the table already holds,
// and last the elements under new keys in batches, each pointing at a
// chain already complete.
func (w *write) transactions() []txPlan {
	fam := string(Family(w.s.cfg.Family))
	creates := objectOps(addOp, slices.Concat(w.table, w.addSets, w.addChains))
	changes := []ops{objectOps(addOp, w.addBase), objectOps(flushOp, w.flushes), objectOps(deleteOp, w.deleteChains),
		objectOps(deleteOp, w.deleteSets), objectOps(addOp, w.readd), objectOps(deleteOp, w.elemDeletes), ruleOps(fam, w.rules), elementOps(fam, w.elemAdds)}
	newRules, newElems := ruleOps(fam, w.newRules), elementOps(fam, w.newElems)
	whole := func(all ...ops) txPlan {
		var p txPlan
		for _, o := range all {
			if o.n > 0 {
				p = append(p, opsRange{o, 0, o.n})
			}
		}
		return p
	}
	total := 0
	for _, o := range slices.Concat([]ops{creates, newRules, newElems}, changes) {
		total += o.n
	}
	if total <= w.s.maxTxOps || len(w.readd) > 0 {
		if total == 0 {
			return nil
		}
		return []txPlan{whole(slices.Concat([]ops{creates}, changes, []ops{newRules, newElems})...)}
	}
	var plans []txPlan
	batches := func(o ops) {
		for from := 0; from < o.n; from += w.s.maxTxOps {
			plans = append(plans, txPlan{{o, from, min(from+w.s.maxTxOps, o.n)}})
		}
	}
	batches(creates)
	batches(newRules)
	if p := whole(changes...); len(p) > 0 {
		plans = append(plans, p)
	}
	batches(newElems)
	return plans
}

// deleteStaleChains deletes the chains flushed at least staleChainDelay
// ago, in transactions of their own after the sync's: one that fails (a
// chain another program's rule still jumps to) is logged and counted, and
// its chains are tried again at a later sync, without failing this one.
// Chains that failed before go in a transaction apart from the newly due
// ones, so that one stuck chain does not keep the others.
func (s *Syncer) deleteStaleChains() {
	now := s.now()
	var due, failed []string
	for _, name := range slices.Sorted(maps.Keys(s.stale)) {
		switch c := s.stale[name]; {
		case now.Sub(c.flushed) < staleChainDelay:
		case c.failed:
			failed = append(failed, name)
		default:
			due = append(due, name)
		}
	}
	for _, names := range [][]string{due, failed} {
		if len(names) == 0 {
			continue
		}
		chains := make([]knftables.Object, len(names))
		for i, name := range names {
			chains[i] = &knftables.Chain{Name: name}
		}
		// Adding first makes the delete succeed when another program
		// deleted the chain already.
		plan := txPlan{{objectOps(addOp, chains), 0, len(chains)}, {objectOps(deleteOp, chains), 0, len(chains)}}
		if err := s.run(func() error { return s.send(plan) }); err != nil {
			klog.ErrorS(err, "Deleting stale nftables chains failed; retrying at a later sync", "ipFamily", s.cfg.Family, "chains", names)
			metrics.NFTablesCleanupFailuresTotal.WithLabelValues(string(s.cfg.Family)).Inc()
			for _, name := range names {
				s.stale[name] = staleChain{flushed: s.stale[name].flushed, failed: true}
			}
			continue
		}
		for _, name := range names {
			delete(s.stale, name)
			delete(s.kernel.chains, name)
		}
	}
}

// NextSync is when flushed chains are due for deletion, for the core to
// sync then even if nothing changes; zero when none waits (chains whose
// deletion failed wait for the next sync that comes anyway).
func (s *Syncer) NextSync() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var next time.Time
	for _, c := range s.stale {
		if at := c.flushed.Add(staleChainDelay); !c.failed && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// object is the set or map to write.
func (st Set) object() knftables.Object {
	var timeout *time.Duration
	if st.Timeout != 0 {
		timeout = &st.Timeout
	}
	var cmt *string
	if st.Comment != "" {
		cmt = &st.Comment
	}
	if st.Map {
		return &knftables.Map{Name: st.Name, Type: st.Type, Flags: st.Flags, Timeout: timeout, Comment: cmt}
	}
	return &knftables.Set{Name: st.Name, Type: st.Type, Flags: st.Flags, Timeout: timeout, Comment: cmt}
}

// element is the element of key in this set or map, to delete.
func (ts *tableSet) element(key string) knftables.Object {
	e := &knftables.Element{Key: strings.Split(key, " . ")}
	if ts.Map {
		e.Map = ts.Name
	} else {
		e.Set = ts.Name
	}
	return e
}

func sameSet(a, b Set) bool {
	return a.Map == b.Map && a.Type == b.Type && a.Timeout == b.Timeout && a.Comment == b.Comment &&
		slices.Equal(sortedFlags(a.Flags), sortedFlags(b.Flags))
}

func sortedFlags(f []knftables.SetFlag) []knftables.SetFlag {
	return slices.Sorted(slices.Values(f))
}

// sameHook compares what makes a base chain: type, hook and priority
// (by number: nft prints "dstnat - 10" or "-110" for what was written as
// "dstnat-10").
func sameHook(a, b knftables.Chain) bool {
	if (a.Hook == nil) != (b.Hook == nil) {
		return false
	}
	if a.Hook == nil {
		return true
	}
	if a.Type == nil || b.Type == nil || a.Priority == nil || b.Priority == nil {
		return false
	}
	return *a.Type == *b.Type && *a.Hook == *b.Hook && priority(*a.Priority) == priority(*b.Priority)
}

func priority(p knftables.BaseChainPriority) int {
	n, err := knftables.ParsePriority(knftables.IPv4Family, strings.ReplaceAll(string(p), " ", ""))
	if err != nil {
		return -1 << 31
	}
	return n
}

// sameRules compares rule lists as nft prints them; where text differs,
// the elements of anonymous sets may just be listed in another order.
func sameRules(have, want []string) bool {
	if len(have) != len(want) {
		return false
	}
	for i := range have {
		if have[i] != want[i] && normalizeSets(have[i]) != normalizeSets(want[i]) {
			return false
		}
	}
	return true
}

// normalizeSets sorts the items of each "{ a, b }" in a rule, and
// unwraps a set of one address or range: nft lists a set written with
// one element as that element, but one whose elements it merged into one
// still as a set.
func normalizeSets(rule string) string {
	var b strings.Builder
	for {
		start := strings.Index(rule, "{ ")
		if start < 0 {
			break
		}
		end := strings.Index(rule[start:], " }")
		if end < 0 {
			break
		}
		items := strings.Split(rule[start+2:start+end], ", ")
		slices.Sort(items)
		if len(items) == 1 && !strings.Contains(items[0], " : ") {
			b.WriteString(rule[:start] + items[0])
		} else {
			b.WriteString(rule[:start+2] + strings.Join(items, ", ") + " }")
		}
		rule = rule[start+end+2:]
	}
	b.WriteString(rule)
	return b.String()
}

// writable is a rule as sent: knftables' Fake reads "goto X, 1 : ..." in a
// verdict map as a jump to a chain named "X,", so the comma is set apart;
// nft reads both alike and prints ", ".
func writable(rule string) string {
	if !strings.Contains(rule, " vmap { ") {
		return rule
	}
	return strings.ReplaceAll(rule, ", ", " , ")
}
