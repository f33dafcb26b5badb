// Package nfacct creates, reads and deletes the kernel's extended packet
// accounting objects (nfnetlink_acct), which iptables rules count packets
// in with `-m nfacct --nfacct-name NAME`. Objects belong to the network
// namespace of the calling thread.
package nfacct

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Message types and attributes of linux/netfilter/nfnetlink_acct.h.
const (
	subsysAcct = 7 // NFNL_SUBSYS_ACCT
	msgNew     = 0 // NFNL_MSG_ACCT_NEW, also the type of the kernel's answers
	msgGet     = 1 // NFNL_MSG_ACCT_GET
	msgDel     = 3 // NFNL_MSG_ACCT_DEL

	attrName    = 1 // NFACCT_NAME, a NUL-terminated string
	attrPackets = 2 // NFACCT_PKTS, big-endian u64
	attrBytes   = 3 // NFACCT_BYTES, big-endian u64
)

// MaxNameLength is the longest name the kernel takes (NFACCT_NAME_MAX
// less the terminating NUL).
const MaxNameLength = 31

// Counter is an accounting object with its counts.
type Counter struct {
	Name    string
	Packets uint64
	Bytes   uint64
}

// Ensure creates the object unless it exists; an existing one keeps its counts.
func Ensure(name string) error {
	// NLM_F_EXCL: without it the kernel answers EBUSY for an existing
	// object, with it EEXIST, which is unambiguous.
	_, err := request(msgNew, unix.NLM_F_CREATE|unix.NLM_F_EXCL, name)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return wrap("creating", name, err)
}

// Get reads one object's counts. The error wraps unix.ENOENT when it does
// not exist, and unix.EINVAL when the kernel has no nfnetlink_acct.
func Get(name string) (Counter, error) {
	msgs, err := request(msgGet, 0, name)
	if err != nil {
		return Counter{}, wrap("reading", name, err)
	}
	for _, msg := range msgs {
		if c, ok := parse(msg); ok && c.Name == name {
			return c, nil
		}
	}
	return Counter{}, fmt.Errorf("reading nfacct object %q: not in the kernel's answer", name)
}

// Delete deletes the object. The error wraps unix.ENOENT when it does not
// exist, and unix.EBUSY while a rule still uses it.
func Delete(name string) error {
	_, err := request(msgDel, 0, name)
	return wrap("deleting", name, err)
}

// request sends one message about the named object and returns the
// answers' payloads. Every request asks for an acknowledgement: the kernel
// sends none otherwise for a create or delete, and ends its answer to a
// get with it (that answer is flagged multipart, with no end marker).
func request(msgType uint16, flags int, name string) ([][]byte, error) {
	if name == "" || len(name) > MaxNameLength {
		return nil, fmt.Errorf("nfacct object name %q: want 1 to %d bytes", name, MaxNameLength)
	}
	req := nl.NewNetlinkRequest(subsysAcct<<8|int(msgType), flags|unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(attrName, nl.ZeroTerminated(name)))
	return req.Execute(unix.NETLINK_NETFILTER, subsysAcct<<8|msgNew)
}

// parse reads an object from one answer: the nfgenmsg header, then attributes.
func parse(msg []byte) (Counter, bool) {
	if len(msg) < nl.SizeofNfgenmsg {
		return Counter{}, false
	}
	attrs, err := nl.ParseRouteAttr(msg[nl.SizeofNfgenmsg:])
	if err != nil {
		return Counter{}, false
	}
	var c Counter
	for _, a := range attrs {
		switch a.Attr.Type &^ unix.NLA_F_NESTED {
		case attrName:
			c.Name = unix.ByteSliceToString(a.Value)
		case attrPackets:
			if len(a.Value) == 8 {
				c.Packets = binary.BigEndian.Uint64(a.Value)
			}
		case attrBytes:
			if len(a.Value) == 8 {
				c.Bytes = binary.BigEndian.Uint64(a.Value)
			}
		}
	}
	return c, c.Name != ""
}

func wrap(doing, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s nfacct object %q: %w", doing, name, err)
}
