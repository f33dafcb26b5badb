// The decoder's relations: the loads of headers, their comparisons with
// constants and the printing of those, and lookups in sets and maps.

package nftnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// payload names a load of the network or transport header.
func (d *decoder) payload(e *expr.Payload) (*operand, error) {
	n := int(e.Len)
	switch {
	case e.Base == expr.PayloadBaseNetworkHeader && d.family == unix.NFPROTO_IPV4 && n >= 1 && n <= 4 && (e.Offset == 12 || e.Offset == 16):
		return &operand{text: map[uint32]string{12: "ip saddr", 16: "ip daddr"}[e.Offset], kind: kindAddr, size: n, addrSize: 4}, nil
	case e.Base == expr.PayloadBaseNetworkHeader && d.family == unix.NFPROTO_IPV6 && n >= 1 && n <= 16 && (e.Offset == 8 || e.Offset == 24):
		return &operand{text: map[uint32]string{8: "ip6 saddr", 24: "ip6 daddr"}[e.Offset], kind: kindAddr, size: n, addrSize: 16}, nil
	case e.Base == expr.PayloadBaseTransportHeader && n == 2 && e.Offset == 2 && !d.l4proto:
		return &operand{text: "th dport", kind: kindService, size: 2}, nil
	}
	return nil, fmt.Errorf("payload %+v", *e)
}

// relation prints a comparison of an operand with a constant.
func (d *decoder) relation(op *operand, cmpOp expr.CmpOp, data []byte) (string, error) {
	// An interface name prefix compares its bytes only.
	if len(data) != op.size && (op.kind != kindIfname || len(data) > op.size) {
		return "", fmt.Errorf("%s compared with %d bytes", op.text, len(data))
	}
	neg := ""
	switch cmpOp {
	case expr.CmpOpEq:
	case expr.CmpOpNeq:
		neg = "!= "
	default:
		return "", fmt.Errorf("%s compared by %d", op.text, cmpOp)
	}
	if op.kind == kindCtState || op.kind == kindCtStatus {
		// "ct state new" is a test of its bit.
		flag := binary.NativeEndian.Uint32(op.mask)
		names := map[kind]map[uint32]string{
			kindCtState:  {1: "invalid", 2: "established", 4: "related", 8: "new", 64: "untracked"},
			kindCtStatus: {1: "expected", 2: "seen-reply", 4: "assured", 8: "confirmed", 16: "snat", 32: "dnat", 512: "dying"},
		}[op.kind]
		if op.mask == nil || cmpOp != expr.CmpOpNeq || !allZero(op.xor) || !allZero(data) || names[flag] == "" {
			return "", fmt.Errorf("%s compared other than by one flag", op.text)
		}
		return op.text + " " + names[flag], nil
	}
	if op.kind == kindMark && op.mask != nil {
		if !allZero(op.xor) {
			return "", errors.New("meta mark compared after a xor")
		}
		sep := " == "
		if neg != "" {
			sep = " != "
		}
		return fmt.Sprintf("meta mark & 0x%08x%s0x%08x", binary.NativeEndian.Uint32(op.mask), sep, binary.NativeEndian.Uint32(data)), nil
	}
	value, err := d.value(op, data)
	if err != nil {
		return "", err
	}
	if op.kind == kindProto && neg == "" {
		d.l4proto = true
	}
	return op.text + " " + neg + value, nil
}

// value prints a constant compared with an operand.
func (d *decoder) value(op *operand, data []byte) (string, error) {
	if op.mask != nil && op.kind != kindAddr {
		return "", fmt.Errorf("%s compared after a bitwise operation", op.text)
	}
	switch op.kind {
	case kindAddr:
		return prefix(op, data)
	case kindProto:
		return formatOne(typeInetProto, data, false)
	case kindService:
		return formatOne(typeInetService, data, false)
	case kindMark:
		return formatOne(typeMark, data, false)
	case kindIfname:
		// A name without its NUL is a prefix: "eth*".
		if i := bytes.IndexByte(data, 0); i >= 0 {
			if !allZero(data[i:]) {
				return "", fmt.Errorf("interface name %q", data)
			}
			return `"` + string(data[:i]) + `"`, nil
		}
		return `"` + string(data) + `*"`, nil
	case kindFibType:
		names := map[uint32]string{1: "unicast", 2: "local", 3: "broadcast", 4: "anycast", 5: "multicast", 6: "blackhole", 7: "unreachable", 8: "prohibit"}
		if name, ok := names[binary.NativeEndian.Uint32(data)]; ok {
			return name, nil
		}
		return "", fmt.Errorf("fib type %x", data)
	case kindInteger:
		return fmt.Sprint(binary.NativeEndian.Uint32(data)), nil
	}
	return "", fmt.Errorf("%s compared with a constant", op.text)
}

