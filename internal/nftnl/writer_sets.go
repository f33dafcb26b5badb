// The writer's sets and maps: named ones, and the anonymous ones rules make.

package nftnl

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// typeID is the kernel's id of a type or concatenation of types.
func typeID(ts []uint32) uint32 {
	id := uint32(0)
	for _, t := range ts {
		id = id<<concatBits | t
	}
	return id
}

// valueLen is the bytes a value of the types takes: each field of a
// concatenation padded to 4; an integer takes 4.
func valueLen(ts []uint32) int {
	if len(ts) == 1 {
		return max(dtypes[ts[0]].size, 4*b2i(ts[0] == typeInteger))
	}
	n := 0
	for _, t := range ts {
		n += (dtypes[t].size + 3) &^ 3
	}
	return n
}

// addAnonymous adds an anonymous set of a rule and its elements, as nft
// makes them: constant, with intervals for address ranges.
func (w *Writer) addAnonymous(set *anonSet, chain string) error {
	info := &setInfo{keyTypes: set.keyTypes, keyLen: valueLen(set.keyTypes), hostKey: set.hostKey, interval: set.interval, dataTypes: set.dataTypes}
	info.Map = set.dataTypes != nil
	name := "__set%d"
	flags := uint32(setAnonymous | setConstant)
	if info.Map {
		name, flags = "__map%d", flags|setMap
	}
	if set.interval {
		flags |= setInterval
		if err := disjoint(set.elements, info.keyLen); err != nil {
			return err
		}
	}
	// Elements in messages of at most maxElementList bytes each.
	var lists [][]byte
	n := 0
	for _, e := range set.elements {
		b, count, err := w.element(info, e, true)
		if err != nil {
			return err
		}
		if len(lists) == 0 || len(lists[len(lists)-1])+len(b) > maxElementList {
			lists = append(lists, nil)
		}
		lists[len(lists)-1], n = append(lists[len(lists)-1], b...), n+count
	}
	what := "adding an anonymous set to a rule of chain " + chain
	if err := w.newSet(what, name, set.id, flags, info, func(ae *netlink.AttributeEncoder) {
		ae.Nested(unix.NFTA_SET_DESC, func(nae *netlink.AttributeEncoder) error {
			nae.Uint32(unix.NFTA_SET_DESC_SIZE, uint32(n))
			return nil
		})
		ae.Bytes(unix.NFTA_SET_USERDATA, byteorder(udataSetKeyByteorder, set.hostKey))
	}); err != nil {
		return err
	}
	for _, list := range lists {
		if err := w.add(unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE, what, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, w.table)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
			ae.Uint32(unix.NFTA_SET_ELEM_LIST_SET_ID, set.id)
			ae.Bytes(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_LIST_ELEMENTS, list)
		}); err != nil {
			return err
		}
	}
	return nil
}

// byteorder is a set's userdata entry of a key's or data's byte order.
func byteorder(typ byte, host bool) []byte {
	order := uint32(2) // big endian
	if host {
		order = byteorderHost
	}
	return append([]byte{typ, 4}, native(order)...)
}

// AddSet adds a named set or map, as "add set" or "add map" does.
func (w *Writer) AddSet(s Set) error {
	info, err := parseSetType(s.Type, s.Map, s.Flags)
	if err != nil {
		return fmt.Errorf("set %s: %w", s.Name, err)
	}
	var flags uint32
	for _, f := range s.Flags {
		bit, ok := map[string]uint32{"constant": setConstant, "dynamic": setEval, "interval": setInterval, "timeout": setTimeout}[f]
		if !ok {
			return unsupported("set %s: flag %q", s.Name, f)
		}
		flags |= bit
	}
	if s.Map {
		flags |= setMap
	}
	if len(s.Comment) > 250 || slices.Contains(info.keyTypes, typeInteger) {
		return unsupported("set %s of %s with a comment of %d bytes", s.Name, s.Type, len(s.Comment))
	}
	w.sets[s.Name] = info
	// The kernel wants an id for every new set.
	w.nextID++
	return w.newSet("adding set "+s.Name, s.Name, w.nextID, flags, info, func(ae *netlink.AttributeEncoder) {
		if s.Timeout != 0 {
			ae.Uint64(unix.NFTA_SET_TIMEOUT, uint64(s.Timeout/time.Millisecond))
		}
		udata := byteorder(udataSetKeyByteorder, false)
		if s.Comment != "" {
			udata = append(udata, userdata(udataSetComment, s.Comment)...)
		}
		ae.Bytes(unix.NFTA_SET_USERDATA, udata)
	})
}

