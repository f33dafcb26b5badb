// Package nfgen reads the kernel's nftables ruleset generation over
// netlink, without starting a program: every committed nftables
// transaction (one `nft -f`, whatever it holds; iptables-nft's too)
// moves it by one, in the calling thread's network namespace. Checking it
// first lets a watch for rules removed by other programs cost nearly
// nothing while nothing changes.
package nfgen

import (
	"encoding/binary"
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// Netlink constants of nftables (linux/netfilter/nf_tables.h, nfnetlink.h).
const (
	nfnlSubsysNFTables = 10
	nftMsgNewGen       = 15
	nftMsgGetGen       = 16
	nftaGenID          = 1
)

// Generation returns the current nftables ruleset generation.
func Generation() (uint64, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	// nlmsghdr, then nfgenmsg (family, version, res_id): all zero but the header.
	req := make([]byte, unix.SizeofNlMsghdr+4)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], nfnlSubsysNFTables<<8|nftMsgGetGen)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], 1) // sequence number
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if m.Header.Type&0xff != nftMsgNewGen || len(m.Data) < 4 {
			continue
		}
		// After nfgenmsg: attributes (length, type, value, padded to 4 bytes).
		for attrs := m.Data[4:]; len(attrs) >= unix.SizeofNlAttr; {
			length := int(binary.NativeEndian.Uint16(attrs[0:]))
			kind := binary.NativeEndian.Uint16(attrs[2:]) &^ unix.NLA_F_NESTED
			if length < unix.SizeofNlAttr || length > len(attrs) {
				break
			}
			if kind == nftaGenID && length == unix.SizeofNlAttr+4 {
				return uint64(binary.BigEndian.Uint32(attrs[unix.SizeofNlAttr:])), nil
			}
			attrs = attrs[min(len(attrs), (length+3)&^3):]
		}
	}
	return 0, errors.New("nftables: no ruleset generation in the answer")
}
