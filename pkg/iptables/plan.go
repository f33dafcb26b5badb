package iptables

import (
	"bytes"
	"errors"
	"io"
	"strings"
)

// restoreInput builds iptables-restore --noflush input, one section per
// table, each applied atomically by the kernel. Within a table the order
// is what keeps every intermediate step valid: chains are declared (which
// creates or flushes them) first, then rules are deleted, written and
// inserted, and unused chains are deleted last, once nothing jumps to them.
type restoreInput struct {
	tables map[Table]*tableInput
}

// tableInput holds one table's lines as text, section by section: at 10k
// services a full sync writes some 200k lines, and one string each would
// double the memory they take.
type tableInput struct {
	declare, deleteRules, appendRules, insertRules, deleteChains section
}

type section struct {
	text  bytes.Buffer
	lines int
}

func (s *section) add(parts ...string) {
	for _, p := range parts {
		s.text.WriteString(p)
	}
	s.text.WriteByte('\n')
	s.lines++
}

func newRestoreInput() *restoreInput { return &restoreInput{tables: map[Table]*tableInput{}} }

func (in *restoreInput) table(t Table) *tableInput {
	ti := in.tables[t]
	if ti == nil {
		ti = &tableInput{}
		in.tables[t] = ti
	}
	return ti
}

// writeChain declares a chain and gives it exactly these rules.
func (in *restoreInput) writeChain(t Table, c OwnChain) {
	ti := in.table(t)
	ti.declare.add(":", string(c.Name), " - [0:0]")
	for _, r := range c.Rules {
		ti.appendRules.add("-A ", string(c.Name), " ", string(r))
	}
}

// deleteChain flushes a chain and deletes it.
func (in *restoreInput) deleteChain(t Table, c Chain) {
	ti := in.table(t)
	ti.declare.add(":", string(c), " - [0:0]")
	ti.deleteChains.add("-X ", string(c))
}

func (in *restoreInput) addShared(r SharedRule) {
	if r.Table == TableNAT && r.Chain == chainServices {
		// Ahead of the NodePort jump that must stay last.
		in.insertFirst(r.Table, r.Chain, r.Rule)
		return
	}
	in.table(r.Table).insertRules.add("-A ", string(r.Chain), " ", string(r.Rule))
}

// insertFirst puts a rule at the top of a chain, where the jumps from the
// built-in chains go, ahead of other programs' rules.
func (in *restoreInput) insertFirst(t Table, c Chain, r Rule) {
	in.table(t).insertRules.add("-I ", string(c), " 1 ", string(r))
}

func (in *restoreInput) removeShared(r SharedRule) {
	in.table(r.Table).deleteRules.add("-D ", string(r.Chain), " ", string(r.Rule))
}

// empty tells whether there is nothing to restore.
func (in *restoreInput) empty() bool {
	for _, ti := range in.tables {
		if ti.lines() > 0 {
			return false
		}
	}
	return true
}

func (ti *tableInput) sections() []*section {
	return []*section{&ti.declare, &ti.deleteRules, &ti.appendRules, &ti.insertRules, &ti.deleteChains}
}

func (ti *tableInput) lines() int {
	n := 0
	for _, s := range ti.sections() {
		n += s.lines
	}
	return n
}

// reader renders the input without copying it; filter goes before nat so
// that a service losing its endpoints is rejected before its nat rules
// disappear.
func (in *restoreInput) reader() io.Reader {
	var parts []io.Reader
	for _, t := range []Table{TableMangle, TableFilter, TableNAT} {
		ti := in.tables[t]
		if ti == nil || ti.lines() == 0 {
			continue
		}
		parts = append(parts, strings.NewReader("*"+string(t)+"\n"))
		for _, s := range ti.sections() {
			parts = append(parts, bytes.NewReader(s.text.Bytes()))
		}
		parts = append(parts, strings.NewReader("COMMIT\n"))
	}
	return io.MultiReader(parts...)
}

// String renders the input, for tests and errors.
func (in *restoreInput) String() string {
	var b strings.Builder
	io.Copy(&b, in.reader())
	return b.String()
}

// counts returns the rules written per table, for the metrics.
func (in *restoreInput) counts() map[Table]int {
	out := map[Table]int{}
	for t, ti := range in.tables {
		out[t] = ti.appendRules.lines + ti.insertRules.lines
	}
	return out
}

// appliedService is what one service port has in the kernel: its chains
// by fingerprint, not their rules, which at 10k services would be most of
// the proxier's memory, and its shared rules, which deleting them needs.
type appliedService struct {
	chains []appliedChain
	shared []SharedRule
}

type appliedChain struct {
	name        Chain
	fingerprint uint64
	rules       int
}

// summarize records a service port's rules as applied.
func summarize(r ServiceRules) appliedService {
	a := appliedService{chains: make([]appliedChain, len(r.Chains)), shared: r.Shared}
	for i, c := range r.Chains {
		a.chains[i] = appliedChain{name: c.Name, fingerprint: chainFingerprint(c.Rules), rules: len(c.Rules)}
	}
	return a
}

// ruleCounts counts the rules per table.
func (a appliedService) ruleCounts() map[Table]int {
	counts := map[Table]int{}
	for _, c := range a.chains {
		counts[TableNAT] += c.rules
	}
	for _, s := range a.shared {
		counts[s.Table]++
	}
	return counts
}

