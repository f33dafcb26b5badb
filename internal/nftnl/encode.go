// Over 600 lines: the encoder of every rule shape kube-proxy's tables hold
// (ours and upstream's), one case per expression, in one file like the
// decoder (rule.go) it mirrors.

package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"strconv"
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

// selector reads one selector.
func (e *ruleEncoder) selector(s *stream) (*field, error) {
	payload := func(base expr.PayloadBase, offset uint32, size int) func(uint32) expr.Any {
		return func(r uint32) expr.Any {
			return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: r, Base: base, Offset: offset, Len: uint32(size)}
		}
	}
	meta := func(key expr.MetaKey) func(uint32) expr.Any {
		return func(r uint32) expr.Any { return &expr.Meta{Key: key, Register: r} }
	}
	t := s.next()
	switch {
	case (t == "ip" && e.family == unix.NFPROTO_IPV4 || t == "ip6" && e.family == unix.NFPROTO_IPV6) && (s.peek(0) == "saddr" || s.peek(0) == "daddr"):
		which := s.next()
		offsets := map[string]uint32{"ipsaddr": 12, "ipdaddr": 16, "ip6saddr": 8, "ip6daddr": 24}
		typ, size := uint32(typeIPv4), 4
		if t == "ip6" {
			typ, size = typeIPv6, 16
		}
		return &field{text: t + " " + which, typ: typ, size: size, load: payload(expr.PayloadBaseNetworkHeader, offsets[t+which], size)}, nil
	case t == "meta" && s.peek(0) == "l4proto":
		s.next()
		return &field{text: "meta l4proto", typ: typeInetProto, size: 1, load: meta(expr.MetaKeyL4PROTO)}, nil
	case t == "meta" && s.peek(0) == "mark":
		s.next()
		return &field{text: "meta mark", typ: typeMark, size: 4, load: meta(expr.MetaKeyMARK)}, nil
	case t == "iifname":
		return &field{text: t, typ: typeIfname, size: 16, load: meta(expr.MetaKeyIIFNAME)}, nil
	case t == "oifname":
		return &field{text: t, typ: typeIfname, size: 16, load: meta(expr.MetaKeyOIFNAME)}, nil
	case t == "th" && s.peek(0) == "dport" && !e.l4proto:
		s.next()
		return &field{text: "th dport", typ: typeInetService, size: 2, load: payload(expr.PayloadBaseTransportHeader, 2, 2)}, nil
	case t == "ct" && s.peek(0) == "state":
		s.next()
		return &field{text: "ct state", size: 4, load: func(r uint32) expr.Any { return &expr.Ct{Key: expr.CtKeySTATE, Register: r} },
			ct: map[string]uint32{"invalid": 1, "established": 2, "related": 4, "new": 8, "untracked": 64}}, nil
	case t == "ct" && s.peek(0) == "status":
		s.next()
		return &field{text: "ct status", size: 4, load: func(r uint32) expr.Any { return &expr.Ct{Key: expr.CtKeySTATUS, Register: r} },
			ct: map[string]uint32{"expected": 1, "seen-reply": 2, "assured": 4, "confirmed": 8, "snat": 16, "dnat": 32, "dying": 512}}, nil
	case t == "fib" && (s.peek(0) == "saddr" || s.peek(0) == "daddr") && s.peek(1) == "type":
		saddr := s.next() == "saddr"
		s.next()
		return &field{text: "fib type", size: 4, fib: true, load: func(r uint32) expr.Any {
			return &expr.Fib{Register: r, ResultADDRTYPE: true, FlagSADDR: saddr, FlagDADDR: !saddr}
		}}, nil
	case t == "numgen" && s.peek(0) == "random" && s.peek(1) == "mod":
		s.next()
		s.next()
		mod, err := strconv.ParseUint(s.next(), 10, 32)
		if err != nil || mod == 0 {
			return nil, unsupported("numgen modulus: %v", err)
		}
		var offset uint64
		if s.peek(0) == "offset" {
			s.next()
			if offset, err = strconv.ParseUint(s.next(), 10, 32); err != nil {
				return nil, unsupported("numgen offset: %v", err)
			}
		}
		return &field{text: "numgen", typ: typeInteger, size: 4, load: func(r uint32) expr.Any {
			return &expr.Numgen{Register: r, Modulus: uint32(mod), Type: unix.NFT_NG_RANDOM, Offset: uint32(offset)}
		}}, nil
	}
	return nil, unsupported("selector %q", t)
}

