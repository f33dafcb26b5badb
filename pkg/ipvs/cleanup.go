// Package ipvs is the IPVS mode. For now it holds what --cleanup needs to
// remove what upstream's IPVS mode leaves on a node; the mode itself
// comes later.
package ipvs

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
)

// DummyLink holds the service addresses in IPVS mode, so the node accepts
// traffic to them.
const DummyLink = "kube-ipvs0"

// ipsetNames are the sets the IPVS mode creates, per family ("KUBE-6-"
// for IPv6).
var ipsetNames = []string{
	"LOOP-BACK", "CLUSTER-IP", "EXTERNAL-IP", "EXTERNAL-IP-LOCAL",
	"LOAD-BALANCER", "LOAD-BALANCER-LOCAL", "LOAD-BALANCER-FW",
	"LOAD-BALANCER-SOURCE-IP", "LOAD-BALANCER-SOURCE-CIDR",
	"NODE-PORT-TCP", "NODE-PORT-LOCAL-TCP", "NODE-PORT-UDP", "NODE-PORT-LOCAL-UDP",
	"NODE-PORT-SCTP-HASH", "NODE-PORT-LOCAL-SCTP-HASH", "HEALTH-CHECK-NODE-PORT", "IPVS-IPS",
}

// isKubeProxySet tells whether an ipset is one the IPVS mode creates.
func isKubeProxySet(name string) bool {
	for _, prefix := range []string{"KUBE-", "KUBE-6-"} {
		if rest, ok := strings.CutPrefix(name, prefix); ok && slices.Contains(ipsetNames, rest) {
			return true
		}
	}
	return false
}

// Cleanup removes the IPVS virtual servers, the dummy link and the ipsets
// the IPVS mode leaves, and says what it removed. The iptables rules that
// use the ipsets must be gone first: the kernel keeps a set in use.
func Cleanup() ([]string, error) {
	var removed []string
	var errs []error
	// As upstream: without the ip_vs module there is no IPVS state, and
	// asking netlink for it would only log errors.
	if exec.Command("modprobe", "-q", "ip_vs").Run() == nil {
		if h, err := libipvs.New(""); err == nil {
			services, _ := h.GetServices()
			if err := h.Flush(); err != nil {
				errs = append(errs, fmt.Errorf("flushing IPVS: %w", err))
			} else if len(services) > 0 {
				removed = append(removed, fmt.Sprintf("%d IPVS virtual servers", len(services)))
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
	if out, err := exec.Command("ipset", "list", "-n").Output(); err == nil {
		for _, name := range strings.Fields(string(out)) {
			if !isKubeProxySet(name) {
				continue
			}
			if out, err := exec.Command("ipset", "destroy", name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ipset destroy %s: %w: %s", name, err, strings.TrimSpace(string(out))))
				continue
			}
			removed = append(removed, "ipset "+name)
		}
	}
	return removed, errors.Join(errs...)
}
