// The writer's elements: adding and deleting them, grouped many to a
// message, and their encoding, intervals included.

package nftnl

import (
	"bytes"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// AddElement adds an element to a named set or map, as "add element". In
// an interval set, the kernel refuses one that overlaps another.
func (w *Writer) AddElement(set string, e Element) error {
	return w.elementOp(unix.NFT_MSG_NEWSETELEM, set, e)
}

// DeleteElement deletes the element of a key from a named set or map.
func (w *Writer) DeleteElement(set, key string) error {
	return w.elementOp(unix.NFT_MSG_DELSETELEM, set, Element{Key: key})
}

// maxElementList bounds the elements of one message: an attribute holds
// at most 64 KiB.
const maxElementList = 32 << 10

func (w *Writer) elementOp(msgType uint16, set string, e Element) error {
	info, err := w.set(set)
	if err != nil {
		return err
	}
	b, _, err := w.element(info, e, msgType == unix.NFT_MSG_NEWSETELEM)
	if err != nil {
		return fmt.Errorf("set %s: %w", set, err)
	}
	g := &w.elems
	if g.n > 0 && (g.msgType != msgType || g.set != set || len(g.list)+len(b) > maxElementList) {
		if err := w.flushElements(); err != nil {
			return err
		}
	}
	if g.n == 0 {
		*g = elementGroup{msgType: msgType, set: set, first: e.Key}
	}
	g.list, g.n = append(g.list, b...), g.n+1
	return nil
}

// flushElements puts the element operations gathered into the batch.
func (w *Writer) flushElements() error {
	g := w.elems
	if g.n == 0 {
		return nil
	}
	w.elems = elementGroup{}
	verb := map[uint16]string{unix.NFT_MSG_NEWSETELEM: "adding", unix.NFT_MSG_DELSETELEM: "deleting"}[g.msgType]
	what := fmt.Sprintf("%s element %s of %s", verb, g.first, g.set)
	if g.n > 1 {
		what = fmt.Sprintf("%s %d elements of %s, from %s", verb, g.n, g.set, g.first)
	}
	flags := uint16(0)
	if g.msgType == unix.NFT_MSG_NEWSETELEM {
		flags = unix.NLM_F_CREATE
	}
	return w.add(g.msgType, flags, what, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, w.table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, g.set)
		ae.Bytes(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_LIST_ELEMENTS, g.list)
	})
}

// element encodes one element (with its value when withData) as list
// entries: one, or the start and end of each range of an interval set.
func (w *Writer) element(info *setInfo, e Element, withData bool) ([]byte, int, error) {
	if info.interval {
		return intervalElements(info, e)
	}
	key, err := encodeValue(info.keyTypes, e.Key, info.keyLen, info.hostKey)
	if err != nil {
		return nil, 0, err
	}
	var data []byte
	switch {
	case !withData:
	case info.Map && info.dataTypes[0] == typeVerdict:
		s := &stream{toks: strings.Fields(e.Value)}
		v, err := parseVerdict(s)
		if err != nil || !s.done() {
			return nil, 0, unsupported("verdict %q", e.Value)
		}
		verdict := netlink.NewAttributeEncoder()
		verdict.ByteOrder = bigEndian
		verdict.Nested(unix.NFTA_DATA_VERDICT, func(nae *netlink.AttributeEncoder) error {
			nae.Uint32(unix.NFTA_VERDICT_CODE, uint32(int32(v.Kind)))
			if v.Chain != "" {
				nae.String(unix.NFTA_VERDICT_CHAIN, v.Chain)
			}
			return nil
		})
		if data, err = verdict.Encode(); err != nil {
			return nil, 0, unsupported("verdict %q: %v", e.Value, err)
		}
	case info.Map:
		value, err := encodeValue(info.dataTypes, e.Value, valueLen(info.dataTypes), false)
		if err != nil {
			return nil, 0, err
		}
		data = valueAttr(value)
	case e.Value != "":
		return nil, 0, unsupported("a value %q in a set", e.Value)
	}
	if len(e.Comment) > 250 {
		return nil, 0, unsupported("an element comment of %d bytes", len(e.Comment))
	}
	return listEntry(key, data, e.Comment, 0), 1, nil
}

