package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// Fake is an in-memory kernel for tests of the IPVS mode: virtual and real
// servers, kube-ipvs0 and its addresses, the node's other addresses, and
// ipsets. It refuses what the kernel refuses, with the errno the kernel
// returns where there is one (errors.Is(err, syscall.EEXIST) holds for
// both), and behaves as Kernel where Kernel softens the kernel (binding a
// bound address, ipset's -exist). Unlike Kernel it holds both families:
// VirtualServers, BoundAddresses and NodeAddresses return whatever was
// put in. It counts the calls it receives, can fail a method on demand,
// and Dump prints its whole state. It is safe for concurrent use.
type Fake struct {
	mu sync.Mutex
	// listing is held while EachVirtualServer's callback runs, as the
	// kernel adapter holds its open listing: a second listing waits.
	listing   sync.Mutex
	services  map[VirtualServerKey]*fakeService
	link      bool // kube-ipvs0 exists
	bound     map[netip.Addr]bool
	nodeAddrs []netip.Addr
	sets      map[string]*fakeSet
	calls     map[string]int
	failures  map[string]error
}

type fakeService struct {
	vs    VirtualServer
	dests map[netip.AddrPort]*RealServer
	// ended counts the connections of a real server, among its inactive
	// ones, that have ended and wait to expire (SetEndedConnections).
	ended map[netip.AddrPort]int
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty kernel: no virtual servers, no kube-ipvs0, no
// node addresses, no sets.
func NewFake() *Fake {
	return &Fake{
		services: map[VirtualServerKey]*fakeService{},
		bound:    map[netip.Addr]bool{},
		sets:     map[string]*fakeSet{},
		calls:    map[string]int{},
		failures: map[string]error{},
	}
}

// schedulers are the IPVS schedulers of Linux (and "none"); the kernel
// refuses others with ENOENT.
var schedulers = []string{"none", "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

// call counts a call of the method and returns the failure set for it.
// The caller holds mu.
func (f *Fake) call(method string) error {
	f.calls[method]++
	err := f.failures[method]
	delete(f.failures, method)
	return err
}

// Calls returns how many times each method was called since NewFake or
// ResetCalls, failed calls included.
func (f *Fake) Calls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.calls)
}

// ResetCalls zeroes the call counts.
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.calls)
}

// FailNext makes the next call of the named method (e.g. "ChangeSets")
// return err without doing anything.
func (f *Fake) FailNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures[method] = err
}

// SetNodeAddresses sets the addresses of the node's links other than
// kube-ipvs0, which NodeAddresses returns filtered as Kernel filters them.
func (f *Fake) SetNodeAddresses(addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodeAddrs = slices.Clone(addrs)
}

// SetConnections sets a real server's connection counts, as traffic would.
func (f *Fake) SetConnections(key VirtualServerKey, rs netip.AddrPort, active, inactive int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.dest(key, rs)
	if err != nil {
		return err
	}
	d.ActiveConns, d.InactiveConns = active, inactive
	return nil
}

func (f *Fake) VirtualServers() ([]VirtualServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VirtualServers"); err != nil {
		return nil, err
	}
	var vss []VirtualServer
	for _, s := range f.sortedServices() {
		vss = append(vss, s.vs)
	}
	return vss, nil
}

func (f *Fake) AddVirtualServer(vs VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("AddVirtualServer"); err != nil {
		return err
	}
	if err := checkVirtualServer(vs); err != nil {
		return err
	}
	if f.services[vs.VirtualServerKey] != nil {
		return fmt.Errorf("adding IPVS virtual server %s: %w", vs.VirtualServerKey, syscall.EEXIST)
	}
	vs.Flags &^= FlagHashed
	f.services[vs.VirtualServerKey] = &fakeService{vs: vs, dests: map[netip.AddrPort]*RealServer{}}
	return nil
}

func (f *Fake) UpdateVirtualServer(vs VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("UpdateVirtualServer"); err != nil {
		return err
	}
	s, err := f.service(vs.VirtualServerKey)
	if err != nil {
		return err
	}
	if err := checkVirtualServer(vs); err != nil {
		return err
	}
	vs.Flags &^= FlagHashed
	s.vs = vs
	return nil
}

func (f *Fake) DeleteVirtualServer(key VirtualServerKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("DeleteVirtualServer"); err != nil {
		return err
	}
	if _, err := f.service(key); err != nil {
		return err
	}
	delete(f.services, key)
	return nil
}

// RealServers of a virtual server that does not exist is an empty list,
// as the kernel's dump of its destinations.
func (f *Fake) RealServers(key VirtualServerKey) ([]RealServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("RealServers"); err != nil {
		return nil, err
	}
	rss := []RealServer{}
	if s := f.services[key]; s != nil {
		for _, d := range s.sortedDests() {
			rss = append(rss, *d)
		}
	}
	return rss, nil
}

