package nftables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nfgen"
	"github.com/rapidproxy/rapidproxy/internal/nftnl"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// Reading and writing tables over netlink on the real kernel, against nft.

// Every golden table and the tables upstream v1.36.3 wrote, loaded with
// nft -f, read over netlink the same as from nft's listing.
func TestKernelNetlinkReadMatchesListing(t *testing.T) {
	if !inNetns(t) {
		return
	}
	scripts := tableScripts(t)
	for _, name := range sortedKeys(scripts) {
		t.Run(name, func(t *testing.T) {
			family := knftables.IPv4Family
			if strings.Contains(strings.SplitN(scripts[name], "\n", 2)[0], " ip6 ") {
				family = knftables.IPv6Family
			}
			loadTable(t, family, scripts[name])
			listed, err := readTable(t.Context(), lister(family), "table", "")
			if err != nil {
				t.Fatal(err)
			}
			nt, err := nftnl.Read(t.Context(), string(family), TableName)
			if err != nil {
				t.Fatal(err)
			}
			if want, got := tableText(listed), tableText(fromNetlink(nt)); want != got {
				t.Errorf("read over netlink (+), listed by nft (-):\n%s", testutil.LineDiff(want, got))
			}
		})
	}
}

// tableScripts are nft scripts of every golden table, the tables upstream
// v1.36.3 wrote, and further shapes, by name.
func tableScripts(t *testing.T) map[string]string {
	t.Helper()
	scripts := map[string]string{}
	goldens, err := filepath.Glob("testdata/*.golden")
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, path := range goldens {
		script, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		scripts[strings.TrimSuffix(filepath.Base(path), ".golden")] = string(script)
	}
	sample, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, family := range []string{"ip", "ip6"} {
		scripts["upstream-"+family] = sampleTable(t, string(sample), "table "+family+" kube-proxy {")
	}
	// Shapes the files above hold only in part: maps of 10 endpoints or
	// more (sorted by value), interface name prefixes, masks, ranges.
	var dnatMap, vmap []string
	for i := range 12 {
		dnatMap = append(dnatMap, fmt.Sprintf("%d : 10.244.0.%d . 8080", i, i+1))
		vmap = append(vmap, fmt.Sprintf("%d : goto endpoint", i))
	}
	scripts["more-shapes-ip"] = `table ip kube-proxy {
	set ranges { type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 192.168.1.1, 172.16.0.1-172.16.0.5 }; }
	chain endpoint { }
	chain c {
		iifname "veth*" meta mark set meta mark | 0x4000
		ip daddr 10.0.0.0/12 drop
		meta l4proto tcp dnat ip to numgen random mod 12 map { ` + strings.Join(dnatMap, ", ") + ` }
		numgen random mod 12 vmap { ` + strings.Join(vmap, ", ") + ` }
		ip saddr != { 10.0.0.0/8, 192.168.1.1, 172.16.0.1-172.16.0.5 } drop
		ip saddr @ranges accept
	}
}
`
	scripts["more-shapes-ip6"] = `table ip6 kube-proxy {
	chain endpoint { }
	chain c {
		meta l4proto udp dnat ip6 to numgen random mod 2 map { 0 : fd00::1 . 53, 1 : fd00::2 . 53 }
		ip6 saddr != { fd00::/64, fd01::1 } goto endpoint
		ip6 daddr fd00:10::/28 reject
	}
}
`
	return scripts
}

// A rule of a shape the netlink reader does not decode makes a full sync
// read the table with nft, once logged, and restore the chain.
func TestKernelUnknownRuleShapeFallsBackToListing(t *testing.T) {
	if !inNetns(t) {
		return
	}
	h, k, params := kernelSample(t)
	const chain = "service-DMA2WJPR-hx-conf/fid-a/tcp/http"
	if out, err := exec.Command("nft", "insert", "rule", "ip", TableName, chain, "counter").CombinedOutput(); err != nil {
		t.Fatalf("nft insert rule: %v: %s", err, out)
	}
	var readErrs []error
	h.syncer = h.kernelSyncer(v1.IPv4Protocol, params, k)
	real := h.syncer.cfg.Kernel.(*realKernel)
	read := real.netlinkRead
	real.netlinkRead = func(ctx context.Context) (*nftnl.Table, error) {
		nt, err := read(ctx)
		readErrs = append(readErrs, err)
		return nt, err
	}
	n := len(k.txs)
	h.full()
	if len(readErrs) != 1 || readErrs[0] == nil || !strings.Contains(readErrs[0].Error(), `expression "counter"`) {
		t.Errorf("reading over netlink: %v, want one error naming the counter", readErrs)
	}
	if len(k.txs) != n+1 || !strings.Contains(k.txs[n], chain) {
		t.Errorf("the full sync did not rewrite %s:\n%s", chain, strings.Join(k.txs[n:], "\n"))
	}
	compareWithFresh(t, h, params)
	// Read over netlink again once the shape is gone.
	h.full()
	if len(readErrs) != 2 || readErrs[1] != nil {
		t.Errorf("reading over netlink after the repair: %v", readErrs[1:])
	}
}

