package nftnl

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// setInfo is what a rule or a listing needs of a set.
type setInfo struct {
	Set
	anonymous, interval, dynamic bool
	keyTypes                     []uint32
	keyLen                       int
	hostKey                      bool
	// dataTypes is nil in a set, [typeVerdict] in a verdict map.
	dataTypes []uint32
	dataLen   int
	// elements of an anonymous set, as a rule prints them: "{ ... }".
	elements string
}

// Set flags (linux/netfilter/nf_tables.h).
const (
	setAnonymous = 1 << iota
	setConstant
	setInterval
	setMap
	setTimeout
	setEval
	setObject
	setConcat
	setExpr
)

// Set userdata entries (libnftnl's udata.h).
const (
	udataSetKeyByteorder = iota
	udataSetDataByteorder
	udataSetMergeElements
	udataSetKeyTypeof
	udataSetDataTypeof
	udataSetExpr
	udataSetDataInterval
	udataSetComment
	byteorderHost = 1
)

// sets dumps the table's sets and reads the elements of each that is
// neither dynamic nor a map's anonymous set kept only by the kernel.
func (r *reader) sets() (map[string]*setInfo, error) {
	msgs, err := r.request(unix.NFT_MSG_GETSET, true, netlink.Attribute{Type: unix.NFTA_SET_TABLE, Data: str(r.table)})
	if err != nil {
		return nil, err
	}
	sets := map[string]*setInfo{}
	for _, m := range msgs {
		s, err := parseSet(m)
		if err != nil {
			return nil, err
		}
		sets[s.Name] = s
	}
	for _, s := range sets {
		if err := r.readElements(s); err != nil {
			return nil, err
		}
	}
	return sets, nil
}

// set reads one set or map by name, with its elements; an error wrapping
// fs.ErrNotExist means there is no such set.
func (r *reader) set(name string) (*setInfo, error) {
	msg, err := r.named(unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME, "set", name)
	if err != nil {
		return nil, err
	}
	s, err := parseSet(msg)
	if err != nil {
		return nil, err
	}
	return s, r.readElements(s)
}

// readElements reads a set's elements unless it is dynamic (the kernel
// writes those).
func (r *reader) readElements(s *setInfo) error {
	if s.dynamic {
		return nil
	}
	elems, err := r.elements(s.Name)
	if err != nil {
		return fmt.Errorf("set %s: %w", s.Name, err)
	}
	if err := s.fill(elems); err != nil {
		return fmt.Errorf("set %s: %w", s.Name, err)
	}
	return nil
}

// parseSet reads one set of the kernel's answer to NFT_MSG_GETSET.
func parseSet(m []byte) (*setInfo, error) {
	s := &setInfo{}
	a, err := s.readAttributes(m)
	if err != nil {
		return nil, err
	}
	if err := s.setFlags(a.flags); err != nil {
		return nil, err
	}
	if err := s.readUserdata(a.udata); err != nil {
		return nil, err
	}
	if err := s.setTypes(a.keyType, a.dataType); err != nil {
		return nil, err
	}
	return s, nil
}

// setAttributes are the attributes of a set that parseSet reads after
// the others.
type setAttributes struct {
	flags, keyType, dataType uint32
	udata                    []byte
}

// readAttributes reads name, lengths and timeout into s, and returns the
// rest; a set with objects or expressions is an error.
func (s *setInfo) readAttributes(m []byte) (setAttributes, error) {
	var a setAttributes
	ad, err := attrs(m)
	if err != nil {
		return a, err
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_NAME:
			s.Name = ad.String()
		case unix.NFTA_SET_FLAGS:
			a.flags = ad.Uint32()
		case unix.NFTA_SET_KEY_TYPE:
			a.keyType = ad.Uint32()
		case unix.NFTA_SET_KEY_LEN:
			s.keyLen = int(ad.Uint32())
		case unix.NFTA_SET_DATA_TYPE:
			a.dataType = ad.Uint32()
		case unix.NFTA_SET_DATA_LEN:
			s.dataLen = int(ad.Uint32())
		case unix.NFTA_SET_TIMEOUT:
			s.Timeout = time.Duration(ad.Uint64()) * time.Millisecond
		case unix.NFTA_SET_USERDATA:
			a.udata = ad.Bytes()
		case unix.NFTA_SET_OBJ_TYPE, nftaSetExpr, nftaSetExpressions:
			return a, fmt.Errorf("set %s: attribute %d", s.Name, ad.Type())
		}
	}
	return a, ad.Err()
}