// key reads a selector or a concatenation of them.
func (e *ruleEncoder) key(s *stream) ([]*field, error) {
	var fields []*field
	for {
		f, err := e.selector(s)
		if err != nil {
			return nil, err
		}
		fields = append(fields, f)
		if s.peek(0) != "." {
			return fields, nil
		}
		s.next()
	}
}

// loadKey loads the fields into consecutive registers from word 0.
func (e *ruleEncoder) loadKey(fields []*field) ([]uint32, error) {
	var types []uint32
	word := 0
	for _, f := range fields {
		if f.typ == 0 || len(fields) > 1 && f.typ == typeInteger {
			return nil, unsupported("%s in a set key", f.text)
		}
		e.exprs = append(e.exprs, f.load(reg(word)))
		word += words(f.size)
		types = append(types, f.typ)
	}
	return types, nil
}

// match writes a relation: a key compared with a constant, looked up in
// a set, or a verdict map's key.
func (e *ruleEncoder) match(s *stream) error {
	fields, err := e.key(s)
	if err != nil {
		return err
	}
	if s.peek(0) == "vmap" {
		s.next()
		types, err := e.loadKey(fields)
		if err != nil {
			return err
		}
		return e.lookup(s.next(), types, []uint32{typeVerdict}, false, true, unix.NFT_REG_VERDICT)
	}
	neg := s.peek(0) == "!="
	if neg {
		s.next()
	}
	if t := s.peek(0); strings.HasPrefix(t, "@") || strings.HasPrefix(t, "{") {
		s.next()
		types, err := e.loadKey(fields)
		if err != nil {
			return err
		}
		return e.lookup(t, types, nil, neg, false, 0)
	}
	if len(fields) != 1 {
		return unsupported("a concatenation compared with a constant")
	}
	f := fields[0]
	switch {
	case f.ct != nil:
		flag, ok := f.ct[s.next()]
		if !ok || neg {
			return unsupported("%s match", f.text)
		}
		e.exprs = append(e.exprs, f.load(reg(0)),
			&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: native(flag), Xor: native(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg(0), Data: native(0)})
		return nil
	case f.typ == typeMark && s.peek(0) == "&":
		s.next()
		mask, err := parseUint32(s.next())
		if err != nil || neg {
			return unsupported("meta mark & %v", err)
		}
		op := expr.CmpOpEq
		switch s.next() {
		case "!=":
			op = expr.CmpOpNeq
		case "==":
		default:
			return unsupported("meta mark & without a comparison")
		}
		value, err := parseUint32(s.next())
		if err != nil {
			return err
		}
		e.exprs = append(e.exprs, f.load(reg(0)),
			&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: native(mask), Xor: native(0)},
			&expr.Cmp{Op: op, Register: reg(0), Data: native(value)})
		return nil
	}
	op := expr.CmpOpEq
	if neg {
		op = expr.CmpOpNeq
	}
	text := s.next()
	if f.typ == typeIPv4 || f.typ == typeIPv6 {
		// A prefix of whole bytes loads just those; any other loads the
		// address and masks it, as nft does (nft lists a shorter load
		// masked as a raw payload).
		p, err := parsePrefix(text, f.size)
		if err != nil {
			return err
		}
		n := f.size
		if p.Bits()%8 == 0 {
			n = p.Bits() / 8
		}
		load := f.load(reg(0)).(*expr.Payload)
		load.Len = uint32(n)
		e.exprs = append(e.exprs, load)
		if p.Bits()%8 != 0 {
			mask := make([]byte, n)
			for i := range p.Bits() {
				mask[i/8] |= 0x80 >> (i % 8)
			}
			e.exprs = append(e.exprs, &expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: uint32(n), Mask: mask, Xor: make([]byte, n)})
		}
		e.exprs = append(e.exprs, &expr.Cmp{Op: op, Register: reg(0), Data: p.Addr().AsSlice()[:n]})
		return nil
	}
	var data []byte
	switch {
	case f.fib:
		names := map[string]uint32{"unicast": 1, "local": 2, "broadcast": 3, "anycast": 4, "multicast": 5, "blackhole": 6, "unreachable": 7, "prohibit": 8}
		v, ok := names[text]
		if !ok {
			return unsupported("fib type %q", text)
		}
		data = native(v)
	case f.typ == typeIfname:
		name, err := unquote(text)
		if err != nil {
			return err
		}
		if prefix, ok := strings.CutSuffix(name, "*"); ok {
			data = []byte(prefix)
		} else {
			data = make([]byte, 16)
			if len(name) >= 16 {
				return unsupported("interface name %q", name)
			}
			copy(data, name)
		}
	default:
		if data, err = encodeOne(f.typ, text, 4, true); err != nil {
			return err
		}
	}
	if f.typ == typeInetProto && !neg {
		e.l4proto = true
	}
	e.exprs = append(e.exprs, f.load(reg(0)), &expr.Cmp{Op: op, Register: reg(0), Data: data})
	return nil
}

