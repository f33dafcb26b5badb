// Comparing what the table holds with what a sync wants, as nft prints
// both, and the objects written where they differ.

package nftables

import (
	"slices"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/linehash"
	"sigs.k8s.io/knftables"
)

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

// elementOf is the element of key in this set or map with v's value and
// comment, to add.
func (ts *tableSet) elementOf(key string, v wantedValue) *knftables.Element {
	e := ts.element(key).(*knftables.Element)
	if ts.Map {
		e.Value = strings.Split(v.value, " . ")
	}
	e.Comment = v.comment
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

// rulesPrint identifies a chain's rules as sameRules compares them: a
// 64-bit FNV-1a hash of each rule, its anonymous sets normalized, and
// their number. The syncer keeps these instead of the rules' text: what it
// applied and what the table holds compare by them.
type rulesPrint struct {
	hash uint64
	n    int
}

// printOf is the print of rules; none for no rules, as a flushed chain's.
func printOf(rules []string) rulesPrint {
	if len(rules) == 0 {
		return rulesPrint{}
	}
	h := linehash.Start
	for _, r := range rules {
		if strings.Contains(r, "{ ") {
			r = normalizeSets(r)
		}
		h = linehash.Line(h, r)
	}
	return rulesPrint{hash: h, n: len(rules)}
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
