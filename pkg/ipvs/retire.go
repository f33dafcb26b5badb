package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
)

// Retire is one round of taking the IPVS mode's objects off a node that
// runs another mode now: IPVS keeps its own connection table, and a
// connection it forwards breaks when its virtual server or real server
// goes, or when the address it was sent to leaves kube-ipvs0 (the packets
// then no longer reach IPVS at LOCAL_IN). So each virtual server stays
// while any of its real servers has a connection that has not ended (all
// go when force), and an address stays bound while a remaining virtual
// server uses it. The new mode's rules take every new connection before
// routing, so what stays serves only the old ones. The link itself and
// the ipsets go with Cleanup once none drains.
//
// A real server whose connections have all ended (TCP in TIME_WAIT) goes
// at once, its virtual server with it when no other of its real servers
// has an open one: when an entry of IPVS's table expires, the kernel
// (ip_vs_conn_drop_conntrack) deletes the conntrack entry of the same
// client address and port and virtual address and port, whoever owns it.
// Left to expire (2 minutes after the connection ended), an entry would
// delete the entry of a new connection from a reused client port that the
// new mode serves, and that connection would break. Deleted with its real
// server (expire_nodest_conn, SetDrainSysctls), the entry expires while
// no client can have reused the port: a client that closed keeps the port
// a minute in TIME_WAIT.
func Retire(k ipvskernel.Interface, excludeCIDRs []netip.Prefix, force bool) (Retired, error) {
	var errs []error
	var r Retired
	open, err := k.OpenConnections()
	if err != nil {
		// Without the table, every connection counts as open: what has
		// any stays.
		errs = append(errs, fmt.Errorf("reading the IPVS connection table: %w", err))
	}
	kept := map[netip.Addr]bool{}
	var remove []ipvskernel.VirtualServerKey
	var ended []endedReal
	err = k.EachVirtualServer(func(key ipvskernel.VirtualServerKey, reals []ipvskernel.RealServer) error {
		if slices.ContainsFunc(excludeCIDRs, func(p netip.Prefix) bool { return p.Contains(key.Addr) }) {
			kept[key.Addr] = true // another program's
			return nil
		}
		serving := false
		var done []endedReal
		for _, rs := range reals {
			switch {
			case rs.ActiveConns+rs.InactiveConns == 0:
			case open == nil || open[key][rs.AddrPort()] > 0:
				serving = true
			default:
				done = append(done, endedReal{key, rs.AddrPort()})
			}
		}
		switch {
		case serving && !force:
			kept[key.Addr] = true
			r.Draining++
			ended = append(ended, done...)
		case serving:
			r.Cut = append(r.Cut, key)
			remove = append(remove, key)
		default:
			remove = append(remove, key)
		}
		return nil
	})
	if err != nil {
		return Retired{}, errors.Join(append(errs, fmt.Errorf("listing the IPVS virtual servers: %w", err))...)
	}
	for _, key := range remove {
		if err := k.DeleteVirtualServer(key); err != nil {
			errs = append(errs, fmt.Errorf("deleting virtual server %s: %w", key, err))
			continue
		}
		r.Removed++
	}
	for _, e := range ended {
		if err := k.DeleteRealServer(e.virtual, e.real); err != nil {
			errs = append(errs, fmt.Errorf("deleting real server %s of %s: %w", e.real, e.virtual, err))
			continue
		}
		r.EndedReals++
	}
	bound, err := k.BoundAddresses()
	if err != nil {
		// No kube-ipvs0: nothing is bound.
		return r, errors.Join(errs...)
	}
	for _, a := range bound {
		if !kept[a] {
			if err := k.Unbind(a); err != nil {
				errs = append(errs, fmt.Errorf("unbinding %s from %s: %w", a, ipvskernel.DummyLink, err))
			}
		}
	}
	return r, errors.Join(errs...)
}

// endedReal is a real server of a draining virtual server whose
// connections have all ended.
type endedReal struct {
	virtual ipvskernel.VirtualServerKey
	real    netip.AddrPort
}

// Retired is what one round of Retire did: how many virtual servers it
// removed and how many still drain, and how many real servers of those it
// removed because their connections had ended; Cut are the virtual
// servers removed with connections (force).
type Retired struct {
	Removed, Draining, EndedReals int
	Cut                           []ipvskernel.VirtualServerKey
}