// newSet adds a set of the types, flags and id, with the attributes more
// writes.
func (w *Writer) newSet(what, name string, id, flags uint32, info *setInfo, more func(ae *netlink.AttributeEncoder)) error {
	return w.add(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, what, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_TABLE, w.table)
		ae.String(unix.NFTA_SET_NAME, name)
		ae.Uint32(unix.NFTA_SET_FLAGS, flags)
		ae.Uint32(unix.NFTA_SET_KEY_TYPE, typeID(info.keyTypes))
		ae.Uint32(unix.NFTA_SET_KEY_LEN, uint32(info.keyLen))
		if info.Map {
			if info.dataTypes[0] == typeVerdict {
				ae.Uint32(unix.NFTA_SET_DATA_TYPE, verdictData)
			} else {
				ae.Uint32(unix.NFTA_SET_DATA_TYPE, typeID(info.dataTypes))
				ae.Uint32(unix.NFTA_SET_DATA_LEN, uint32(valueLen(info.dataTypes)))
			}
		}
		ae.Uint32(unix.NFTA_SET_ID, id)
		more(ae)
	})
}

// DeleteSet deletes a named set or map.
func (w *Writer) DeleteSet(name string) error {
	delete(w.sets, name)
	return w.add(unix.NFT_MSG_DELSET, 0, "deleting set "+name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_TABLE, w.table)
		ae.String(unix.NFTA_SET_NAME, name)
	})
}

// AddCounter adds a named counter, as "add counter" does: at zero when
// new, kept as it is when there.
func (w *Writer) AddCounter(name string) error {
	return w.add(unix.NFT_MSG_NEWOBJ, unix.NLM_F_CREATE, "adding counter "+name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_OBJ_TABLE, w.table)
		ae.String(unix.NFTA_OBJ_NAME, name)
		ae.Uint32(unix.NFTA_OBJ_TYPE, objectCounter)
		ae.Nested(unix.NFTA_OBJ_DATA, func(nae *netlink.AttributeEncoder) error {
			nae.Uint64(unix.NFTA_COUNTER_BYTES, 0)
			nae.Uint64(unix.NFTA_COUNTER_PACKETS, 0)
			return nil
		})
	})
}

// DeleteCounter deletes a named counter.
func (w *Writer) DeleteCounter(name string) error {
	return w.add(unix.NFT_MSG_DELOBJ, 0, "deleting counter "+name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_OBJ_TABLE, w.table)
		ae.String(unix.NFTA_OBJ_NAME, name)
		ae.Uint32(unix.NFTA_OBJ_TYPE, objectCounter)
	})
}

// parseSetType reads a set's type as nft lists it.
func parseSetType(typ string, isMap bool, flags []string) (*setInfo, error) {
	key, data, hasData := strings.Cut(typ, " : ")
	if hasData != isMap {
		return nil, unsupported("type %q of a set or map", typ)
	}
	info := &setInfo{interval: slices.Contains(flags, "interval")}
	info.Map = isMap
	byName := func(list string) ([]uint32, error) {
		var ts []uint32
		for _, name := range strings.Split(list, " . ") {
			found := false
			for id, t := range dtypes {
				if t.name == name && id != typeVerdict {
					ts, found = append(ts, id), true
				}
			}
			if !found {
				return nil, unsupported("type %q", name)
			}
		}
		return ts, nil
	}
	var err error
	if info.keyTypes, err = byName(key); err != nil {
		return nil, err
	}
	info.keyLen = valueLen(info.keyTypes)
	if data == "verdict" {
		info.dataTypes = []uint32{typeVerdict}
	} else if isMap {
		if info.dataTypes, err = byName(data); err != nil {
			return nil, err
		}
	}
	return info, nil
}

// set is what the writer knows of a named set.
func (w *Writer) set(name string) (*setInfo, error) {
	if info, ok := w.sets[name]; ok {
		return info, nil
	}
	typ, flags, ok := w.setType(name)
	if !ok {
		return nil, unsupported("no set %s known", name)
	}
	info, err := parseSetType(typ, strings.Contains(typ, " : "), flags)
	if err != nil {
		return nil, fmt.Errorf("set %s: %w", name, err)
	}
	w.sets[name] = info
	return info, nil
}
