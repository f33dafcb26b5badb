package nftnl

import (
	"errors"
	"fmt"
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
	case "objref":
		e = &expr.Objref{}
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

// apply decodes one expression: a load into registers, a bitwise
// operation on one, a relation that prints what it takes from them, or a
// statement.
func (d *decoder) apply(e expr.Any) error {
	switch e := e.(type) {
	case *expr.Payload:
		return d.loadPayload(e)
	case *expr.Meta:
		if e.SourceRegister {
			return d.setMark(e)
		}
		return d.loadMeta(e)
	case *expr.Ct:
		return d.loadCt(e)
	case *expr.Fib:
		return d.loadFib(e)
	case *expr.Numgen:
		return d.loadNumgen(e)
	case *expr.Immediate:
		return d.put(e.Register, &operand{text: "a constant", kind: kindConst, size: len(e.Data), data: e.Data})
	case *expr.Bitwise:
		return d.bitwise(e)
	case *expr.Cmp:
		return d.compare(e)
	case *expr.Lookup:
		return d.lookup(e)
	case *expr.Verdict:
		return d.verdictStatement(e)
	case *expr.NAT:
		return d.nat(e)
	case *expr.Masq:
		return d.masquerade(e)
	case *expr.Reject:
		return d.reject(e)
	case *expr.Objref:
		return d.counter(e)
	case *expr.Dynset:
		return d.update(e)
	}
	return fmt.Errorf("expression %T", e)
}

func (d *decoder) loadPayload(e *expr.Payload) error {
	if e.OperationType != expr.PayloadLoad {
		return errors.New("a payload write")
	}
	op, err := d.payload(e)
	if err != nil {
		return err
	}
	return d.put(e.DestRegister, op)
}

// metaKeys are the meta keys a rule may load, as nft prints them.
var metaKeys = map[expr.MetaKey]operand{
	expr.MetaKeyL4PROTO: {text: "meta l4proto", kind: kindProto, size: 1},
	expr.MetaKeyMARK:    {text: "meta mark", kind: kindMark, size: 4},
	expr.MetaKeyIIFNAME: {text: "iifname", kind: kindIfname, size: 16},
	expr.MetaKeyOIFNAME: {text: "oifname", kind: kindIfname, size: 16},
}

func (d *decoder) loadMeta(e *expr.Meta) error {
	op, ok := metaKeys[e.Key]
	if !ok {
		return fmt.Errorf("meta key %d", e.Key)
	}
	return d.put(e.Register, &op)
}

func (d *decoder) loadCt(e *expr.Ct) error {
	switch e.Key {
	case expr.CtKeySTATE:
		return d.put(e.Register, &operand{text: "ct state", kind: kindCtState, size: 4})
	case expr.CtKeySTATUS:
		return d.put(e.Register, &operand{text: "ct status", kind: kindCtStatus, size: 4})
	}
	return fmt.Errorf("ct key %d", e.Key)
}

// loadFib loads the address type of the source or destination: "fib
// saddr type", "fib daddr type".
func (d *decoder) loadFib(e *expr.Fib) error {
	if !e.ResultADDRTYPE || e.ResultOIF || e.ResultOIFNAME || e.FlagSADDR == e.FlagDADDR ||
		e.FlagMARK || e.FlagIIF || e.FlagOIF || e.FlagPRESENT {
		return fmt.Errorf("fib %+v", *e)
	}
	text := "fib daddr type"
	if e.FlagSADDR {
		text = "fib saddr type"
	}
	return d.put(e.Register, &operand{text: text, kind: kindFibType, size: 4})
}

func (d *decoder) loadNumgen(e *expr.Numgen) error {
	if e.Type != unix.NFT_NG_RANDOM {
		return fmt.Errorf("numgen type %d", e.Type)
	}
	text := fmt.Sprintf("numgen random mod %d", e.Modulus)
	if e.Offset != 0 {
		text += fmt.Sprintf(" offset %d", e.Offset)
	}
	return d.put(e.Register, &operand{text: text, kind: kindInteger, size: 4})
}

// bitwise masks and flips an operand in place, once: what it does is
// printed with the relation or statement that takes the operand.
func (d *decoder) bitwise(e *expr.Bitwise) error {
	op, ok := d.regs[word(e.SourceRegister)]
	if !ok || e.DestRegister != e.SourceRegister || op.mask != nil || int(e.Len) != op.size ||
		len(e.Mask) != op.size || len(e.Xor) != op.size {
		return fmt.Errorf("bitwise %+v", *e)
	}
	op.mask, op.xor = e.Mask, e.Xor
	return nil
}

// compare prints an operand compared with a constant.
func (d *decoder) compare(e *expr.Cmp) error {
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
