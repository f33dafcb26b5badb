package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/internal/kernel"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
)

// validScheduler are the names a scheduler module can have (ip_vs_NAME).
var validScheduler = regexp.MustCompile(`^[a-z0-9]+$`)

// DefaultScheduler is upstream's: round robin.
const DefaultScheduler = "rr"

// ModulesDir lists the kernel's loaded modules, each a directory.
const ModulesDir = "/sys/module"

// CheckScheduler tells whether the kernel can run virtual servers with the
// scheduler, by adding one (which loads the scheduler's module) at an
// address reserved for documentation, as upstream does, and removing it.
// The scheduler's module among the loaded ones in modules (it registers
// the scheduler with IPVS as it loads) or a virtual server that uses the
// scheduler proves it already. The module is looked at first: it costs
// no request, where the list of virtual servers took 0.5 s of a restart
// at 10,000 services under emulation.
func CheckScheduler(k ipvskernel.Interface, modules, scheduler string, ipv6 bool) error {
	if validScheduler.MatchString(scheduler) {
		if _, err := os.Stat(filepath.Join(modules, "ip_vs_"+scheduler)); err == nil {
			return nil
		}
	}
	servers, err := k.VirtualServers()
	if err != nil {
		return fmt.Errorf("IPVS is not usable: %w", err)
	}
	for _, vs := range servers {
		if vs.Scheduler == scheduler {
			return nil
		}
	}
	addr := netip.MustParseAddr("198.51.100.0")
	if ipv6 {
		addr = netip.MustParseAddr("2001:db8::") // RFC 3849's
	}
	probe := ipvskernel.VirtualServer{
		VirtualServerKey: ipvskernel.VirtualServerKey{Addr: addr, Port: 20000, Protocol: v1.ProtocolTCP},
		Scheduler:        scheduler,
	}
	if err := k.AddVirtualServer(probe); err != nil {
		return fmt.Errorf("IPVS scheduler %q is not available (kernel module ip_vs_%s): %w", scheduler, scheduler, err)
	}
	return k.DeleteVirtualServer(probe.VirtualServerKey)
}

// Sysctls upstream's IPVS mode sets.
const (
	sysctlConntrack        = "net/ipv4/vs/conntrack"
	sysctlConnReuse        = "net/ipv4/vs/conn_reuse_mode"
	sysctlExpireNoDest     = "net/ipv4/vs/expire_nodest_conn"
	sysctlExpireQuiescent  = "net/ipv4/vs/expire_quiescent_template"
	sysctlForward          = "net/ipv4/ip_forward"
	sysctlArpIgnore        = "net/ipv4/conf/all/arp_ignore"
	sysctlArpAnnounce      = "net/ipv4/conf/all/arp_announce"
	connReuseFixedKernelMj = 5
	connReuseFixedKernelMn = 9
)

// SetSysctls sets what IPVS mode needs: IPVS connections tracked by
// conntrack (so SNAT works), connections to deleted real servers and
// quiescent templates expired, forwarding on, and with strictARP the ARP
// settings that keep the node from answering for kube-ipvs0's addresses.
// conn_reuse_mode is set to 0 only on kernels older than 5.9, where its
// default stalls reused connections for a second.
func SetSysctls(s sysctl.Interface, kernelRelease string, strictARP bool) error {
	want := []sysctlSetting{{sysctlConntrack, 1}, {sysctlExpireNoDest, 1}, {sysctlExpireQuiescent, 1}, {sysctlForward, 1}}
	if !kernelAtLeast(kernelRelease, connReuseFixedKernelMj, connReuseFixedKernelMn) {
		want = append(want, sysctlSetting{sysctlConnReuse, 0})
	}
	if strictARP {
		want = append(want, sysctlSetting{sysctlArpIgnore, 1}, sysctlSetting{sysctlArpAnnounce, 2})
	}
	return setSysctls(s, want)
}

// SetDrainSysctls sets what Retire needs on a node that left the IPVS
// mode: expire_nodest_conn, which the IPVS mode sets too. With it the
// kernel expires the entries of a deleted real server at once, and the
// conntrack entries of the same client address and port with them,
// instead of when each entry times out (up to 2 minutes after a TCP
// connection ended), by which time that conntrack entry may be a new
// connection's that another mode's rules serve.
func SetDrainSysctls(s sysctl.Interface) error {
	return setSysctls(s, []sysctlSetting{{sysctlExpireNoDest, 1}})
}

type sysctlSetting struct {
	name  string
	value int
}

// setSysctls sets each that differs, and says which could not be set.
func setSysctls(s sysctl.Interface, want []sysctlSetting) error {
	var errs []error
	for _, w := range want {
		if v, err := s.Get(w.name); err == nil && v == w.value {
			continue
		}
		if err := s.Set(w.name, w.value); err != nil {
			errs = append(errs, fmt.Errorf("setting %s to %d: %w", w.name, w.value, err))
			continue
		}
		klog.V(2).InfoS("Set sysctl", "name", w.name, "value", w.value)
	}
	return errors.Join(errs...)
}

// KernelRelease is the running kernel's release ("6.1.0-18-amd64"), ""
// when unreadable.
func KernelRelease() string {
	release, _ := kernel.Release()
	return release
}

// kernelAtLeast compares a release's major and minor numbers; an
// unreadable release counts as new enough.
func kernelAtLeast(release string, major, minor int) bool {
	v, err := kernel.ParseVersion(release)
	return err != nil || v.AtLeast(kernel.Version{Major: major, Minor: minor})
}
