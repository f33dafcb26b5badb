package framework

import (
	"net/netip"
	"testing"
)

// A crafted SYN carries valid checksums (the Internet checksum over a
// header with its checksum in is 0) and reads back as sent.
func TestSYNPacket(t *testing.T) {
	src, dst := netip.MustParseAddrPort("10.255.1.2:40001"), netip.MustParseAddrPort("127.0.0.1:30080")
	p := synPacket(src, dst)
	if c := checksum(p[:20], 0); c != 0 {
		t.Errorf("IP header checksum does not verify: %#x", c)
	}
	s, d := src.Addr().As4(), dst.Addr().As4()
	pseudo := sum(d[:], sum(s[:], 0)) + 6 + 20
	if c := checksum(p[20:], pseudo); c != 0 {
		t.Errorf("TCP checksum does not verify: %#x", c)
	}
	if flags, ok := tcpFlagsFrom(p, src, dst); !ok || flags != tcpSYN {
		t.Errorf("read back: flags %#x, %v", flags, ok)
	}
	if _, ok := tcpFlagsFrom(p, dst, src); ok {
		t.Error("read back the other way round")
	}
}
