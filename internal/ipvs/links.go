package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	ipvsmode "github.com/rapidproxy/rapidproxy/pkg/ipvs"
)

// links is the kube-ipvs0 and node-address part of Kernel.
type links struct {
	mu   sync.Mutex // one request at a time on the handle's socket
	h    *netlink.Handle
	ipv6 bool
}

// newLinks opens a route netlink socket in the calling thread's network
// namespace.
func newLinks(ipv6 bool) (*links, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a route netlink socket: %w", err)
	}
	return &links{h: h, ipv6: ipv6}, nil
}

func (l *links) family() int {
	if l.ipv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// EnsureDummyLink creates kube-ipvs0 as upstream does: a dummy link, never
// set up (IPv4 addresses on a link that is down still get their local
// routes; IPv6 ones stay tentative and get none), and any existing link of
// that name is taken as it is, whatever its type.
func (l *links) EnsureDummyLink() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.h.LinkByName(ipvsmode.DummyLink)
	if err == nil {
		return nil
	}
	if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return fmt.Errorf("looking up link %s: %w", ipvsmode.DummyLink, err)
	}
	if err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: ipvsmode.DummyLink}}); err != nil {
		return fmt.Errorf("creating dummy link %s (needs the kernel module dummy): %w", ipvsmode.DummyLink, err)
	}
	return nil
}

func (l *links) BoundAddresses() ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	link, err := l.dummyLink()
	if err != nil {
		return nil, err
	}
	list, err := l.h.AddrList(link, l.family())
	if err != nil {
		return nil, fmt.Errorf("listing the addresses of %s: %w", ipvsmode.DummyLink, err)
	}
	return addrSet(list, func(netlink.Addr) bool { return true }), nil
}

// Bind adds the address; an address already there is not an error.
func (l *links) Bind(a netip.Addr) error {
	return l.addrCmd(a, "binding", func(link netlink.Link, addr *netlink.Addr) error {
		if err := l.h.AddrAdd(link, addr); !errors.Is(err, unix.EEXIST) {
			return err
		}
		return nil
	})
}

// Unbind removes the address; an address not there is not an error.
func (l *links) Unbind(a netip.Addr) error {
	return l.addrCmd(a, "unbinding", func(link netlink.Link, addr *netlink.Addr) error {
		if err := l.h.AddrDel(link, addr); !errors.Is(err, unix.EADDRNOTAVAIL) {
			return err
		}
		return nil
	})
}

func (l *links) addrCmd(a netip.Addr, verb string, cmd func(netlink.Link, *netlink.Addr) error) error {
	if !a.IsValid() || a.Is6() != l.ipv6 {
		return fmt.Errorf("%s %v: not an address of this adapter's family (IPv6: %t)", verb, a, l.ipv6)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	link, err := l.dummyLink()
	if err == nil {
		// NewIPNet makes the /32 or /128.
		err = cmd(link, &netlink.Addr{IPNet: netlink.NewIPNet(a.AsSlice())})
	}
	if err != nil {
		return fmt.Errorf("%s %v on %s: %w", verb, a, ipvsmode.DummyLink, err)
	}
	return nil
}

// NodeAddresses is upstream's GetAllLocalAddressesExcept(kube-ipvs0): the
// family's addresses on every other link, the loopback link included,
// without loopback addresses (127.0.0.0/8, ::1) and without IPv6
// link-local ones (fe80::/10); IPv4 link-local ones are kept. Sorted, each
// once.
func (l *links) NodeAddresses() ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	skip := 0 // no link has index 0
	if link, err := l.h.LinkByName(ipvsmode.DummyLink); err == nil {
		skip = link.Attrs().Index
	} else if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, fmt.Errorf("looking up link %s: %w", ipvsmode.DummyLink, err)
	}
	list, err := l.h.AddrList(nil, l.family())
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	return addrSet(list, func(a netlink.Addr) bool {
		ip, _ := netip.AddrFromSlice(a.IP)
		return a.LinkIndex != skip && isNodeAddress(ip.Unmap())
	}), nil
}

// isNodeAddress is upstream's filter of node addresses (isValidForSet).
func isNodeAddress(a netip.Addr) bool {
	return !a.IsLoopback() && !(a.Is6() && a.IsLinkLocalUnicast())
}

func (l *links) dummyLink() (netlink.Link, error) {
	link, err := l.h.LinkByName(ipvsmode.DummyLink)
	if err != nil {
		return nil, fmt.Errorf("looking up link %s: %w", ipvsmode.DummyLink, err)
	}
	return link, nil
}

// addrSet returns the kept addresses, sorted, without duplicates.
func addrSet(list []netlink.Addr, keep func(netlink.Addr) bool) []netip.Addr {
	var addrs []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && keep(a) {
			addrs = append(addrs, ip.Unmap())
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}
