package nftables

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/badinput"
)

func asList(o badinput.Objects) []any {
	var out []any
	for _, s := range o.Services {
		out = append(out, s)
	}
	for _, s := range o.EndpointSlices {
		out = append(out, s)
	}
	return out
}

// Every kind of bad object next to good services, through the real nft
// of each family: a partial sync adding them all and a restart's full
// sync over them are never refused, the restart writes nothing, and the
// good services' chains and elements are in the kernel's table.
func TestBadObjectsNeverBreakTheTransaction(t *testing.T) {
	if !inNetns(t) {
		return
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		h, k := kernelHarness(t, family, fuzzParams(t, family))
		h.apply(asList(badinput.Good())...)
		h.full()
		var bad []any
		for _, c := range badinput.Cases() {
			bad = append(bad, asList(c.Objects)...)
		}
		h.apply(bad...)
		h.partial()
		h.syncer = h.kernelSyncer(family, fuzzParams(t, family), k)
		n := len(k.txs)
		h.full()
		if len(k.txs) != n {
			t.Errorf("%s: a restart over the bad objects wrote:\n%s", family, k.txs[len(k.txs)-1])
		}

		kf := Family(family)
		tb, err := readTable(t.Context(), lister(kf), "table", "")
		if err != nil {
			t.Fatal(err)
		}
		chains, elements := 0, 0
		for name, o := range planned(t, family, badinput.Good()) {
			for _, c := range o.Chains {
				chains++
				if have := tb.chains[c.Name]; have == nil || !sameRules(have.Rules, c.Rules) {
					t.Errorf("%s: chain %s of good service %s is not in the kernel as written: %v, want %v", family, c.Name, name, have, c.Rules)
				}
			}
			for _, e := range o.Elements {
				elements++
				set := e.Set + e.Map
				if s := tb.sets[set]; s == nil || !slices.Contains(keys(s.elements), joinKey(e.Key)) {
					t.Errorf("%s: element %v of good service %s is not in %s", family, e.Key, name, set)
				}
			}
		}
		t.Logf("%s: %d chains and %d elements of good services in place next to %d kinds of bad objects", family, chains, elements, len(badinput.Cases()))
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func joinKey(key []string) string {
	out := key[0]
	for _, k := range key[1:] {
		out += " . " + k
	}
	return out
}

// nft lists a set written with one element as that element, and one it
// merged into one element still as a set: both read as the rule planned.
func TestSameRulesTakesASetOfOneAsItsElement(t *testing.T) {
	want := []string{"ip saddr != { 10.0.0.0/8 } drop"}
	for _, have := range []string{"ip saddr != 10.0.0.0/8 drop", "ip saddr != { 10.0.0.0/8 } drop"} {
		if !sameRules([]string{have}, want) {
			t.Errorf("%q differs from %q", have, want[0])
		}
	}
	if sameRules([]string{"ip saddr != 10.0.0.0/9 drop"}, want) {
		t.Error("another prefix is the same")
	}
	if !sameRules([]string{"numgen random mod 1 vmap { 0 : goto x }"}, []string{"numgen random mod 1 vmap { 0 : goto x }"}) {
		t.Error("a map of one element differs from itself")
	}
}