// loadTable replaces the family's kube-proxy table with an nft script.
func loadTable(t *testing.T, family knftables.Family, script string) {
	t.Helper()
	if err := Cleanup(t.Context(), realStreamer(t, family)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
}

// tableText prints every field of a table that a sync compares, sorted.
func tableText(tb *table) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exists %v, comment %q\n", tb.exists, tb.comment)
	for _, name := range sortedKeys(tb.chains) {
		c := tb.chains[name]
		fmt.Fprintf(&b, "chain %s", name)
		if c.Type != nil {
			fmt.Fprintf(&b, " type %s hook %s priority %s", *c.Type, *c.Hook, *c.Priority)
		}
		if c.Comment != nil {
			fmt.Fprintf(&b, " comment %q", *c.Comment)
		}
		b.WriteString("\n")
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t%s\n", r)
		}
	}
	for _, name := range sortedKeys(tb.sets) {
		s := tb.sets[name]
		fmt.Fprintf(&b, "set %s map %v type %q flags %v timeout %v comment %q\n", name, s.Map, s.Type, s.Flags, s.Timeout, s.Comment)
		for _, key := range sortedKeys(s.elements) {
			fmt.Fprintf(&b, "\t%s : %s", key, s.elements[key])
			if c, ok := s.comments[key]; ok {
				fmt.Fprintf(&b, " comment %q", c)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// scriptFamily is the family of the table an nft script writes.
func scriptFamily(script string) knftables.Family {
	if strings.Contains(strings.SplitN(script, "\n", 2)[0], " ip6 ") {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// Every table of tableScripts written over netlink (nftnl.Writer: the
// table, its chains and sets, then their rules and elements, in one
// batch) lists as nft -f of the script does: the writer makes what nft
// makes of every rule shape and element type.
func TestKernelNetlinkWriteMatchesNFT(t *testing.T) {
	if !inNetns(t) {
		return
	}
	scripts := tableScripts(t)
	for _, name := range sortedKeys(scripts) {
		t.Run(name, func(t *testing.T) {
			family := scriptFamily(scripts[name])
			loadTable(t, family, scripts[name])
			want, err := readTable(t.Context(), lister(family), "table", "")
			if err != nil {
				t.Fatal(err)
			}
			wantSizes := setSizes(t, family)
			if err := Cleanup(t.Context(), realStreamer(t, family)); err != nil {
				t.Fatal(err)
			}
			if err := writerOf(t, family, want).Send(); err != nil {
				t.Fatal(err)
			}
			got, err := readTable(t.Context(), lister(family), "table", "")
			if err != nil {
				t.Fatal(err)
			}
			if want, got := tableText(want), tableText(got); want != got {
				t.Errorf("written over netlink (+), by nft -f (-):\n%s", testutil.LineDiff(want, got))
			}
			if got := setSizes(t, family); got != wantSizes {
				t.Errorf("sets' sizes written over netlink (+), by nft -f (-):\n%s", testutil.LineDiff(wantSizes, got))
			}
		})
	}
}

// setSizes are the table's sets with the size nft lists for each, which
// the table's reader leaves out. The writer sends no size: the kernel gives
// a dynamic set without one 65535 when an update rule binds it, as it does
// to the same set from nft -f, and as upstream's affinity sets list.
func setSizes(t *testing.T, family knftables.Family) string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", string(family), TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	var sizes []string
	set := ""
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "map "):
			set = strings.TrimSuffix(line, " {")
		case strings.HasPrefix(line, "size "):
			sizes = append(sizes, set+": "+line)
		}
	}
	slices.Sort(sizes)
	return strings.Join(sizes, "\n")
}

// writerOf is a netlink transaction that makes the table tb.
func writerOf(t *testing.T, family knftables.Family, tb *table) *nftnl.Writer {
	t.Helper()
	w, err := nftnl.NewWriter(string(family), TableName, func(string) (string, []string, bool) { return "", nil, false })
	if err != nil {
		t.Fatal(err)
	}
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	check(w.AddTable(tb.comment))
	for _, name := range sortedKeys(tb.counters) {
		check(w.AddCounter(name))
	}
	for _, name := range sortedKeys(tb.chains) {
		c := tb.chains[name]
		nc := nftnl.Chain{Name: name}
		if c.Comment != nil {
			nc.Comment = *c.Comment
		}
		if c.Hook != nil {
			nc.Base = &nftnl.BaseChain{Type: string(*c.Type), Hook: string(*c.Hook), Priority: string(*c.Priority)}
		}
		check(w.AddChain(nc))
	}
	for _, name := range sortedKeys(tb.sets) {
		s := tb.sets[name]
		ns := nftnl.Set{Name: name, Map: s.Map, Type: s.Type, Timeout: s.Timeout, Comment: s.Comment}
		for _, f := range s.Flags {
			ns.Flags = append(ns.Flags, string(f))
		}
		check(w.AddSet(ns))
	}
	for _, name := range sortedKeys(tb.chains) {
		for _, rule := range tb.chains[name].Rules {
			check(w.AddRule(name, rule))
		}
	}
	for _, name := range sortedKeys(tb.sets) {
		s := tb.sets[name]
		for _, key := range sortedKeys(s.elements) {
			check(w.AddElement(name, nftnl.Element{Key: key, Value: s.elements[key], Comment: s.comments[key]}))
		}
	}
	return w
}

// A netlink batch the kernel refuses part of applies none of it, moves no
// generation, and its error names the operation refused: a rule jumping
// to a missing chain, an element of a set that is not there.
func TestKernelRefusedNetlinkBatchAppliesNothing(t *testing.T) {
	if !inNetns(t) {
		return
	}
	loadTable(t, knftables.IPv4Family, "table ip kube-proxy {\n\tset s { type ipv4_addr; }\n\tchain c { }\n}\n")
	before, err := readTable(t.Context(), lister(knftables.IPv4Family), "table", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		bad  func(w *nftnl.Writer) error
		want string
	}{
		{"a jump to a missing chain", func(w *nftnl.Writer) error { return w.AddRule("c", "jump missing") },
			`adding rule "jump missing" to chain c: no such file or directory`},
		{"an element of a missing set", func(w *nftnl.Writer) error { return w.AddElement("gone", nftnl.Element{Key: "10.0.0.2"}) },
			"adding element 10.0.0.2 of gone: no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The writer takes "gone" for a set the table holds, as a
			// syncer whose view of the table is stale would.
			w, err := nftnl.NewWriter("ip", TableName, func(string) (string, []string, bool) { return "ipv4_addr", nil, true })
			if err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(w.AddChain(nftnl.Chain{Name: "d"}), w.AddRule("c", "ip daddr 10.0.0.1 jump d"),
				w.AddElement("s", nftnl.Element{Key: "10.0.0.1"}), tc.bad(w), w.AddRule("c", "drop")); err != nil {
				t.Fatal(err)
			}
			gen, err := nfgen.Generation()
			if err != nil {
				t.Fatal(err)
			}
			err = w.Send()
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v, want %q", err, tc.want)
			}
			after, err := readTable(t.Context(), lister(knftables.IPv4Family), "table", "")
			if err != nil {
				t.Fatal(err)
			}
			if want, got := tableText(before), tableText(after); want != got {
				t.Errorf("the refused batch changed the table (+):\n%s", testutil.LineDiff(want, got))
			}
			if moved, err := nfgen.Generation(); err != nil || moved != gen {
				t.Errorf("the generation moved from %d to %d (%v)", gen, moved, err)
			}
		})
	}
}

