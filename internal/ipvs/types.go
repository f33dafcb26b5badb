package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
)

// DummyLink holds the service addresses in IPVS mode, so the node accepts
// traffic to them.
const DummyLink = "kube-ipvs0"

// Virtual-server flags kube-proxy sets, as the kernel numbers them.
const (
	// FlagPersistent makes a virtual server keep a client on one real
	// server for Timeout seconds: ClientIP session affinity.
	FlagPersistent uint32 = 0x1
	// FlagHashed is set by the kernel on every virtual server; it is
	// ignored when comparing.
	FlagHashed uint32 = 0x2
	// FlagSourceHash is what the mh scheduler needs.
	FlagSourceHash uint32 = 0x10
)

// VirtualServerKey identifies a virtual server: the kernel keys them by
// address, port and protocol.
type VirtualServerKey struct {
	Addr     netip.Addr
	Port     uint16
	Protocol v1.Protocol
}

func (k VirtualServerKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Protocol)
}

// Compare orders keys by address, port, then protocol.
func (k VirtualServerKey) Compare(o VirtualServerKey) int {
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Port, o.Port); c != 0 {
		return c
	}
	return cmp.Compare(k.Protocol, o.Protocol)
}

// VirtualServer is one IPVS service as kube-proxy programs it.
type VirtualServer struct {
	VirtualServerKey
	Scheduler string
	// Flags holds FlagPersistent and FlagSourceHash; never FlagHashed.
	Flags uint32
	// Timeout is the persistence timeout in seconds.
	Timeout uint32
}

// RealServer is one destination of a virtual server; kube-proxy always
// uses masquerading (NAT) forwarding.
type RealServer struct {
	Addr   netip.Addr
	Port   uint16
	Weight int
	// ActiveConns and InactiveConns are read from the kernel; they decide
	// when a draining real server can go.
	ActiveConns   int
	InactiveConns int
}

// AddrPort is the real server's address and port, its key within a
// virtual server.
func (r RealServer) AddrPort() netip.AddrPort { return netip.AddrPortFrom(r.Addr, r.Port) }

// SetType is an ipset type kube-proxy uses.
type SetType string

const (
	HashIP        SetType = "hash:ip"
	HashIPPort    SetType = "hash:ip,port"
	HashIPPortIP  SetType = "hash:ip,port,ip"
	HashIPPortNet SetType = "hash:ip,port,net"
	BitmapPort    SetType = "bitmap:port"
)

// SetSpec is how an ipset is created: the hash types with the family,
// hashsize 1024 and maxelem 65536, bitmap:port with range 0-65535, as
// upstream creates them.
type SetSpec struct {
	Name string
	Type SetType
	IPv6 bool
	// MaxElem is a hash set's maxelem; 0 means MaxSetEntries.
	MaxElem int
}

// MaxSetEntries is the maxelem the hash sets are created with.
const MaxSetEntries = 65536

// Limit is how many entries a hash set takes (its maxelem: MaxElem, or
// MaxSetEntries if that is 0); 0 for a bitmap:port set, which holds its
// whole range (0-65535) and so cannot overflow.
func (s SetSpec) Limit() int {
	if s.Type == BitmapPort {
		return 0
	}
	if s.MaxElem > 0 {
		return s.MaxElem
	}
	return MaxSetEntries
}

// SetChange adds or deletes one entry of one set, written as ipset
// prints it (e.g. "10.96.0.1,tcp:80").
type SetChange struct {
	Set    string
	Entry  string
	Delete bool
}

// Interface is what the IPVS mode needs from the kernel, for one IP family:
// IPVS over netlink, the addresses of the dummy link, and ipsets. Each
// method is one small request; none starts a process per entry.
type Interface interface {
	// VirtualServers lists every virtual server of the family, with
	// FlagHashed cleared.
	VirtualServers() ([]VirtualServer, error)
	AddVirtualServer(vs VirtualServer) error
	UpdateVirtualServer(vs VirtualServer) error
	DeleteVirtualServer(key VirtualServerKey) error
	// RealServers lists a virtual server's destinations with their
	// connection counts.
	RealServers(key VirtualServerKey) ([]RealServer, error)
	// EachVirtualServer reads every virtual server of the family with its
	// destinations at once (a restart at 10k services would otherwise send
	// 10k requests), calling each with one at a time as it is read (reals
	// is empty when it has none, and reused after each returns): neither
	// a reader nor the kernel holds the whole listing. An error from each
	// ends the read with that error.
	EachVirtualServer(each func(key VirtualServerKey, reals []RealServer) error) error
	// OpenConnections counts the connections of each virtual and real
	// server of the family that have not ended.
	OpenConnections() (OpenConnections, error)
	AddRealServer(key VirtualServerKey, rs RealServer) error
	UpdateRealServer(key VirtualServerKey, rs RealServer) error
	DeleteRealServer(key VirtualServerKey, rs netip.AddrPort) error

	// EnsureDummyLink creates the kube-ipvs0 dummy link if it is missing.
	EnsureDummyLink() error
	// BoundAddresses are the family's addresses on kube-ipvs0.
	BoundAddresses() ([]netip.Addr, error)
	// Bind and Unbind add and remove a /32 (/128) on kube-ipvs0.
	Bind(a netip.Addr) error
	Unbind(a netip.Addr) error
	// NodeAddresses are the family's addresses on every link but
	// kube-ipvs0, without loopback and IPv6 link-local ones (as upstream).
	NodeAddresses() ([]netip.Addr, error)

	// EnsureSets creates the sets that are missing (never changing one
	// that exists).
	EnsureSets(sets []SetSpec) error
	// SetEntries lists the entries of the named sets that exist.
	SetEntries(names []string) (map[string][]string, error)
	// SetSizes counts the entries of the named sets that exist, without
	// listing them: the drift check's read, every second or so.
	SetSizes(names []string) (map[string]int, error)
	// ChangeSets applies the changes in one go (one `ipset restore`
	// process, or netlink): adding an entry that is there or deleting
	// one that is not is not an error.
	ChangeSets(changes []SetChange) error
}
