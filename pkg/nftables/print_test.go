package nftables

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// Prints compare rules as sameRules does: anonymous sets' items in any
// order, a set of one address as that address; rule order and text
// otherwise count.
func TestPrintOfComparesAsSameRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b []string
		same bool
	}{
		{"equal", []string{"counter", "drop"}, []string{"counter", "drop"}, true},
		{"set items in another order", []string{"ip daddr { 10.0.0.2, 10.0.0.1 } drop"}, []string{"ip daddr { 10.0.0.1, 10.0.0.2 } drop"}, true},
		{"a set of one address", []string{"ip daddr { 10.0.0.1 } drop"}, []string{"ip daddr 10.0.0.1 drop"}, true},
		{"vmap items in another order", []string{"numgen random mod 2 vmap { 1 : goto b, 0 : goto a }"}, []string{"numgen random mod 2 vmap { 0 : goto a, 1 : goto b }"}, true},
		{"another rule", []string{"counter", "drop"}, []string{"counter", "accept"}, false},
		{"rules in another order", []string{"counter", "drop"}, []string{"drop", "counter"}, false},
		{"a rule more", []string{"drop"}, []string{"drop", "drop"}, false},
		{"joined rules", []string{"a", "b"}, []string{"a\nb"}, false},
		{"none and one", nil, []string{"drop"}, false},
		{"none and empty", nil, []string{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := printOf(tc.a) == printOf(tc.b); got != tc.same || sameRules(tc.a, tc.b) != tc.same {
				t.Errorf("same prints %v, sameRules %v, want %v", got, sameRules(tc.a, tc.b), tc.same)
			}
			if printOf(tc.a) != printOf(slices.Clone(tc.a)) {
				t.Error("printing twice gives another print")
			}
		})
	}
	if printOf(nil) != (rulesPrint{}) {
		t.Error("no rules print as something: a flushed chain would be flushed again")
	}
}

