// Package nfgen reads the kernel's nftables ruleset generation over
// netlink, without starting a program: every committed nftables
// transaction (one `nft -f`, whatever it holds; iptables-nft's too)
// moves it by one, in the calling thread's network namespace. Checking it
// first lets a watch for rules removed by other programs cost nearly
// nothing while nothing changes. It also tells whether a table exists
// (TableExists), for the same reason.
package nfgen

import (
	"encoding/binary"
	"errors"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Netlink constants of nftables (linux/netfilter/nf_tables.h, nfnetlink.h).
const (
	nfnlSubsysNFTables = 10
	nftMsgNewTable     = 0
	nftMsgGetTable     = 1
	nftMsgNewGen       = 15
	nftMsgGetGen       = 16
	nftaTableName      = 1
	nftaGenID          = 1
)

// Generation returns the current nftables ruleset generation.
func Generation() (uint64, error) {
	msgs, err := request(nftMsgGetGen, unix.NFPROTO_UNSPEC, nil)
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

// TableExists tells whether the kernel holds the nftables table of this
// family (unix.NFPROTO_IPV4, _IPV6, ...), with one request: a start that
// removes another mode's leftovers need not run nft to find none. A
// kernel without nf_tables holds no table.
func TableExists(family uint8, name string) (bool, error) {
	attr := make([]byte, unix.SizeofNlAttr+(len(name)+1+3)&^3)
	binary.NativeEndian.PutUint16(attr[0:], uint16(unix.SizeofNlAttr+len(name)+1))
	binary.NativeEndian.PutUint16(attr[2:], nftaTableName)
	copy(attr[unix.SizeofNlAttr:], name)
	msgs, err := request(nftMsgGetTable, family, attr)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return false, nil
	case err != nil:
		return false, err
	}
	for _, m := range msgs {
		if m.Header.Type&0xff == nftMsgNewTable {
			return true, nil
		}
	}
	return false, errors.New("nftables: no table in the answer")
}

// request sends one nf_tables request (a nfgenmsg of the family, then the
// attributes) and returns the kernel's answer, or the error it answered
// with.
func request(msgType uint16, family uint8, attrs []byte) ([]syscall.NetlinkMessage, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// nlmsghdr, then nfgenmsg (family, version, res_id).
	req := make([]byte, unix.SizeofNlMsghdr+4, unix.SizeofNlMsghdr+4+len(attrs))
	req = append(req, attrs...)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], nfnlSubsysNFTables<<8|msgType)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], 1) // sequence number
	req[unix.SizeofNlMsghdr] = family
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
			if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
				return nil, syscall.Errno(errno)
			}
		}
	}
	return msgs, nil
}

// own counts the generations this process's writes moved the ruleset by,
// so that a watch tells another program's changes from ours, whichever
// of our syncers (one per IP family) wrote: each would otherwise take
// the other's writes for a stranger's and check its rules after each.
var own struct {
	sync.Mutex
	generations uint64
}

// Write runs one write of this process to the ruleset (a transaction,
// one restore), which ForeignGeneration then does not count. Writes are
// serialized, as the kernel serializes transactions anyway.
func Write(write func() error) error {
	own.Lock()
	defer own.Unlock()
	before, errBefore := Generation()
	err := write()
	after, errAfter := Generation()
	// A write that moved it by more than one raced with another
	// program's: counting it as foreign costs one needless check.
	if errBefore == nil && errAfter == nil && after == before+1 {
		own.generations++
	}
	return err
}

// ForeignGeneration is the ruleset generation less the moves of this
// process's own writes (Write): it changes only when another program
// changes the ruleset.
func ForeignGeneration() (uint64, error) {
	own.Lock()
	defer own.Unlock()
	gen, err := Generation()
	return gen - own.generations, err
}
