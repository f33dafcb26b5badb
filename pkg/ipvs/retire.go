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
// while any of its real servers has connections (all go when force), and
// an address stays bound while a remaining virtual server uses it. The
// new mode's rules take every new connection before routing, so what
// stays serves only the old ones. The link itself and the ipsets go with
// Cleanup once none drains.
func Retire(k ipvskernel.Interface, excludeCIDRs []netip.Prefix, force bool) (Retired, error) {
	var errs []error
	var r Retired
	kept := map[netip.Addr]bool{}
	var remove []ipvskernel.VirtualServerKey
	err := k.EachVirtualServer(func(key ipvskernel.VirtualServerKey, reals []ipvskernel.RealServer) error {
		if slices.ContainsFunc(excludeCIDRs, func(p netip.Prefix) bool { return p.Contains(key.Addr) }) {
			kept[key.Addr] = true // another program's
			return nil
		}
		if slices.ContainsFunc(reals, func(rs ipvskernel.RealServer) bool { return rs.ActiveConns+rs.InactiveConns > 0 }) {
			if !force {
				kept[key.Addr] = true
				r.Draining++
				return nil
			}
			r.Cut = append(r.Cut, key)
		}
		remove = append(remove, key)
		return nil
	})
	if err != nil {
		return Retired{}, fmt.Errorf("listing the IPVS virtual servers: %w", err)
	}
	for _, key := range remove {
		if err := k.DeleteVirtualServer(key); err != nil {
			errs = append(errs, fmt.Errorf("deleting virtual server %s: %w", key, err))
			continue
		}
		r.Removed++
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

// Retired is what one round of Retire did: how many virtual servers it
// removed and how many still drain; Cut are those removed with
// connections (force).
type Retired struct {
	Removed, Draining int
	Cut               []ipvskernel.VirtualServerKey
}
