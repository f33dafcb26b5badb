// Why hand-written: vishvananda/netlink's IpsetList (v1.3.1) reads these
// sets right (every type and family this mode uses, as `ipset save` prints
// them), but measured against this decoder it is worse in time, bytes and
// allocations alike. Reading one set of 10,000 entries and printing it as
// `ipset save` does (medians of 3; IpsetList "locked" on a thread in the
// namespace, as the drift check reads, "handle" on a netlink.Handle made
// in it, on any thread):
//
//	type             this decoder            IpsetList locked         IpsetList handle
//	hash:ip          10.6 ms  2.6 MB 30149   1562 ms 13.3 MB 50125    62 ms 13.3 MB 50112
//	hash:ip,port     23.1 ms  4.2 MB 40219   1440 ms 13.6 MB 70171   111 ms 13.6 MB 70158
//	hash:ip,port,ip  38.8 ms  5.1 MB 50282   2939 ms 15.7 MB 90207   106 ms 15.7 MB 90195
//	hash:ip,port,net 17.0 ms  7.8 MB 60324   3360 ms 15.6 MB 90241   161 ms 15.6 MB 90222
//	bitmap:port      10.6 ms  2.3 MB 20135    878 ms 11.4 MB 40096    78 ms 11.4 MB 40083
//
// (time, bytes and allocations per read; as root:
// go test -run '^$' -bench SetEntries10k -benchmem -count 3 -benchtime 10x ./internal/ipvs).
// Both send the same request; the difference is decoding: IpsetList
// walks each attribute list on a goroutine sending on a channel
// (nl.ParseAttributes), so every entry costs goroutine switches (on a
// locked thread, a handoff between threads), and keeps every entry as
// net.IP slices and pointers before they are printed; and it logs, through
// the standard logger, each header attribute it does not know, on every
// list of a hash set on this kernel (IPSET_ATTR_BUCKETSIZE and _INITVAL).

package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// SetEntries reads the named sets' entries over netlink (one IPSET_CMD_LIST
// dump per set, what `ipset list NAME` asks the kernel: no process), as
// `ipset save` prints them, sorted; a named set that does not exist has
// no key. A set whose type or entries the decoder does not know (an
// extension such as timeouts or comments, a protocol other than TCP, UDP
// and SCTP) sends the whole read to `ipset save`, logged once at -v=2.
func (ipsets) SetEntries(names []string) (map[string][]string, error) {
	entries, err := listedEntries(names)
	if errors.Is(err, errUndecoded) {
		fallbackOnce.Do(func() {
			klog.V(2).InfoS("Reading the ipsets' entries with ipset save", "reason", err)
		})
		return savedEntries(names)
	}
	return entries, err
}

var fallbackOnce sync.Once

// errUndecoded marks what the netlink decoder does not know.
var errUndecoded = errors.New("not decoded")

// listedEntries lists the named sets over netlink in the network namespace
// of the calling thread.
func listedEntries(names []string) (map[string][]string, error) {
	all := make(map[string][]string, len(names))
	for _, name := range names {
		if err := checkWord("set name", name); err != nil {
			return nil, err
		}
		msgs, err := listSets(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
		if errors.Is(err, unix.ENOENT) {
			continue // no such set
		}
		if err != nil {
			return nil, fmt.Errorf("listing ipset %s: %w", name, err)
		}
		list := []string{}
		var typ SetType
		var family uint8
		for _, msg := range msgs {
			if list, err = appendSetEntries(list, msg, &typ, &family); err != nil {
				return nil, fmt.Errorf("listing ipset %s: %w", name, err)
			}
		}
		slices.Sort(list)
		all[name] = list
	}
	return all, nil
}

// appendSetEntries decodes one message of a set's listing: its header
// (type and family, in the first message only) and a part of its entries,
// each nested in IPSET_ATTR_ADT as an IPSET_ATTR_DATA.
func appendSetEntries(list []string, msg []byte, typ *SetType, family *uint8) ([]string, error) {
	if len(msg) < nl.SizeofNfgenmsg {
		return nil, fmt.Errorf("a message of %d bytes", len(msg))
	}
	attrs, err := nl.ParseRouteAttr(msg[nl.SizeofNfgenmsg:])
	if err != nil {
		return nil, err
	}
	for _, a := range attrs {
		switch a.Attr.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER) {
		case nl.IPSET_ATTR_TYPENAME:
			*typ = SetType(strings.TrimRight(string(a.Value), "\x00"))
		case nl.IPSET_ATTR_FAMILY:
			if len(a.Value) == 1 {
				*family = a.Value[0]
			}
		case nl.IPSET_ATTR_ADT:
			if _, known := entryAttrs[*typ]; !known {
				return nil, fmt.Errorf("set type %q: %w", *typ, errUndecoded)
			}
			data, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return nil, err
			}
			for _, d := range data {
				e, err := decodeEntry(*typ, *family == unix.NFPROTO_IPV6, d.Value)
				if err != nil {
					return nil, err
				}
				list = append(list, e)
			}
		}
	}
	return list, nil
}

