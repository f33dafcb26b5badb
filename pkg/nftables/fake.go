package nftables

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
)

// Fake is a Kernel on knftables' Fake, for tests. Run makes each
// transaction's objects and runs them on the Fake; ReadTable and List
// read the Fake's table printed as `nft list` prints it, through the
// parser of the real listing; ReadObjects fails as with NFTOnly, so that
// a verify lists; Generation counts the transactions run.
type Fake struct {
	// Fake holds the table: tests look at it, and change it as another
	// program would.
	*knftables.Fake
	// nft runs the transactions on the Fake: the Fake itself, or a
	// test's wrapper of it that records or fails them.
	nft knftables.Interface
	// generation, when set, is the ruleset generation instead of runs: a
	// test's, which other programs' changes move too.
	generation func() uint64
	runs       uint64
}

// NewFake is an empty kube-proxy table of the family on knftables' Fake.
func NewFake(family v1.IPFamily) *Fake {
	f := knftables.NewFake(Family(family), TableName)
	return &Fake{Fake: f, nft: f}
}

func (f *Fake) ReadTable(ctx context.Context) (*table, error) {
	return f.List(ctx, "table", "")
}

func (f *Fake) ReadObjects(context.Context, []string, []string) (*table, error) {
	return nil, errNotOverNetlink
}

func (f *Fake) List(ctx context.Context, kind, name string) (*table, error) {
	return readTable(ctx, listFake(f.Fake), kind, name)
}

func (f *Fake) Run(ctx context.Context, tx txPlan, _ tableSets) error {
	if err := f.nft.Run(ctx, tx.transaction(f.nft)); err != nil {
		return err
	}
	f.runs++
	return nil
}

func (f *Fake) Generation() (uint64, error) {
	if f.generation != nil {
		return f.generation(), nil
	}
	return f.runs, nil
}

func (f *Fake) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	return f.nft.ListRules(ctx, chain)
}

// listFake prints a Fake's table, or one chain, set or map of it, as `nft
// list` does, for the Fake's reads.
func listFake(f *knftables.Fake) func(context.Context, string, string) (io.ReadCloser, error) {
	return func(_ context.Context, kind, name string) (io.ReadCloser, error) {
		f.RLock()
		defer f.RUnlock()
		t := f.Table
		if t != nil && kind != "table" {
			t = onlyObject(t, kind, name)
		}
		if t == nil {
			return nil, fmt.Errorf("no %s %s: %w", kind, name, fs.ErrNotExist)
		}
		return io.NopCloser(strings.NewReader(renderFake(t))), nil
	}
}

// onlyObject is t with just one of its chains, sets or maps; nil when t
// has no such object.
func onlyObject(t *knftables.FakeTable, kind, name string) *knftables.FakeTable {
	only := &knftables.FakeTable{Table: knftables.Table{Family: t.Family, Name: t.Name}}
	switch c, s, m := t.Chains[name], t.Sets[name], t.Maps[name]; {
	case kind == "chain" && c != nil:
		only.Chains = map[string]*knftables.FakeChain{name: c}
	case kind == "set" && s != nil:
		only.Sets = map[string]*knftables.FakeSet{name: s}
	case kind == "map" && m != nil:
		only.Maps = map[string]*knftables.FakeMap{name: m}
	default:
		return nil
	}
	return only
}

// renderFake prints t as `nft list table` does.
func renderFake(t *knftables.FakeTable) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", t.Family, t.Name)
	if t.Comment != nil {
		fmt.Fprintf(&b, "\tcomment %q\n", *t.Comment)
	}
	for _, name := range sortedKeys(t.Counters) {
		fmt.Fprintf(&b, "\tcounter %s {\n\t\tpackets 0 bytes 0\n\t}\n\n", name)
	}
	for _, name := range sortedKeys(t.Sets) {
		s := t.Sets[name]
		timeout := ""
		if s.Timeout != nil {
			timeout = nftnl.Duration(*s.Timeout)
		}
		renderSet(&b, "set", name, s.Type, s.Flags, timeout, s.Comment, s.Elements)
	}
	for _, name := range sortedKeys(t.Maps) {
		m := t.Maps[name]
		renderSet(&b, "map", name, m.Type, m.Flags, "", m.Comment, m.Elements)
	}
	for _, name := range sortedKeys(t.Chains) {
		renderChain(&b, name, t.Chains[name])
	}
	b.WriteString("}\n")
	return b.String()
}

func renderSet(b *strings.Builder, kind, name, typ string, flags []knftables.SetFlag, timeout string, cmt *string, els []*knftables.Element) {
	fmt.Fprintf(b, "\t%s %s {\n\t\ttype %s\n", kind, name, typ)
	if len(flags) > 0 {
		fs := make([]string, len(flags))
		for i, f := range flags {
			fs[i] = string(f)
		}
		fmt.Fprintf(b, "\t\tsize 65535\n\t\tflags %s\n", strings.Join(fs, ","))
	}
	if timeout != "" {
		fmt.Fprintf(b, "\t\ttimeout %s\n", timeout)
	}
	if cmt != nil {
		fmt.Fprintf(b, "\t\tcomment %q\n", *cmt)
	}
	if len(els) > 0 {
		var out []string
		for _, e := range els {
			s := strings.Join(e.Key, " . ")
			if e.Comment != nil {
				s += fmt.Sprintf(" comment %q", *e.Comment)
			}
			if len(e.Value) > 0 {
				s += " : " + strings.Join(e.Value, " . ")
			}
			out = append(out, s)
		}
		fmt.Fprintf(b, "\t\telements = { %s }\n", strings.Join(out, ",\n\t\t\t     "))
	}
	b.WriteString("\t}\n\n")
}

func renderChain(b *strings.Builder, name string, c *knftables.FakeChain) {
	fmt.Fprintf(b, "\tchain %s {\n", name)
	if c.Hook != nil {
		fmt.Fprintf(b, "\t\ttype %s hook %s priority %s; policy accept;\n", *c.Type, *c.Hook, *c.Priority)
	}
	if c.Comment != nil {
		fmt.Fprintf(b, "\t\tcomment %q\n", *c.Comment)
	}
	for _, r := range c.Rules {
		// nft prints a verdict map's items as "a, b".
		line := strings.ReplaceAll(r.Rule, " , ", ", ")
		if r.Comment != nil {
			line += fmt.Sprintf(" comment %q", *r.Comment)
		}
		fmt.Fprintf(b, "\t\t%s\n", line)
	}
	b.WriteString("\t}\n\n")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
