// Over 600 lines: the decoder of every rule shape kube-proxy's tables hold,
// the inverse of encode.go, kept in one file so a shape and its printing
// stay side by side.

package nftnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The rule shapes decoded are those of kube-proxy's tables, ours and
// upstream's: loads of ip/ip6 saddr and daddr (whole or a prefix), th
// dport, meta l4proto, mark and iifname, ct state and status, fib saddr
// and daddr type, numgen; compared with a constant, looked up in a named
// or anonymous set, or as a key of a verdict map or of a dnat map; and the
// statements verdict, meta mark set, dnat, masquerade, reject, update of
// a set, and a comment. An expression of another kind, a value loaded and
// never used, or any form nft would print otherwise, is an error.

// kind says how nft prints a value compared with, or taken from, an
// operand.
type kind int

const (
	kindAddr kind = iota // ip/ip6 saddr and daddr, maybe a prefix
	kindProto
	kindService
	kindMark
	kindIfname
	kindFibType
	kindInteger // numgen, in host byte order
	kindCtState
	kindCtStatus
	kindConst // an immediate value
	kindMap   // the data a map lookup found
)

// operand is a value a rule put into registers and has not used yet.
type operand struct {
	text string
	kind kind
	// size is the bytes it takes in registers.
	size int
	// addrSize is 4 or 16 for kindAddr; fewer bytes loaded are a prefix.
	addrSize int
	// mask and xor are a bitwise operation on it, if any.
	mask, xor []byte
	data      []byte // kindConst
	// dataTypes of a map lookup's value (kindMap).
	dataTypes []uint32
}

type decoder struct {
	family byte
	sets   map[string]*setInfo
	// fetch, when set, reads a set that sets lacks (ReadObjects reads
	// only the sets its chains' rules use).
	fetch func(name string) (*setInfo, error)
	// regs holds operands by the first 32-bit register word they take.
	regs map[int]*operand
	out  []string
	// l4proto is set once a "meta l4proto" relation was printed: nft
	// would then print a later th load as tcp/udp/sctp.
	l4proto bool
}

// word is the index of a register's first 32-bit word: registers 1-4 are
// 16 bytes wide, 8-23 4 bytes (NFT_REG32_00).
func word(reg uint32) int {
	if reg <= unix.NFT_REG_4 {
		return int(reg) * 4
	}
	return int(reg) - unix.NFT_REG32_00 + 4
}

func words(size int) int { return (size + 3) / 4 }

func (d *decoder) put(reg uint32, op *operand) error {
	w := word(reg)
	if reg == unix.NFT_REG_VERDICT {
		return errors.New("a value loaded into the verdict register")
	}
	for at, o := range d.regs {
		if at < w+words(op.size) && w < at+words(o.size) {
			return fmt.Errorf("%q overwrites %q, never used", op.text, o.text)
		}
	}
	d.regs[w] = op
	return nil
}

func (d *decoder) take(reg uint32) (*operand, error) {
	op, ok := d.regs[word(reg)]
	if !ok {
		return nil, fmt.Errorf("register %d read before it was loaded", reg)
	}
	delete(d.regs, word(reg))
	return op, nil
}

// rule decodes one rule's expressions (NFTA_RULE_EXPRESSIONS) and
// userdata into the line nft lists.
func (d *decoder) rule(exprs, udata []byte) (string, error) {
	d.regs, d.out, d.l4proto = map[int]*operand{}, nil, false
	list, err := netlink.NewAttributeDecoder(exprs)
	if err != nil {
		return "", err
	}
	for list.Next() {
		var name string
		var data []byte
		list.Nested(func(ad *netlink.AttributeDecoder) error {
			for ad.Next() {
				switch ad.Type() {
				case unix.NFTA_EXPR_NAME:
					name = ad.String()
				case unix.NFTA_EXPR_DATA:
					data = ad.Bytes()
				}
			}
			return nil
		})
		e, err := d.decodeExpr(name, data)
		if err != nil {
			return "", err
		}
		if err := d.apply(e); err != nil {
			return "", fmt.Errorf("%s: %w (after %q)", name, err, strings.Join(d.out, " "))
		}
	}
	if err := list.Err(); err != nil {
		return "", err
	}
	for _, op := range d.regs {
		return "", fmt.Errorf("%q loaded and never used", op.text)
	}
	if len(d.out) == 0 {
		return "", errors.New("an empty rule")
	}
	if len(udata) > 0 {
		c, err := comment(udata)
		if err != nil {
			return "", err
		}
		d.out = append(d.out, `comment "`+c+`"`)
	}
	return strings.Join(d.out, " "), nil
}

