// Package ipvs is the kernel side of the IPVS mode: Kernel, the adapter
// that programs IPVS, the kube-ipvs0 dummy link and ipsets for one IP
// family, and Fake, an in-memory kernel for tests. Both implement
// pkg/ipvs.Kernel. They only translate requests; every decision about what
// to program lives in pkg/ipvs.
package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// Kernel is the real pkg/ipvs.Kernel for one IP family. Its netlink
// sockets (IPVS and links) are opened by New in the network namespace of
// the calling thread and stay there; the ipset program runs in the
// namespace of the thread calling the ipset methods. kube-proxy uses the
// host's namespace for both.
type Kernel struct {
	table
	*links
	ipsets
}

var _ Interface = (*Kernel)(nil)

// New checks that the kernel has IPVS and opens the handles.
func New(ipv6 bool) (*Kernel, error) {
	h, err := openIPVS()
	if err != nil {
		return nil, err
	}
	proc, err := openProcIPVS()
	if err != nil {
		h.Close()
		return nil, err
	}
	conns, err := openProcConnections()
	if err != nil {
		h.Close()
		proc.Close()
		return nil, err
	}
	dump, err := openServiceDump()
	if err != nil {
		h.Close()
		proc.Close()
		conns.Close()
		return nil, err
	}
	l, err := newLinks(ipv6)
	if err != nil {
		h.Close()
		proc.Close()
		conns.Close()
		dump.close()
		return nil, err
	}
	return &Kernel{table: table{h: h, proc: proc, conns: conns, dump: dump, ipv6: ipv6}, links: l}, nil
}

// Close releases the netlink sockets and the IPVS listing.
func (k *Kernel) Close() {
	k.table.h.Close()
	k.table.proc.Close()
	k.table.conns.Close()
	k.table.dump.close()
	k.links.close()
}

// openIPVS loads ip_vs and returns a handle that has been seen to reach
// IPVS. github.com/moby/ipvs itself reports nothing when IPVS is missing:
// its requests then go to netlink family 0, which the kernel acknowledges
// without doing anything, so every list is empty and every change
// "succeeds". It also looks the family up only once per process.
func openIPVS() (*libipvs.Handle, error) {
	// modprobe only when the family is missing (a restart finds it). A
	// failed modprobe is not final: ip_vs may be built in, or loaded
	// already in a container without module tools.
	var modprobe []byte
	err := ipvsFamily()
	if err != nil {
		modprobe = loadIPVSModule()
		err = ipvsFamily()
	}
	if err != nil {
		msg := fmt.Sprintf("IPVS is not available: the kernel has no IPVS netlink family (%v); the kernel module ip_vs is missing", err)
		if out := strings.TrimSpace(string(modprobe)); out != "" {
			msg += "; modprobe ip_vs: " + out
		}
		return nil, errors.New(msg)
	}
	h, err := libipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("opening an IPVS netlink socket: %w", err)
	}
	// The kernel answers a lookup of a service that does not exist with
	// ESRCH; family 0 would answer with an empty success.
	_, err = h.GetService(&libipvs.Service{AddressFamily: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Address: net.IPv4zero.To4(), Netmask: 0xffffffff})
	if err != nil && !errors.Is(err, unix.ESRCH) {
		h.Close()
		return nil, fmt.Errorf("IPVS does not answer through github.com/moby/ipvs (was it used in this process before ip_vs was loaded?): %w", err)
	}
	return h, nil
}

// ipvsFamily and loadIPVSModule are the kernel's answers openIPVS acts
// on; tests replace them to take the path of a kernel without IPVS on any
// host, without loading a module into the host's kernel.
var (
	ipvsFamily = func() error {
		_, err := netlink.GenlFamilyGet("IPVS")
		return err
	}
	loadIPVSModule = func() []byte {
		out, _ := exec.Command("modprobe", "ip_vs").CombinedOutput()
		return out
	}
)

// table is the IPVS part of Kernel.
type table struct {
	// mu serializes the requests: replies on the one socket would
	// otherwise interleave.
	mu sync.Mutex
	h  *libipvs.Handle
	// proc is the kernel's listing of virtual and real servers; procMu
	// serializes its reads, which take seconds at 10k services under
	// emulation, without holding up the netlink requests.
	procMu sync.Mutex
	proc   *os.File
	// conns is the connection table (under procMu too).
	conns *os.File
	// dump lists the virtual servers (under mu too).
	dump *serviceDump
	ipv6 bool
}

// The protocol numbers IPVS keys virtual servers by.
var protocolNumbers = map[v1.Protocol]uint16{
	v1.ProtocolTCP:  unix.IPPROTO_TCP,
	v1.ProtocolUDP:  unix.IPPROTO_UDP,
	v1.ProtocolSCTP: unix.IPPROTO_SCTP,
}

