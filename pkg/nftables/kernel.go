package nftables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
)

// table is what the kernel's kube-proxy table holds, as far as a sync
// compares it: read from `nft list table` by a full sync, then kept up to
// date by every successful transaction.
type table struct {
	exists  bool
	comment string
	chains  map[string]*tableChain
	sets    map[string]*tableSet
	// counters are the named counters, as far as known: a read over
	// netlink does not list them (a sync adds them again, which keeps
	// their counts).
	counters map[string]bool
}

// tableChain is a chain the table holds: as read, its name, hook and
// comment and its rules; in the syncer's mirror of the table, all a sync
// compares (see printed): its hook, and the print of its rules.
type tableChain struct {
	*knftables.Chain
	Rules []string
	print rulesPrint
}

// regularChain is every regular chain of the mirror, whose name is its
// key: a sync compares no more of one than that it has no hook. Never
// changed.
var regularChain = &knftables.Chain{}

// mirrored is c as the mirror keeps it: its hook, and the print of its
// rules.
func mirrored(c knftables.Chain, print rulesPrint) *tableChain {
	if c.Hook == nil {
		return &tableChain{Chain: regularChain, print: print}
	}
	return &tableChain{Chain: &c, print: print}
}

// printed has a table just read keep of its chains what the mirror
// keeps: no rule text.
func (t *table) printed() {
	for name, c := range t.chains {
		t.chains[name] = mirrored(*c.Chain, printOf(c.Rules))
	}
}

// tableSet is a set or map and its elements, key to value ("" in a set),
// both joined with " . " as nft prints them. Elements of dynamic sets
// (affinity) are not kept: the kernel writes those.
type tableSet struct {
	Set
	elements map[string]string
	// comments are the elements' comments, for the few that have one.
	comments map[string]string
}

func newTable() *table {
	return &table{chains: map[string]*tableChain{}, sets: map[string]*tableSet{}, counters: map[string]bool{}}
}

// lister runs `nft list` on the family's kube-proxy table (kind "table",
// name "") or on one chain, set or map in it; the returned reader's Close
// reports nft's failure, fs.ErrNotExist when there is no such object.
func lister(family knftables.Family) func(ctx context.Context, kind, name string) (io.ReadCloser, error) {
	return func(ctx context.Context, kind, name string) (io.ReadCloser, error) {
		args := []string{"list", kind, string(family), TableName}
		if kind != "table" {
			args = append(args, name)
		}
		cmd := exec.CommandContext(ctx, "nft", args...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		r := &cmdReader{ReadCloser: out, cmd: cmd}
		cmd.Stderr = &r.stderr
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("running nft: %w", err)
		}
		return r, nil
	}
}

type cmdReader struct {
	io.ReadCloser
	cmd    *exec.Cmd
	stderr bytes.Buffer
}

func (r *cmdReader) Close() error {
	_, _ = io.Copy(io.Discard, r.ReadCloser)
	err := r.cmd.Wait()
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(r.stderr.String())
	command := strings.Join(r.cmd.Args, " ")
	if strings.Contains(msg, "No such file or directory") {
		return fmt.Errorf("%s: %s: %w", command, msg, fs.ErrNotExist)
	}
	return fmt.Errorf("%s: %v: %s", command, err, msg)
}

// readTable reads what `nft list` prints of the table or of one object in
// it (see Kernel.List), line by line, through list: an empty table when
// there is no such object (an error wrapping fs.ErrNotExist from list or
// from its reader's Close).
func readTable(ctx context.Context, list func(ctx context.Context, kind, name string) (io.ReadCloser, error), kind, name string) (*table, error) {
	r, err := list(ctx, kind, name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || knftables.IsNotFound(err) {
			return newTable(), nil
		}
		return nil, err
	}
	t, parseErr := parseTable(r)
	if err := r.Close(); err != nil {
		if errors.Is(err, fs.ErrNotExist) || knftables.IsNotFound(err) {
			return newTable(), nil
		}
		return nil, err
	}
	return t, parseErr
}

