package nfacct

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// An object is created once, counts what a rule sends through it, cannot
// be deleted while the rule uses it, and is gone once deleted.
func TestObjectLifecycle(t *testing.T) {
	netns := testutil.NewNetns(t)
	testutil.RequireCommands(t, "iptables-nft")
	testutil.InNetns(t, netns, "ip", "link", "set", "lo", "up")
	const name = "rpx_test_pkts"
	testutil.DoInNetns(t, netns, func() {
		if _, err := Get(name); !errors.Is(err, unix.ENOENT) {
			if errors.Is(err, unix.EINVAL) {
				testutil.Skip(t, "this kernel has no nfnetlink_acct")
			}
			t.Fatalf("before creation: got %v, want ENOENT", err)
		}
		for range 2 {
			if err := Ensure(name); err != nil {
				t.Fatal(err)
			}
		}
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		port := strconv.Itoa(conn.LocalAddr().(*net.UDPAddr).Port)
		rule := []string{"OUTPUT", "-o", "lo", "-p", "udp", "--dport", port, "-m", "nfacct", "--nfacct-name", name}
		testutil.InNetns(t, netns, append([]string{"iptables-nft", "-A"}, rule...)...)
		for range 3 {
			if _, err := conn.WriteTo([]byte("x"), conn.LocalAddr()); err != nil {
				t.Fatal(err)
			}
		}
		c, err := Get(name)
		if err != nil || c.Name != name || c.Packets != 3 || c.Bytes != 3*29 {
			t.Errorf("after 3 datagrams: %+v, %v; want 3 packets of 29 bytes", c, err)
		}
		// A second Ensure leaves the counts alone.
		if err := Ensure(name); err != nil {
			t.Fatal(err)
		}
		if c, _ := Get(name); c.Packets != 3 {
			t.Errorf("Ensure of an existing object reset it: %+v", c)
		}
		if err := Delete(name); !errors.Is(err, unix.EBUSY) {
			t.Errorf("deleting an object a rule uses: got %v, want EBUSY", err)
		}
		testutil.InNetns(t, netns, append([]string{"iptables-nft", "-D"}, rule...)...)
		if err := Delete(name); err != nil {
			t.Fatal(err)
		}
		if _, err := Get(name); !errors.Is(err, unix.ENOENT) {
			t.Errorf("after deletion: got %v, want ENOENT", err)
		}
	})
}

func TestNamesAreChecked(t *testing.T) {
	for _, name := range []string{"", strings.Repeat("x", MaxNameLength+1)} {
		if err := Ensure(name); err == nil || !strings.Contains(err.Error(), "want 1 to 31 bytes") {
			t.Errorf("Ensure(%q): %v", name, err)
		}
	}
}
