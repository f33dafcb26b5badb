package nftnl

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// batchKernel answers a reader's requests with what a Writer's batch makes
// of an empty table, as the kernel's dumps present it: the encoder's
// messages decoded by the reader without root or a kernel.
//
// The reader decodes the kernel's dump messages (NEWTABLE, NEWCHAIN,
// NEWRULE, NEWSET, NEWSETELEM answers), not the batch's, and the two
// differ where the kernel fills in what it assigns. batchKernel does what
// the kernel does there and nothing more:
//   - an anonymous set's name is a format ("__set%d", "__map%d") the
//     kernel fills with the lowest number free for it, and the batch's
//     lookups and element lists name such a set by its NFTA_SET_ID: the
//     dump names it, and has no ids;
//   - chains and rules get handles, and a base chain its policy (accept);
//   - a set's elements come back in an order of the kernel's own (a
//     hash's, or an rbtree's, descending): here the reverse of the order
//     written, so that nothing may depend on it; and in as many messages
//     as they fill.
//
// Of the kernel's checks it makes the one a reader would not notice: an
// element's key and value are as long as its set's (the kernel refuses
// the batch otherwise). Anything else in the batch (a deletion, a flush)
// is an error: a round trip only adds.
type batchKernel struct {
	family byte
	table  []netlink.Attribute
	chains [][]netlink.Attribute
	// rules are each chain's NEWRULE attributes, in order.
	rules map[string][][]netlink.Attribute
	sets  [][]netlink.Attribute
	// objects are the named objects (counters).
	objects [][]netlink.Attribute
	// elements are each set's NFTA_LIST_ELEM entries, in the order written.
	elements map[string][]netlink.Attribute
	// setIDs names the batch's sets by their NFTA_SET_ID.
	setIDs map[uint32]string
	// lengths are each set's key and data lengths (0: none, a verdict).
	lengths map[string][2]int
	// nextAnonymous is the number the kernel gives the next anonymous set
	// of each name format.
	nextAnonymous map[string]int
	handle        uint64
}

// newBatchKernel applies the writer's batch to an empty kernel.
func newBatchKernel(w *Writer) (*batchKernel, error) {
	if err := w.flushElements(); err != nil {
		return nil, err
	}
	k := &batchKernel{family: w.family, rules: map[string][][]netlink.Attribute{}, elements: map[string][]netlink.Attribute{},
		setIDs: map[uint32]string{}, lengths: map[string][2]int{}, nextAnonymous: map[string]int{}}
	msgs, err := syscall.ParseNetlinkMessage(w.batch.Messages())
	if err != nil {
		return nil, err
	}
	for i, m := range msgs {
		if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 || m.Data[0] != w.family {
			return nil, fmt.Errorf("message %d: type %#x, family %d", i, m.Header.Type, m.Data[0])
		}
		attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		if err := k.apply(m.Header.Type&0xff, attrs); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
	}
	return k, nil
}

// attrType is an attribute's type without the nested and byte order flags.
func attrType(a netlink.Attribute) uint16 {
	return a.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
}

func find(attrs []netlink.Attribute, typ uint16) ([]byte, bool) {
	for _, a := range attrs {
		if attrType(a) == typ {
			return a.Data, true
		}
	}
	return nil, false
}

func findString(attrs []netlink.Attribute, typ uint16) string {
	b, _ := find(attrs, typ)
	return string(trimNUL(b))
}

// without drops the attributes of a type, and the kernel's values come in
// their place by with.
func without(attrs []netlink.Attribute, typ uint16) []netlink.Attribute {
	return slices.DeleteFunc(slices.Clone(attrs), func(a netlink.Attribute) bool { return attrType(a) == typ })
}

func with(attrs []netlink.Attribute, typ uint16, data []byte) []netlink.Attribute {
	return append(without(attrs, attrType(netlink.Attribute{Type: typ})), netlink.Attribute{Type: typ, Data: data})
}

// marshalAttributes encodes attributes, some read and changed: each
// length is that of its data now.
func marshalAttributes(attrs []netlink.Attribute) ([]byte, error) {
	attrs = slices.Clone(attrs)
	for i := range attrs {
		attrs[i].Length = 0
	}
	return netlink.MarshalAttributes(attrs)
}

func (k *batchKernel) nextHandle() []byte {
	k.handle++
	return binary.BigEndian.AppendUint64(nil, k.handle)
}

