package iptables

import (
	"bytes"
	"io"
	"slices"
	"strings"
)

// RestoreInput builds iptables-restore --noflush input, one section per
// table, each applied atomically by the kernel. Within a table the order
// is what keeps every intermediate step valid: chains are declared (which
// creates or flushes them) first, then rules are deleted, written and
// inserted, and unused chains are deleted last, once nothing jumps to them.
type RestoreInput struct {
	tables map[Table]*tableInput
	// NATFirst writes the nat table before filter (see JoinInputs).
	NATFirst bool
}

// tableInput holds one table's lines as text, section by section: at 10k
// services a full sync writes some 200k lines, and one string each would
// double the memory they take.
type tableInput struct {
	declare, deleteRules, appendRules, insertRules, deleteChains section
}

// section is text in chunks, each twice the last up to chunkSize: growing
// one buffer would copy it at each doubling and leave the old copies to
// the collector, tens of MB at 10k services.
type section struct {
	chunks [][]byte
	lines  int
}

const firstChunkSize, chunkSize = 512, 64 << 10

func (s *section) add(parts ...string) {
	n := 1
	for _, p := range parts {
		n += len(p)
	}
	if len(s.chunks) == 0 || cap(s.chunks[len(s.chunks)-1])-len(s.chunks[len(s.chunks)-1]) < n {
		size := chunkSize
		if len(s.chunks) == 0 {
			size = firstChunkSize
		} else if last := cap(s.chunks[len(s.chunks)-1]); last < chunkSize {
			size = 2 * last
		}
		s.chunks = append(s.chunks, make([]byte, 0, max(size, n)))
	}
	last := &s.chunks[len(s.chunks)-1]
	for _, p := range parts {
		*last = append(*last, p...)
	}
	*last = append(*last, '\n')
	s.lines++
}

// NewRestoreInput returns an empty input.
func NewRestoreInput() *RestoreInput { return &RestoreInput{tables: map[Table]*tableInput{}} }

func (in *RestoreInput) table(t Table) *tableInput {
	ti := in.tables[t]
	if ti == nil {
		ti = &tableInput{}
		in.tables[t] = ti
	}
	return ti
}

// WriteChain declares a chain and gives it exactly these rules.
func (in *RestoreInput) WriteChain(t Table, c OwnChain) {
	in.DeclareChain(t, c.Name)
	in.AppendChainRules(t, c)
}

// DeclareChain creates a chain, or flushes it.
func (in *RestoreInput) DeclareChain(t Table, c Chain) {
	in.table(t).declare.add(":", string(c), " - [0:0]")
}

// AppendChainRules writes a chain's rules without declaring it.
func (in *RestoreInput) AppendChainRules(t Table, c OwnChain) {
	ti := in.table(t)
	for _, r := range c.Rules {
		ti.appendRules.add("-A ", string(c.Name), " ", string(r))
	}
}

// DeleteChain flushes a chain and deletes it.
func (in *RestoreInput) DeleteChain(t Table, c Chain) {
	in.DeclareChain(t, c)
	in.table(t).deleteChains.add("-X ", string(c))
}

// AddRule appends one rule to a chain others add to as well, after the
// chains written whole.
func (in *RestoreInput) AddRule(t Table, c Chain, r Rule) {
	in.table(t).insertRules.add("-A ", string(c), " ", string(r))
}

// InsertFirst puts a rule at the top of a chain, where the jumps from the
// built-in chains go, ahead of other programs' rules.
func (in *RestoreInput) InsertFirst(t Table, c Chain, r Rule) {
	in.table(t).insertRules.add("-I ", string(c), " 1 ", string(r))
}

// DeleteRule deletes one rule of a chain, before any is added.
func (in *RestoreInput) DeleteRule(t Table, c Chain, r Rule) {
	in.table(t).deleteRules.add("-D ", string(c), " ", string(r))
}

// Empty tells whether there is nothing to restore.
func (in *RestoreInput) Empty() bool {
	for _, ti := range in.tables {
		if ti.lines() > 0 {
			return false
		}
	}
	return true
}

// Lines is how many lines the input holds for table t.
func (in *RestoreInput) Lines(t Table) int {
	if ti := in.tables[t]; ti != nil {
		return ti.lines()
	}
	return 0
}

func (ti *tableInput) sections() []*section {
	return []*section{&ti.declare, &ti.deleteRules, &ti.appendRules, &ti.insertRules, &ti.deleteChains}
}

// body is the table's lines, section by section.
func (ti *tableInput) body() [][]byte {
	var parts [][]byte
	for _, s := range ti.sections() {
		parts = append(parts, s.chunks...)
	}
	return parts
}

func (ti *tableInput) lines() int {
	n := 0
	for _, s := range ti.sections() {
		n += s.lines
	}
	return n
}

// Reader renders the input without copying it.
func (in *RestoreInput) Reader() io.Reader {
	if r := JoinInputs(in); r != nil {
		return r
	}
	return strings.NewReader("")
}

// JoinInputs renders inputs as one, each table holding their lines in
// turn, or nil if they are all empty. filter goes before nat so that a
// service losing its endpoints is rejected before its nat rules disappear,
// unless an input asks for nat first (NATFirst).
func JoinInputs(inputs ...*RestoreInput) io.Reader {
	var parts []io.Reader
	order := KubeTables
	if slices.ContainsFunc(inputs, func(in *RestoreInput) bool { return in.NATFirst }) {
		order = []Table{TableMangle, TableNAT, TableFilter}
	}
	for _, t := range order {
		var body []io.Reader
		for _, in := range inputs {
			if ti := in.tables[t]; ti != nil && ti.lines() > 0 {
				for _, b := range ti.body() {
					body = append(body, bytes.NewReader(b))
				}
			}
		}
		if len(body) == 0 {
			continue
		}
		parts = append(parts, strings.NewReader("*"+string(t)+"\n"))
		parts = append(append(parts, body...), strings.NewReader("COMMIT\n"))
	}
	if len(parts) == 0 {
		return nil
	}
	return io.MultiReader(parts...)
}

// String renders the input, for tests and errors.
func (in *RestoreInput) String() string {
	var b strings.Builder
	io.Copy(&b, in.Reader())
	return b.String()
}

// Counts returns the rules written per table, for the metrics.
func (in *RestoreInput) Counts() map[Table]int {
	out := map[Table]int{}
	for t, ti := range in.tables {
		out[t] = ti.appendRules.lines + ti.insertRules.lines
	}
	return out
}
