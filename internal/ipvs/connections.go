package ipvs

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"

	v1 "k8s.io/api/core/v1"
)

// procConnections is the kernel's IPVS connection table. Netlink has no
// dump of it; `ipvsadm -Lnc` reads this file too.
const procConnections = "/proc/thread-self/net/ip_vs_conn"

// OpenConnections counts, per virtual server and real server of the
// family, the connections IPVS holds that have not ended. A TCP
// connection in TIME_WAIT or CLOSE has ended: its entry only waits to
// expire. Every UDP and SCTP entry counts: a flow without a handshake
// ends only when it goes quiet.
type OpenConnections map[VirtualServerKey]map[netip.AddrPort]int

// closedTCPStates are the states of ended TCP connections in the table.
var closedTCPStates = map[string]bool{"TIME_WAIT": true, "CLOSE": true}

func (t *table) OpenConnections() (OpenConnections, error) {
	t.procMu.Lock()
	defer t.procMu.Unlock()
	if _, err := t.conns.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("reading %s: %w", procConnections, err)
	}
	return parseProcConnections(t.conns, t.ipv6)
}

func openProcConnections() (*os.File, error) {
	f, err := os.Open(procConnections)
	if err != nil {
		return nil, fmt.Errorf("opening the IPVS connection table: %w", err)
	}
	return f, nil
}

// parseProcConnections reads the table's lines, "TCP 0AFF0104 A3C2
// 0A60650A 0050 0AF40065 1F90 TIME_WAIT 98" (protocol, client, virtual
// and real address each with its port, IPv4 in hex, IPv6 written out in
// full, then the state and the seconds until it expires), after one
// header line. Connections of the other family and other protocols are
// left out.
func parseProcConnections(r io.Reader, ipv6 bool) (OpenConnections, error) {
	open := OpenConnections{}
	sc := bufio.NewScanner(r)
	var fields [12][]byte
	for line := 0; sc.Scan(); line++ {
		f := splitFields(sc.Bytes(), fields[:0])
		if line == 0 || len(f) < 9 {
			continue
		}
		proto, ok := procProtocols[string(f[0])]
		if !ok {
			continue
		}
		virtual, err := parseConnAddrPort(f[3], f[4])
		if err == nil && virtual.Addr().Is6() != ipv6 {
			continue
		}
		var real netip.AddrPort
		if err == nil {
			real, err = parseConnAddrPort(f[5], f[6])
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: line %d: %w", procConnections, line+1, err)
		}
		if proto == v1.ProtocolTCP && closedTCPStates[string(f[7])] {
			continue
		}
		key := VirtualServerKey{Addr: virtual.Addr(), Port: virtual.Port(), Protocol: proto}
		if open[key] == nil {
			open[key] = map[netip.AddrPort]int{}
		}
		open[key][real]++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", procConnections, err)
	}
	return open, nil
}

// parseConnAddrPort reads an address ("0A60650A", or IPv6 written out)
// and a port in hex ("0050").
func parseConnAddrPort(addr, port []byte) (netip.AddrPort, error) {
	p, ok := parseHex(port, 4)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q is not a port", port)
	}
	if v4, ok := parseHexIPv4(addr); ok {
		return netip.AddrPortFrom(v4, uint16(p)), nil
	}
	a, err := netip.ParseAddr(string(addr))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is not an address", addr)
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}