// setFlags reads the set's kind and the flags nft lists from its flags.
func (s *setInfo) setFlags(flags uint32) error {
	if flags&(setObject|setExpr) != 0 {
		return fmt.Errorf("set %s: flags %#x", s.Name, flags)
	}
	s.anonymous, s.interval, s.dynamic = flags&setAnonymous != 0, flags&setInterval != 0, flags&(setEval|setTimeout) != 0
	s.Map = flags&setMap != 0
	for _, f := range []struct {
		bit  uint32
		name string
	}{{setConstant, "constant"}, {setEval, "dynamic"}, {setInterval, "interval"}, {setTimeout, "timeout"}} {
		if flags&f.bit != 0 {
			s.Flags = append(s.Flags, f.name)
		}
	}
	return nil
}

// readUserdata reads the key's byte order and the comment; userdata
// that nft would list otherwise is an error.
func (s *setInfo) readUserdata(udata []byte) error {
	for len(udata) > 0 {
		if len(udata) < 2 || len(udata) < 2+int(udata[1]) {
			return fmt.Errorf("set %s: malformed userdata", s.Name)
		}
		typ, value := udata[0], udata[2:2+int(udata[1])]
		switch {
		case typ == udataSetKeyByteorder && len(value) == 4:
			s.hostKey = binary.NativeEndian.Uint32(value) == byteorderHost
		case typ == udataSetKeyTypeof, typ == udataSetDataTypeof:
			// nft records a concatenation of types as an expression
			// without data, and lists "type" then; "typeof" only for
			// expressions it can rebuild from their data (of named
			// sets: an anonymous set's type is never listed).
			if !s.anonymous && typeofData(value) {
				return fmt.Errorf("set %s: declared with typeof", s.Name)
			}
		case typ == udataSetDataByteorder, typ == udataSetMergeElements, typ == udataSetDataInterval && allZero(value):
		case typ == udataSetComment:
			s.Comment = string(trimNUL(value))
		default:
			// typeof, set expressions, interval data: nft lists them.
			return fmt.Errorf("set %s: userdata of type %d", s.Name, typ)
		}
		udata = udata[2+len(value):]
	}
	return nil
}

// setTypes reads the key's types and a map's value types, and the type
// nft lists of them.
func (s *setInfo) setTypes(keyType, dataType uint32) error {
	var err error
	if s.keyTypes, err = types(keyType); err != nil {
		return fmt.Errorf("set %s: key: %w", s.Name, err)
	}
	s.Type = typeNames(s.keyTypes)
	if s.Map {
		if dataType == verdictData {
			s.dataTypes = []uint32{typeVerdict}
		} else if s.dataTypes, err = types(dataType); err != nil {
			return fmt.Errorf("set %s: data: %w", s.Name, err)
		}
		s.Type += " : " + typeNames(s.dataTypes)
	}
	return nil
}

// typeofData tells whether a set's typeof userdata holds an expression's
// data (NFTNL_UDATA_SET_TYPEOF_DATA, type 1, not empty).
func typeofData(udata []byte) bool {
	for len(udata) >= 2 && len(udata) >= 2+int(udata[1]) {
		if udata[0] == 1 && udata[1] > 0 {
			return true
		}
		udata = udata[2+int(udata[1]):]
	}
	return len(udata) > 0
}

// rawElement is an element as the kernel keeps it.
type rawElement struct {
	key, data []byte
	verdict   string
	end       bool
	comment   string
}

