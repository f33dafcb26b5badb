// Package ipvs is the IPVS mode: plan.go decides each service port's
// virtual servers, addresses and set entries (a pure function), rules.go
// the iptables chains around the sets, proxier.go makes the kernel hold
// them, changing only what the changed service ports own; cleanup.go
// removes what the mode (ours or upstream's) leaves on a node.
package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
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

// Cleanup removes the IPVS virtual servers (but those in excludeCIDRs,
// which belong to other programs), the dummy link and the ipsets the IPVS
// mode leaves, and says what it removed. The iptables rules that use the
// ipsets must be gone first: the kernel keeps a set in use.
func Cleanup(excludeCIDRs []netip.Prefix) ([]string, error) {
	var removed []string
	var errs []error
	// Without the ip_vs module loaded (or built in) there is no IPVS
	// state, and asking netlink for it would load the module.
	if _, err := os.Stat("/sys/module/ip_vs"); err == nil {
		if h, err := libipvs.New(""); err == nil {
			services, err := h.GetServices()
			if err != nil {
				errs = append(errs, fmt.Errorf("listing IPVS virtual servers: %w", err))
			}
			deleted := 0
			for _, svc := range services {
				addr, _ := netip.AddrFromSlice(svc.Address)
				if slices.ContainsFunc(excludeCIDRs, func(p netip.Prefix) bool { return p.Contains(addr.Unmap()) }) {
					continue
				}
				if err := h.DelService(svc); err != nil {
					errs = append(errs, fmt.Errorf("deleting IPVS virtual server %s:%d: %w", svc.Address, svc.Port, err))
					continue
				}
				deleted++
			}
			if deleted > 0 {
				removed = append(removed, fmt.Sprintf("%d IPVS virtual servers", deleted))
			}
			h.Close()
		}
	}
	if link, err := netlink.LinkByName(DummyLink); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("deleting link %s: %w", DummyLink, err))
		} else {
			removed = append(removed, "link "+DummyLink)
		}
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
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return nil, nil // no ipset tool or module: no sets
	}
	var removed []string
	var errs []error
	for _, name := range strings.Fields(string(out)) {
		if !IsKubeProxySet(name) {
			continue
		}
		if out, err := exec.Command("ipset", "destroy", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %w: %s", name, err, strings.TrimSpace(string(out))))
			continue
		}
		removed = append(removed, "ipset "+name)
	}
	return removed, errors.Join(errs...)
}
