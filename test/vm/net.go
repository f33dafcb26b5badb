package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
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

// setUpTap creates the tap and removes it when the test ends. The host
// forwards nothing that arrives on it and it carries no IPv6, so the guest
// reaches this machine's own addresses only.
func setUpTap(t testing.TB) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(netLock), 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(netLock, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	// Holding the lock, a tap of that name can only be a killed run's.
	_ = exec.Command("ip", "link", "delete", TapName).Run()
	if out, err := exec.Command("ip", "tuntap", "add", "dev", TapName, "mode", "tap").CombinedOutput(); err != nil {
		t.Fatalf("vm: creating %s: %v: %s", TapName, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "delete", TapName).Run() })
	steps := [][]string{
		{"sysctl", "-qw", "net.ipv4.conf." + TapName + ".forwarding=0", "net.ipv6.conf." + TapName + ".disable_ipv6=1"},
		{"ip", "addr", "add", HostIP + "/30", "dev", TapName},
		{"ip", "link", "set", TapName, "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("vm: %v: %v: %s", s, err, out)
		}
	}
}