// lookup looks the key loaded from word 0 up in a named set ("@name") or
// an anonymous one ("{ ... }") of the types, into dreg for a map.
func (e *ruleEncoder) lookup(target string, keyTypes, dataTypes []uint32, invert, isMap bool, dreg uint32) error {
	l := &expr.Lookup{SourceRegister: reg(0), Invert: invert, IsDestRegSet: isMap, DestRegister: dreg}
	if name, ok := strings.CutPrefix(target, "@"); ok {
		l.SetName = name
		e.exprs = append(e.exprs, l)
		return nil
	}
	body, ok := braced(target)
	if !ok {
		return unsupported("a lookup in %q", target)
	}
	set := &anonSet{keyTypes: keyTypes, dataTypes: dataTypes, hostKey: len(keyTypes) == 1 && keyTypes[0] == typeInteger}
	for _, item := range strings.Split(body, ",") {
		item = strings.TrimSpace(item)
		el := Element{Key: item}
		if isMap {
			var ok bool
			if el.Key, el.Value, ok = strings.Cut(item, " : "); !ok {
				return unsupported("map element %q without a value", item)
			}
		} else if strings.Contains(item, " : ") {
			return unsupported("a map element %q in a set", item)
		}
		if len(keyTypes) == 1 && (keyTypes[0] == typeIPv4 || keyTypes[0] == typeIPv6) && strings.ContainsAny(el.Key, "/-") {
			set.interval = true
		}
		set.elements = append(set.elements, el)
	}
	if set.interval && isMap {
		return unsupported("an interval map")
	}
	*e.nextID++
	set.id = *e.nextID
	e.sets = append(e.sets, set)
	l.SetName, l.SetID = "__set%d", set.id
	if isMap {
		l.SetName = "__map%d"
	}
	e.exprs = append(e.exprs, l)
	return nil
}

// markSet writes "meta mark set meta mark | 0x4000" (or ^, &), or "meta
// mark set 0x4000".
func (e *ruleEncoder) markSet(s *stream) error {
	if err := s.expect("meta", "mark", "set"); err != nil {
		return err
	}
	if s.peek(0) != "meta" {
		v, err := parseUint32(s.next())
		if err != nil {
			return err
		}
		e.exprs = append(e.exprs, &expr.Immediate{Register: reg(0), Data: native(v)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg(0)})
		return nil
	}
	if err := s.expect("meta", "mark"); err != nil {
		return err
	}
	op := s.next()
	v, err := parseUint32(s.next())
	if err != nil {
		return err
	}
	var mask, xor uint32
	switch op {
	case "|":
		mask, xor = ^v, v
	case "^":
		mask, xor = ^uint32(0), v
	case "&":
		mask, xor = v, 0
	default:
		return unsupported("meta mark %s", op)
	}
	e.exprs = append(e.exprs, &expr.Meta{Key: expr.MetaKeyMARK, Register: reg(0)},
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: native(mask), Xor: native(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg(0)})
	return nil
}

// update writes "update @set { key }".
func (e *ruleEncoder) update(s *stream) error {
	s.next()
	name, ok := strings.CutPrefix(s.next(), "@")
	body, okBody := braced(s.next())
	if !ok || !okBody {
		return unsupported("update statement")
	}
	toks, err := tokens(body)
	if err != nil {
		return err
	}
	inner := &stream{toks: toks}
	fields, err := e.key(inner)
	if err != nil {
		return err
	}
	if !inner.done() {
		return unsupported("update of %s with %q", name, inner.toks[inner.i:])
	}
	if _, err := e.loadKey(fields); err != nil {
		return err
	}
	e.exprs = append(e.exprs, &expr.Dynset{SrcRegKey: reg(0), SetName: name, Operation: unix.NFT_DYNSET_OP_UPDATE})
	return nil
}