func (k *batchKernel) apply(msgType uint16, attrs []netlink.Attribute) error {
	switch msgType {
	case unix.NFT_MSG_NEWTABLE:
		k.table = attrs
	case unix.NFT_MSG_NEWOBJ:
		k.objects = append(k.objects, attrs)
	case unix.NFT_MSG_NEWCHAIN:
		attrs = with(attrs, unix.NFTA_CHAIN_HANDLE, k.nextHandle())
		if _, base := find(attrs, unix.NFTA_CHAIN_HOOK); base {
			attrs = with(attrs, unix.NFTA_CHAIN_POLICY, binary.BigEndian.AppendUint32(nil, nfAccept))
		}
		k.chains = append(k.chains, attrs)
	case unix.NFT_MSG_NEWSET:
		name := findString(attrs, unix.NFTA_SET_NAME)
		if strings.Contains(name, "%d") {
			n := k.nextAnonymous[name]
			k.nextAnonymous[name]++
			name = fmt.Sprintf(name, n)
		}
		id, ok := find(attrs, unix.NFTA_SET_ID)
		if !ok || len(id) != 4 {
			return fmt.Errorf("set %s without an id", name)
		}
		k.setIDs[binary.BigEndian.Uint32(id)] = name
		var lengths [2]int
		for i, typ := range []uint16{unix.NFTA_SET_KEY_LEN, unix.NFTA_SET_DATA_LEN} {
			if b, ok := find(attrs, typ); ok && len(b) == 4 {
				lengths[i] = int(binary.BigEndian.Uint32(b))
			}
		}
		k.lengths[name] = lengths
		k.sets = append(k.sets, with(without(attrs, unix.NFTA_SET_ID), unix.NFTA_SET_NAME, str(name)))
	case unix.NFT_MSG_NEWSETELEM:
		name, err := k.setName(attrs, unix.NFTA_SET_ELEM_LIST_SET, unix.NFTA_SET_ELEM_LIST_SET_ID)
		if err != nil {
			return err
		}
		list, _ := find(attrs, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		entries, err := netlink.UnmarshalAttributes(list)
		if err != nil {
			return err
		}
		for _, entry := range entries {
			if err := k.checkLengths(name, entry); err != nil {
				return err
			}
		}
		k.elements[name] = append(k.elements[name], entries...)
	case unix.NFT_MSG_NEWRULE:
		exprs, ok := find(attrs, unix.NFTA_RULE_EXPRESSIONS)
		if !ok {
			return fmt.Errorf("a rule without expressions")
		}
		dumped, err := k.dumpExpressions(exprs)
		if err != nil {
			return err
		}
		attrs = with(attrs, unix.NLA_F_NESTED|unix.NFTA_RULE_EXPRESSIONS, dumped)
		attrs = with(attrs, unix.NFTA_RULE_HANDLE, k.nextHandle())
		chain := findString(attrs, unix.NFTA_RULE_CHAIN)
		k.rules[chain] = append(k.rules[chain], attrs)
	default:
		return fmt.Errorf("message type %d in a round trip", msgType)
	}
	return nil
}

// checkLengths refuses an element whose key or value is not as long as
// its set's, as the kernel does (EINVAL).
func (k *batchKernel) checkLengths(set string, entry netlink.Attribute) error {
	lengths, ok := k.lengths[set]
	if !ok {
		return fmt.Errorf("an element of set %s, not in the table", set)
	}
	fields, err := netlink.UnmarshalAttributes(entry.Data)
	if err != nil {
		return err
	}
	for i, typ := range []uint16{unix.NFTA_SET_ELEM_KEY, unix.NFTA_SET_ELEM_DATA} {
		nested, ok := find(fields, typ)
		if !ok {
			continue
		}
		data, err := netlink.UnmarshalAttributes(nested)
		if err != nil {
			return err
		}
		if value, ok := find(data, unix.NFTA_DATA_VALUE); ok && len(value) != lengths[i] {
			return fmt.Errorf("set %s: an element's %s of %d bytes, not %d", set, []string{"key", "value"}[i], len(value), lengths[i])
		}
	}
	return nil
}

// setName is the name a message refers to a set by: the kernel's name of
// an anonymous set, which the batch gives by its id.
func (k *batchKernel) setName(attrs []netlink.Attribute, nameType, idType uint16) (string, error) {
	name := findString(attrs, nameType)
	if !strings.Contains(name, "%d") {
		return name, nil
	}
	id, ok := find(attrs, idType)
	if !ok || len(id) != 4 || k.setIDs[binary.BigEndian.Uint32(id)] == "" {
		return "", fmt.Errorf("set %s by an unknown id %x", name, id)
	}
	return k.setIDs[binary.BigEndian.Uint32(id)], nil
}

// dumpExpressions is a rule's expression list as the kernel dumps it: a
// lookup or dynset names its set, and has no set id.
func (k *batchKernel) dumpExpressions(list []byte) ([]byte, error) {
	elems, err := netlink.UnmarshalAttributes(list)
	if err != nil {
		return nil, err
	}
	refs := map[string][2]uint16{"lookup": {unix.NFTA_LOOKUP_SET, unix.NFTA_LOOKUP_SET_ID}, "dynset": {unix.NFTA_DYNSET_SET_NAME, unix.NFTA_DYNSET_SET_ID}}
	for i, el := range elems {
		fields, err := netlink.UnmarshalAttributes(el.Data)
		if err != nil {
			return nil, err
		}
		ref, ok := refs[findString(fields, unix.NFTA_EXPR_NAME)]
		if !ok {
			continue
		}
		data, _ := find(fields, unix.NFTA_EXPR_DATA)
		args, err := netlink.UnmarshalAttributes(data)
		if err != nil {
			return nil, err
		}
		name, err := k.setName(args, ref[0], ref[1])
		if err != nil {
			return nil, err
		}
		if data, err = marshalAttributes(with(without(args, ref[1]), ref[0], str(name))); err != nil {
			return nil, err
		}
		if elems[i].Data, err = marshalAttributes(with(fields, unix.NLA_F_NESTED|unix.NFTA_EXPR_DATA, data)); err != nil {
			return nil, err
		}
	}
	return marshalAttributes(elems)
}

// Request answers as the kernel would: a dump of the table's chains, of a
// chain's rules, of the table's sets (anonymous ones too), of a set's
// elements; or the table, a chain or a set by name.
func (k *batchKernel) Request(msgType uint16, family byte, dump bool, data []byte) ([][]byte, error) {
	req, err := netlink.UnmarshalAttributes(data)
	if err != nil || family != k.family {
		return nil, fmt.Errorf("request %d of family %d: %v", msgType, family, err)
	}
	// named are the objects of the name the request gives.
	named := func(objects [][]netlink.Attribute, nameType uint16) [][]netlink.Attribute {
		return slices.DeleteFunc(slices.Clone(objects), func(a []netlink.Attribute) bool {
			return findString(a, nameType) != findString(req, nameType)
		})
	}
	var answers [][]netlink.Attribute
	switch {
	case msgType == unix.NFT_MSG_GETTABLE && !dump:
		answers = named([][]netlink.Attribute{k.table}, unix.NFTA_TABLE_NAME)
	case msgType == unix.NFT_MSG_GETCHAIN && dump:
		answers = k.chains
	case msgType == unix.NFT_MSG_GETCHAIN:
		answers = named(k.chains, unix.NFTA_CHAIN_NAME)
	case msgType == unix.NFT_MSG_GETRULE && dump:
		answers = k.rules[findString(req, unix.NFTA_RULE_CHAIN)]
	case msgType == unix.NFT_MSG_GETSET && dump:
		answers = k.sets
	case msgType == unix.NFT_MSG_GETOBJ && dump:
		answers = k.objects
	case msgType == unix.NFT_MSG_GETSET:
		answers = named(k.sets, unix.NFTA_SET_NAME)
	case msgType == unix.NFT_MSG_GETSETELEM && dump:
		// The kernel answers in messages of what fits its dump's buffer.
		set := findString(req, unix.NFTA_SET_ELEM_LIST_SET)
		entries := slices.Clone(k.elements[set])
		slices.Reverse(entries)
		for len(entries) > 0 {
			var list []byte
			for len(entries) > 0 && len(list) < 16<<10 {
				b, err := marshalAttributes(entries[:1])
				if err != nil {
					return nil, err
				}
				list, entries = append(list, b...), entries[1:]
			}
			answers = append(answers, []netlink.Attribute{
				{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: str(findString(k.table, unix.NFTA_TABLE_NAME))},
				{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: str(set)},
				{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: list},
			})
		}
	default:
		return nil, fmt.Errorf("request %d (dump %v)", msgType, dump)
	}
	if !dump && len(answers) == 0 {
		return nil, unix.ENOENT
	}
	var out [][]byte
	for _, attrs := range answers {
		b, err := marshalAttributes(attrs)
		if err != nil {
			return nil, err
		}
		out = append(out, append([]byte{k.family, unix.NFNETLINK_V0, 0, 0}, b...))
	}
	return out, nil
}