// SetEndedConnections says that ended of the real server's inactive
// connections have ended (TCP in TIME_WAIT), as traffic would.
func (f *Fake) SetEndedConnections(key VirtualServerKey, rs netip.AddrPort, ended int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.dest(key, rs)
	if err != nil {
		return err
	}
	if ended > d.InactiveConns {
		return fmt.Errorf("%d ended connections of %s, more than its %d inactive ones", ended, rs, d.InactiveConns)
	}
	s := f.services[key]
	if s.ended == nil {
		s.ended = map[netip.AddrPort]int{}
	}
	s.ended[rs] = ended
	return nil
}

func (f *Fake) OpenConnections() (OpenConnections, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("OpenConnections"); err != nil {
		return nil, err
	}
	open := OpenConnections{}
	for key, s := range f.services {
		for addr, d := range s.dests {
			if n := d.ActiveConns + d.InactiveConns - s.ended[addr]; n > 0 {
				if open[key] == nil {
					open[key] = map[netip.AddrPort]int{}
				}
				open[key][addr] = n
			}
		}
	}
	return open, nil
}

func (f *Fake) EachVirtualServer(each func(key VirtualServerKey, reals []RealServer) error) error {
	f.listing.Lock()
	defer f.listing.Unlock()
	f.mu.Lock()
	if err := f.call("EachVirtualServer"); err != nil {
		f.mu.Unlock()
		return err
	}
	all := map[VirtualServerKey][]RealServer{}
	for key, s := range f.services {
		all[key] = []RealServer{}
		for _, d := range s.sortedDests() {
			all[key] = append(all[key], *d)
		}
	}
	// Called without the lock, as the kernel's listing calls it while the
	// syncer may be writing.
	f.mu.Unlock()
	for key, reals := range all {
		if err := each(key, reals); err != nil {
			return err
		}
	}
	return nil
}

func (f *Fake) AddRealServer(key VirtualServerKey, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("AddRealServer"); err != nil {
		return err
	}
	s, err := f.service(key)
	if err != nil {
		return err
	}
	if err := checkRealServer(key, rs); err != nil {
		return err
	}
	if s.dests[rs.AddrPort()] != nil {
		return fmt.Errorf("adding real server %s of IPVS virtual server %s: %w", rs.AddrPort(), key, syscall.EEXIST)
	}
	// Connections come from traffic (SetConnections). The kernel would
	// bring back the counts of a real server deleted moments ago, which
	// it keeps while connections use it; the fake forgets them.
	rs.ActiveConns, rs.InactiveConns = 0, 0
	s.dests[rs.AddrPort()] = &rs
	return nil
}

// UpdateRealServer changes the weight, as the kernel does; the connection
// counts stay.
func (f *Fake) UpdateRealServer(key VirtualServerKey, rs RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("UpdateRealServer"); err != nil {
		return err
	}
	d, err := f.dest(key, rs.AddrPort())
	if err != nil {
		return err
	}
	if err := checkRealServer(key, rs); err != nil {
		return err
	}
	d.Weight = rs.Weight
	return nil
}

func (f *Fake) DeleteRealServer(key VirtualServerKey, rs netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("DeleteRealServer"); err != nil {
		return err
	}
	if _, err := f.dest(key, rs); err != nil {
		return err
	}
	delete(f.services[key].dests, rs)
	delete(f.services[key].ended, rs)
	return nil
}

// service returns the virtual server or the kernel's ESRCH.
func (f *Fake) service(key VirtualServerKey) (*fakeService, error) {
	s := f.services[key]
	if s == nil {
		return nil, fmt.Errorf("IPVS virtual server %s: %w", key, syscall.ESRCH)
	}
	return s, nil
}

// dest returns the real server, or the kernel's ESRCH for a missing
// virtual server and ENOENT for a missing real server.
func (f *Fake) dest(key VirtualServerKey, rs netip.AddrPort) (*RealServer, error) {
	s, err := f.service(key)
	if err != nil {
		return nil, err
	}
	d := s.dests[rs]
	if d == nil {
		return nil, fmt.Errorf("real server %s of IPVS virtual server %s: %w", rs, key, syscall.ENOENT)
	}
	return d, nil
}

func checkVirtualServer(vs VirtualServer) error {
	if !vs.Addr.IsValid() || vs.Addr.Is4In6() {
		return fmt.Errorf("IPVS virtual server %s: invalid address", vs.VirtualServerKey)
	}
	if _, ok := protocolNumbers[vs.Protocol]; !ok {
		return fmt.Errorf("IPVS virtual server %s: unknown protocol %q", vs.VirtualServerKey, vs.Protocol)
	}
	if !slices.Contains(schedulers, vs.Scheduler) {
		return fmt.Errorf("IPVS virtual server %s: scheduler %q: %w", vs.VirtualServerKey, vs.Scheduler, syscall.ENOENT)
	}
	return nil
}

