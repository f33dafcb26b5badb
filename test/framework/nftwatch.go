package framework

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// The nftables mode (upstream's v1.36 and ours) writes a service's DNAT
// into its service chain, `dnat ip to numgen random mod N map { i : ip .
// port }`, the map an anonymous set of the rule; only some services (e.g.
// with affinity) get endpoint chains. `nft list chain` of that one chain
// costs what listing every set of the table does (nft builds its set cache
// first): 2.7 s at 10,000 services x 5, so a poller could not keep up. The
// kernel answers the same question over netlink in well under a
// millisecond: a dump of the chain's rules, then of the elements of each
// set they look up.

// Message types and attributes of linux/netfilter/nf_tables.h.
const (
	nfnlSubsysNFTables = 10
	nftMsgGetRule      = 7
	nftMsgGetSetElem   = 13

	nftaRuleTable       = 1
	nftaRuleChain       = 2
	nftaRuleExpressions = 4
	nftaListElem        = 1
	nftaExprName        = 1
	nftaExprData        = 2
	nftaLookupSet       = 1
	nftaSetElemListTbl  = 1
	nftaSetElemListSet  = 2
)

// NFTablesReader reads the IPv4 table "kube-proxy" of a namespace over a
// netlink socket of its own. Not safe for concurrent use.
type NFTablesReader struct {
	fd  int
	seq uint32
	buf []byte
}

// NFTablesReader opens a netfilter netlink socket in the namespace.
func (n *Netns) NFTablesReader() (*NFTablesReader, error) {
	fd, err := n.socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netlink socket in %s: %w", n.Name, err)
	}
	tv := unix.Timeval{Sec: 10}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &NFTablesReader{fd: fd, buf: make([]byte, 1<<20)}, nil
}

// Close closes the socket.
func (r *NFTablesReader) Close() error { return unix.Close(r.fd) }

// ChainSendsTo tells whether a rule of chain, or a set or map that one of
// its rules looks up, holds the destination dest ("ip:port", IPv4): the
// address in the rule, or address and port in an element. The map is
// written with the rule, in one transaction.
func (r *NFTablesReader) ChainSendsTo(chain, dest string) (bool, error) {
	host, portText, err := net.SplitHostPort(dest)
	if err != nil {
		return false, err
	}
	ip := net.ParseIP(host).To4()
	port, err := strconv.ParseUint(portText, 10, 16)
	if ip == nil || err != nil {
		return false, fmt.Errorf("not an IPv4 ip:port: %q", dest)
	}
	element := binary.BigEndian.AppendUint16(bytes.Clone(ip), uint16(port))
	var sets []string
	found := false
	err = r.dump(nftMsgGetRule, attr(nftaRuleTable, "kube-proxy")+attr(nftaRuleChain, chain), func(rule []byte) {
		found = found || bytes.Contains(rule, ip)
		sets = append(sets, lookedUpSets(rule)...)
	})
	if errors.Is(err, unix.ENOENT) { // no such table or chain (yet)
		return false, nil
	}
	if err != nil || found {
		return found, err
	}
	for _, set := range sets {
		err := r.dump(nftMsgGetSetElem, attr(nftaSetElemListTbl, "kube-proxy")+attr(nftaSetElemListSet, set), func(elements []byte) {
			found = found || bytes.Contains(elements, element)
		})
		if err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// lookedUpSets are the sets that a rule's lookup expressions name.
func lookedUpSets(rule []byte) []string {
	var out []string
	for _, exprs := range attrsOf(rule, nftaRuleExpressions) {
		for _, expr := range attrsOf(exprs, nftaListElem) {
			if name := attrsOf(expr, nftaExprName); len(name) == 1 && unix.ByteSliceToString(name[0]) == "lookup" {
				for _, data := range attrsOf(expr, nftaExprData) {
					for _, set := range attrsOf(data, nftaLookupSet) {
						out = append(out, unix.ByteSliceToString(set))
					}
				}
			}
		}
	}
	return out
}

// attrsOf are the values of the attributes of type typ in b.
func attrsOf(b []byte, typ uint16) [][]byte {
	var out [][]byte
	for len(b) >= unix.NLA_HDRLEN {
		length := int(binary.NativeEndian.Uint16(b))
		if length < unix.NLA_HDRLEN || length > len(b) {
			break
		}
		if binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == typ {
			out = append(out, b[unix.NLA_HDRLEN:length])
		}
		b = b[min(nlaAlign(length), len(b)):]
	}
	return out
}

func nlaAlign(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// attr is a string attribute, NUL-terminated and padded.
func attr(typ uint16, value string) string {
	b := binary.NativeEndian.AppendUint16(nil, uint16(unix.NLA_HDRLEN+len(value)+1))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, value...)
	b = append(b, 0)
	return string(append(b, make([]byte, nlaAlign(len(b))-len(b))...))
}

// dump sends an IPv4 dump request and calls each on every answer, past
// its nfgenmsg header, until the kernel says done.
func (r *NFTablesReader) dump(msgType uint16, attrs string, each func([]byte)) error {
	r.seq++
	body := append([]byte{unix.AF_INET, unix.NFNETLINK_V0, 0, 0}, attrs...)
	msg := binary.NativeEndian.AppendUint32(nil, uint32(unix.NLMSG_HDRLEN+len(body)))
	msg = binary.NativeEndian.AppendUint16(msg, nfnlSubsysNFTables<<8|msgType)
	msg = binary.NativeEndian.AppendUint16(msg, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	msg = binary.NativeEndian.AppendUint32(msg, r.seq)
	msg = binary.NativeEndian.AppendUint32(msg, 0)
	msg = append(msg, body...)
	if err := unix.Sendto(r.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	for {
		n, _, err := unix.Recvfrom(r.fd, r.buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(r.buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != r.seq {
				continue // a late answer to an earlier request
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := -int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return syscall.Errno(errno)
					}
				}
				return nil
			default:
				if len(m.Data) >= 4 {
					each(m.Data[4:])
				}
			}
		}
	}
}
