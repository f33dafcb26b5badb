// The encoder's relations: a selector's load, compared with a constant,
// looked up in a set, or a verdict map's key.

package nftnl

import (
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// selector reads one selector.
func (e *ruleEncoder) selector(s *stream) (*field, error) {
	meta := func(key expr.MetaKey) func(uint32) expr.Any {
		return func(r uint32) expr.Any { return &expr.Meta{Key: key, Register: r} }
	}
	t := s.next()
	switch {
	case (t == "ip" && e.family == unix.NFPROTO_IPV4 || t == "ip6" && e.family == unix.NFPROTO_IPV6) && (s.peek(0) == "saddr" || s.peek(0) == "daddr"):
		return addressSelector(t, s.next()), nil
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
		return &field{text: "th dport", typ: typeInetService, size: 2, load: payloadLoad(expr.PayloadBaseTransportHeader, 2, 2)}, nil
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
		return numgenSelector(s)
	}
	return nil, unsupported("selector %q", t)
}

// payloadLoad loads size bytes of a header from offset.
func payloadLoad(base expr.PayloadBase, offset uint32, size int) func(uint32) expr.Any {
	return func(r uint32) expr.Any {
		return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: r, Base: base, Offset: offset, Len: uint32(size)}
	}
}

// addressSelector is "ip|ip6 saddr|daddr".
func addressSelector(ip, which string) *field {
	offsets := map[string]uint32{"ipsaddr": 12, "ipdaddr": 16, "ip6saddr": 8, "ip6daddr": 24}
	typ, size := uint32(typeIPv4), 4
	if ip == "ip6" {
		typ, size = typeIPv6, 16
	}
	return &field{text: ip + " " + which, typ: typ, size: size, load: payloadLoad(expr.PayloadBaseNetworkHeader, offsets[ip+which], size)}
}

// numgenSelector reads "N [offset M]" after "numgen random mod".
func numgenSelector(s *stream) (*field, error) {
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
		return e.lookupKey(fields, s.next(), []uint32{typeVerdict}, false, true, unix.NFT_REG_VERDICT)
	}
	neg := s.peek(0) == "!="
	if neg {
		s.next()
	}
	if t := s.peek(0); strings.HasPrefix(t, "@") || strings.HasPrefix(t, "{") {
		s.next()
		return e.lookupKey(fields, t, nil, neg, false, 0)
	}
	if len(fields) != 1 {
		return unsupported("a concatenation compared with a constant")
	}
	return e.compare(fields[0], neg, s)
}

// lookupKey loads the key's fields and looks them up in target (see
// lookup).
func (e *ruleEncoder) lookupKey(fields []*field, target string, dataTypes []uint32, invert, isMap bool, dreg uint32) error {
	types, err := e.loadKey(fields)
	if err != nil {
		return err
	}
	return e.lookup(target, types, dataTypes, invert, isMap, dreg)
}

// compare writes a field compared with the constant that follows: a ct
// flag, a masked mark, an address or prefix, or a value of the field's
// type.
func (e *ruleEncoder) compare(f *field, neg bool, s *stream) error {
	switch {
	case f.ct != nil:
		return e.ctFlag(f, neg, s.next())
	case f.typ == typeMark && s.peek(0) == "&":
		s.next()
		return e.maskedMark(f, neg, s)
	}
	op := expr.CmpOpEq
	if neg {
		op = expr.CmpOpNeq
	}
	text := s.next()
	if f.typ == typeIPv4 || f.typ == typeIPv6 {
		return e.address(f, op, text)
	}
	data, err := constantData(f, text)
	if err != nil {
		return err
	}
	if f.typ == typeInetProto && !neg {
		e.l4proto = true
	}
	e.exprs = append(e.exprs, f.load(reg(0)), &expr.Cmp{Op: op, Register: reg(0), Data: data})
	return nil
}

// ctFlag writes "ct state|status <flag>": the flag is set.
func (e *ruleEncoder) ctFlag(f *field, neg bool, text string) error {
	flag, ok := f.ct[text]
	if !ok || neg {
		return unsupported("%s match", f.text)
	}
	e.exprs = append(e.exprs, f.load(reg(0)),
		&expr.Bitwise{SourceRegister: reg(0), DestRegister: reg(0), Len: 4, Mask: native(flag), Xor: native(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg(0), Data: native(0)})
	return nil
}

// maskedMark writes "meta mark & MASK ==|!= VALUE", after the "&".
func (e *ruleEncoder) maskedMark(f *field, neg bool, s *stream) error {
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

// address writes an address field compared with an address or prefix.
// A prefix of whole bytes loads just those; any other loads the address
// and masks it, as nft does (nft lists a shorter load masked as a raw
// payload).
func (e *ruleEncoder) address(f *field, op expr.CmpOp, text string) error {
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

// fibTypes are the address types "fib ... type" compares with.
var fibTypes = map[string]uint32{"unicast": 1, "local": 2, "broadcast": 3, "anycast": 4, "multicast": 5, "blackhole": 6, "unreachable": 7, "prohibit": 8}

// constantData is text as the value a field of its type is compared with.
func constantData(f *field, text string) ([]byte, error) {
	switch {
	case f.fib:
		v, ok := fibTypes[text]
		if !ok {
			return nil, unsupported("fib type %q", text)
		}
		return native(v), nil
	case f.typ == typeIfname:
		return ifnameData(text)
	}
	return encodeOne(f.typ, text, 4, true)
}

// ifnameData is a quoted interface name as compared with: the bytes of a
// "prefix*", or the whole name padded with NULs.
func ifnameData(text string) ([]byte, error) {
	name, err := unquote(text)
	if err != nil {
		return nil, err
	}
	if prefix, ok := strings.CutSuffix(name, "*"); ok {
		return []byte(prefix), nil
	}
	if len(name) >= 16 {
		return nil, unsupported("interface name %q", name)
	}
	data := make([]byte, 16)
	copy(data, name)
	return data, nil
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
