package ipvs

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	ipvsmode "github.com/rapidproxy/rapidproxy/pkg/ipvs"
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

func (t *table) EachVirtualServer(each func(key ipvsmode.VirtualServerKey, reals []ipvsmode.RealServer) error) error {
	t.procMu.Lock()
	defer t.procMu.Unlock()
	// A seq file lists afresh when read again from the start.
	if _, err := t.proc.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("reading %s: %w", procIPVS, err)
	}
	return parseProcIPVS(bufio.NewReaderSize(t.proc, 1<<20), t.ipv6, each)
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
func parseProcIPVS(r io.Reader, ipv6 bool, each func(key ipvsmode.VirtualServerKey, reals []ipvsmode.RealServer) error) error {
	sc := bufio.NewScanner(r)
	var current *ipvsmode.VirtualServerKey // nil while skipping a virtual server
	var reals []ipvsmode.RealServer
	done := func() error {
		if current == nil {
			return nil
		}
		key := *current
		current = nil
		return each(key, reals)
	}
	for line := 0; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if line < 3 || len(fields) < 2 { // the three header lines
			continue
		}
		if fields[0] != "->" {
			if err := done(); err != nil {
				return err
			}
			proto, ok := procProtocols[fields[0]]
			if !ok {
				continue
			}
			addr, err := parseProcAddrPort(fields[1])
			if err != nil {
				return fmt.Errorf("reading %s: line %d: %w", procIPVS, line+1, err)
			}
			if addr.Addr().Is6() != ipv6 {
				continue
			}
			current = &ipvsmode.VirtualServerKey{Addr: addr.Addr(), Port: addr.Port(), Protocol: proto}
			reals = reals[:0]
			continue
		}
		if current == nil {
			continue
		}
		if len(fields) != 6 {
			return fmt.Errorf("reading %s: line %d: %q is not a destination", procIPVS, line+1, sc.Text())
		}
		addr, err := parseProcAddrPort(fields[1])
		if err != nil {
			return fmt.Errorf("reading %s: line %d: %w", procIPVS, line+1, err)
		}
		var counts [3]int
		for i, f := range fields[3:] {
			if counts[i], err = strconv.Atoi(f); err != nil {
				return fmt.Errorf("reading %s: line %d: %q is not a destination", procIPVS, line+1, sc.Text())
			}
		}
		reals = append(reals, ipvsmode.RealServer{
			Addr: addr.Addr(), Port: addr.Port(), Weight: counts[0], ActiveConns: counts[1], InactiveConns: counts[2],
		})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", procIPVS, err)
	}
	return done()
}

// parseProcAddrPort reads "0A600001:0050" (IPv4 in hex, network order)
// or "[fd00:0000:0000:0000:0000:0000:0000:0001]:0050", the port in hex.
func parseProcAddrPort(s string) (netip.AddrPort, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.AddrPort{}, fmt.Errorf("%q is not an address and port", s)
	}
	port, err := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q has no port: %w", s, err)
	}
	var addr netip.Addr
	if a, ok := strings.CutPrefix(s[:i], "["); ok {
		addr, err = netip.ParseAddr(strings.TrimSuffix(a, "]"))
	} else {
		var b []byte
		if b, err = hex.DecodeString(s[:i]); err == nil && len(b) == 4 {
			addr = netip.AddrFrom4([4]byte(b))
		} else if err == nil {
			err = fmt.Errorf("%d bytes", len(b))
		}
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q has no address: %w", s, err)
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
