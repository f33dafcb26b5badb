// The encoding of constants, as nft lists them, into the bytes the kernel
// compares, loads and keeps in sets.

package nftnl

import (
	"encoding/binary"
	"math/big"
	"net/netip"
	"strconv"
	"strings"
)

func native(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func parseUint32(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, unsupported("number %q", s)
	}
	return uint32(v), nil
}

// parsePrefix reads an address or a prefix of the size.
func parsePrefix(text string, size int) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(text)
	if err != nil {
		a, aerr := netip.ParseAddr(text)
		if aerr != nil {
			return netip.Prefix{}, unsupported("address %q", text)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().BitLen() != size*8 || p.Addr().Zone() != "" || p.Masked() != p || p.Bits() == 0 {
		return netip.Prefix{}, unsupported("address %q", text)
	}
	return p, nil
}

// encodeOne writes one value of a type, as formatOne prints it; an
// integer takes size bytes, in host byte order if host is set.
func encodeOne(t uint32, text string, size int, host bool) ([]byte, error) {
	switch t {
	case typeIPv4, typeIPv6:
		a, err := netip.ParseAddr(text)
		if err != nil || a.Zone() != "" || a.BitLen() != dtypes[t].size*8 {
			return nil, unsupported("%s %q", dtypes[t].name, text)
		}
		return a.AsSlice(), nil
	case typeInetProto:
		for n, name := range protocols {
			if name == text {
				return []byte{n}, nil
			}
		}
		return nil, unsupported("protocol %q", text)
	case typeInetService:
		v, err := strconv.ParseUint(text, 10, 16)
		if err != nil {
			return nil, unsupported("port %q", text)
		}
		return binary.BigEndian.AppendUint16(nil, uint16(v)), nil
	case typeMark:
		v, err := parseUint32(text)
		return native(v), err
	case typeIfname:
		name, err := unquote(text)
		if err != nil || len(name) >= 16 || strings.Contains(name, "*") {
			return nil, unsupported("interface name %q", text)
		}
		b := make([]byte, 16)
		copy(b, name)
		return b, nil
	case typeInteger:
		v, ok := new(big.Int).SetString(text, 10)
		if !ok || v.Sign() < 0 || v.BitLen() > size*8 {
			return nil, unsupported("integer %q", text)
		}
		b := v.FillBytes(make([]byte, size))
		if host {
			for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
				b[i], b[j] = b[j], b[i] // little-endian hosts only, as formatOne
			}
		}
		return b, nil
	}
	return nil, unsupported("a value of type %d", t)
}

// encodeValue writes a value of the types (several: a concatenation,
// each field padded to 4 bytes), as format prints it.
func encodeValue(ts []uint32, text string, size int, host bool) ([]byte, error) {
	if len(ts) == 1 {
		return encodeOne(ts[0], text, size, host)
	}
	parts := strings.Split(text, " . ")
	if len(parts) != len(ts) {
		return nil, unsupported("%q is not a %s", text, typeNames(ts))
	}
	var b []byte
	for i, t := range ts {
		v, err := encodeOne(t, parts[i], dtypes[t].size, host)
		if err != nil {
			return nil, err
		}
		b = append(b, v...)
		b = append(b, make([]byte, (4-len(v)%4)%4)...)
	}
	return b, nil
}
