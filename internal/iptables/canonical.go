package iptables

import (
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rapidproxy/rapidproxy/internal/linehash"
)

// CanonicalRule rewrites a rule, as the modes write it or as
// iptables-save prints it back, into one form, so that the rules already
// in the kernel (from an earlier run, ours or upstream's) can be compared
// with the desired ones and left alone when equal. iptables-save moves the
// address and protocol matches to the front, adds /32, default options and
// quotes, and prints marks and probabilities its own way; all of that is
// undone here. A form this does not know only costs a needless rewrite.
// The canonical form is itself a rule meaning the same (in iptables-save's
// order, options sorted, quoted where needed), so it is its own canonical
// form.
func CanonicalRule(r Rule) string {
	c := canonicalizers.Get().(*canonicalizer)
	defer canonicalizers.Put(c)
	return string(c.rule(r))
}

// RuleFingerprint identifies a rule by its canonical form.
func RuleFingerprint(r Rule) uint64 { return ruleFingerprint(linehash.Start, r) }

// ruleFingerprint continues the fingerprint h with the canonical form of r.
func ruleFingerprint(h uint64, r Rule) uint64 {
	c := canonicalizers.Get().(*canonicalizer)
	defer canonicalizers.Put(c)
	return linehash.Line(h, c.rule(r))
}

// canonicalizer holds the buffers canonical forms are built in, reused
// from rule to rule: a full sync at 10k services puts some 340k rules
// through here, and a restart only hashes them.
type canonicalizer struct {
	args    []string
	blocks  []ruleBlock
	options []ruleOption
	out     []byte
}

var canonicalizers = sync.Pool{New: func() any { return new(canonicalizer) }}

// rule returns the canonical form of r, valid until the next call. Blocks
// and options are index ranges into shared slices, option values
// sub-slices of args.
func (c *canonicalizer) rule(r Rule) []byte {
	c.args = appendArgs(c.args[:0], r)
	args := c.args
	var header [len(headerFlags)]string
	var headerSet, headerNegated [len(headerFlags)]bool
	blocks := c.blocks[:0]
	options := c.options[:0]
	negate := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		short := shortFlags[a]
		switch {
		case a == "!":
			negate = true
			continue
		case short == "-s" || short == "-d":
			h := headerIndex(short)
			header[h], headerSet[h], headerNegated[h] = canonicalPrefix(value()), true, negate
		case short == "-p" || short == "-i" || short == "-o":
			h := headerIndex(short)
			header[h], headerSet[h], headerNegated[h] = value(), true, negate
		case short == "-m" || short == "-j" || short == "-g":
			blocks = append(blocks, ruleBlock{kind: short, name: value(), from: len(options), to: len(options)})
		case strings.HasPrefix(a, "--"):
			if len(blocks) == 0 {
				// An option of the protocol's implicit match.
				blocks = append(blocks, ruleBlock{kind: "-m", name: header[headerIndex("-p")], from: len(options), to: len(options)})
			}
			end := i + 1
			for end < len(args) && args[end] != "!" && !strings.HasPrefix(args[end], "--") && shortFlags[args[end]] == "" {
				end++
			}
			options = append(options, ruleOption{negated: negate, name: a, values: args[i+1 : end]})
			blocks[len(blocks)-1].to = len(options)
			i = end - 1
		}
		negate = false
	}

	c.blocks, c.options = blocks, options

	b := c.out[:0]
	// word writes one argument, quoted where Args would not read it
	// back as one: empty, with a space, or starting with a quote.
	word := func(w string) {
		if len(b) > 0 {
			b = append(b, ' ')
		}
		if w != "" && !strings.Contains(w, " ") && w[0] != '"' {
			b = append(b, w...)
			return
		}
		b = append(b, '"')
		for i := 0; i < len(w); i++ {
			if w[i] == '"' || w[i] == '\\' {
				b = append(b, '\\')
			}
			b = append(b, w[i])
		}
		b = append(b, '"')
	}
	for h, flag := range headerFlags {
		if headerSet[h] {
			if headerNegated[h] {
				word("!")
			}
			word(flag)
			word(header[h])
		}
	}
	for _, blk := range blocks {
		word(blk.kind)
		word(blk.name)
		for _, o := range blk.normalize(options[blk.from:blk.to]) {
			if o.negated {
				word("!")
			}
			word(o.name)
			for _, v := range o.values {
				word(v)
			}
		}
	}
	c.out = b
	return b
}