// serviceChain is a service chain the syncer applied: the first by name.
func serviceChain(t *testing.T, s *Syncer) string {
	t.Helper()
	var names []string
	for _, objects := range s.applied {
		for _, c := range objects.Chains {
			if strings.HasPrefix(c.Name, prefixService) {
				names = append(names, c.Name)
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("no service chain applied")
	}
	return slices.Min(names)
}

// repairsCounted is the IPv4 table's repairs counted so far.
func repairsCounted(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.NFTablesRepairsTotal.WithLabelValues(string(v1.IPv4Protocol)).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// requireNoRuleText checks that the syncer's mirror of the table holds
// prints, not rule text, and that wanted holds no owner's element.
func requireNoRuleText(t *testing.T, s *Syncer) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(s.table.kernel.chains)) {
		if c := s.table.kernel.chains[name]; c.Rules != nil {
			t.Errorf("the mirror holds chain %s's rules as text", name)
		}
	}
	for id, we := range s.wanted {
		for _, v := range we {
			if v.elem != nil {
				t.Errorf("wanted keeps an owner's element for %v", id)
			}
		}
	}
}

// A full sync compares the table it reads with what it wants by prints:
// over the table in place it writes nothing, also after a change or a
// restart; a chain whose rules another program changed is rewritten, as
// is, and counted as restored when the watch asked for the sync.
func TestFullSyncComparesByPrints(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change is another program's change to chain, nil for none.
		change func(tx *knftables.Transaction, chain string)
	}{
		{"in place", nil},
		{"a rule added", func(tx *knftables.Transaction, chain string) {
			tx.Add(&knftables.Rule{Chain: chain, Rule: "counter"})
		}},
		{"flushed", func(tx *knftables.Transaction, chain string) {
			tx.Flush(&knftables.Chain{Name: chain})
		}},
		{"a rule replaced", func(tx *knftables.Transaction, chain string) {
			tx.Flush(&knftables.Chain{Name: chain})
			tx.Add(&knftables.Rule{Chain: chain, Rule: "drop"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := sampleHarness(t)
			h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.11")))
			h.partial()
			requireNoRuleText(t, h.syncer)
			before, chain := dump(h.nft.Fake), serviceChain(t, h.syncer)
			n := len(h.nft.txs)
			h.full()
			requireNoTransaction(t, h, n)
			requireNoRuleText(t, h.syncer)
			if tc.change == nil {
				h.syncer = h.newSyncer(v1.IPv4Protocol, v4(nil)(t))
				h.full()
				requireNoTransaction(t, h, n)
				requireNoRuleText(t, h.syncer)
				return
			}
			tx := h.nft.NewTransaction()
			tc.change(tx, chain)
			if err := h.nft.Fake.Run(t.Context(), tx); err != nil {
				t.Fatal(err)
			}
			h.nft.gen++
			h.syncer.RepairNext()
			repairs := repairsCounted(t)
			h.full()
			if got := repairsCounted(t) - repairs; got != 1 {
				t.Errorf("%v repairs counted, want 1", got)
			}
			if ops := operations(h.nft.last()); len(h.nft.txs) != n+1 || !slices.Contains(ops, "flush chain ip kube-proxy "+chain) {
				t.Errorf("chain %s was not rewritten:\n%s", chain, h.nft.last())
			}
			for _, op := range operations(h.nft.last()) {
				if !strings.Contains(op, chain) {
					t.Errorf("the repair wrote %q, not of chain %s", op, chain)
				}
			}
			if got := dump(h.nft.Fake); got != before {
				t.Errorf("table not restored:\n%s", testutil.LineDiff(before, got))
			}
			requireNoRuleText(t, h.syncer)
		})
	}
}

// An element is made, when written, from its set, key, value and comment
// alone: as the owner's element was.
func TestElementOfMakesTheOwnersElement(t *testing.T) {
	cmt := "ns/svc:p"
	for _, tc := range []struct {
		name string
		set  Set
		elem knftables.Element
	}{
		{"set", Set{Name: "cluster-ips"}, knftables.Element{Set: "cluster-ips", Key: []string{"10.96.0.1"}, Comment: &cmt}},
		{"map", Set{Name: "service-ips", Map: true}, knftables.Element{Map: "service-ips", Key: []string{"10.96.0.1", "tcp", "80"}, Value: []string{"goto service-X-ns/svc/tcp/p"}, Comment: &cmt}},
		{"concatenated value", Set{Name: "m", Map: true}, knftables.Element{Map: "m", Key: []string{"10.96.0.1"}, Value: []string{"10.244.0.1", "8080"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := appliedOf(ServiceObjects{Elements: []knftables.Element{tc.elem}}).Elements[0]
			ts := &tableSet{Set: tc.set}
			got := ts.elementOf(a.id.key, wantedValue{value: a.value, comment: a.comment})
			if !reflect.DeepEqual(*got, tc.elem) {
				t.Errorf("made %+v, want %+v", *got, tc.elem)
			}
		})
	}
}

// The mirror keeps of a chain read its hook and the print of its rules;
// a regular chain is only a chain with no hook.
func TestPrintedKeepsHooksAndPrints(t *testing.T) {
	tb, err := parseTable(strings.NewReader(`table ip kube-proxy {
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain services {
		comment "the services"
		ip daddr { 10.0.0.2, 10.0.0.1 } drop
	}
	chain empty {
	}
}
`))
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]tableChain{}
	for name, c := range tb.chains {
		read[name] = tableChain{Chain: c.Chain, Rules: c.Rules}
	}
	tb.printed()
	for name, was := range read {
		c := tb.chains[name]
		if c.Rules != nil || c.print != printOf(was.Rules) || !sameHook(*c.Chain, *was.Chain) {
			t.Errorf("chain %s: mirrored as %+v (rules %q, print %v), read as %+v", name, *c.Chain, c.Rules, c.print, *was.Chain)
		}
	}
	if c := tb.chains["nat-prerouting"]; c.Hook == nil || *c.Hook != knftables.PreroutingHook {
		t.Errorf("the base chain lost its hook: %+v", *c.Chain)
	}
	if tb.chains["empty"].print != (rulesPrint{}) || tb.chains["services"].print.n != 1 {
		t.Errorf("prints: empty %v, services %v", tb.chains["empty"].print, tb.chains["services"].print)
	}
}

// A repair whose transaction fails stays due: the full sync after it is
// the repair, counted once.
func TestFailedRepairIsRetriedAsRepair(t *testing.T) {
	h := sampleHarness(t)
	chain := serviceChain(t, h.syncer)
	tx := h.nft.NewTransaction()
	tx.Flush(&knftables.Chain{Name: chain})
	if err := h.nft.Fake.Run(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	h.nft.gen++
	h.syncer.RepairNext()
	repairs := repairsCounted(t)
	h.nft.failNext = true
	if err := h.syncer.FullSync(h.view()); err == nil {
		t.Fatal("the repair did not fail")
	}
	if got := repairsCounted(t) - repairs; got != 0 {
		t.Errorf("%v repairs counted for the failed sync, want 0", got)
	}
	h.full()
	if got := repairsCounted(t) - repairs; got != 1 {
		t.Errorf("%v repairs counted after the retry, want 1", got)
	}
	h.full()
	if got := repairsCounted(t) - repairs; got != 1 {
		t.Errorf("%v repairs counted after one more full sync, want still 1", got)
	}
}

// After a restart's full sync over the table in place, the mirror holds
// the service ports' chain names and elements as the strings applied and
// wanted hold, not as the reader's copies of them.
func TestFullSyncMirrorSharesTheSyncersStrings(t *testing.T) {
	h := sampleHarness(t)
	h.syncer = h.newSyncer(v1.IPv4Protocol, v4(nil)(t))
	n := len(h.nft.txs)
	h.full()
	requireNoTransaction(t, h, n)
	s := h.syncer
	mirrorNames := map[string]*byte{}
	for name := range s.table.kernel.chains {
		mirrorNames[name] = unsafe.StringData(name)
	}
	for spn, objects := range s.applied {
		for _, c := range objects.Chains {
			if mirrorNames[c.Name] != unsafe.StringData(c.Name) {
				t.Errorf("%v: the mirror holds chain %s as another string", spn, c.Name)
			}
		}
	}
	for id, we := range s.wanted {
		ts := s.table.kernel.sets[id.container]
		if ts == nil || len(we) == 0 {
			continue
		}
		for key, value := range ts.elements {
			if key == id.key && (unsafe.StringData(key) != unsafe.StringData(id.key) || value != "" && unsafe.StringData(value) != unsafe.StringData(we[0].value)) {
				t.Errorf("the mirror holds element %s of %s as other strings", id.key, id.container)
			}
		}
	}
}
