package vm

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// The guest's network (Config.Network): a point-to-point /30 on a tap in
// the host namespace, next to the local cluster's addresses (see
// test/framework's doc.go), which do not use 10.255.4.0/24.
const (
	// TapName is the host end. Its prefix is the unit tests' "rpxt-", not
	// the cluster's "rpx-": a cluster starting removes every "rpx-" link it
	// finds, and a VM test does not hold the cluster's lock.
	TapName = "rpxt-vm0"
	HostIP  = "10.255.4.1"
	GuestIP = "10.255.4.2"
	// APIServerRoute is the cluster's host-to-node link, where the API
	// server listens (framework.APIServerIP); the guest routes it via HostIP.
	APIServerRoute = "10.255.0.0/30"
)

// netLock serializes networked VMs: they would share the tap's name and addresses.
const netLock = "/run/rapidproxy/vm-net.lock"

// setUpTap creates the tap, waiting for any other networked VM to end
// first, and returns what removes it. The host forwards nothing that
// arrives on it and it carries no IPv6, so the guest reaches this
// machine's own addresses only.
func setUpTap(logf func(string, ...any)) (remove func(), err error) {
	if err := os.MkdirAll(filepath.Dir(netLock), 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(netLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		logf("vm: waiting for the other networked VM to end (%s)", netLock)
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			lock.Close()
			return nil, err
		}
	}
	remove = func() {
		_ = exec.Command("ip", "link", "delete", TapName).Run()
		lock.Close()
	}
	// Holding the lock, a tap of that name can only be a killed run's.
	_ = exec.Command("ip", "link", "delete", TapName).Run()
	steps := [][]string{
		{"ip", "tuntap", "add", "dev", TapName, "mode", "tap"},
		{"sysctl", "-qw", "net.ipv4.conf." + TapName + ".forwarding=0", "net.ipv6.conf." + TapName + ".disable_ipv6=1"},
		{"ip", "addr", "add", HostIP + "/30", "dev", TapName},
		{"ip", "link", "set", TapName, "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			remove()
			return nil, fmt.Errorf("%v: %v: %s", s, err, out)
		}
	}
	return remove, nil
}

// Underlay is a guest's link on a bridge in a network namespace of the
// caller's (test/framework's underlay for real nodes), through a tap of
// its own there (Config.Underlay); qemu runs in that namespace. The guest
// has GuestCIDR on eth0 and no route beyond the bridge's subnet but what
// its script adds.
type Underlay struct {
	Netns, Bridge, Tap string
	GuestCIDR          string // "10.255.0.3/24"
}

// GuestIP is the guest's address on the underlay.
func (u *Underlay) GuestIP() string {
	ip, _, _ := strings.Cut(u.GuestCIDR, "/")
	return ip
}

// mac is the guest's link's address, from its IP: qemu gives every guest
// the same one, and guests on one bridge need their own.
func (u *Underlay) mac() string {
	ip := netip.MustParsePrefix(u.GuestCIDR).Addr().As4()
	return fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", ip[0], ip[1], ip[2], ip[3])
}

// setUp makes the tap on the bridge and returns what removes it (the
// namespace's removal, after a killed run, takes it too).
func (u *Underlay) setUp() (remove func(), err error) {
	remove = func() { _ = exec.Command("ip", "-n", u.Netns, "link", "delete", u.Tap).Run() }
	remove()
	for _, s := range [][]string{
		{"ip", "-n", u.Netns, "tuntap", "add", "dev", u.Tap, "mode", "tap"},
		{"ip", "-n", u.Netns, "link", "set", u.Tap, "master", u.Bridge},
		{"ip", "-n", u.Netns, "link", "set", u.Tap, "up"},
	} {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			remove()
			return nil, fmt.Errorf("%v: %v: %s", s, err, out)
		}
	}
	return remove, nil
}