// fromNetlink is the table nftnl.Read read, as readTable reads it from
// `nft list table`.
func fromNetlink(nt *nftnl.Table) *table {
	t := newTable()
	t.exists, t.comment = true, nt.Comment
	for _, nc := range nt.Chains {
		c := &tableChain{Chain: &knftables.Chain{Name: nc.Name}, Rules: nc.Rules}
		if nc.Comment != "" {
			c.Comment = &nc.Comment
		}
		if b := nc.Base; b != nil {
			typ, hook, prio := knftables.BaseChainType(b.Type), knftables.BaseChainHook(b.Hook), knftables.BaseChainPriority(b.Priority)
			c.Type, c.Hook, c.Priority = &typ, &hook, &prio
		}
		t.chains[nc.Name] = c
	}
	for _, name := range nt.Counters {
		t.counters[name] = true
	}
	for _, ns := range nt.Sets {
		s := &tableSet{Set: Set{Name: ns.Name, Map: ns.Map, Type: ns.Type, Timeout: ns.Timeout, Comment: ns.Comment}, elements: map[string]string{}}
		for _, f := range ns.Flags {
			s.Flags = append(s.Flags, knftables.SetFlag(f))
		}
		for _, e := range ns.Elements {
			s.elements[e.Key] = e.Value
			if e.Comment != "" {
				if s.comments == nil {
					s.comments = map[string]string{}
				}
				s.comments[e.Key] = e.Comment
			}
		}
		t.sets[ns.Name] = s
	}
	return t
}

// parseTable parses one table of `nft list` output.
func parseTable(r io.Reader) (*table, error) {
	sc := bufio.NewScanner(r)
	// A numgen map of a service with thousands of endpoints is one line.
	sc.Buffer(make([]byte, 0, 64*1024), 256<<20)
	p := &listingParser{t: newTable()}
	for lineNo := 1; sc.Scan(); lineNo++ {
		if err := p.line(strings.TrimSpace(sc.Text())); err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
	}
	return p.t, sc.Err()
}

// listingParser reads `nft list` output into t, line by line.
type listingParser struct {
	t *table
	// c or s is the chain, or the set or map, whose lines are being read.
	c *tableChain
	s *tableSet
	// elements is s's elements list while it spans lines (inElements).
	elements   strings.Builder
	inElements bool
}

// line reads one line, trimmed.
func (p *listingParser) line(line string) error {
	switch {
	case p.inElements:
		p.elements.WriteString(" " + line)
		return p.endElements(line)
	case line == "" || strings.HasPrefix(line, "#"):
	case strings.HasPrefix(line, "table "):
		p.t.exists = true
	case line == "}":
		p.c, p.s = nil, nil
	case p.c != nil:
		return p.chainLine(line)
	case p.s != nil:
		return p.setLine(line)
	default:
		p.tableLine(line)
	}
	return nil
}

// tableLine reads a line of the table itself: one that starts a chain, a
// set or map, or a counter, or the table's comment. The table's flags
// are nothing a sync compares.
func (p *listingParser) tableLine(line string) {
	switch {
	case strings.HasPrefix(line, "chain "):
		name := strings.TrimSuffix(strings.TrimPrefix(line, "chain "), " {")
		p.c = &tableChain{Chain: &knftables.Chain{Name: name}}
		p.t.chains[name] = p.c
	case strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "map "):
		kind, name, _ := strings.Cut(strings.TrimSuffix(line, " {"), " ")
		p.s = &tableSet{Set: Set{Name: name, Map: kind == "map"}, elements: map[string]string{}}
		p.t.sets[name] = p.s
	case strings.HasPrefix(line, "counter ") && strings.HasSuffix(line, " {"):
		// Its packets and bytes, and "}", follow: nothing compared.
		p.t.counters[strings.TrimSuffix(strings.TrimPrefix(line, "counter "), " {")] = true
	case strings.HasPrefix(line, "comment \""):
		p.t.comment, _ = strconv.Unquote(strings.TrimPrefix(line, "comment "))
	}
}

// chainLine reads a line of chain c: its hook, its comment, or a rule.
func (p *listingParser) chainLine(line string) error {
	switch {
	case strings.HasPrefix(line, "type ") && strings.Contains(line, " hook "):
		return parseBaseChain(p.c.Chain, line)
	case strings.HasPrefix(line, "comment \""):
		cmt, err := strconv.Unquote(strings.TrimPrefix(line, "comment "))
		if err != nil {
			return fmt.Errorf("chain comment: %w", err)
		}
		p.c.Comment = &cmt
	default:
		p.c.Rules = append(p.c.Rules, line)
	}
	return nil
}

