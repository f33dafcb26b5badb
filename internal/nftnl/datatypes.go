// The data types of set keys and values that kube-proxy's tables use, and
// their printing as nft lists them (encode_values.go is the inverse).

package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// dtype is one of nft's data types (include/datatype.h) that kube-proxy's
// tables use, and how nft prints a value of it.
type dtype struct {
	name string
	// size in bytes; 0 for integer, whose size the set's key gives.
	size int
}

// The data type ids, as the kernel keeps them for a set's key and data.
const (
	typeVerdict     = 1
	typeInteger     = 4
	typeIPv4        = 7
	typeIPv6        = 8
	typeInetProto   = 12
	typeInetService = 13
	typeMark        = 19
	typeIfname      = 41
	// verdictData is the data type of a verdict map in the kernel.
	verdictData = 0xffffff00
	// concatBits is the width of each type id in a concatenation's.
	concatBits = 6
)

var dtypes = map[uint32]dtype{
	typeVerdict:     {"verdict", 0},
	typeInteger:     {"integer", 0},
	typeIPv4:        {"ipv4_addr", 4},
	typeIPv6:        {"ipv6_addr", 16},
	typeInetProto:   {"inet_proto", 1},
	typeInetService: {"inet_service", 2},
	typeMark:        {"mark", 4},
	typeIfname:      {"ifname", 16},
}

// protocols are the names nft prints for inet_proto values (from
// /etc/protocols); kube-proxy uses these three.
var protocols = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

// types splits a set's key or data type into the types it concatenates.
func types(id uint32) ([]uint32, error) {
	var ts []uint32
	for ; id != 0; id >>= concatBits {
		t := id & (1<<concatBits - 1)
		if _, ok := dtypes[t]; !ok {
			return nil, fmt.Errorf("data type %d", t)
		}
		ts = append([]uint32{t}, ts...)
	}
	if len(ts) == 0 {
		return nil, errors.New("no data type")
	}
	return ts, nil
}

func typeNames(ts []uint32) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = dtypes[t].name
	}
	return strings.Join(names, " . ")
}

// format prints a value of the types (several: a concatenation, each
// field padded to 4 bytes), as nft does; host tells that an integer is
// in host byte order.
func format(ts []uint32, b []byte, host bool) (string, error) {
	if len(ts) == 1 {
		return formatOne(ts[0], b, host)
	}
	fields := make([]string, len(ts))
	for i, t := range ts {
		size := dtypes[t].size
		if size == 0 || len(b) < size {
			return "", fmt.Errorf("cannot split %x as %s", b, typeNames(ts))
		}
		f, err := formatOne(t, b[:size], host)
		if err != nil {
			return "", err
		}
		fields[i] = f
		b = b[min(len(b), (size+3)&^3):]
	}
	return strings.Join(fields, " . "), nil
}

func formatOne(t uint32, b []byte, host bool) (string, error) {
	if size := dtypes[t].size; size != 0 && len(b) != size {
		return "", fmt.Errorf("%s of %d bytes", dtypes[t].name, len(b))
	}
	switch t {
	case typeIPv4:
		return netip.AddrFrom4([4]byte(b)).String(), nil
	case typeIPv6:
		return netip.AddrFrom16([16]byte(b)).String(), nil
	case typeInetProto:
		if name, ok := protocols[b[0]]; ok {
			return name, nil
		}
		return "", fmt.Errorf("protocol %d", b[0])
	case typeInetService:
		return fmt.Sprint(binary.BigEndian.Uint16(b)), nil
	case typeMark:
		return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b)), nil
	case typeIfname:
		return `"` + string(trimNUL(b)) + `"`, nil
	case typeInteger:
		if host {
			b = slices.Clone(b)
			slices.Reverse(b) // little-endian hosts only (amd64, arm64)
		}
		return new(big.Int).SetBytes(b).String(), nil
	}
	return "", fmt.Errorf("cannot print a %s", dtypes[t].name)
}