// headerFlags are the matches iptables-save prints first, in its order.
var headerFlags = [...]string{"-s", "-d", "-i", "-o", "-p"}

func headerIndex(flag string) int {
	for i, f := range headerFlags {
		if f == flag {
			return i
		}
	}
	return -1
}

// shortFlags maps the flags that structure a rule to their short form.
var shortFlags = map[string]string{
	"-s": "-s", "--source": "-s", "-d": "-d", "--destination": "-d",
	"-p": "-p", "--protocol": "-p", "-i": "-i", "--in-interface": "-i", "-o": "-o", "--out-interface": "-o",
	"-m": "-m", "--match": "-m", "-j": "-j", "--jump": "-j", "-g": "-g", "--goto": "-g",
}

// ruleBlock is a match module or a target with its options, which are
// options[from:to] of the rule.
type ruleBlock struct {
	kind, name string
	from, to   int
}

type ruleOption struct {
	negated bool
	name    string
	values  []string
}

// normalize removes defaults iptables-save adds, rewrites what it prints
// differently, and orders options (their order within a block does not
// matter to the kernel). It works in place and returns what is kept.
func (blk ruleBlock) normalize(options []ruleOption) []ruleOption {
	kept := options[:0]
	for _, o := range options {
		for i, v := range o.values {
			o.values[i] = canonicalHex(v)
		}
		switch {
		case blk.name == "recent" && (o.name == "--rsource" || o.name == "--mask" && len(o.values) == 1 && isFullMask(o.values[0])):
			continue
		case blk.name == "REJECT" && o.name == "--reject-with" && len(o.values) == 1 &&
			(o.values[0] == "icmp-port-unreachable" || o.values[0] == "icmp6-port-unreachable"):
			continue
		case blk.name == "statistic" && o.name == "--probability" && len(o.values) == 1:
			// The kernel keeps the probability as a fraction of 2^31:
			// the probability it holds, exactly.
			if p, err := strconv.ParseFloat(o.values[0], 64); err == nil {
				o.values[0] = strconv.FormatFloat(math.Round(p*(1<<31))/(1<<31), 'g', -1, 64)
			}
		case blk.name == "MARK" && (o.name == "--or-mark" || o.name == "--xor-mark") && len(o.values) == 1:
			mask := o.values[0]
			if o.name == "--xor-mark" {
				mask = "0x0"
			}
			o = ruleOption{name: "--set-xmark", values: []string{o.values[0] + "/" + mask}}
		}
		kept = append(kept, o)
	}
	slices.SortStableFunc(kept, func(a, b ruleOption) int { return strings.Compare(a.name, b.name) })
	return kept
}

// canonicalPrefix prints an address or CIDR as iptables-save does: always
// with a prefix length, host bits cleared.
func canonicalPrefix(s string) string {
	if !strings.Contains(s, "/") {
		// (An address with a zone has no prefix.)
		if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
			return netip.PrefixFrom(a, a.BitLen()).String()
		}
		return s
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked().String()
	}
	return s
}

// canonicalHex prints "0x004000/0x4000"-like values without leading zeros.
func canonicalHex(v string) string {
	if !strings.HasPrefix(v, "0x") {
		return v
	}
	parts := strings.Split(v, "/")
	for i, part := range parts {
		n, err := strconv.ParseUint(part, 0, 32)
		if err != nil {
			return v
		}
		parts[i] = "0x" + strconv.FormatUint(n, 16)
	}
	return strings.Join(parts, "/")
}

func isFullMask(m string) bool {
	a, err := netip.ParseAddr(m)
	if err != nil {
		return false
	}
	for _, b := range a.AsSlice() {
		if b != 0xff {
			return false
		}
	}
	return true
}

// TextFingerprint identifies rules as generated, rule order included:
// cheaper than ChainFingerprint, for comparing one generation of a chain
// with the next, never with what the kernel prints.
func TextFingerprint(rules []Rule) uint64 {
	h := linehash.Start
	for _, r := range rules {
		h = linehash.Line(h, string(r))
	}
	return h
}

// chainFingerprint identifies a chain's content, rule order included.
func chainFingerprint(rules []Rule) uint64 {
	h := linehash.Start
	for _, r := range rules {
		h = ruleFingerprint(h, r)
	}
	return h
}
