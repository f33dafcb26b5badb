// The decoder's statements: meta mark set and dnat, which take operands,
// the verdicts, masquerade, reject, a named counter and a set update.

package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

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

// setMark prints "meta mark set <value>".
func (d *decoder) setMark(e *expr.Meta) error {
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

func (d *decoder) verdictStatement(e *expr.Verdict) error {
	v, err := verdict(int32(e.Kind), e.Chain)
	if err != nil {
		return err
	}
	d.out = append(d.out, v)
	return nil
}

func (d *decoder) masquerade(e *expr.Masq) error {
	if e.ToPorts || e.Random || e.Persistent {
		return fmt.Errorf("masquerade %+v", *e)
	}
	s := "masquerade"
	if e.FullyRandom {
		s += " fully-random"
	}
	d.out = append(d.out, s)
	return nil
}

// reject prints nft's default reject only: ICMP(v6) port unreachable.
func (d *decoder) reject(e *expr.Reject) error {
	port := map[byte]uint8{unix.NFPROTO_IPV4: 3, unix.NFPROTO_IPV6: 4}[d.family]
	if e.Type != unix.NFT_REJECT_ICMP_UNREACH || e.Code != port {
		return fmt.Errorf("reject type %d code %d", e.Type, e.Code)
	}
	d.out = append(d.out, "reject")
	return nil
}

// counter prints a named counter, the only object a rule may refer to.
func (d *decoder) counter(e *expr.Objref) error {
	if e.Type != objectCounter {
		return fmt.Errorf("objref of object type %d", e.Type)
	}
	d.out = append(d.out, "counter name "+strconv.Quote(e.Name))
	return nil
}

// update prints "update @set { key [timeout T] }": the key added to a
// named set, or its timeout refreshed.
func (d *decoder) update(e *expr.Dynset) error {
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