// A transaction with an operation the netlink writer does not encode (a
// counter) goes whole to nft, and the syncer says so once.
func TestKernelUnencodedTransactionGoesToNFT(t *testing.T) {
	if !inNetns(t) {
		return
	}
	h, k, _ := kernelSample(t)
	c := &Chain{Chain: knftables.Chain{Name: "other"}, Rules: []string{"counter", "drop"}}
	plan := txPlan{{objectOps(addOp, []knftables.Object{&c.Chain}), 0, 1}, {ruleOps("ip", []ruleRef{{c, 0}, {c, 1}}), 0, 2}}
	n, overNetlink := len(k.txs), k.overNetlink
	for range 2 {
		if err := h.syncer.cfg.Kernel.Run(t.Context(), plan, h.syncer.table.kernel); err != nil {
			t.Fatal(err)
		}
	}
	if k.overNetlink != overNetlink || len(k.txs) != n+2 || !strings.Contains(k.txs[n], "add rule ip kube-proxy other counter") {
		t.Errorf("over netlink: %d; transactions:\n%s", k.overNetlink-overNetlink, strings.Join(k.txs[n:], "\n"))
	}
	if !h.syncer.cfg.Kernel.(*realKernel).loggedEncode {
		t.Error("the fallback was not logged")
	}
	rules, err := k.ListRules(t.Context(), "other")
	if err != nil || len(rules) != 4 {
		t.Errorf("chain other holds %d rules (%v), want 4", len(rules), err)
	}
}