// setLine reads a line of set or map s: its settings, or the start of
// its elements. Size, policy and gc-interval are set by the kernel, and
// not compared.
func (p *listingParser) setLine(line string) error {
	word, rest, _ := strings.Cut(line, " ")
	switch word {
	case "type":
		p.s.Type = rest
	case "flags":
		for _, f := range strings.Split(rest, ",") {
			p.s.Flags = append(p.s.Flags, knftables.SetFlag(strings.TrimSpace(f)))
		}
	case "timeout":
		d, err := parseDuration(rest)
		if err != nil {
			return err
		}
		p.s.Timeout = d
	case "comment":
		cmt, err := strconv.Unquote(rest)
		if err != nil {
			return fmt.Errorf("set comment: %w", err)
		}
		p.s.Comment = cmt
	case "elements":
		p.elements.Reset()
		p.elements.WriteString(strings.TrimPrefix(rest, "= "))
		return p.endElements(line)
	}
	return nil
}

// endElements reads s's elements once line, the last of their list so
// far, closes it; until then the lines that follow continue it.
func (p *listingParser) endElements(line string) error {
	if p.inElements = !closes(line); p.inElements {
		return nil
	}
	return parseElements(p.s, p.elements.String())
}

// closes tells whether an elements line ends the list: a "}" outside quotes.
func closes(line string) bool {
	return strings.HasSuffix(line, "}") && strings.Count(line, `"`)%2 == 0
}

// parseBaseChain reads "type filter hook input priority filter; policy accept;".
func parseBaseChain(c *knftables.Chain, line string) error {
	fields := strings.Split(strings.TrimSuffix(line, ";"), ";")
	words := strings.Fields(fields[0])
	if len(words) < 6 || words[0] != "type" || words[2] != "hook" || words[4] != "priority" {
		return fmt.Errorf("base chain %s: cannot read %q", c.Name, line)
	}
	typ, hook := knftables.BaseChainType(words[1]), knftables.BaseChainHook(words[3])
	prio := knftables.BaseChainPriority(strings.Join(words[5:], " "))
	c.Type, c.Hook, c.Priority = &typ, &hook, &prio
	return nil
}

// parseElements reads "{ k1 [comment "c"] [: v1], k2 ... }" into s,
// leaving out what the kernel adds to dynamic sets.
func parseElements(s *tableSet, text string) error {
	text = strings.TrimSpace(text)
	if !strings.HasPrefix(text, "{") || !strings.HasSuffix(text, "}") {
		return fmt.Errorf("%s: cannot read elements %q", s.Name, text)
	}
	if s.dynamic() {
		return nil
	}
	for _, e := range splitOutsideQuotes(text[1:len(text)-1], ',') {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		// A comment may hold " : "; it goes before the value.
		cmt := ""
		if i := strings.Index(e, ` comment "`); i >= 0 {
			end := strings.IndexByte(e[i+len(` comment "`):], '"')
			if end < 0 {
				return fmt.Errorf("%s: cannot read element %q", s.Name, e)
			}
			cmt = e[i+len(` comment "`) : i+len(` comment "`)+end]
			e = e[:i] + e[i+len(` comment "`)+end+1:]
		}
		key, value, _ := strings.Cut(e, " : ")
		key = strings.TrimSpace(key)
		s.elements[key] = strings.TrimSpace(value)
		if cmt != "" {
			if s.comments == nil {
				s.comments = map[string]string{}
			}
			s.comments[key] = cmt
		}
	}
	return nil
}

func (s *Set) dynamic() bool {
	for _, f := range s.Flags {
		if f == knftables.DynamicFlag || f == knftables.TimeoutFlag {
			return true
		}
	}
	return false
}

func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case sep:
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// parseDuration reads nft's times: "3h", "2h59m56s992ms", "1d", "10800s".
func parseDuration(s string) (time.Duration, error) {
	var total time.Duration
	rest := strings.TrimSpace(s)
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		j := i
		for j < len(rest) && (rest[j] < '0' || rest[j] > '9') {
			j++
		}
		n, err := strconv.Atoi(rest[:i])
		if err != nil {
			return 0, fmt.Errorf("time %q: %w", s, err)
		}
		unit := map[string]time.Duration{"d": 24 * time.Hour, "h": time.Hour, "m": time.Minute, "s": time.Second, "ms": time.Millisecond}[rest[i:j]]
		if unit == 0 {
			return 0, fmt.Errorf("time %q: unknown unit %q", s, rest[i:j])
		}
		total += time.Duration(n) * unit
		rest = rest[j:]
	}
	return total, nil
}
