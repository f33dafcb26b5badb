package framework

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// SYNReply is how a destination answered a TCP SYN.
type SYNReply string

// The answers RawSYN tells apart.
const (
	NoReply SYNReply = "no reply"
	SYNACK  SYNReply = "SYN-ACK"
	Reset   SYNReply = "RST"
)

// RawSYN sends one TCP SYN from src to dst (IPv4) as a frame out of the
// namespace's link to the MAC of peer's peerLink, the next hop, whatever
// this namespace's routing says: so a destination its routing refuses,
// such as 127.0.0.1, reaches the peer as another host on the link could
// send it. It returns the first answer from dst to src seen on the link
// within timeout. Nothing leaves the namespaces: the frame goes to the
// peer only.
func (n *Netns) RawSYN(link string, peer *Netns, peerLink string, src, dst netip.AddrPort, timeout time.Duration) (SYNReply, error) {
	mac, err := peer.Exec("cat", "/sys/class/net/"+peerLink+"/address")
	if err != nil {
		return "", err
	}
	hw, err := net.ParseMAC(strings.TrimSpace(mac))
	if err != nil {
		return "", err
	}
	index, err := n.Exec("cat", "/sys/class/net/"+link+"/ifindex")
	if err != nil {
		return "", err
	}
	ifindex, err := strconv.Atoi(strings.TrimSpace(index))
	if err != nil {
		return "", err
	}
	ipProto := int(htons(unix.ETH_P_IP))
	fd, err := n.socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, ipProto)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifindex}); err != nil {
		return "", err
	}
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return "", err
	}
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], hw)
	if err := unix.Sendto(fd, synPacket(src, dst), 0, to); err != nil {
		return "", fmt.Errorf("sending the SYN: %w", err)
	}
	buf := make([]byte, 1<<16)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		size, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return "", err
		}
		if flags, ok := tcpFlagsFrom(buf[:size], dst, src); ok {
			switch {
			case flags&tcpRST != 0:
				return Reset, nil
			case flags&(tcpSYN|tcpACK) == tcpSYN|tcpACK:
				return SYNACK, nil
			}
		}
	}
	return NoReply, nil
}

const (
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// synPacket is an IPv4 TCP SYN from src to dst, checksums included.
func synPacket(src, dst netip.AddrPort) []byte {
	p := make([]byte, 40)
	ip, tcp := p[:20], p[20:]
	ip[0] = 0x45 // version 4, 5 words of header
	binary.BigEndian.PutUint16(ip[2:], uint16(len(p)))
	binary.BigEndian.PutUint16(ip[4:], uint16(rand.Uint32()))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // don't fragment
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip, 0))

	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], rand.Uint32())
	tcp[12] = 5 << 4 // 5 words of header
	tcp[13] = tcpSYN
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	pseudo := sum(s[:], 0)
	pseudo = sum(d[:], pseudo)
	pseudo += unix.IPPROTO_TCP + uint32(len(tcp))
	binary.BigEndian.PutUint16(tcp[16:], checksum(tcp, pseudo))
	return p
}

// tcpFlagsFrom reads the TCP flags of an IPv4 packet from src to dst.
func tcpFlagsFrom(p []byte, src, dst netip.AddrPort) (byte, bool) {
	if len(p) < 20 || p[0]>>4 != 4 || p[9] != unix.IPPROTO_TCP {
		return 0, false
	}
	header := int(p[0]&0x0f) * 4
	if len(p) < header+14 {
		return 0, false
	}
	from, to := netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
	tcp := p[header:]
	if from != src.Addr() || to != dst.Addr() ||
		binary.BigEndian.Uint16(tcp[0:]) != src.Port() || binary.BigEndian.Uint16(tcp[2:]) != dst.Port() {
		return 0, false
	}
	return tcp[13], true
}

// sum adds b as big-endian 16-bit words to acc.
func sum(b []byte, acc uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		acc += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		acc += uint32(b[len(b)-1]) << 8
	}
	return acc
}

// checksum is the Internet checksum of b with acc already summed in.
func checksum(b []byte, acc uint32) uint16 {
	acc = sum(b, acc)
	for acc>>16 != 0 {
		acc = acc&0xffff + acc>>16
	}
	return ^uint16(acc)
}

// ListenTCP opens a TCP socket listening at addr in the namespace, as a
// local service bound there would: the kernel answers SYNs for it until
// stop closes it.
func (n *Netns) ListenTCP(addr netip.AddrPort) (stop func(), err error) {
	fd, err := n.socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return func() { unix.Close(fd) }, nil
}

// socket opens a socket in the namespace, from a thread that has entered
// it; the socket stays in it.
func (n *Netns) socket(domain, typ, proto int) (int, error) {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + n.Name)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	defer func() {
		// A thread that cannot go back stays locked: the runtime then
		// ends it with this goroutine instead of reusing it.
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return unix.Socket(domain, typ, proto)
}
