package nftnl

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// testdata of the nftables mode: its golden tables, as the transaction
// (`nft -f`) that makes each, and the tables upstream kube-proxy wrote, as
// `nft list table` prints them; and, in ours, the shapes those hold only
// in part, as nft lists them.
const (
	goldenDir   = "../../pkg/nftables/testdata"
	sampleFile  = "upstream-nftables-sample.txt"
	furtherFile = "testdata/further-shapes.txt"
)

// tableInput is a table to write, and the family ("ip", "ip6") of it.
type tableInput struct {
	name, family string
	table        *Table
}

// roundTripInputs are every golden table, both of upstream's tables, and
// those of further shapes.
func roundTripInputs(t *testing.T) []tableInput {
	t.Helper()
	goldens, err := filepath.Glob(filepath.Join(goldenDir, "*.golden"))
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no golden tables in %s: %v", goldenDir, err)
	}
	var inputs []tableInput
	for _, path := range goldens {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		family, tb, err := tableFromTransaction(string(text))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		inputs = append(inputs, tableInput{strings.TrimSuffix(filepath.Base(path), ".golden"), family, tb})
	}
	for _, listing := range []struct{ name, path string }{{"upstream", filepath.Join(goldenDir, sampleFile)}, {"further-shapes", furtherFile}} {
		text, err := os.ReadFile(listing.path)
		if err != nil {
			t.Fatal(err)
		}
		for _, family := range []string{"ip", "ip6"} {
			tb, err := tableFromListing(string(text), family, "kube-proxy")
			if err != nil {
				t.Fatalf("%s, table %s: %v", listing.path, family, err)
			}
			inputs = append(inputs, tableInput{listing.name + "-" + family, family, tb})
		}
	}
	return inputs
}

// Every golden table of the nftables mode, every table upstream wrote and
// those of further shapes, written by the Writer and read back by the
// reader from what the kernel would dump of the batch, is the table it
// was: every chain, rule, set, map and element, rules as text, verbatim.
func TestGoldenTablesRoundTrip(t *testing.T) {
	tables, rules, sets, elements := 0, 0, 0, 0
	for _, in := range roundTripInputs(t) {
		t.Run(in.name, func(t *testing.T) {
			got, err := roundTrip(t.Context(), in.family, in.table)
			if err != nil {
				t.Fatal(err)
			}
			if want, got := tableText(in.table), tableText(got); want != got {
				t.Errorf("read back (+), written (-):\n%s", testutil.LineDiff(want, got))
				return
			}
			tables++
			for _, c := range in.table.Chains {
				rules += len(c.Rules)
			}
			for _, s := range in.table.Sets {
				sets, elements = sets+1, elements+len(s.Elements)
			}
		})
	}
	t.Logf("%d tables round-trip: %d rules, %d sets and maps, %d elements", tables, rules, sets, elements)
}

// roundTrip writes the table with a Writer and reads what the kernel
// would dump of the batch.
func roundTrip(ctx context.Context, family string, tb *Table) (*Table, error) {
	w, err := writeTable(family, tb)
	if err != nil {
		return nil, err
	}
	k, err := newBatchKernel(w)
	if err != nil {
		return nil, err
	}
	r := &reader{sock: k, family: w.family, table: w.table}
	return r.read(ctx)
}

