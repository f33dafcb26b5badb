package nftnl

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The two texts a table of the nftables mode's testdata is kept as, read
// into a Table for the Writer: the `nft -f` transaction of a golden table
// (one add a line) and the `nft list table` output of upstream's. Each
// reader refuses what it does not know rather than leave it out, so that
// what a round trip compares is all the text holds.

// tableFromTransaction reads a golden table: the transaction that makes
// it, "add table", "add chain", "add set", "add map", "add rule" and "add
// element" lines, as the nftables mode's fake nft dumps them. (knftables'
// own ParseDump refuses rules that quote an interface name.)
func tableFromTransaction(text string) (family string, tb *Table, err error) {
	tb = &Table{}
	chains, sets := map[string]int{}, map[string]int{}
	for n, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		// add <kind> <family> kube-proxy [<name> [<rest>]]
		f := strings.SplitN(line, " ", 6)
		if len(f) < 4 || f[0] != "add" || f[3] != "kube-proxy" || family != "" && f[2] != family {
			return "", nil, fmt.Errorf("line %d: %q", n+1, line)
		}
		family = f[2]
		name, rest := "", ""
		if len(f) > 4 {
			name = f[4]
		}
		if len(f) > 5 {
			rest = f[5]
		}
		switch f[1] {
		case "table":
			err = declaration(strings.TrimPrefix(line, strings.Join(f[:4], " ")+" "), func(word, value string) error {
				if word != "comment" {
					return fmt.Errorf("table %s", word)
				}
				var unquoteErr error
				tb.Comment, unquoteErr = strconv.Unquote(value)
				return unquoteErr
			})
		case "counter":
			tb.Counters = append(tb.Counters, name)
			slices.Sort(tb.Counters)
		case "chain":
			chains[name] = len(tb.Chains)
			tb.Chains = append(tb.Chains, Chain{Name: name})
			if rest != "" {
				err = declaration(rest, func(word, value string) error { return chainProperty(&tb.Chains[chains[name]], word, value) })
			}
		case "set", "map":
			sets[name] = len(tb.Sets)
			tb.Sets = append(tb.Sets, Set{Name: name, Map: f[1] == "map"})
			err = declaration(rest, func(word, value string) error { return setProperty(&tb.Sets[sets[name]], word, value) })
		case "rule":
			i, ok := chains[name]
			if !ok || rest == "" {
				return "", nil, fmt.Errorf("line %d: a rule of chain %q", n+1, name)
			}
			tb.Chains[i].Rules = append(tb.Chains[i].Rules, rest)
		case "element":
			i, ok := sets[name]
			body, braced := braced(rest)
			if !ok || !braced {
				return "", nil, fmt.Errorf("line %d: an element of set %q", n+1, name)
			}
			var e Element
			if e, err = parseElement(body, tb.Sets[i].Map); err == nil {
				tb.Sets[i].Elements = append(tb.Sets[i].Elements, e)
			}
		default:
			err = fmt.Errorf("add %s", f[1])
		}
		if err != nil {
			return "", nil, fmt.Errorf("line %d: %w", n+1, err)
		}
	}
	return family, tb, nil
}

// declaration reads "{ word value ; word value ; }", each property by
// set.
func declaration(text string, set func(word, value string) error) error {
	body, ok := braced(text)
	if !ok {
		return fmt.Errorf("%q is not a declaration", text)
	}
	for _, prop := range splitOutsideQuotes(body, ';') {
		if prop = strings.TrimSpace(prop); prop == "" {
			continue
		}
		word, value, _ := strings.Cut(prop, " ")
		if err := set(word, value); err != nil {
			return err
		}
	}
	return nil
}

// chainProperty sets a chain's comment, or its base chain's "type nat hook
// prerouting priority dstnat" (a transaction's) or "type nat hook
// prerouting priority dstnat; policy accept;" (a listing's: the policy
// is the kernel's default, which the Writer leaves alone).
func chainProperty(c *Chain, word, value string) error {
	switch word {
	case "comment":
		var err error
		c.Comment, err = strconv.Unquote(value)
		return err
	case "type":
		value = strings.TrimSuffix(strings.TrimSuffix(value, "; policy accept;"), ";")
		typ, rest, _ := strings.Cut(value, " hook ")
		hook, prio, ok := strings.Cut(rest, " priority ")
		if !ok {
			return fmt.Errorf("chain %s: base chain %q", c.Name, value)
		}
		c.Base = &BaseChain{Type: typ, Hook: hook, Priority: prio}
		return nil
	}
	return fmt.Errorf("chain %s: %s %s", c.Name, word, value)
}

// setProperty sets a set's type, flags, timeout or comment.
func setProperty(s *Set, word, value string) error {
	var err error
	switch word {
	case "type":
		s.Type = value
	case "flags":
		s.Flags = strings.Split(value, ",")
	case "timeout":
		s.Timeout, err = parseDuration(value)
	case "comment":
		s.Comment, err = strconv.Unquote(value)
	default:
		err = fmt.Errorf("%s %s", word, value)
	}
	if err != nil {
		return fmt.Errorf("set %s: %w", s.Name, err)
	}
	return nil
}