// prefix prints an address, or the prefix a shorter load or a mask
// makes of it: "10.96.0.0/16".
func prefix(op *operand, data []byte) (string, error) {
	n := op.size * 8
	if op.mask != nil {
		if !allZero(op.xor) {
			return "", fmt.Errorf("%s compared after a xor", op.text)
		}
		ones := 0
		for _, b := range op.mask {
			ones += bits.OnesCount8(b)
		}
		// The mask must be a prefix.
		for i := range op.mask {
			want := byte(0)
			if left := ones - 8*i; left >= 8 {
				want = 0xff
			} else if left > 0 {
				want = ^byte(0xff >> left)
			}
			if op.mask[i] != want {
				return "", fmt.Errorf("%s masked by %x", op.text, op.mask)
			}
		}
		n = ones
	}
	full := make([]byte, op.addrSize)
	copy(full, data)
	addr, _ := netip.AddrFromSlice(full)
	if n == op.addrSize*8 {
		return addr.String(), nil
	}
	p, err := addr.Prefix(n)
	if err != nil || p.Addr() != addr {
		return "", fmt.Errorf("%s compared with %x, not a prefix of %d bits", op.text, data, n)
	}
	return p.String(), nil
}

// fields of a concatenation in consecutive registers.
func (d *decoder) key(reg uint32, s *setInfo) (string, error) {
	w := word(reg)
	var fields []string
	for i, t := range s.keyTypes {
		op, ok := d.regs[w]
		if !ok {
			return "", fmt.Errorf("the key of %s: register word %d not loaded", s.Name, w)
		}
		want := dtypes[t].size
		if len(s.keyTypes) == 1 {
			want = s.keyLen
		}
		if op.mask != nil || op.size != want || !keyKinds[t][op.kind] || op.kind == kindAddr && op.addrSize != op.size {
			return "", fmt.Errorf("field %d of the key of %s: %s", i, s.Name, op.text)
		}
		delete(d.regs, w)
		fields = append(fields, op.text)
		w += words(op.size)
	}
	return strings.Join(fields, " . "), nil
}

// keyKinds are the operands that may be a set key field of each type.
var keyKinds = map[uint32]map[kind]bool{
	typeIPv4:        {kindAddr: true},
	typeIPv6:        {kindAddr: true},
	typeInetProto:   {kindProto: true},
	typeInetService: {kindService: true},
	typeMark:        {kindMark: true},
	typeIfname:      {kindIfname: true},
	typeInteger:     {kindInteger: true},
}

// set is the named set a rule refers to.
func (d *decoder) set(name string) (*setInfo, error) {
	if s, ok := d.sets[name]; ok {
		return s, nil
	}
	if d.fetch == nil {
		return nil, fmt.Errorf("set %q not in the table", name)
	}
	s, err := d.fetch(name)
	if err != nil {
		return nil, err
	}
	d.sets[name] = s
	return s, nil
}

func (d *decoder) lookup(e *expr.Lookup) error {
	s, err := d.set(e.SetName)
	if err != nil {
		return err
	}
	key, err := d.key(e.SourceRegister, s)
	if err != nil {
		return err
	}
	ref := "@" + s.Name
	if s.anonymous {
		if s.elements == "" {
			return fmt.Errorf("anonymous set %s not read", s.Name)
		}
		ref = s.elements
	}
	switch {
	case !e.IsDestRegSet && !s.Map:
		neg := ""
		if e.Invert {
			neg = "!= "
		}
		d.out = append(d.out, key+" "+neg+ref)
	case e.Invert || !e.IsDestRegSet || !s.Map:
		return fmt.Errorf("lookup %+v in %s", *e, s.Name)
	case e.DestRegister == unix.NFT_REG_VERDICT:
		if s.dataTypes[0] != typeVerdict {
			return fmt.Errorf("vmap %s without verdicts", s.Name)
		}
		d.out = append(d.out, key+" vmap "+ref)
	default:
		if s.dataTypes[0] == typeVerdict {
			return fmt.Errorf("verdict map %s into a register", s.Name)
		}
		return d.put(e.DestRegister, &operand{text: key + " map " + ref, kind: kindMap, size: s.dataLen, dataTypes: s.dataTypes})
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
