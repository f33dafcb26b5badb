package nftables

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// libraryTable writes the nftables mode's table of n ClusterIP services x
// 5 endpoints (a first full sync) in a fresh network namespace, and
// returns the namespace, open, and the table as our reader reads it.
func libraryTable(b testing.TB, n int) (string, *os.File, *nftnl.Table) {
	testutil.RequireRoot(b)
	testutil.RequireCommands(b, "nft", "ip")
	h := scaleHarness(n)
	ns := testutil.NewNetns(b)
	var tb *nftnl.Table
	testutil.DoInNetns(b, ns, func() {
		nft := newTimedNFT(b)
		s, err := New(Config{Family: v1.IPv4Protocol, Kernel: sendingKernel(v1.IPv4Protocol, nft, nft.send), Params: h.syncer.cfg.Params})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.FullSync(h.view()); err != nil {
			b.Fatal(err)
		}
		if tb, err = nftnl.Read(context.Background(), "ip", TableName); err != nil {
			b.Fatal(err)
		}
	})
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return ns, f, tb
}

// libraryObjects is what google/nftables' Conn reads of the table: its
// chains, each chain's rules, its sets (named and anonymous) and each
// set's elements, in its own types.
type libraryObjects struct {
	table    *gnft.Table
	chains   []*gnft.Chain
	rules    [][]*gnft.Rule
	sets     []*gnft.Set
	elements [][]gnft.SetElement
}

func (o *libraryObjects) counts() (rules, elements int) {
	for _, r := range o.rules {
		rules += len(r)
	}
	for _, e := range o.elements {
		elements += len(e)
	}
	return rules, elements
}

// libraryRead reads the table with the dumps our reader makes (chains,
// rules a chain at a time, sets, each set's elements).
func libraryRead(c *gnft.Conn) (*libraryObjects, error) {
	o := &libraryObjects{table: &gnft.Table{Name: TableName, Family: gnft.TableFamilyIPv4}}
	chains, err := c.ListChainsOfTableFamily(gnft.TableFamilyIPv4)
	if err != nil {
		return nil, err
	}
	for _, ch := range chains {
		if ch.Table.Name != TableName {
			continue
		}
		rules, err := c.GetRules(o.table, ch)
		if err != nil {
			return nil, fmt.Errorf("chain %s: %w", ch.Name, err)
		}
		o.chains, o.rules = append(o.chains, ch), append(o.rules, rules)
	}
	if o.sets, err = c.GetSets(o.table); err != nil {
		return nil, err
	}
	for _, s := range o.sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		o.elements = append(o.elements, elems)
	}
	return o, nil
}

func tableCounts(tb *nftnl.Table) (rules, elements int) {
	for _, c := range tb.Chains {
		rules += len(c.Rules)
	}
	for _, s := range tb.Sets {
		elements += len(s.Elements)
	}
	return rules, elements
}

// BenchmarkLibraryRead10k reads, in a fresh network namespace, the
// nftables mode's table of 10,000 ClusterIP services x 5 endpoints: with
// our reader (nftnl.Read: every rule as the text nft lists, which the
// syncer compares) and with google/nftables' Conn (ListChainsOfTableFamily,
// GetRules per chain, GetSets, GetSetElements per set: the same dumps,
// decoded into its expression and element types and not printed; its
// anonymous sets' elements, which ours prints in the rules, are read as
// sets of their own). That both read the same table is
// TestLibraryComparisonReadsAndWritesOneTable's. As root:
//
//	go test -run '^$' -bench 'Library(Read|Write)10k' -benchmem -count 3 -benchtime 5x ./pkg/nftables
func BenchmarkLibraryRead10k(b *testing.B) {
	ns, nsFile, tb := libraryTable(b, 10000)
	conn, err := gnft.New(gnft.WithNetNSFd(int(nsFile.Fd())), gnft.AsLasting())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.CloseLasting()
	ourRules, _ := tableCounts(tb)
	b.Run("reader=ours", func(b *testing.B) {
		b.ReportAllocs()
		testutil.DoInNetns(b, ns, func() {
			for b.Loop() {
				got, err := nftnl.Read(context.Background(), "ip", TableName)
				if err != nil {
					b.Fatal(err)
				}
				if rules, _ := tableCounts(got); rules != ourRules {
					b.Fatal(rules)
				}
			}
		})
	})
	b.Run("reader=google-nftables", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			got, err := libraryRead(conn)
			if err != nil {
				b.Fatal(err)
			}
			if rules, _ := got.counts(); rules != ourRules {
				b.Fatal(rules)
			}
		}
	})
}

