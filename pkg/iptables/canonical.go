package iptables

import (
	"hash/fnv"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// canonicalRule rewrites a rule, as this package writes it or as
// iptables-save prints it back, into one form, so that the rules already
// in the kernel (from an earlier run, ours or upstream's) can be compared
// with the desired ones and left alone when equal. iptables-save moves the
// address and protocol matches to the front, adds /32, default options and
// quotes, and prints marks and probabilities its own way; all of that is
// undone here. A form this does not know only costs a needless rewrite.
func canonicalRule(r Rule) string {
	var (
		header  = map[string]string{}
		blocks  []*ruleBlock
		current *ruleBlock
		option  *ruleOption
		negate  bool
	)
	args := splitArgs(r)
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		not := ""
		if negate {
			not = "!"
		}
		switch {
		case a == "!":
			negate = true
			continue
		case shortFlags[a] == "-s" || shortFlags[a] == "-d":
			header[shortFlags[a]] = not + canonicalPrefix(value())
		case shortFlags[a] == "-p" || shortFlags[a] == "-i" || shortFlags[a] == "-o":
			header[shortFlags[a]] = not + value()
		case shortFlags[a] == "-m" || shortFlags[a] == "-j" || shortFlags[a] == "-g":
			current = &ruleBlock{kind: shortFlags[a], name: value()}
			blocks = append(blocks, current)
			option = nil
		case strings.HasPrefix(a, "--"):
			if current == nil {
				// An option of the protocol's implicit match.
				current = &ruleBlock{kind: "-m", name: header["-p"]}
				blocks = append(blocks, current)
			}
			current.options = append(current.options, ruleOption{negated: negate, name: a})
			option = &current.options[len(current.options)-1]
		default:
			if option != nil {
				option.values = append(option.values, a)
			}
		}
		negate = false
	}

	var b strings.Builder
	for _, key := range []string{"-s", "-d", "-i", "-o", "-p"} {
		if v, ok := header[key]; ok {
			b.WriteString(key + "=" + v + " ")
		}
	}
	for _, blk := range blocks {
		blk.normalize()
		b.WriteString("|" + blk.kind + " " + blk.name)
		for _, o := range blk.options {
			b.WriteByte(' ')
			if o.negated {
				b.WriteByte('!')
			}
			b.WriteString(o.name)
			for _, v := range o.values {
				b.WriteString("=" + v)
			}
		}
	}
	return b.String()
}

// shortFlags maps the flags that structure a rule to their short form.
var shortFlags = map[string]string{
	"-s": "-s", "--source": "-s", "-d": "-d", "--destination": "-d",
	"-p": "-p", "--protocol": "-p", "-i": "-i", "--in-interface": "-i", "-o": "-o", "--out-interface": "-o",
	"-m": "-m", "--match": "-m", "-j": "-j", "--jump": "-j", "-g": "-g", "--goto": "-g",
}

// ruleBlock is a match module or a target with its options.
type ruleBlock struct {
	kind, name string
	options    []ruleOption
}

type ruleOption struct {
	negated bool
	name    string
	values  []string
}

// normalize removes defaults iptables-save adds, rewrites what it prints
// differently, and orders options (their order within a block does not
// matter to the kernel).
func (blk *ruleBlock) normalize() {
	kept := blk.options[:0]
	for _, o := range blk.options {
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
			// The kernel keeps the probability as a fraction of 2^31.
			if p, err := strconv.ParseFloat(o.values[0], 64); err == nil {
				o.values[0] = strconv.FormatInt(int64(math.Round(p*(1<<31))), 10)
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
	blk.options = kept
	slices.SortFunc(blk.options, func(a, b ruleOption) int { return strings.Compare(a.name, b.name) })
}

// canonicalPrefix prints an address or CIDR as iptables-save does: always
// with a prefix length, host bits cleared.
func canonicalPrefix(s string) string {
	if !strings.Contains(s, "/") {
		if a, err := netip.ParseAddr(s); err == nil {
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

// chainFingerprint identifies a chain's content, rule order included.
func chainFingerprint(rules []Rule) uint64 {
	h := fnv.New64a()
	for _, r := range rules {
		h.Write([]byte(canonicalRule(r)))
		h.Write([]byte{'\n'})
	}
	return h.Sum64()
}