func (r *reader) elements(set string) ([]rawElement, error) {
	msgs, err := r.request(unix.NFT_MSG_GETSETELEM, true,
		netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: str(r.table)},
		netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: str(set)})
	if err != nil {
		return nil, err
	}
	var elems []rawElement
	for _, m := range msgs {
		ad, err := attrs(m)
		if err != nil {
			return nil, err
		}
		for ad.Next() {
			if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					var e rawElement
					list.Nested(func(ead *netlink.AttributeDecoder) error { return e.decode(ead) })
					elems = append(elems, e)
				}
				return nil
			})
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
	}
	return elems, nil
}

func (e *rawElement) decode(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_KEY:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					if d.Type() == unix.NFTA_DATA_VALUE {
						e.key = d.Bytes()
					}
				}
				return nil
			})
		case unix.NFTA_SET_ELEM_DATA:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					switch d.Type() {
					case unix.NFTA_DATA_VALUE:
						e.data = d.Bytes()
					case unix.NFTA_DATA_VERDICT:
						var err error
						d.Nested(func(v *netlink.AttributeDecoder) error {
							e.verdict, err = decodeVerdict(v)
							return err
						})
					}
				}
				return nil
			})
		case unix.NFTA_SET_ELEM_FLAGS:
			e.end = ad.Uint32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
		case unix.NFTA_SET_ELEM_USERDATA:
			udata := ad.Bytes()
			for len(udata) >= 2 && len(udata) >= 2+int(udata[1]) {
				if udata[0] == 0 { // NFTNL_UDATA_SET_ELEM_COMMENT
					e.comment = string(trimNUL(udata[2 : 2+int(udata[1])]))
				}
				udata = udata[2+int(udata[1]):]
			}
		case unix.NFTA_SET_ELEM_TIMEOUT, unix.NFTA_SET_ELEM_EXPIRATION, unix.NFTA_SET_ELEM_EXPR,
			nftaSetElemExpressions, unix.NFTA_SET_ELEM_OBJREF, nftaSetElemKeyEnd:
			return fmt.Errorf("an element with attribute %d", ad.Type())
		}
	}
	return nil
}

// decodeVerdict reads NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN.
func decodeVerdict(ad *netlink.AttributeDecoder) (string, error) {
	code, chain := int32(0), ""
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code = int32(ad.Uint32())
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		}
	}
	return verdict(code, chain)
}

func verdict(code int32, chain string) (string, error) {
	switch code {
	case nfDrop:
		return "drop", nil
	case nfAccept:
		return "accept", nil
	case unix.NFT_CONTINUE:
		return "continue", nil
	case unix.NFT_RETURN:
		return "return", nil
	case unix.NFT_JUMP:
		return "jump " + chain, nil
	case unix.NFT_GOTO:
		return "goto " + chain, nil
	}
	return "", fmt.Errorf("verdict %d", code)
}

// fill formats the elements: into Elements for a named set, into the
// text a rule prints for an anonymous one.
func (s *setInfo) fill(elems []rawElement) error {
	var items []setItem
	var err error
	if s.interval {
		items, err = s.intervalItems(elems)
	} else {
		items, err = s.plainItems(elems)
	}
	if err != nil {
		return err
	}
	if s.anonymous {
		return s.anonymousText(items)
	}
	if s.interval {
		for _, it := range items {
			s.Elements = append(s.Elements, Element{Key: it.text})
		}
	}
	return nil
}

// setItem is an element as a rule prints it, with its key as the kernel
// holds it, to sort by.
type setItem struct {
	key        []byte
	text, cmnt string
}

// intervalItems are the ranges of an interval set's elements.
func (s *setInfo) intervalItems(elems []rawElement) ([]setItem, error) {
	if s.Map || len(s.keyTypes) != 1 {
		return nil, errors.New("an interval map or concatenation")
	}
	ranges, err := intervals(s.keyTypes[0], s.keyLen, elems)
	if err != nil {
		return nil, err
	}
	items := make([]setItem, 0, len(ranges))
	for _, r := range ranges {
		items = append(items, setItem{key: r.start, text: r.text})
	}
	return items, nil
}