func valueAttr(value []byte) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(unix.NFTA_DATA_VALUE, value)
	b, _ := ae.Encode()
	return b
}

// listEntry is one NFTA_LIST_ELEM of an element list.
func listEntry(key, data []byte, comment string, flags uint32) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = bigEndian
	ae.Nested(unix.NFTA_LIST_ELEM, func(nae *netlink.AttributeEncoder) error {
		nae.Bytes(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_KEY, valueAttr(key))
		if data != nil {
			nae.Bytes(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_DATA, data)
		}
		if flags != 0 {
			nae.Uint32(unix.NFTA_SET_ELEM_FLAGS, flags)
		}
		if comment != "" {
			nae.Bytes(unix.NFTA_SET_ELEM_USERDATA, userdata(0, comment))
		}
		return nil
	})
	b, _ := ae.Encode()
	return b
}

// intervalElements are the entries of the elements of an interval set of
// addresses ("10.0.0.0/8, 10.1.0.1, 10.2.0.1-10.2.0.5"): each range's
// start and, flagged, the address after its end (none at the top of the
// address space).
func intervalElements(info *setInfo, e Element) ([]byte, int, error) {
	if info.Map || len(info.keyTypes) != 1 || e.Comment != "" {
		return nil, 0, unsupported("an interval element %q", e.Key)
	}
	size := info.keyLen
	lo, hi, err := addrRange(e.Key, size)
	if err != nil {
		return nil, 0, err
	}
	b := listEntry(lo, nil, "", 0)
	end := new(big.Int).Add(new(big.Int).SetBytes(hi), big.NewInt(1))
	if end.BitLen() <= size*8 {
		b = append(b, listEntry(end.FillBytes(make([]byte, size)), nil, "", unix.NFT_SET_ELEM_INTERVAL_END)...)
		return b, 2, nil
	}
	return b, 1, nil
}

// disjoint tells that no two ranges overlap or touch: nft would merge
// them, and list them merged.
func disjoint(elems []Element, size int) error {
	type span struct{ lo, hi []byte }
	spans := make([]span, 0, len(elems))
	for _, e := range elems {
		lo, hi, err := addrRange(e.Key, size)
		if err != nil {
			return err
		}
		spans = append(spans, span{lo, hi})
	}
	slices.SortFunc(spans, func(a, b span) int { return bytes.Compare(a.lo, b.lo) })
	for i := 1; i < len(spans); i++ {
		end := new(big.Int).Add(new(big.Int).SetBytes(spans[i-1].hi), big.NewInt(1))
		if end.Cmp(new(big.Int).SetBytes(spans[i].lo)) >= 0 {
			return unsupported("ranges that nft would merge")
		}
	}
	return nil
}

// addrRange is the first and last address of an address, prefix or
// range "a-b".
func addrRange(text string, size int) (lo, hi []byte, err error) {
	if first, last, ok := strings.Cut(text, "-"); ok {
		a, err1 := netip.ParseAddr(first)
		b, err2 := netip.ParseAddr(last)
		if err1 != nil || err2 != nil || a.BitLen() != size*8 || b.BitLen() != size*8 || b.Less(a) {
			return nil, nil, unsupported("range %q", text)
		}
		return a.AsSlice(), b.AsSlice(), nil
	}
	p, err := parsePrefix(text, size)
	if err != nil {
		return nil, nil, err
	}
	lo = p.Addr().AsSlice()
	hi = slices.Clone(lo)
	for i := p.Bits(); i < size*8; i++ {
		hi[i/8] |= 0x80 >> (i % 8)
	}
	return lo, hi, nil
}