// diffService adds to in what turns old into updated for one service port:
// only its changed chains are rewritten, and only its changed shared rules
// are deleted or inserted.
func diffService(in *restoreInput, old, updated appliedService, rules ServiceRules) {
	oldChains := make(map[Chain]uint64, len(old.chains))
	for _, c := range old.chains {
		oldChains[c.name] = c.fingerprint
	}
	kept := make(map[Chain]bool, len(updated.chains))
	for i, c := range updated.chains {
		kept[c.name] = true
		if fp, ok := oldChains[c.name]; !ok || fp != c.fingerprint {
			in.writeChain(TableNAT, rules.Chains[i])
		}
	}
	for _, c := range old.chains {
		if !kept[c.name] {
			in.deleteChain(TableNAT, c.name)
		}
	}
	oldShared := countRules(old.shared)
	newShared := countRules(updated.shared)
	for _, r := range old.shared {
		if newShared[r] > 0 {
			newShared[r]--
			continue
		}
		in.removeShared(r)
	}
	for _, r := range updated.shared {
		if oldShared[r] > 0 {
			oldShared[r]--
			continue
		}
		in.addShared(r)
	}
}

func countRules(rules []SharedRule) map[SharedRule]int {
	m := make(map[SharedRule]int, len(rules))
	for _, r := range rules {
		m[r]++
	}
	return m
}

// chainLevel orders chains for a full sync split over several inputs:
// each level only jumps to chains of lower levels, so writing level by
// level never leaves a jump to a chain that is not complete yet.
func chainLevel(c Chain) int {
	switch {
	case strings.HasPrefix(string(c), prefixEndpoint):
		return 0
	case strings.HasPrefix(string(c), prefixClusterPolicy), strings.HasPrefix(string(c), prefixLocalPolicy):
		return 1
	case strings.HasPrefix(string(c), prefixExternal):
		return 2
	default: // KUBE-FW-
		return 3
	}
}

// chainBatches writes a full sync's service chains, ahead of the input
// that makes the shared chains jump to them. Split, each level (see
// chainLevel) collects its own chains; after a service's chains are in, a
// level holding a batch's worth is restored, after every lower level, so
// that no input jumps to a chain that is not written yet. Unsplit, every
// chain goes into one restore that reads the text as it is made, each
// service's chains declared before their rules. Either way only a little
// text is kept, never the services' rules.
type chainBatches struct {
	kernel Kernel
	size   int
	levels [4]*restoreInput
	counts [4]int
	stream *restoreStream
}

// newChainBatches restores inputs of about size chains; 0 streams them
// all into one.
func newChainBatches(kernel Kernel, size int) *chainBatches {
	return &chainBatches{kernel: kernel, size: size}
}

// addService takes the chains of one service that need writing.
func (b *chainBatches) addService(chains []OwnChain) error {
	if len(chains) == 0 {
		return nil
	}
	if b.size <= 0 {
		if b.stream == nil {
			b.stream = startRestoreStream(b.kernel)
			if err := b.stream.write([]byte("*" + TableNAT + "\n")); err != nil {
				return err
			}
		}
		in := newRestoreInput()
		for _, c := range chains {
			in.writeChain(TableNAT, c)
		}
		var parts [][]byte
		for _, sec := range in.table(TableNAT).sections() {
			parts = append(parts, sec.text.Bytes())
		}
		return b.stream.write(parts...)
	}
	full := -1
	for _, c := range chains {
		level := chainLevel(c.Name)
		if b.levels[level] == nil {
			b.levels[level] = newRestoreInput()
		}
		b.levels[level].writeChain(TableNAT, c)
		b.counts[level]++
		if b.counts[level] >= b.size {
			full = max(full, level)
		}
	}
	return b.restoreUpTo(full)
}

func (b *chainBatches) restoreUpTo(level int) error {
	for l := 0; l <= level; l++ {
		if b.counts[l] == 0 {
			continue
		}
		if err := b.kernel.Restore(b.levels[l].reader()); err != nil {
			return err
		}
		b.levels[l], b.counts[l] = nil, 0
	}
	return nil
}

// flush restores every chain not restored yet.
func (b *chainBatches) flush() error {
	if b.stream != nil {
		if err := b.stream.write([]byte("COMMIT\n")); err != nil {
			return err
		}
		return b.stream.finish()
	}
	return b.restoreUpTo(len(b.levels) - 1)
}

// restoreStream is one restore whose input is written while it runs.
type restoreStream struct {
	pipe *io.PipeWriter
	done chan error
}

func startRestoreStream(kernel Kernel) *restoreStream {
	r, w := io.Pipe()
	s := &restoreStream{pipe: w, done: make(chan error, 1)}
	go func() {
		err := kernel.Restore(r)
		// Unblocks the writer if the restore ended before reading it all.
		r.CloseWithError(errors.Join(err, errRestoreEnded))
		s.done <- err
	}()
	return s
}

var errRestoreEnded = errors.New("the restore ended before its input")

// write passes input on; after an error the stream is finished.
func (s *restoreStream) write(parts ...[]byte) error {
	for _, part := range parts {
		if _, err := s.pipe.Write(part); err != nil {
			return s.end(err)
		}
	}
	return nil
}

// finish ends the input and returns the restore's result.
func (s *restoreStream) finish() error { return s.end(nil) }

func (s *restoreStream) end(writeErr error) error {
	s.pipe.Close()
	if err := <-s.done; err != nil {
		return err
	}
	return writeErr
}