// plainItems are the elements of a set without intervals, "key" or
// "key : value"; each is added to Elements too.
func (s *setInfo) plainItems(elems []rawElement) ([]setItem, error) {
	var items []setItem
	for _, e := range elems {
		if e.end {
			return nil, errors.New("an interval end in a set without intervals")
		}
		key, err := format(s.keyTypes, e.key, s.hostKey)
		if err != nil {
			return nil, err
		}
		it := setItem{key: e.key, text: key, cmnt: e.comment}
		if !s.Map {
			s.Elements = append(s.Elements, Element{Key: key, Comment: e.comment})
			items = append(items, it)
			continue
		}
		value, err := s.mapValue(e)
		if err != nil {
			return nil, err
		}
		it.text += " : " + value
		s.Elements = append(s.Elements, Element{Key: key, Value: value, Comment: e.comment})
		items = append(items, it)
	}
	return items, nil
}

// mapValue is a map element's value: its verdict, or its data formatted.
func (s *setInfo) mapValue(e rawElement) (string, error) {
	if s.dataTypes[0] != typeVerdict {
		return format(s.dataTypes, e.data, false)
	}
	if e.verdict == "" {
		return "", errors.New("a verdict map element without a verdict")
	}
	return e.verdict, nil
}

// anonymousText is the anonymous set as a rule lists it: "{ a, b }",
// sorted by key (integers in host byte order by value).
func (s *setInfo) anonymousText(items []setItem) error {
	slices.SortFunc(items, func(a, b setItem) int {
		if s.hostKey {
			return cmp.Compare(hostValue(a.key), hostValue(b.key))
		}
		return bytes.Compare(a.key, b.key)
	})
	texts := make([]string, len(items))
	for i, it := range items {
		if it.cmnt != "" {
			return errors.New("an anonymous set element with a comment")
		}
		texts[i] = it.text
	}
	s.elements = "{ " + strings.Join(texts, ", ") + " }"
	return nil
}

func hostValue(b []byte) uint64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

type interval struct {
	start []byte
	text  string
}

// intervals turns the elements of an interval set of addresses (each
// range kept as its start and, flagged, the value after its end) into
// nft's prefixes, single addresses and ranges, sorted.
func intervals(t uint32, keyLen int, elems []rawElement) ([]interval, error) {
	if t != typeIPv4 && t != typeIPv6 {
		return nil, fmt.Errorf("intervals of %s", dtypes[t].name)
	}
	// Where one range ends as the next starts, the end comes first.
	slices.SortFunc(elems, func(a, b rawElement) int {
		return cmp.Or(bytes.Compare(a.key, b.key), cmp.Compare(b2i(!a.end), b2i(!b.end)))
	})
	var out []interval
	var start []byte
	add := func(end *big.Int) error {
		lo := new(big.Int).SetBytes(start)
		size := new(big.Int).Sub(end, lo)
		text, err := formatOne(t, start, false)
		if err != nil {
			return err
		}
		bits := keyLen * 8
		tz := size.TrailingZeroBits()
		if size.Sign() > 0 && uint(size.BitLen()-1) == tz && (lo.Sign() == 0 || lo.TrailingZeroBits() >= tz) {
			// A power of two, aligned: a prefix, or one address.
			if p := bits - int(tz); p < bits {
				text += fmt.Sprintf("/%d", p)
			}
		} else {
			last := new(big.Int).Sub(end, big.NewInt(1)).FillBytes(make([]byte, keyLen))
			lastText, err := formatOne(t, last, false)
			if err != nil {
				return err
			}
			text += "-" + lastText
		}
		out = append(out, interval{start: start, text: text})
		start = nil
		return nil
	}
	for _, e := range elems {
		if len(e.key) != keyLen {
			return nil, fmt.Errorf("a key of %d bytes", len(e.key))
		}
		switch {
		case e.end && start != nil:
			if err := add(new(big.Int).SetBytes(e.key)); err != nil {
				return nil, err
			}
		case e.end:
			// The end of nothing: the kernel's marker below the first range.
		case start != nil:
			return nil, errors.New("overlapping intervals")
		default:
			start = e.key
		}
	}
	if start != nil {
		// Open to the top of the address space.
		if err := add(new(big.Int).Lsh(big.NewInt(1), uint(keyLen*8))); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