// checkRealServer refuses what the kernel refuses for a masquerading
// destination: another family than the virtual server's (EINVAL), a
// negative weight (ERANGE).
func checkRealServer(key VirtualServerKey, rs RealServer) error {
	if !rs.Addr.IsValid() || rs.Addr.Is4In6() || rs.Addr.Is6() != key.Addr.Is6() {
		return fmt.Errorf("real server %s of IPVS virtual server %s: %w", rs.AddrPort(), key, syscall.EINVAL)
	}
	if rs.Weight < 0 {
		return fmt.Errorf("real server %s of IPVS virtual server %s: weight %d: %w", rs.AddrPort(), key, rs.Weight, syscall.ERANGE)
	}
	return nil
}

func (f *Fake) EnsureDummyLink() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("EnsureDummyLink"); err != nil {
		return err
	}
	f.link = true
	return nil
}

func (f *Fake) BoundAddresses() ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("BoundAddresses"); err != nil {
		return nil, err
	}
	if err := f.checkLink(); err != nil {
		return nil, err
	}
	return slices.SortedFunc(maps.Keys(f.bound), netip.Addr.Compare), nil
}

// Bind adds the address; one already there is not an error, as in Kernel.
func (f *Fake) Bind(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Bind"); err != nil {
		return err
	}
	if !a.IsValid() || a.Is4In6() {
		return fmt.Errorf("binding %v: invalid address", a)
	}
	if err := f.checkLink(); err != nil {
		return err
	}
	f.bound[a] = true
	return nil
}

// Unbind removes the address; one not there is not an error, as in Kernel.
func (f *Fake) Unbind(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Unbind"); err != nil {
		return err
	}
	if err := f.checkLink(); err != nil {
		return err
	}
	delete(f.bound, a)
	return nil
}

func (f *Fake) checkLink() error {
	if !f.link {
		return fmt.Errorf("looking up link %s: Link not found", DummyLink)
	}
	return nil
}

func (f *Fake) NodeAddresses() ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("NodeAddresses"); err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	for _, a := range f.nodeAddrs {
		if isNodeAddress(a) {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs), nil
}

// Dump prints the whole state, sorted: the virtual servers as `ipvsadm
// -Ln` lists them (without its version line and trailing blanks), the sets
// as `ipset save` writes them (without the kernel's bucketsize and
// initval), then kube-ipvs0 and its addresses (nothing when the link does
// not exist). It does not count as a call.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	b.WriteString("Prot LocalAddress:Port Scheduler Flags\n")
	b.WriteString("  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n")
	for _, s := range f.sortedServices() {
		vs := s.vs
		// An IPv6 address in brackets, as ipvsadm writes it.
		fmt.Fprintf(&b, "%-4s %s %s%s\n", vs.Protocol, netip.AddrPortFrom(vs.Addr, vs.Port), vs.Scheduler, ipvsadmFlags(vs))
		for _, d := range s.sortedDests() {
			fmt.Fprintf(&b, "  -> %-28s %-7s %-6d %-10d %d\n", d.AddrPort(), "Masq", d.Weight, d.ActiveConns, d.InactiveConns)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(f.sets)) {
		s := f.sets[name]
		line, _ := createArgs(s.spec)
		fmt.Fprintf(&b, "create %s\n", strings.TrimSuffix(line, " -exist"))
		for _, e := range slices.Sorted(maps.Keys(s.entries)) {
			fmt.Fprintf(&b, "add %s %s\n", name, e)
		}
	}
	if f.link {
		fmt.Fprintf(&b, "link %s\n", DummyLink)
		for _, a := range slices.SortedFunc(maps.Keys(f.bound), netip.Addr.Compare) {
			family, bits := "inet", 32
			if a.Is6() {
				family, bits = "inet6", 128
			}
			fmt.Fprintf(&b, "    %s %s/%d\n", family, a, bits)
		}
	}
	return b.String()
}

// ipvsadmFlags writes the scheduler flags and persistence as ipvsadm does.
func ipvsadmFlags(vs VirtualServer) string {
	var s string
	if vs.Flags&FlagSourceHash != 0 {
		// The second scheduler flag; sh and mh name it.
		name := "flag-2"
		if vs.Scheduler == "sh" || vs.Scheduler == "mh" {
			name = vs.Scheduler + "-port"
		}
		s += " (" + name + ")"
	}
	if vs.Flags&FlagPersistent != 0 {
		s += fmt.Sprintf(" persistent %d", vs.Timeout)
	}
	if other := vs.Flags &^ (FlagPersistent | FlagSourceHash); other != 0 {
		s += fmt.Sprintf(" flags %#x", other)
	}
	return s
}

func (f *Fake) sortedServices() []*fakeService {
	return slices.SortedFunc(maps.Values(f.services), func(a, b *fakeService) int {
		if c := a.vs.Addr.Compare(b.vs.Addr); c != 0 {
			return c
		}
		if a.vs.Port != b.vs.Port {
			return int(a.vs.Port) - int(b.vs.Port)
		}
		return strings.Compare(string(a.vs.Protocol), string(b.vs.Protocol))
	})
}

func (s *fakeService) sortedDests() []*RealServer {
	return slices.SortedFunc(maps.Values(s.dests), func(a, b *RealServer) int {
		return a.AddrPort().Compare(b.AddrPort())
	})
}