// entryAttrs are the attributes the kernel lists for an entry of each set
// type kube-proxy uses, without extensions (timeouts, counters, comments,
// flags such as nomatch): an entry with any other is not decoded.
var entryAttrs = map[SetType][]uint16{
	HashIP:        {nl.IPSET_ATTR_IP},
	HashIPPort:    {nl.IPSET_ATTR_IP, nl.IPSET_ATTR_PORT, nl.IPSET_ATTR_PROTO},
	HashIPPortIP:  {nl.IPSET_ATTR_IP, nl.IPSET_ATTR_PORT, nl.IPSET_ATTR_PROTO, nl.IPSET_ATTR_IP2},
	HashIPPortNet: {nl.IPSET_ATTR_IP, nl.IPSET_ATTR_PORT, nl.IPSET_ATTR_PROTO, nl.IPSET_ATTR_IP2, nl.IPSET_ATTR_CIDR2},
	BitmapPort:    {nl.IPSET_ATTR_PORT},
}

// protocolNames are the names `ipset save` prints for the protocols of
// kube-proxy's entries (/etc/protocols').
var protocolNames = map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

// entryFields are one entry's attributes.
type entryFields struct {
	ip, ip2 netip.Addr
	port    uint16
	proto   uint8
	cidr2   int
}

// decodeEntry turns one entry's attributes into the text `ipset save`
// prints for it (canonicalEntry's form).
func decodeEntry(typ SetType, ipv6 bool, data []byte) (string, error) {
	attrs, err := nl.ParseRouteAttr(data)
	if err != nil {
		return "", err
	}
	want := entryAttrs[typ]
	var f entryFields
	seen := 0
	for _, a := range attrs {
		t := a.Attr.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if !slices.Contains(want, t) {
			return "", fmt.Errorf("%s entry attribute %d: %w", typ, t, errUndecoded)
		}
		seen++
		switch t {
		case nl.IPSET_ATTR_IP, nl.IPSET_ATTR_IP2:
			ip, err := decodeAddr(a.Value, ipv6)
			if err != nil {
				return "", fmt.Errorf("%s entry: %w", typ, err)
			}
			if t == nl.IPSET_ATTR_IP {
				f.ip = ip
			} else {
				f.ip2 = ip
			}
		case nl.IPSET_ATTR_PORT:
			if len(a.Value) != 2 {
				return "", fmt.Errorf("%s entry: a port of %d bytes", typ, len(a.Value))
			}
			f.port = binary.BigEndian.Uint16(a.Value)
		case nl.IPSET_ATTR_PROTO:
			if len(a.Value) != 1 {
				return "", fmt.Errorf("%s entry: a protocol of %d bytes", typ, len(a.Value))
			}
			f.proto = a.Value[0]
		case nl.IPSET_ATTR_CIDR2:
			if len(a.Value) != 1 {
				return "", fmt.Errorf("%s entry: a prefix length of %d bytes", typ, len(a.Value))
			}
			f.cidr2 = int(a.Value[0])
		}
	}
	if seen != len(want) {
		return "", fmt.Errorf("%s entry with %d of its %d attributes", typ, seen, len(want))
	}
	return f.text(typ)
}

// text prints the entry as `ipset save` does: a net's prefix length only
// when shorter than the address.
func (f entryFields) text(typ SetType) (string, error) {
	if typ == BitmapPort {
		return strconv.Itoa(int(f.port)), nil
	}
	b := f.ip.AppendTo(make([]byte, 0, 64))
	if typ == HashIP {
		return string(b), nil
	}
	proto, ok := protocolNames[f.proto]
	if !ok {
		return "", fmt.Errorf("%s entry with protocol %d: %w", typ, f.proto, errUndecoded)
	}
	b = append(append(append(b, ','), proto...), ':')
	b = strconv.AppendUint(b, uint64(f.port), 10)
	if typ == HashIPPort {
		return string(b), nil
	}
	b = f.ip2.AppendTo(append(b, ','))
	if typ == HashIPPortNet && f.cidr2 != f.ip2.BitLen() {
		if f.cidr2 < 1 || f.cidr2 > f.ip2.BitLen() {
			return "", fmt.Errorf("%s entry with prefix length %d", typ, f.cidr2)
		}
		b = strconv.AppendInt(append(b, '/'), int64(f.cidr2), 10)
	}
	return string(b), nil
}

// decodeAddr reads a nested IPSET_ATTR_IPADDR_IPV4 or _IPV6 of the set's
// family.
func decodeAddr(nested []byte, ipv6 bool) (netip.Addr, error) {
	attrs, err := nl.ParseRouteAttr(nested)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(attrs) != 1 {
		return netip.Addr{}, fmt.Errorf("an address of %d attributes", len(attrs))
	}
	a := attrs[0]
	switch t := a.Attr.Type &^ unix.NLA_F_NET_BYTEORDER; {
	case t == nl.IPSET_ATTR_IPADDR_IPV4 && !ipv6 && len(a.Value) == 4:
		return netip.AddrFrom4([4]byte(a.Value)), nil
	case t == nl.IPSET_ATTR_IPADDR_IPV6 && ipv6 && len(a.Value) == 16:
		return netip.AddrFrom16([16]byte(a.Value)), nil
	}
	return netip.Addr{}, fmt.Errorf("an address attribute %d of %d bytes in a set of IPv6 %t", a.Attr.Type, len(a.Value), ipv6)
}
