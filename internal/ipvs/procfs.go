package ipvs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"

	v1 "k8s.io/api/core/v1"
)

// procIPVS is where the kernel lists every virtual server of a network
// namespace with its destinations. Netlink has no such dump: it lists
// destinations one virtual server per request, which at 10k services made
// a restart's read take seconds.
const procIPVS = "/proc/thread-self/net/ip_vs"

// openProcIPVS opens the listing of the calling thread's namespace; the
// open file keeps reading that namespace, as the netlink sockets do.
func openProcIPVS() (*os.File, error) {
	f, err := os.Open(procIPVS)
	if err != nil {
		return nil, fmt.Errorf("opening the IPVS listing: %w", err)
	}
	return f, nil
}

func (t *table) EachVirtualServer(each func(key VirtualServerKey, reals []RealServer) error) error {
	t.procMu.Lock()
	defer t.procMu.Unlock()
	// A seq file lists afresh when read again from the start.
	if _, err := t.proc.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("reading %s: %w", procIPVS, err)
	}
	// The kernel hands out at most a page per read, whatever the buffer.
	return parseProcIPVS(t.proc, t.ipv6, each)
}

// procProtocols are the protocol names the listing uses for those
// kube-proxy programs.
var procProtocols = map[string]v1.Protocol{"TCP": v1.ProtocolTCP, "UDP": v1.ProtocolUDP, "SCTP": v1.ProtocolSCTP}

// parseProcIPVS reads the kernel's listing: a virtual server per line
// ("TCP  0A600001:0050 rr", IPv6 as "[fd00:0000:...:0001]:0050"), each
// followed by its destinations ("  -> 0AF40005:1F90 Masq 1 0 0":
// address, forwarding, weight, active and inactive connections). Virtual
// servers of the other family, firewall-mark ones and other protocols
// are left out. Each virtual server goes to each once its destinations
// are read; a read or parse error is wrapped, each's is returned as is.
// It reads the lines in place, without a string or slice per line: at
// 10,000 services under emulation the parse cost as much as the kernel's
// printing of the listing.
func parseProcIPVS(r io.Reader, ipv6 bool, each func(key VirtualServerKey, reals []RealServer) error) error {
	sc := bufio.NewScanner(r)
	var current VirtualServerKey
	listing := false // whether current's real servers are being read
	var reals []RealServer
	done := func() error {
		if !listing {
			return nil
		}
		listing = false
		return each(current, reals)
	}
	var fields [8][]byte
	for line := 0; sc.Scan(); line++ {
		f := splitFields(sc.Bytes(), fields[:0])
		if line < 3 || len(f) < 2 { // the three header lines
			continue
		}
		if string(f[0]) != "->" {
			if err := done(); err != nil {
				return err
			}
			proto, ok := procProtocols[string(f[0])]
			if !ok {
				continue
			}
			addr, err := parseProcAddrPort(f[1])
			if err != nil {
				return fmt.Errorf("reading %s: line %d: %w", procIPVS, line+1, err)
			}
			if addr.Addr().Is6() != ipv6 {
				continue
			}
			current, listing = VirtualServerKey{Addr: addr.Addr(), Port: addr.Port(), Protocol: proto}, true
			reals = reals[:0]
			continue
		}
		if !listing {
			continue
		}
		if len(f) != 6 {
			return fmt.Errorf("reading %s: line %d: %q is not a destination", procIPVS, line+1, sc.Text())
		}
		addr, err := parseProcAddrPort(f[1])
		if err != nil {
			return fmt.Errorf("reading %s: line %d: %w", procIPVS, line+1, err)
		}
		var counts [3]int
		for i, c := range f[3:] {
			if counts[i], err = atoi(c); err != nil {
				return fmt.Errorf("reading %s: line %d: %q is not a destination", procIPVS, line+1, sc.Text())
			}
		}
		reals = append(reals, RealServer{
			Addr: addr.Addr(), Port: addr.Port(), Weight: counts[0], ActiveConns: counts[1], InactiveConns: counts[2],
		})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", procIPVS, err)
	}
	return done()
}

// splitFields appends the space-separated fields of line to fields,
// which it returns; the listing's fields are at most 8 (IPv4 persistent
// virtual servers with "ops").
func splitFields(line []byte, fields [][]byte) [][]byte {
	for i := 0; i < len(line); {
		if line[i] == ' ' || line[i] == '\t' {
			i++
			continue
		}
		j := i
		for j < len(line) && line[j] != ' ' && line[j] != '\t' {
			j++
		}
		fields = append(fields, line[i:j])
		i = j
	}
	return fields
}

// atoi reads a non-negative decimal number.
func atoi(b []byte) (int, error) {
	if len(b) == 0 || len(b) > 18 {
		return 0, fmt.Errorf("%q is not a number", b)
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a number", b)
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

// parseProcAddrPort reads "0A600001:0050" (IPv4 in hex, network order)
// or "[fd00:0000:0000:0000:0000:0000:0000:0001]:0050", the port in hex.
func parseProcAddrPort(s []byte) (netip.AddrPort, error) {
	i := bytes.LastIndexByte(s, ':')
	if i < 0 {
		return netip.AddrPort{}, fmt.Errorf("%q is not an address and port", s)
	}
	port, ok := parseHex(s[i+1:], 4)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q has no port", s)
	}
	var addr netip.Addr
	var err error
	if a, isV6 := bytes.CutPrefix(s[:i], []byte("[")); isV6 {
		addr, err = netip.ParseAddr(string(bytes.TrimSuffix(a, []byte("]"))))
	} else if v4, ok := parseHexIPv4(s[:i]); ok {
		addr = v4
	} else {
		err = fmt.Errorf("%d hex digits", i)
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q has no address: %w", s, err)
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// parseHexIPv4 reads an IPv4 address as the kernel's listings print it:
// eight hex digits, in network order.
func parseHexIPv4(b []byte) (netip.Addr, bool) {
	v4, ok := parseHex(b, 8)
	if !ok {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte{byte(v4 >> 24), byte(v4 >> 16), byte(v4 >> 8), byte(v4)}), true
}

// parseHex reads exactly digits hex digits.
func parseHex(b []byte, digits int) (uint32, bool) {
	if len(b) != digits {
		return 0, false
	}
	var n uint32
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		n = n<<4 | uint32(c)
	}
	return n, true
}