func (d *decoder) decodeExpr(name string, data []byte) (expr.Any, error) {
	var e expr.Any
	switch name {
	case "payload":
		e = &expr.Payload{}
	case "meta":
		e = &expr.Meta{}
	case "cmp":
		e = &expr.Cmp{}
	case "bitwise":
		e = &expr.Bitwise{}
	case "lookup":
		e = &expr.Lookup{}
	case "immediate":
		e = &expr.Immediate{}
	case "ct":
		e = &expr.Ct{}
	case "fib":
		e = &expr.Fib{}
	case "numgen":
		e = &expr.Numgen{}
	case "nat":
		e = &expr.NAT{}
	case "masq":
		e = &expr.Masq{}
	case "reject":
		e = &expr.Reject{}
	case "dynset":
		e = &expr.Dynset{}
	default:
		return nil, fmt.Errorf("expression %q", name)
	}
	if err := expr.Unmarshal(d.family, data, e); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	// A verdict is an immediate into the verdict register.
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT {
		v := &expr.Verdict{}
		if err := expr.Unmarshal(d.family, data, v); err != nil {
			return nil, fmt.Errorf("verdict: %w", err)
		}
		return v, nil
	}
	return e, nil
}

func (d *decoder) apply(e expr.Any) error {
	switch e := e.(type) {
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad {
			return errors.New("a payload write")
		}
		op, err := d.payload(e)
		if err != nil {
			return err
		}
		return d.put(e.DestRegister, op)
	case *expr.Meta:
		if e.SourceRegister {
			if e.Key != expr.MetaKeyMARK {
				return fmt.Errorf("meta %d set", e.Key)
			}
			op, err := d.take(e.Register)
			if err != nil {
				return err
			}
			v, err := markValue(op)
			if err != nil {
				return err
			}
			d.out = append(d.out, "meta mark set "+v)
			return nil
		}
		op, ok := map[expr.MetaKey]*operand{
			expr.MetaKeyL4PROTO: {text: "meta l4proto", kind: kindProto, size: 1},
			expr.MetaKeyMARK:    {text: "meta mark", kind: kindMark, size: 4},
			expr.MetaKeyIIFNAME: {text: "iifname", kind: kindIfname, size: 16},
			expr.MetaKeyOIFNAME: {text: "oifname", kind: kindIfname, size: 16},
		}[e.Key]
		if !ok {
			return fmt.Errorf("meta key %d", e.Key)
		}
		return d.put(e.Register, op)
	case *expr.Ct:
		switch e.Key {
		case expr.CtKeySTATE:
			return d.put(e.Register, &operand{text: "ct state", kind: kindCtState, size: 4})
		case expr.CtKeySTATUS:
			return d.put(e.Register, &operand{text: "ct status", kind: kindCtStatus, size: 4})
		}
		return fmt.Errorf("ct key %d", e.Key)
	case *expr.Fib:
		if !e.ResultADDRTYPE || e.ResultOIF || e.ResultOIFNAME || e.FlagSADDR == e.FlagDADDR ||
			e.FlagMARK || e.FlagIIF || e.FlagOIF || e.FlagPRESENT {
			return fmt.Errorf("fib %+v", *e)
		}
		text := "fib daddr type"
		if e.FlagSADDR {
			text = "fib saddr type"
		}
		return d.put(e.Register, &operand{text: text, kind: kindFibType, size: 4})
	case *expr.Numgen:
		if e.Type != unix.NFT_NG_RANDOM {
			return fmt.Errorf("numgen type %d", e.Type)
		}
		text := fmt.Sprintf("numgen random mod %d", e.Modulus)
		if e.Offset != 0 {
			text += fmt.Sprintf(" offset %d", e.Offset)
		}
		return d.put(e.Register, &operand{text: text, kind: kindInteger, size: 4})
	case *expr.Bitwise:
		op, ok := d.regs[word(e.SourceRegister)]
		if !ok || e.DestRegister != e.SourceRegister || op.mask != nil || int(e.Len) != op.size ||
			len(e.Mask) != op.size || len(e.Xor) != op.size {
			return fmt.Errorf("bitwise %+v", *e)
		}
		op.mask, op.xor = e.Mask, e.Xor
		return nil
	case *expr.Cmp:
		op, err := d.take(e.Register)
		if err != nil {
			return err
		}
		rel, err := d.relation(op, e.Op, e.Data)
		if err != nil {
			return err
		}
		d.out = append(d.out, rel)
		return nil
	case *expr.Lookup:
		return d.lookup(e)
	case *expr.Immediate:
		return d.put(e.Register, &operand{text: "a constant", kind: kindConst, size: len(e.Data), data: e.Data})
	case *expr.Verdict:
		v, err := verdict(int32(e.Kind), e.Chain)
		if err != nil {
			return err
		}
		d.out = append(d.out, v)
		return nil
	case *expr.NAT:
		return d.nat(e)
	case *expr.Masq:
		if e.ToPorts || e.Random || e.Persistent {
			return fmt.Errorf("masquerade %+v", *e)
		}
		s := "masquerade"
		if e.FullyRandom {
			s += " fully-random"
		}
		d.out = append(d.out, s)
		return nil
	case *expr.Reject:
		// nft's default: ICMP(v6) port unreachable.
		port := map[byte]uint8{unix.NFPROTO_IPV4: 3, unix.NFPROTO_IPV6: 4}[d.family]
		if e.Type != unix.NFT_REJECT_ICMP_UNREACH || e.Code != port {
			return fmt.Errorf("reject type %d code %d", e.Type, e.Code)
		}
		d.out = append(d.out, "reject")
		return nil
	case *expr.Dynset:
		if e.Operation != unix.NFT_DYNSET_OP_UPDATE || e.SrcRegData != 0 || e.Invert || len(e.Exprs) > 0 {
			return fmt.Errorf("dynset %+v", *e)
		}
		s, err := d.set(e.SetName)
		if err != nil {
			return err
		}
		if s.anonymous {
			return fmt.Errorf("dynset of set %q", e.SetName)
		}
		key, err := d.key(e.SrcRegKey, s)
		if err != nil {
			return err
		}
		stmt := "update @" + e.SetName + " { " + key
		if e.Timeout != 0 {
			stmt += " timeout " + Duration(e.Timeout)
		}
		d.out = append(d.out, stmt+" }")
		return nil
	}
	return fmt.Errorf("expression %T", e)
}

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