// dnat writes "dnat to 10.0.0.1:80", "dnat to [fd00::1]:80", "dnat to
// 10.0.0.1" or "dnat ip to numgen random mod 2 map { 0 : 10.0.0.1 . 80, ... }".
func (e *ruleEncoder) dnat(s *stream) error {
	s.next()
	addrType, addrSize, family := uint32(typeIPv4), 4, "ip"
	if e.family == unix.NFPROTO_IPV6 {
		addrType, addrSize, family = typeIPv6, 16, "ip6"
	}
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(e.family), RegAddrMin: reg(0), RegAddrMax: reg(0)}
	if s.peek(0) == family {
		s.next()
		if err := s.expect("to"); err != nil {
			return err
		}
		fields, err := e.key(s)
		if err != nil {
			return err
		}
		if s.next() != "map" {
			return unsupported("dnat %s to a key without a map", family)
		}
		types, err := e.loadKey(fields)
		if err != nil {
			return err
		}
		if err := e.lookup(s.next(), types, []uint32{addrType, typeInetService}, false, true, reg(0)); err != nil {
			return err
		}
		port := reg(words(addrSize))
		nat.RegProtoMin, nat.RegProtoMax, nat.Specified = port, port, true
		e.exprs = append(e.exprs, nat)
		return nil
	}
	if err := s.expect("to"); err != nil {
		return err
	}
	to := s.next()
	addrText, portText := to, ""
	if i := strings.LastIndex(to, ":"); i >= 0 && (addrSize == 4 || strings.HasPrefix(to, "[")) {
		addrText, portText = strings.TrimSuffix(strings.TrimPrefix(to[:i], "["), "]"), to[i+1:]
	}
	addr, err := encodeOne(addrType, addrText, addrSize, false)
	if err != nil {
		return err
	}
	e.exprs = append(e.exprs, &expr.Immediate{Register: reg(0), Data: addr})
	if portText != "" {
		port, err := encodeOne(typeInetService, portText, 2, false)
		if err != nil {
			return err
		}
		e.exprs = append(e.exprs, &expr.Immediate{Register: reg(4), Data: port})
		nat.RegProtoMin, nat.RegProtoMax, nat.Specified = reg(4), reg(4), true
	}
	e.exprs = append(e.exprs, nat)
	return nil
}

func native(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func parseUint32(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, unsupported("number %q", s)
	}
	return uint32(v), nil
}

// parsePrefix reads an address or a prefix of the size.
func parsePrefix(text string, size int) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(text)
	if err != nil {
		a, aerr := netip.ParseAddr(text)
		if aerr != nil {
			return netip.Prefix{}, unsupported("address %q", text)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().BitLen() != size*8 || p.Addr().Zone() != "" || p.Masked() != p || p.Bits() == 0 {
		return netip.Prefix{}, unsupported("address %q", text)
	}
	return p, nil
}

// encodeOne writes one value of a type, as formatOne prints it; an
// integer takes size bytes, in host byte order if host is set.
func encodeOne(t uint32, text string, size int, host bool) ([]byte, error) {
	switch t {
	case typeIPv4, typeIPv6:
		a, err := netip.ParseAddr(text)
		if err != nil || a.Zone() != "" || a.BitLen() != dtypes[t].size*8 {
			return nil, unsupported("%s %q", dtypes[t].name, text)
		}
		return a.AsSlice(), nil
	case typeInetProto:
		for n, name := range protocols {
			if name == text {
				return []byte{n}, nil
			}
		}
		return nil, unsupported("protocol %q", text)
	case typeInetService:
		v, err := strconv.ParseUint(text, 10, 16)
		if err != nil {
			return nil, unsupported("port %q", text)
		}
		return binary.BigEndian.AppendUint16(nil, uint16(v)), nil
	case typeMark:
		v, err := parseUint32(text)
		return native(v), err
	case typeIfname:
		name, err := unquote(text)
		if err != nil || len(name) >= 16 || strings.Contains(name, "*") {
			return nil, unsupported("interface name %q", text)
		}
		b := make([]byte, 16)
		copy(b, name)
		return b, nil
	case typeInteger:
		v, ok := new(big.Int).SetString(text, 10)
		if !ok || v.Sign() < 0 || v.BitLen() > size*8 {
			return nil, unsupported("integer %q", text)
		}
		b := v.FillBytes(make([]byte, size))
		if host {
			for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
				b[i], b[j] = b[j], b[i] // little-endian hosts only, as formatOne
			}
		}
		return b, nil
	}
	return nil, unsupported("a value of type %d", t)
}

// encodeValue writes a value of the types (several: a concatenation,
// each field padded to 4 bytes), as format prints it.
func encodeValue(ts []uint32, text string, size int, host bool) ([]byte, error) {
	if len(ts) == 1 {
		return encodeOne(ts[0], text, size, host)
	}
	parts := strings.Split(text, " . ")
	if len(parts) != len(ts) {
		return nil, unsupported("%q is not a %s", text, typeNames(ts))
	}
	var b []byte
	for i, t := range ts {
		v, err := encodeOne(t, parts[i], dtypes[t].size, host)
		if err != nil {
			return nil, err
		}
		b = append(b, v...)
		b = append(b, make([]byte, (4-len(v)%4)%4)...)
	}
	return b, nil
}
