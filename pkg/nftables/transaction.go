// The sync's operations in an order that keeps every reference valid, split
// into transactions when large and sent; and the later deletion of the
// chains a sync flushed.

package nftables

import (
	"bufio"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

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
	creates := objectOps(addOp, slices.Concat(w.table, w.addCounters, w.addSets, w.addChains))
	changes := []ops{objectOps(addOp, w.addBase), objectOps(flushOp, w.flushes), objectOps(deleteOp, w.deleteChains),
		objectOps(deleteOp, w.deleteSets), objectOps(deleteOp, w.deleteCounters), objectOps(addOp, w.readd), objectOps(deleteOp, w.elemDeletes), ruleOps(fam, w.rules), elementOps(fam, w.elemAdds)}
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
		if err := s.run(plan, s.table.kernel); err != nil {
			klog.ErrorS(err, "Deleting stale nftables chains failed; retrying at a later sync", "ipFamily", s.cfg.Family, "chains", names)
			metrics.NFTablesCleanupFailuresTotal.WithLabelValues(string(s.cfg.Family)).Inc()
			for _, name := range names {
				s.stale[name] = staleChain{flushed: s.stale[name].flushed, failed: true}
			}
			continue
		}
		for _, name := range names {
			delete(s.stale, name)
			delete(s.table.kernel.chains, name)
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