// parseElement reads `key [comment "c"] [: value]`, as both texts write
// an element.
func parseElement(text string, isMap bool) (Element, error) {
	var e Element
	// The value is what follows the last " : " (an IPv6 address holds
	// ":", never " : ").
	key, value := text, ""
	if isMap {
		i := strings.LastIndex(text, " : ")
		if i < 0 {
			return e, fmt.Errorf("map element %q without a value", text)
		}
		key, value = text[:i], text[i+3:]
	}
	if before, quoted, ok := strings.Cut(key, ` comment "`); ok {
		c, err := strconv.Unquote(`"` + quoted)
		if err != nil {
			return e, fmt.Errorf("element %q: %w", text, err)
		}
		key, e.Comment = before, c
	}
	e.Key, e.Value = strings.TrimSpace(key), strings.TrimSpace(value)
	return e, nil
}

// splitOutsideQuotes splits s at each sep not inside a quoted string.
func splitOutsideQuotes(s string, sep byte) []string {
	var parts []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"':
			quoted = !quoted
		case s[i] == sep && !quoted:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// parseDuration reads a time as nft writes one ("10800s", "3h",
// "2h59m56s992ms").
func parseDuration(text string) (time.Duration, error) {
	// time.ParseDuration takes all of these but days.
	days := time.Duration(0)
	if before, after, ok := strings.Cut(text, "d"); ok {
		n, err := strconv.Atoi(before)
		if err != nil {
			return 0, fmt.Errorf("duration %q", text)
		}
		days, text = time.Duration(n)*24*time.Hour, after
	}
	if text == "" {
		return days, nil
	}
	d, err := time.ParseDuration(text)
	return days + d, err
}

// tableFromListing reads the family's kube-proxy table from `nft list`
// output (several tables, and # comments, may surround it). What nft
// lists that the Writer does not write is checked to be the kernel's and
// left out: a base chain's policy accept, a dynamic set's size 65535, and
// the elements of a dynamic set (which the kernel adds as packets come:
// "10.244.1.100 expires 2h59m56s992ms"; the reader leaves them out).
func tableFromListing(text, family, name string) (*Table, error) {
	header := "table " + family + " " + name + " {"
	_, body, ok := strings.Cut(text, "\n"+header+"\n")
	if !ok {
		return nil, fmt.Errorf("no %q", header)
	}
	tb := &Table{}
	var c *Chain
	var s *Set
	var elements string // an elements list, while it spans lines
	sized := false      // s was listed with nft's size of a dynamic set
	for n, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		var err error
		switch {
		case elements != "":
			elements += " " + line
			if strings.HasSuffix(line, "}") {
				err = listedElements(s, elements)
				elements = ""
			}
		case line == "" || strings.HasPrefix(line, "#"):
		case line == "}" && c == nil && s == nil:
			return tb, nil
		case line == "}":
			if sized && !isDynamic(s) {
				err = fmt.Errorf("set %s: a size of a set not dynamic", s.Name)
			}
			c, s, sized = nil, nil, false
		case c != nil && strings.HasPrefix(line, "type "), c != nil && strings.HasPrefix(line, "comment "):
			word, value, _ := strings.Cut(line, " ")
			err = chainProperty(c, word, value)
		case c != nil:
			c.Rules = append(c.Rules, line)
		case s != nil && strings.HasPrefix(line, "elements = "):
			if elements = strings.TrimPrefix(line, "elements = "); strings.HasSuffix(line, "}") {
				err = listedElements(s, elements)
				elements = ""
			}
		case s != nil && line == "size 65535":
			sized = true
		case s != nil:
			word, value, _ := strings.Cut(line, " ")
			err = setProperty(s, word, value)
		case strings.HasPrefix(line, "comment "):
			tb.Comment, err = strconv.Unquote(strings.TrimPrefix(line, "comment "))
		case strings.HasPrefix(line, "chain ") && strings.HasSuffix(line, " {"):
			tb.Chains = append(tb.Chains, Chain{Name: strings.TrimSuffix(strings.TrimPrefix(line, "chain "), " {")})
			c = &tb.Chains[len(tb.Chains)-1]
		case (strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "map ")) && strings.HasSuffix(line, " {"):
			kind, setName, _ := strings.Cut(strings.TrimSuffix(line, " {"), " ")
			tb.Sets = append(tb.Sets, Set{Name: setName, Map: kind == "map"})
			s = &tb.Sets[len(tb.Sets)-1]
		default:
			err = fmt.Errorf("%q", line)
		}
		if err != nil {
			return nil, fmt.Errorf("line %d of the table: %w", n+1, err)
		}
	}
	return nil, fmt.Errorf("%q does not end", header)
}

func isDynamic(s *Set) bool {
	for _, f := range s.Flags {
		if f == "dynamic" || f == "timeout" {
			return true
		}
	}
	return false
}

// listedElements reads a listing's "{ e, e, ... }" into the set's
// elements.
func listedElements(s *Set, text string) error {
	body, ok := braced(text)
	if !ok {
		return fmt.Errorf("set %s: elements %q", s.Name, text)
	}
	if isDynamic(s) {
		return nil
	}
	for _, item := range splitOutsideQuotes(body, ',') {
		e, err := parseElement(strings.TrimSpace(item), s.Map)
		if err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
		s.Elements = append(s.Elements, e)
	}
	return nil
}
