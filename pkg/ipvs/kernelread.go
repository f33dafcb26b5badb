package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/readahead"

	"k8s.io/klog/v2"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// kernelObjects is what a full sync found in the kernel.
type kernelObjects struct {
	servers map[ipvskernel.VirtualServerKey]ipvskernel.VirtualServer
	// reals are as the kernel lists them: a map per virtual server held
	// some 5 MB more at a restart's peak at 10,000 services x 5 endpoints.
	reals   map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer
	bound   map[netip.Addr]bool
	entries map[string]map[string]bool
}

// preparedKernel is what Prepare read, with the sets' entry counts while
// it read, by which the first full sync judges whether it still holds.
type preparedKernel = readahead.Read[*kernelObjects, map[string]int]

// maxPreparedAge is how old a read Prepare made may be for the first sync
// to take it: the informers' lists take seconds; a start that waited
// longer (the API server out of reach) reads again.
const maxPreparedAge = time.Minute

// Prepare reads the kernel while the informers list, before the first
// sync: a restart at 10,000 services spends seconds reading every real
// server (under emulation), the sets' entries and the iptables tables.
// The first full sync takes the read if it still holds (takePrepared).
// It writes nothing: a first start's sets and link are made by the sync.
func (p *Syncer) Prepare() {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	servers := 0
	p.prepared = readahead.Make(p.setSizes(), func() (*kernelObjects, error) {
		objects, err := p.readKernel()
		if err == nil {
			servers = len(objects.servers)
		}
		return objects, err
	})
	if p.prepared == nil {
		return
	}
	p.chains.Prepare(p.cfg.Params.Chains(func(string) bool { return false }, nil))
	klog.V(2).InfoS("Read the kernel before the first sync", "ipFamily", p.cfg.Family,
		"virtualServers", servers, "elapsed", time.Since(start))
}

// setSizes is the version a read of the mode's kernel state holds for.
// The iptables tables have generations, which ChainSet checks. IPVS, the
// link's addresses and ipsets have none: the sets' entry counts (one
// netlink dump of their headers, no process) stand in.
func (p *Syncer) setSizes() readahead.Version[map[string]int] {
	return readahead.Version[map[string]int]{
		Read: func() map[string]int {
			sizes, err := p.cfg.Kernel.SetSizes(p.setNames())
			if err != nil {
				return nil
			}
			return sizes
		},
		Same: func(a, b map[string]int) bool { return a != nil && b != nil && maps.Equal(a, b) },
	}
}

// takePrepared returns what Prepare read if it still holds, else nil; only
// the first full sync gets it. The sets' entry counts must be those
// Prepare saw and the read at most maxPreparedAge old; another program's
// change to the virtual servers, real servers or addresses in those
// seconds is not seen then, as one landing just after any full sync's
// read is not, and the drift check's listings repair it later
// (docs/reliability.md).
func (p *Syncer) takePrepared() *kernelObjects {
	prepared := p.prepared
	p.prepared = nil
	if prepared == nil {
		return nil
	}
	sizes := p.setSizes()
	objects, _ := prepared.Take(sizes, sizes.Read(), maxPreparedAge)
	return objects
}

func (p *Syncer) setNames() []string {
	var names []string
	for _, s := range p.cfg.Params.Sets() {
		names = append(names, s.Name)
	}
	return names
}

func (p *Syncer) readKernel() (*kernelObjects, error) {
	k := p.cfg.Kernel
	current := &kernelObjects{
		servers: map[ipvskernel.VirtualServerKey]ipvskernel.VirtualServer{},
		bound:   map[netip.Addr]bool{}, entries: map[string]map[string]bool{},
	}
	servers, err := k.VirtualServers()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	current.reals = make(map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer, len(servers))
	err = k.EachVirtualServer(func(key ipvskernel.VirtualServerKey, reals []ipvskernel.RealServer) error {
		current.reals[key] = slices.Clone(reals)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing IPVS real servers: %w", err)
	}
	for _, vs := range servers {
		current.servers[vs.VirtualServerKey] = vs
		if _, ok := current.reals[vs.VirtualServerKey]; !ok {
			current.reals[vs.VirtualServerKey] = nil // listed: none
		}
	}
	bound, err := k.BoundAddresses()
	if err != nil {
		return nil, fmt.Errorf("listing the addresses of %s: %w", ipvskernel.DummyLink, err)
	}
	for _, a := range bound {
		current.bound[a] = true
	}
	entries, err := k.SetEntries(p.setNames())
	if err != nil {
		return nil, fmt.Errorf("listing the ipsets: %w", err)
	}
	for set, list := range entries {
		current.entries[set] = map[string]bool{}
		for _, e := range list {
			current.entries[set][e] = true
		}
	}
	return current, nil
}

// readReals lists the real servers of the virtual servers a partial sync
// keeps (wanted now and applied before), with their weights and
// connections, before it decides anything.
func (p *Syncer) readReals(wanted map[state.ServicePortName]ServiceObjects) (map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer, error) {
	listed := map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer{}
	for name, objects := range wanted {
		applied := p.applied[name].Servers
		for _, s := range objects.Servers {
			if findServer(applied, s.VirtualServerKey) == nil {
				continue
			}
			reals, err := p.cfg.Kernel.RealServers(s.VirtualServerKey)
			if err != nil {
				return nil, fmt.Errorf("listing the real servers of %s: %w", s.VirtualServerKey, err)
			}
			listed[s.VirtualServerKey] = reals
		}
	}
	return listed, nil
}
