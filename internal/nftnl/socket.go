package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// socket is a blocking netfilter netlink socket that runs one request at
// a time. A dump per chain makes tens of thousands of small requests,
// and the runtime poller's park and wake-up around each (as a
// non-blocking socket has) cost as much as the kernel's work.
type socket struct {
	fd  int
	seq uint32
	buf []byte
}

// answerTimeout is how long, in seconds, a read waits for the kernel.
const answerTimeout = 30

func dial() (*socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	// The kernel always answers; should it not, a sync gives up the read
	// (and lists with nft) rather than wait forever.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: answerTimeout}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("setting the netlink socket's timeout: %w", err)
	}
	// Each read takes one message batch of a dump, at most 32 KiB.
	return &socket{fd: fd, buf: make([]byte, 128<<10)}, nil
}

func (s *socket) close() error { return unix.Close(s.fd) }

// request sends one nftables request of the family (a dump when dump is
// set) with its attributes, and returns each answer's payload after its
// nlmsghdr.
func (s *socket) request(msgType uint16, family byte, dump bool, attrs []byte) ([][]byte, error) {
	s.seq++
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
	}
	// nlmsghdr, then nfgenmsg: family, version, resource id.
	req := make([]byte, unix.SizeofNlMsghdr+4, unix.SizeofNlMsghdr+4+len(attrs))
	req = append(req, attrs...)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.NFNL_SUBSYS_NFTABLES<<8|msgType)
	binary.NativeEndian.PutUint16(req[6:], flags)
	binary.NativeEndian.PutUint32(req[8:], s.seq)
	req[16], req[17] = family, unix.NFNETLINK_V0
	if err := unix.Sendto(s.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		n, _, recvFlags, _, err := unix.Recvmsg(s.fd, s.buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if recvFlags&unix.MSG_TRUNC != 0 {
			return nil, errors.New("a netlink message larger than the buffer")
		}
		msgs, err := syscall.ParseNetlinkMessage(s.buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != s.seq {
				continue // an answer to an earlier request, abandoned
			}
			if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
				return nil, errors.New("the ruleset changed during a dump")
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("a short netlink error")
				}
				if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
					return nil, syscall.Errno(errno)
				}
				return out, nil
			case unix.NLMSG_DONE:
				return out, nil
			}
			out = append(out, append([]byte(nil), m.Data...))
		}
		if !dump && len(out) > 0 {
			return out, nil
		}
	}
}