// markValue prints the value a meta mark set writes.
func markValue(op *operand) (string, error) {
	switch {
	case op.kind == kindConst && op.size == 4:
		return formatOne(typeMark, op.data, false)
	case op.kind != kindMark || op.mask == nil:
		return "", fmt.Errorf("meta mark set to %s", op.text)
	}
	mask, xor := binary.NativeEndian.Uint32(op.mask), binary.NativeEndian.Uint32(op.xor)
	switch {
	case xor != 0 && mask == ^xor:
		return fmt.Sprintf("meta mark | 0x%08x", xor), nil
	case mask == ^uint32(0):
		return fmt.Sprintf("meta mark ^ 0x%08x", xor), nil
	case xor == 0:
		return fmt.Sprintf("meta mark & 0x%08x", mask), nil
	}
	return "", fmt.Errorf("meta mark & %#x ^ %#x", mask, xor)
}

// key takes the operands a set lookup's key is made of: one, or the
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

// nat prints "dnat to 10.0.0.1:80", "dnat to [fd00::1]:80", or "dnat ip to
// <key> map { ... }" when address and port come from a map.
func (d *decoder) nat(e *expr.NAT) error {
	if e.Type != expr.NATTypeDestNAT || e.Random || e.FullyRandom || e.Persistent || e.Prefix ||
		e.RegAddrMin == 0 || e.RegAddrMax != e.RegAddrMin || e.RegProtoMax != e.RegProtoMin {
		return fmt.Errorf("nat %+v", *e)
	}
	addrSize, family := 4, "ip"
	if e.Family == unix.NFPROTO_IPV6 {
		addrSize, family = 16, "ip6"
	}
	if e.Family != uint32(d.family) {
		return fmt.Errorf("nat of family %d", e.Family)
	}
	addr, ok := d.regs[word(e.RegAddrMin)]
	if !ok {
		return errors.New("nat address not loaded")
	}
	if addr.kind == kindMap {
		// Address and port: the fields of the map's value.
		want := []uint32{map[int]uint32{4: typeIPv4, 16: typeIPv6}[addrSize], typeInetService}
		if e.RegProtoMin == 0 || !e.Specified || word(e.RegProtoMin) != word(e.RegAddrMin)+words(addrSize) ||
			len(addr.dataTypes) != 2 || addr.dataTypes[0] != want[0] || addr.dataTypes[1] != want[1] {
			return fmt.Errorf("nat from %s", addr.text)
		}
		delete(d.regs, word(e.RegAddrMin))
		d.out = append(d.out, "dnat "+family+" to "+addr.text)
		return nil
	}
	if _, err := d.take(e.RegAddrMin); err != nil {
		return err
	}
	if addr.kind != kindConst || addr.size != addrSize {
		return fmt.Errorf("nat to %s", addr.text)
	}
	to, _ := netip.AddrFromSlice(addr.data)
	text := to.String()
	if e.RegProtoMin != 0 {
		port, err := d.take(e.RegProtoMin)
		if err != nil {
			return err
		}
		if port.kind != kindConst || port.size != 2 || !e.Specified {
			return fmt.Errorf("nat to port %s", port.text)
		}
		if addrSize == 16 {
			text = "[" + text + "]"
		}
		text += fmt.Sprintf(":%d", binary.BigEndian.Uint16(port.data))
	} else if e.Specified {
		return errors.New("nat to a port range without a port")
	}
	d.out = append(d.out, "dnat to "+text)
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

// Duration prints a time as nft lists it ("3h", "1h30m", "10s").
func Duration(d time.Duration) string {
	var b strings.Builder
	for _, u := range []struct {
		unit string
		d    time.Duration
	}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}} {
		if d >= u.d {
			fmt.Fprintf(&b, "%d%s", d/u.d, u.unit)
			d %= u.d
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}