// BenchmarkLibraryWrite10k writes, in a fresh network namespace, the
// table BenchmarkLibraryRead10k reads, into an empty ruleset, as one
// transaction: with our Writer (from the table as our reader reads it:
// every rule and element as text, encoded by the Writer) and with
// google/nftables' Conn (from the objects its reader read, its verdict
// maps corrected: expressions and element keys already encoded, so its
// time leaves out the encoding ours includes; see libraryWrite). That
// each writes the table ours reads is
// TestLibraryComparisonReadsAndWritesOneTable's. As root: see
// BenchmarkLibraryRead10k.
func BenchmarkLibraryWrite10k(b *testing.B) {
	ns, nsFile, tb := libraryTable(b, 10000)
	// The transaction is one sendmsg, larger than the default buffer
	// allows (EMSGSIZE), and each rule is echoed back: ours sizes its
	// send buffer to the batch, google/nftables takes socket options.
	conn, err := gnft.New(gnft.WithNetNSFd(int(nsFile.Fd())), gnft.AsLasting(), gnft.WithSockOptions(bigBuffers))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.CloseLasting()
	lib, err := libraryRead(conn)
	if err != nil {
		b.Fatal(err)
	}
	libraryFixSets(b, lib, tb)
	b.Run("writer=ours", func(b *testing.B) {
		b.ReportAllocs()
		testutil.DoInNetns(b, ns, func() {
			for b.Loop() {
				b.StopTimer()
				deleteLibraryTable(b, ns)
				b.StartTimer()
				if err := ourWrite(tb); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("writer=google-nftables", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			deleteLibraryTable(b, ns)
			b.StartTimer()
			if err := libraryWrite(conn, lib); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The two sides of the library benchmarks work on one table: in a fresh
// network namespace, google/nftables' Conn reads the rules our reader
// reads of the nftables mode's table (200 ClusterIP services x 5
// endpoints), and each writer, into an empty ruleset, writes the table
// our reader read (google/nftables' without the comments of the table,
// its chains and sets, which it does not read).
func TestLibraryComparisonReadsAndWritesOneTable(t *testing.T) {
	ns, nsFile, tb := libraryTable(t, 200)
	conn, err := gnft.New(gnft.WithNetNSFd(int(nsFile.Fd())), gnft.AsLasting(), gnft.WithSockOptions(bigBuffers))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseLasting()
	lib, err := libraryRead(conn)
	if err != nil {
		t.Fatal(err)
	}
	ourRules, _ := tableCounts(tb)
	if rules, _ := lib.counts(); rules != ourRules {
		t.Errorf("google/nftables reads %d rules, ours %d", rules, ourRules)
	}
	libraryFixSets(t, lib, tb)
	for _, w := range []struct {
		who      string
		comments bool
		write    func() error
	}{
		{"our Writer", true, func() (err error) {
			testutil.DoInNetns(t, ns, func() { err = ourWrite(tb) })
			return err
		}},
		{"google/nftables", false, func() error { return libraryWrite(conn, lib) }},
	} {
		deleteLibraryTable(t, ns)
		if err := w.write(); err != nil {
			t.Fatalf("%s: %v", w.who, err)
		}
		var got *nftnl.Table
		testutil.DoInNetns(t, ns, func() {
			if got, err = nftnl.Read(context.Background(), "ip", TableName); err != nil {
				t.Fatalf("%s: reading back: %v", w.who, err)
			}
		})
		if want, text := libraryTableText(tb, w.comments), libraryTableText(got, w.comments); text != want {
			t.Errorf("%s wrote another table: read back (+), written (-):\n%s", w.who, testutil.LineDiff(want, text))
		}
	}
}

// deleteLibraryTable deletes the nftables mode's table in the namespace.
func deleteLibraryTable(tb testing.TB, ns string) {
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "delete", "table", "ip", TableName).CombinedOutput(); err != nil {
		tb.Fatalf("deleting the table: %v: %s", err, out)
	}
}

// ourWrite writes the table as one transaction with our Writer.
func ourWrite(tb *nftnl.Table) error {
	w, err := nftnl.NewWriter("ip", TableName, func(string) (string, []string, bool) { return "", nil, false })
	if err != nil {
		return err
	}
	errs := []error{w.AddTable(tb.Comment)}
	for _, c := range tb.Chains {
		errs = append(errs, w.AddChain(nftnl.Chain{Name: c.Name, Comment: c.Comment, Base: c.Base}))
	}
	for _, s := range tb.Sets {
		errs = append(errs, w.AddSet(nftnl.Set{Name: s.Name, Map: s.Map, Type: s.Type, Flags: s.Flags, Timeout: s.Timeout, Comment: s.Comment}))
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
			return err
		}
	}
	return w.Send()
}

// libraryWrite writes what libraryRead read as one transaction with
// google/nftables' Conn: the table, its chains, its sets with their
// elements (anonymous ones in the order the kernel listed them, so that
// it gives them the names the rules look up), then the rules. A set's
// elements go in messages of libraryChunk: Conn puts the elements of one
// call in one attribute, whose 16-bit length a set of 10,000 overflows
// (the kernel then reads a truncated list: elements go missing, or the
// batch is refused with ENOENT).
func libraryWrite(c *gnft.Conn, o *libraryObjects) error {
	t := c.AddTable(&gnft.Table{Name: TableName, Family: gnft.TableFamilyIPv4})
	for _, ch := range o.chains {
		cp := *ch
		cp.Table = t
		c.AddChain(&cp)
	}
	for i, s := range o.sets {
		cp := *s
		cp.Table, cp.ID = t, 0
		elems := o.elements[i]
		first := elems[:min(len(elems), libraryChunk)]
		if err := c.AddSet(&cp, first); err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
		for rest := elems[len(first):]; len(rest) > 0; rest = rest[min(len(rest), libraryChunk):] {
			if err := c.SetAddElements(&cp, rest[:min(len(rest), libraryChunk)]); err != nil {
				return fmt.Errorf("set %s: %w", s.Name, err)
			}
		}
	}
	for i, ch := range o.chains {
		for _, r := range o.rules[i] {
			c.AddRule(&gnft.Rule{Table: t, Chain: ch, Exprs: r.Exprs, UserData: r.UserData})
		}
	}
	return c.Flush()
}

// libraryChunk is how many elements libraryWrite puts in one message.
const libraryChunk = 256

// libraryTableText prints a table read by our reader to compare: chains
// and sets by name, a set's elements sorted (the kernel's order is its
// own); the comments of the table, its chains and sets only if comments
// is set (google/nftables' Conn reads none of them, so its copy has none).
func libraryTableText(tb *nftnl.Table, comments bool) string {
	comment := func(c string) string {
		if comments {
			return c
		}
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table comment %q\n", comment(tb.Comment))
	chains := slices.Clone(tb.Chains)
	slices.SortFunc(chains, func(x, y nftnl.Chain) int { return strings.Compare(x.Name, y.Name) })
	for _, c := range chains {
		fmt.Fprintf(&b, "chain %s comment %q base %v\n", c.Name, comment(c.Comment), c.Base)
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\trule %s\n", r)
		}
	}
	sets := slices.Clone(tb.Sets)
	slices.SortFunc(sets, func(x, y nftnl.Set) int { return strings.Compare(x.Name, y.Name) })
	for _, s := range sets {
		fmt.Fprintf(&b, "set %s map %v type %s flags %v timeout %v comment %q\n", s.Name, s.Map, s.Type, s.Flags, s.Timeout, comment(s.Comment))
		var elements []string
		for _, e := range s.Elements {
			elements = append(elements, fmt.Sprintf("\telement %s : %s comment %q\n", e.Key, e.Value, e.Comment))
		}
		slices.Sort(elements)
		b.WriteString(strings.Join(elements, ""))
	}
	return b.String()
}

// bigBuffers sets a socket's send and receive buffers to 256 MiB.
func bigBuffers(c *mnl.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, 256<<20); e != nil {
				serr = e
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// libraryFixSets corrects what google/nftables' GetSets (v0.3.0) reads
// wrong of the table's verdict maps, so that its Conn can write them
// back: it takes a map's data type (verdict) for its key type, losing the
// key's, and leaves each element's verdict undecoded in Val. The key
// types are taken from our reader's table.
func libraryFixSets(b testing.TB, o *libraryObjects, tb *nftnl.Table) {
	types := map[string]gnft.SetDatatype{"ipv4_addr": gnft.TypeIPAddr, "inet_proto": gnft.TypeInetProto, "inet_service": gnft.TypeInetService}
	for i, s := range o.sets {
		if !s.IsMap || s.KeyType.Name != gnft.TypeVerdict.Name {
			continue
		}
		j := slices.IndexFunc(tb.Sets, func(t nftnl.Set) bool { return t.Name == s.Name })
		if j < 0 {
			b.Fatalf("map %s: not in our table", s.Name)
		}
		key, value, _ := strings.Cut(tb.Sets[j].Type, " : ")
		if value != "verdict" {
			b.Fatalf("map %s of %s", s.Name, tb.Sets[j].Type)
		}
		var fields []gnft.SetDatatype
		for _, f := range strings.Split(key, " . ") {
			t, ok := types[f]
			if !ok {
				b.Fatalf("map %s: key type %s", s.Name, f)
			}
			fields = append(fields, t)
		}
		kt, err := gnft.ConcatSetType(fields...)
		if err != nil {
			b.Fatal(err)
		}
		s.KeyType, s.DataType = kt, gnft.TypeVerdict
		for k := range o.elements[i] {
			e := &o.elements[i][k]
			ad, err := mnl.NewAttributeDecoder(e.Val)
			if err != nil {
				b.Fatal(err)
			}
			ad.ByteOrder = binary.BigEndian
			v := &expr.Verdict{}
			for ad.Next() {
				switch ad.Type() {
				case unix.NFTA_VERDICT_CODE:
					v.Kind = expr.VerdictKind(int32(ad.Uint32()))
				case unix.NFTA_VERDICT_CHAIN:
					v.Chain = ad.String()
				}
			}
			if err := ad.Err(); err != nil {
				b.Fatal(err)
			}
			e.Val, e.VerdictData = nil, v
		}
	}
}
