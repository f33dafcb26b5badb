package iptables

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rapidproxy/rapidproxy/internal/nfgen"
)

// Generation returns a number that changes whenever the rules of one table
// of this runner's backend and family may have changed by another
// program's hand or ours, read without starting a program: on nft the
// kernel's ruleset generation, which every change to any nftables table
// increments, less our own restores' (nfgen.ForeignGeneration: one
// family's restores leave the other's unmoved); on legacy the size and
// rule count of that table. Checking it first lets kube-proxy look for flushed
// rules often while costing nearly nothing when nothing changes; on legacy
// even a one-chain listing copies the whole table.
func (r *Runner) Generation(table string) (uint64, error) {
	if r.backend == NFT {
		return nfgen.ForeignGeneration()
	}
	r.infoMu.Lock()
	defer r.infoMu.Unlock()
	if r.infoSocket < 0 {
		fd, err := legacyInfoSocket(r.ipv6)
		if err != nil {
			return 0, err
		}
		r.infoSocket = fd
	}
	return legacyTableInfo(r.infoSocket, r.ipv6, table)
}

// ipt_getinfo of linux/netfilter_ipv4/ip_tables.h (the IPv6 one is the same).
type iptGetinfo struct {
	Name       [32]byte
	ValidHooks uint32
	HookEntry  [5]uint32
	Underflow  [5]uint32
	NumEntries uint32
	Size       uint32
}

// iptSoGetInfo is IPT_SO_GET_INFO and IP6T_SO_GET_INFO.
const iptSoGetInfo = 64

// LegacyPermitted tells whether this process may use the legacy backend:
// iptables-legacy reads and replaces tables through a raw socket, as this
// package's table probe reads them, and opening one takes CAP_NET_RAW. The
// nft backend talks netlink, for which CAP_NET_ADMIN is enough.
func LegacyPermitted() error {
	fd, err := legacyInfoSocket(false)
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("the iptables legacy backend needs CAP_NET_RAW: iptables-legacy reads and writes its tables through a raw socket, which this process may not open (%w)", err)
	}
	if err != nil {
		return fmt.Errorf("opening a raw socket for the iptables legacy backend: %w", err)
	}
	return unix.Close(fd)
}

// legacyInfoSocket opens a socket of the family to ask the legacy tables'
// sizes through.
func legacyInfoSocket(ipv6 bool) (int, error) {
	domain := unix.AF_INET
	if ipv6 {
		domain = unix.AF_INET6
	}
	return unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
}

func legacyTableInfo(fd int, ipv6 bool, table string) (uint64, error) {
	level := unix.IPPROTO_IP
	if ipv6 {
		level = unix.IPPROTO_IPV6
	}
	var info iptGetinfo
	copy(info.Name[:], table)
	size := uint32(unsafe.Sizeof(info))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), iptSoGetInfo,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return 0, fmt.Errorf("reading the legacy %s table: %w", table, errno)
	}
	return uint64(info.NumEntries)<<32 | uint64(info.Size), nil
}

// TableGeneration is one table's generation, if it could be read.
type TableGeneration struct {
	Value uint64
	OK    bool
}

// ReadGenerations reads each table's generation.
func ReadGenerations(k Kernel, tables []Table) []TableGeneration {
	out := make([]TableGeneration, len(tables))
	for i, t := range tables {
		value, err := k.Generation(string(t))
		out[i] = TableGeneration{Value: value, OK: err == nil}
	}
	return out
}

// SameGenerations tells whether every table's generation was read twice
// and did not move.
func SameGenerations(a, b []TableGeneration) bool {
	for i := range a {
		if !a[i].OK || !b[i].OK || a[i].Value != b[i].Value {
			return false
		}
	}
	return len(a) == len(b)
}
