package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// links is the kube-ipvs0 and node-address part of Kernel.
type links struct {
	mu   sync.Mutex // one request at a time on the handle's socket
	h    *netlink.Handle
	ipv6 bool
	// byLink is a socket with strict checking, whose address dumps the
	// kernel filters by link (Linux 4.20 and later); nil on older kernels.
	byLink *nl.SocketHandle
}

// newLinks opens route netlink sockets in the calling thread's network
// namespace.
func newLinks(ipv6 bool) (*links, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a route netlink socket: %w", err)
	}
	l := &links{h: h, ipv6: ipv6}
	s, err := nl.Subscribe(unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("opening a route netlink socket: %w", err)
	}
	if unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1) == nil {
		l.byLink = &nl.SocketHandle{Socket: s}
	} else {
		s.Close()
	}
	return l, nil
}

func (l *links) close() {
	l.h.Close()
	if l.byLink != nil {
		l.byLink.Close()
	}
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
	_, err := l.h.LinkByName(DummyLink)
	if err == nil {
		return nil
	}
	if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return fmt.Errorf("looking up link %s: %w", DummyLink, err)
	}
	// The other family's syncer may have created it meanwhile.
	if err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DummyLink}}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("creating dummy link %s (needs the kernel module dummy): %w", DummyLink, err)
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
		return nil, fmt.Errorf("listing the addresses of %s: %w", DummyLink, err)
	}
	return addrSet(ipsOf(list, 0), func(netip.Addr) bool { return true }), nil
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
		return fmt.Errorf("%s %v on %s: %w", verb, a, DummyLink, err)
	}
	return nil
}

// NodeAddresses is upstream's GetAllLocalAddressesExcept(kube-ipvs0): the
// family's addresses on every other link, the loopback link included,
// without loopback addresses (127.0.0.0/8, ::1) and without IPv6
// link-local ones (fe80::/10); IPv4 link-local ones are kept. Sorted, each
// once. Every partial sync reads them: the kernel is asked for each other
// link's addresses alone, so kube-ipvs0's, one per service, cost nothing
// (at 10,000 services one dump of all addresses took 0.1 s of a 0.11 s
// endpoint change in the benchmark's VM).
func (l *links) NodeAddresses() ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	all, err := l.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing the links: %w", err)
	}
	var addrs []netip.Addr
	if l.byLink == nil {
		// A kernel without strict checking dumps every link's addresses.
		list, err := l.h.AddrList(nil, l.family())
		if err != nil {
			return nil, fmt.Errorf("listing the node's addresses: %w", err)
		}
		skip := 0 // no link has index 0
		for _, link := range all {
			if link.Attrs().Name == DummyLink {
				skip = link.Attrs().Index
			}
		}
		addrs = ipsOf(list, skip)
	} else {
		for _, link := range all {
			if link.Attrs().Name == DummyLink {
				continue
			}
			list, err := l.addressesOf(link.Attrs().Index)
			if errors.Is(err, unix.ENODEV) {
				continue // removed since the link list (a pod's veth)
			}
			if err != nil {
				return nil, fmt.Errorf("listing the addresses of %s: %w", link.Attrs().Name, err)
			}
			addrs = append(addrs, list...)
		}
	}
	return addrSet(addrs, isNodeAddress), nil
}

// addressesOf lists the family's addresses on one link, in a dump the
// kernel filters by the link's index.
func (l *links) addressesOf(index int) ([]netip.Addr, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: l.byLink}
	msg := nl.NewIfAddrmsg(l.family())
	msg.Index = uint32(index)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfAddrmsg:])
		if err != nil {
			return nil, err
		}
		// The local address; IFA_ADDRESS is the peer's on a point-to-point
		// link, and the only one an IPv6 address has.
		var local, address []byte
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.IFA_LOCAL:
				local = a.Value
			case unix.IFA_ADDRESS:
				address = a.Value
			}
		}
		if local == nil {
			local = address
		}
		if ip, ok := netip.AddrFromSlice(local); ok {
			addrs = append(addrs, ip)
		}
	}
	return addrs, nil
}

// isNodeAddress is upstream's filter of node addresses (isValidForSet).
func isNodeAddress(a netip.Addr) bool {
	return !a.IsLoopback() && !(a.Is6() && a.IsLinkLocalUnicast())
}

func (l *links) dummyLink() (netlink.Link, error) {
	link, err := l.h.LinkByName(DummyLink)
	if err != nil {
		return nil, fmt.Errorf("looking up link %s: %w", DummyLink, err)
	}
	return link, nil
}

// ipsOf returns the addresses of list but those on the link with index
// skip.
func ipsOf(list []netlink.Addr, skip int) []netip.Addr {
	var addrs []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.LinkIndex != skip {
			addrs = append(addrs, ip)
		}
	}
	return addrs
}

// addrSet returns the kept addresses, sorted, without duplicates.
func addrSet(list []netip.Addr, keep func(netip.Addr) bool) []netip.Addr {
	var addrs []netip.Addr
	for _, a := range list {
		if a = a.Unmap(); keep(a) {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}
