// Package nfnetlink is a blocking netfilter netlink socket for nf_tables:
// one request, one dump or one batch of changes at a time. The table
// reader, the generation probe and the transaction writer share it.
package nfnetlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Socket is a blocking netfilter netlink socket that runs one request at
// a time. A dump per chain makes tens of thousands of small requests,
// and the runtime poller's park and wake-up around each (as a
// non-blocking socket has) cost as much as the kernel's work.
type Socket struct {
	fd  int
	seq uint32
	// buf holds one read: 8 KiB for an answer, 128 KiB once a dump
	// was asked for (each read of a dump takes a batch of up to 32 KiB).
	buf []byte
}

// answerTimeout is how long, in seconds, a read waits for the kernel.
const answerTimeout = 30

// Dial opens a socket in the calling thread's network namespace.
func Dial() (*Socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	// The kernel always answers; should it not, a caller gives up the
	// read (a sync lists with nft) rather than wait forever.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: answerTimeout}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("setting the netlink socket's timeout: %w", err)
	}
	return &Socket{fd: fd}, nil
}

// Close closes the socket.
func (s *Socket) Close() error { return unix.Close(s.fd) }

// header writes a message's nlmsghdr and nfgenmsg (family, version,
// resource id) at the start of msg, whose length is the whole message.
func header(msg []byte, typ, flags uint16, seq uint32, family byte, resID uint16) {
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	msg[16], msg[17] = family, unix.NFNETLINK_V0
	binary.BigEndian.PutUint16(msg[18:], resID)
}

// headerLen is the length of nlmsghdr and nfgenmsg.
const headerLen = unix.SizeofNlMsghdr + 4

// Request sends one nf_tables request of the family (a dump when dump is
// set) with its attributes, and returns each answer's payload after its
// nlmsghdr (nfgenmsg, then attributes). An error the kernel answered
// with is a syscall.Errno.
func (s *Socket) Request(msgType uint16, family byte, dump bool, attrs []byte) ([][]byte, error) {
	s.seq++
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
		s.grow(128 << 10)
	}
	req := make([]byte, headerLen, headerLen+len(attrs))
	req = append(req, attrs...)
	header(req, unix.NFNL_SUBSYS_NFTABLES<<8|msgType, flags, s.seq, family, 0)
	if err := unix.Sendto(s.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		msgs, err := s.receive(0)
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
				if errno := errnoOf(m); errno != 0 {
					return nil, errno
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

func (s *Socket) grow(size int) {
	if len(s.buf) < size {
		s.buf = make([]byte, size)
	}
}

// receive reads one datagram of messages.
func (s *Socket) receive(flags int) ([]syscall.NetlinkMessage, error) {
	s.grow(8 << 10)
	for {
		n, _, recvFlags, _, err := unix.Recvmsg(s.fd, s.buf, nil, flags)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if recvFlags&unix.MSG_TRUNC != 0 {
			return nil, errors.New("a netlink message larger than the buffer")
		}
		return syscall.ParseNetlinkMessage(s.buf[:n])
	}
}

// errnoOf is the error of an NLMSG_ERROR message, 0 for an ack.
func errnoOf(m syscall.NetlinkMessage) syscall.Errno {
	if len(m.Data) < 4 {
		return unix.EBADMSG
	}
	return syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data)))
}
