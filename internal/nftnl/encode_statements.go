// The encoder's statements that take operands: meta mark set, update of
// a set, and dnat.

package nftnl

import (
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

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
