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

	"golang.org/x/sys/unix"

	"github.com/rapidproxy/rapidproxy/internal/nfnetlink"
)

// Generation returns the current nftables ruleset generation.
func Generation() (uint64, error) {
	msgs, err := request(unix.NFT_MSG_GETGEN, unix.NFPROTO_UNSPEC, nil)
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if len(m) < 4 {
			continue
		}
		// After nfgenmsg: attributes (length, type, value, padded to 4 bytes).
		for attrs := m[4:]; len(attrs) >= unix.SizeofNlAttr; {
			length := int(binary.NativeEndian.Uint16(attrs[0:]))
			kind := binary.NativeEndian.Uint16(attrs[2:]) &^ unix.NLA_F_NESTED
			if length < unix.SizeofNlAttr || length > len(attrs) {
				break
			}
			if kind == unix.NFTA_GEN_ID && length == unix.SizeofNlAttr+4 {
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
	binary.NativeEndian.PutUint16(attr[2:], unix.NFTA_TABLE_NAME)
	copy(attr[unix.SizeofNlAttr:], name)
	msgs, err := request(unix.NFT_MSG_GETTABLE, family, attr)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EOPNOTSUPP):
		return false, nil
	case err != nil:
		return false, err
	}
	if len(msgs) == 0 {
		return false, errors.New("nftables: no table in the answer")
	}
	return true, nil
}

// request sends one nf_tables request (a nfgenmsg of the family, then the
// attributes) and returns the kernel's answer after its nlmsghdr, or the
// error it answered with.
func request(msgType uint16, family uint8, attrs []byte) ([][]byte, error) {
	sock, err := nfnetlink.Dial()
	if err != nil {
		return nil, err
	}
	defer sock.Close()
	return sock.Request(msgType, family, false, attrs)
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