// VirtualServers lists the family's virtual servers; firewall-mark ones
// have no address, port or protocol, and kube-proxy makes none.
func (t *table) VirtualServers() ([]VirtualServer, error) {
	t.mu.Lock()
	vss, err := t.dump.list(t.family())
	t.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	return vss, nil
}

func (t *table) AddVirtualServer(vs VirtualServer) error {
	return t.serviceCmd("adding", vs, t.h.NewService)
}

func (t *table) UpdateVirtualServer(vs VirtualServer) error {
	return t.serviceCmd("updating", vs, t.h.UpdateService)
}

func (t *table) DeleteVirtualServer(key VirtualServerKey) error {
	return t.serviceCmd("deleting", VirtualServer{VirtualServerKey: key}, t.h.DelService)
}

func (t *table) serviceCmd(verb string, vs VirtualServer, cmd func(*libipvs.Service) error) error {
	s, err := t.toService(vs)
	if err == nil {
		t.mu.Lock()
		err = cmd(s)
		t.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("%s IPVS virtual server %s: %w", verb, vs.VirtualServerKey, err)
	}
	return nil
}

func (t *table) RealServers(key VirtualServerKey) ([]RealServer, error) {
	s, err := t.toService(VirtualServer{VirtualServerKey: key})
	var dests []*libipvs.Destination
	if err == nil {
		t.mu.Lock()
		dests, err = t.h.GetDestinations(s)
		t.mu.Unlock()
	}
	if err != nil {
		return nil, fmt.Errorf("listing the real servers of IPVS virtual server %s: %w", key, err)
	}
	rss := make([]RealServer, 0, len(dests))
	for _, d := range dests {
		addr, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			return nil, fmt.Errorf("IPVS virtual server %s has a real server with address %v", key, d.Address)
		}
		rss = append(rss, RealServer{
			Addr: addr.Unmap(), Port: d.Port, Weight: d.Weight,
			ActiveConns: d.ActiveConnections, InactiveConns: d.InactiveConnections,
		})
	}
	return rss, nil
}

func (t *table) AddRealServer(key VirtualServerKey, rs RealServer) error {
	return t.destinationCmd("adding", key, rs, t.h.NewDestination)
}

func (t *table) UpdateRealServer(key VirtualServerKey, rs RealServer) error {
	return t.destinationCmd("updating", key, rs, t.h.UpdateDestination)
}

func (t *table) DeleteRealServer(key VirtualServerKey, rs netip.AddrPort) error {
	return t.destinationCmd("deleting", key, RealServer{Addr: rs.Addr(), Port: rs.Port()}, t.h.DelDestination)
}

func (t *table) destinationCmd(verb string, key VirtualServerKey, rs RealServer, cmd func(*libipvs.Service, *libipvs.Destination) error) error {
	s, err := t.toService(VirtualServer{VirtualServerKey: key})
	if err == nil {
		err = t.checkFamily(rs.Addr)
	}
	if err == nil {
		// kube-proxy's real servers are always masqueraded (NAT).
		d := &libipvs.Destination{
			Address: rs.Addr.AsSlice(), Port: rs.Port, Weight: rs.Weight,
			ConnectionFlags: libipvs.ConnectionFlagMasq,
		}
		t.mu.Lock()
		err = cmd(s, d)
		t.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("%s real server %s of IPVS virtual server %s: %w", verb, rs.AddrPort(), key, err)
	}
	return nil
}

func (t *table) family() uint16 {
	if t.ipv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func (t *table) checkFamily(a netip.Addr) error {
	if !a.IsValid() || a.Is6() != t.ipv6 {
		return fmt.Errorf("address %v is not of this adapter's family (IPv6: %t)", a, t.ipv6)
	}
	return nil
}

// toService maps a virtual server as upstream does, with the family's
// full netmask.
func (t *table) toService(vs VirtualServer) (*libipvs.Service, error) {
	if err := t.checkFamily(vs.Addr); err != nil {
		return nil, err
	}
	proto, ok := protocolNumbers[vs.Protocol]
	if !ok {
		return nil, fmt.Errorf("unknown protocol %q", vs.Protocol)
	}
	s := &libipvs.Service{
		AddressFamily: t.family(), Address: vs.Addr.AsSlice(), Port: vs.Port, Protocol: proto,
		SchedName: vs.Scheduler, Flags: vs.Flags, Timeout: vs.Timeout, Netmask: 0xffffffff,
	}
	if t.ipv6 {
		s.Netmask = 128
	}
	return s, nil
}
