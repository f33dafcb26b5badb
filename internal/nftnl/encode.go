package nftnl

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The encoder is the decoder's inverse (rule.go): it reads a rule of the
// shapes kube-proxy's tables hold, as nft lists it, into the expressions
// nft would make of it, and the elements of sets and maps as their
// declared types print them. Anything else is ErrUnsupported.

// ErrUnsupported wraps what the writer does not encode: the caller
// writes the transaction with nft instead.
var ErrUnsupported = errors.New("not encoded over netlink")

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, args...)...)
}

// tokens splits a rule into words, a quoted string or a "{ ... }" being
// one.
func tokens(rule string) ([]string, error) {
	var toks []string
	for i := 0; i < len(rule); {
		end := 0
		switch rule[i] {
		case ' ':
			i++
			continue
		case '"':
			end = strings.IndexByte(rule[i+1:], '"') + 2
		case '{':
			end = strings.IndexByte(rule[i:], '}') + 1
		default:
			if end = strings.IndexByte(rule[i:], ' '); end < 0 {
				end = len(rule) - i
			}
		}
		if end <= 0 {
			return nil, unsupported("unbalanced %q", rule[i:])
		}
		toks = append(toks, rule[i:i+end])
		i += end
	}
	return toks, nil
}

// braced is the text inside "{ ... }", or false.
func braced(tok string) (string, bool) {
	if !strings.HasPrefix(tok, "{") || !strings.HasSuffix(tok, "}") {
		return "", false
	}
	return strings.TrimSpace(tok[1 : len(tok)-1]), true
}

// stream is a rule's words, read in order.
type stream struct {
	toks []string
	i    int
}

func (s *stream) peek(ahead int) string {
	if s.i+ahead < len(s.toks) {
		return s.toks[s.i+ahead]
	}
	return ""
}

func (s *stream) next() string {
	t := s.peek(0)
	s.i++
	return t
}

func (s *stream) done() bool { return s.i >= len(s.toks) }

// expect reads the words given, in order.
func (s *stream) expect(words ...string) error {
	for _, w := range words {
		if got := s.next(); got != w {
			return unsupported("%q where %q was expected", got, w)
		}
	}
	return nil
}

// field is a value a selector loads into registers, and how its
// constants are written.
type field struct {
	text string
	// typ is its data type in sets (0: none it may be a set key of).
	typ  uint32
	size int
	// load puts it into the register.
	load func(reg uint32) expr.Any
	// ct is set for ct state and ct status, fib for fib ... type.
	ct  map[string]uint32
	fib bool
}

// anonSet is an anonymous set or map a rule makes, with its elements.
type anonSet struct {
	id                uint32
	keyTypes          []uint32
	dataTypes         []uint32 // nil: a set; [typeVerdict]: a verdict map
	hostKey, interval bool
	elements          []Element
}

// ruleEncoder encodes one rule.
type ruleEncoder struct {
	family byte
	exprs  []expr.Any
	sets   []*anonSet
	// nextID numbers the anonymous sets of the transaction.
	nextID *uint32
	// l4proto is set once a "meta l4proto" match with a protocol was
	// written, after which nft would print "th dport" otherwise (the
	// reader refuses it).
	l4proto bool
}

// objectCounter is NFT_OBJECT_COUNTER, the type of a named counter an
// objref expression ("counter name "x"") refers to.
const objectCounter = 1

// Registers are named by 32-bit words: NFT_REG32_00 + word.
func reg(word int) uint32 { return uint32(unix.NFT_REG32_00 + word) }

// encodeRule returns the expressions, comment and anonymous sets of a
// rule as nft lists it.
func encodeRule(family byte, nextID *uint32, rule string) ([]expr.Any, string, []*anonSet, error) {
	toks, err := tokens(rule)
	if err != nil {
		return nil, "", nil, err
	}
	s := &stream{toks: toks}
	e := &ruleEncoder{family: family, nextID: nextID}
	comment := ""
	for !s.done() {
		var err error
		switch t := s.peek(0); {
		case t == "comment":
			s.next()
			if comment, err = unquote(s.next()); err == nil && !s.done() {
				err = unsupported("words after the comment")
			}
		case t == "accept" || t == "drop" || t == "return" || t == "continue" || t == "jump" || t == "goto":
			var v *expr.Verdict
			if v, err = parseVerdict(s); err == nil {
				e.exprs = append(e.exprs, v)
			}
		case t == "reject":
			s.next()
			code := map[byte]uint8{unix.NFPROTO_IPV4: 3, unix.NFPROTO_IPV6: 4}[family] // port unreachable
			e.exprs = append(e.exprs, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
		case t == "counter" && s.peek(1) == "name":
			s.next()
			s.next()
			var name string
			if name, err = unquote(s.next()); err == nil {
				e.exprs = append(e.exprs, &expr.Objref{Type: objectCounter, Name: name})
			}
		case t == "masquerade":
			s.next()
			m := &expr.Masq{}
			if s.peek(0) == "fully-random" {
				s.next()
				m.FullyRandom = true
			}
			e.exprs = append(e.exprs, m)
		case t == "dnat":
			err = e.dnat(s)
		case t == "meta" && s.peek(1) == "mark" && s.peek(2) == "set":
			err = e.markSet(s)
		case t == "update":
			err = e.update(s)
		default:
			err = e.match(s)
		}
		if err != nil {
			return nil, "", nil, fmt.Errorf("rule %q: %w", rule, err)
		}
	}
	if len(e.exprs) == 0 {
		return nil, "", nil, unsupported("an empty rule")
	}
	return e.exprs, comment, e.sets, nil
}

func unquote(tok string) (string, error) {
	if len(tok) < 2 || tok[0] != '"' || tok[len(tok)-1] != '"' {
		return "", unsupported("%q is not a quoted string", tok)
	}
	return tok[1 : len(tok)-1], nil
}

func parseVerdict(s *stream) (*expr.Verdict, error) {
	switch t := s.next(); t {
	case "accept":
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	case "drop":
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case "return":
		return &expr.Verdict{Kind: expr.VerdictReturn}, nil
	case "continue":
		return &expr.Verdict{Kind: expr.VerdictContinue}, nil
	case "jump", "goto":
		chain := strings.TrimSuffix(s.next(), ",")
		if chain == "" {
			return nil, unsupported("%s without a chain", t)
		}
		if t == "jump" {
			return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}, nil
		}
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}, nil
	default:
		return nil, unsupported("verdict %q", t)
	}
}