// writeTable is the transaction that makes the table, as the syncer
// writes one: the table, its chains and sets, then their rules and
// elements.
func writeTable(family string, tb *Table) (*Writer, error) {
	w, err := NewWriter(family, "kube-proxy", func(string) (string, []string, bool) { return "", nil, false })
	if err != nil {
		return nil, err
	}
	errs := []error{w.AddTable(tb.Comment)}
	for _, c := range tb.Counters {
		errs = append(errs, w.AddCounter(c))
	}
	for _, c := range tb.Chains {
		errs = append(errs, w.AddChain(Chain{Name: c.Name, Comment: c.Comment, Base: c.Base}))
	}
	for _, s := range tb.Sets {
		errs = append(errs, w.AddSet(Set{Name: s.Name, Map: s.Map, Type: s.Type, Flags: s.Flags, Timeout: s.Timeout, Comment: s.Comment}))
	}
	for _, c := range tb.Chains {
		for _, rule := range c.Rules {
			errs = append(errs, w.AddRule(c.Name, rule))
		}
	}
	for _, s := range tb.Sets {
		for _, e := range s.Elements {
			errs = append(errs, w.AddElement(s.Name, e))
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return w, nil
}

// tableText prints a table to compare, a line for each chain, rule, set
// and element. It normalises what nft itself does, and nothing else:
//   - chains and sets are sorted by name: nft lists them in the kernel's
//     order, the golden tables by name;
//   - a base chain's priority is printed as nft lists it ("dstnat - 10"),
//     however it was written ("-110"): the kernel keeps the number;
//   - a set's timeout is printed as nft lists it ("3h" for "10800s"):
//     the kernel keeps milliseconds;
//   - a named set's elements are sorted: the kernel dumps them in an
//     order of its own (a hash's), which nft lists as it comes.
//
// Rules are printed verbatim and in order: the elements of a rule's
// anonymous set are as the rule was written, which the reader prints as
// nft does (sorted), so a rule written otherwise than nft lists it shows.
func tableText(tb *Table) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table comment %q\n", tb.Comment)
	chains := slices.Clone(tb.Chains)
	slices.SortFunc(chains, func(a, b Chain) int { return strings.Compare(a.Name, b.Name) })
	for _, c := range chains {
		fmt.Fprintf(&b, "chain %s comment %q", c.Name, c.Comment)
		if c.Base != nil {
			fmt.Fprintf(&b, " type %s hook %s priority %s", c.Base.Type, c.Base.Hook, listedPriority(c.Base))
		}
		b.WriteString("\n")
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\trule %s\n", r)
		}
	}
	sets := slices.Clone(tb.Sets)
	slices.SortFunc(sets, func(a, b Set) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sets {
		fmt.Fprintf(&b, "set %s map %v type %s flags %s timeout %s comment %q\n", s.Name, s.Map, s.Type, strings.Join(s.Flags, ","), Duration(s.Timeout), s.Comment)
		var elements []string
		for _, e := range s.Elements {
			line := "\telement " + e.Key
			if s.Map {
				line += " : " + e.Value
			}
			if e.Comment != "" {
				line += fmt.Sprintf(" comment %q", e.Comment)
			}
			elements = append(elements, line+"\n")
		}
		slices.Sort(elements)
		b.WriteString(strings.Join(elements, ""))
	}
	return b.String()
}

// listedPriority is a base chain's priority as nft lists it.
func listedPriority(c *BaseChain) string {
	prio, err := parsePriority(c.Priority)
	hook := slices.Index(hooks, c.Hook)
	if err != nil || hook < 0 {
		return fmt.Sprintf("%q (not a priority nft takes at hook %s: %v)", c.Priority, c.Hook, err)
	}
	return priority(uint32(hook), prio)
}

// Random parts of every table round-trip as the whole does: a rule's
// text does not depend on the rules before it (the registers and what
// the reader remembers of a rule start afresh), nor on which anonymous
// sets the batch numbered before its own, nor on the elements beside an
// element. Each trial keeps some chains, some of their rules in a
// shuffled order, and some elements of every set (a rule's lookup needs
// its set).
func TestRandomGoldenRuleSubsetsRoundTrip(t *testing.T) {
	const trials = 20
	for _, in := range roundTripInputs(t) {
		t.Run(in.name, func(t *testing.T) {
			for trial := range trials {
				rng := rand.New(rand.NewPCG(uint64(trial), 29))
				part := &Table{Comment: in.table.Comment}
				for _, c := range in.table.Chains {
					if rng.IntN(4) == 0 {
						continue
					}
					rules := slices.DeleteFunc(slices.Clone(c.Rules), func(string) bool { return rng.IntN(2) == 0 })
					rng.Shuffle(len(rules), func(i, j int) { rules[i], rules[j] = rules[j], rules[i] })
					c.Rules = rules
					part.Chains = append(part.Chains, c)
				}
				for _, s := range in.table.Sets {
					s.Elements = slices.DeleteFunc(slices.Clone(s.Elements), func(Element) bool { return rng.IntN(2) == 0 })
					part.Sets = append(part.Sets, s)
				}
				got, err := roundTrip(t.Context(), in.family, part)
				if err != nil {
					t.Fatalf("trial %d: %v", trial, err)
				}
				if want, got := tableText(part), tableText(got); want != got {
					t.Fatalf("trial %d: read back (+), written (-):\n%s", trial, testutil.LineDiff(want, got))
				}
			}
		})
	}
}

// ReadObjects reads the chains and sets asked for as Read reads them
// (the sets their rules use fetched by name, anonymous ones too), and
// leaves out one the table lacks.
func TestReadObjectsReadsWhatReadReads(t *testing.T) {
	for _, in := range roundTripInputs(t) {
		t.Run(in.name, func(t *testing.T) {
			w, err := writeTable(in.family, in.table)
			if err != nil {
				t.Fatal(err)
			}
			k, err := newBatchKernel(w)
			if err != nil {
				t.Fatal(err)
			}
			whole, err := (&reader{sock: k, family: w.family, table: w.table}).read(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			// Every other chain and set, and one of each not there.
			want := &Table{}
			chains, sets := []string{"absent"}, []string{"absent"}
			for i, c := range whole.Chains {
				if i%2 == 0 {
					want.Chains, chains = append(want.Chains, c), append(chains, c.Name)
				}
			}
			for i, s := range whole.Sets {
				if i%2 == 1 {
					want.Sets, sets = append(want.Sets, s), append(sets, s.Name)
				}
			}
			got, err := (&reader{sock: k, family: w.family, table: w.table}).objects(t.Context(), chains, sets)
			if err != nil {
				t.Fatal(err)
			}
			if want, got := tableText(want), tableText(got); want != got {
				t.Errorf("read by name (+), of the whole table (-):\n%s", testutil.LineDiff(want, got))
			}
		})
	}
}

// Sets, maps and a rule's anonymous map too large for one message (an
// attribute holds at most 64 KiB) are split over several, and read back
// whole.
func TestLargeSetsAndMapsRoundTrip(t *testing.T) {
	const n = 3000
	serviceIPs := Set{Name: "service-ips", Map: true, Type: "ipv4_addr . inet_proto . inet_service : verdict", Comment: "ClusterIP traffic"}
	clusterIPs := Set{Name: "cluster-ips", Type: "ipv4_addr"}
	var endpoints []string
	for i := range n {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		serviceIPs.Elements = append(serviceIPs.Elements, Element{Key: ip + " . tcp . 80", Value: "goto service-" + strconv.Itoa(i), Comment: "ns/svc-" + strconv.Itoa(i) + ":http"})
		clusterIPs.Elements = append(clusterIPs.Elements, Element{Key: ip})
		endpoints = append(endpoints, fmt.Sprintf("%d : 10.244.%d.%d . 8080", i, i/250, i%250+1))
	}
	tb := &Table{Sets: []Set{serviceIPs, clusterIPs}, Chains: []Chain{{Name: "service", Rules: []string{
		"ip daddr . meta l4proto . th dport vmap @service-ips",
		"meta l4proto tcp dnat ip to numgen random mod " + strconv.Itoa(n) + " map { " + strings.Join(endpoints, ", ") + " }",
	}}}}
	w, err := writeTable("ip", tb)
	if err != nil {
		t.Fatal(err)
	}
	// Messages of several elements each, and the anonymous map's set
	// and elements.
	for what, least := range map[string]int{"elements of service-ips": 2, "elements of cluster-ips": 2, "an anonymous set to a rule of chain service": 3} {
		if n := strings.Count(w.String(), what); n < least {
			t.Errorf("%q in %d messages, want %d or more", what, n, least)
		}
	}
	got, err := roundTrip(t.Context(), "ip", tb)
	if err != nil {
		t.Fatal(err)
	}
	if want, got := tableText(tb), tableText(got); want != got {
		t.Errorf("read back (+), written (-):\n%s", testutil.LineDiff(want, got))
	}
}
