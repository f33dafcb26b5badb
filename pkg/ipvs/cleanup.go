// Package ipvs is the IPVS mode: plan.go decides each service port's
// virtual servers, addresses and set entries (a pure function), rules.go
// the iptables chains around the sets; a sync (proxier.go) reads what it
// compares (kernelread.go), decides an ordered plan of what to send for
// the service ports that changed (diff.go), sends it (ops.go) and
// publishes what it applied (snapshot.go) for the drift check (drift.go);
// cleanup.go removes what the mode (ours or upstream's) leaves on a node.
package ipvs

import (
	"errors"
	"fmt"
	"net/netip"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
)

// IsKubeProxySet tells whether an ipset is one the IPVS mode creates, in
// either family.
func IsKubeProxySet(name string) bool {
	for _, ipv6 := range []bool{false, true} {
		p := Params{IPv6: ipv6}
		for _, s := range setTypes {
			if name == p.setName(s.name) {
				return true
			}
		}
	}
	return false
}

// Cleanup removes what the IPVS mode leaves on a node: every virtual
// server in kernels (one per family; none where IPVS is not loaded) but
// those in excludeCIDRs, which belong to other programs, the dummy link
// and the ipsets; it says what it removed. The iptables rules that use the
// ipsets must be gone first: the kernel keeps a set in use.
func Cleanup(kernels []ipvskernel.Interface, excludeCIDRs []netip.Prefix) ([]string, error) {
	var removed []string
	var errs []error
	deleted := 0
	for _, k := range kernels {
		r, err := Retire(k, excludeCIDRs, true)
		if err != nil {
			errs = append(errs, err)
		}
		deleted += r.Removed
	}
	if deleted > 0 {
		removed = append(removed, fmt.Sprintf("%d IPVS virtual servers", deleted))
	}
	if found, err := ipvskernel.DeleteDummyLink(); err != nil {
		errs = append(errs, err)
	} else if found {
		removed = append(removed, "link "+ipvskernel.DummyLink)
	}
	sets, err := CleanupSets()
	removed = append(removed, sets...)
	if err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// CleanupSets destroys the ipsets the IPVS mode leaves (in either family)
// and says which. The iptables rules that use them must be gone first.
func CleanupSets() ([]string, error) {
	destroyed, err := ipvskernel.DestroySets(IsKubeProxySet)
	var removed []string
	for _, name := range destroyed {
		removed = append(removed, "ipset "+name)
	}
	return removed, err
}
