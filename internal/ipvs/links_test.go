package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// linkKernel is the link part of pkg/ipvs.Kernel.
type linkKernel interface {
	EnsureDummyLink() error
	BoundAddresses() ([]netip.Addr, error)
	Bind(netip.Addr) error
	Unbind(netip.Addr) error
	NodeAddresses() ([]netip.Addr, error)
}

// TestLinksKernel runs checkLinks on this machine, whose kernel may have no
// dummy links: kube-ipvs0 is a veth there, which EnsureDummyLink takes as
// it is, as upstream does. The VM test runs it with a real dummy link.
func TestLinksKernel(t *testing.T) {
	ns := testutil.NewNetns(t)
	testutil.InNetns(t, ns, "ip", "link", "add", DummyLink, "type", "veth", "peer", "name", "rpxt-ipvs-peer")
	var k4, k6 *links
	testutil.DoInNetns(t, ns, func() {
		var err error
		if k4, err = newLinks(false); err != nil {
			t.Fatal(err)
		}
		if k6, err = newLinks(true); err != nil {
			t.Fatal(err)
		}
	})
	defer k4.close()
	defer k6.close()
	// The handles stay in the namespace they were opened in.
	checkLinks(t, ns, k4, k6)

	// NodeAddresses never reads kube-ipvs0's addresses: the kernel filters
	// each dump by link, so one link's dump holds its addresses alone.
	if k4.byLink == nil {
		t.Fatal("no strict checking of netlink dumps on this kernel (before Linux 4.20?)")
	}
	dummy, err := k4.h.LinkByName(DummyLink)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []*links{k4, k6} {
		got, err := k.addressesOf(dummy.Attrs().Index)
		want := map[bool]string{false: "[10.96.0.1]", true: "[fd00::1]"}[k.ipv6]
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("IPv6 %t: the addresses of %s alone = %v, %v; want %s", k.ipv6, DummyLink, got, err, want)
		}
	}
	// A kernel without strict checking: one dump of every address.
	k4.byLink.Close()
	k4.byLink = nil
	got, err := k4.NodeAddresses()
	if want := "[10.96.0.1 169.254.1.1 192.0.2.5 192.0.2.99]"; err != nil || fmt.Sprint(got) != want {
		t.Errorf("IPv4 NodeAddresses() without strict checking = %v, %v; want %s", got, err, want)
	}
}

// checkLinks checks every link method of the two families' kernels, opened
// in the namespace, and that kube-ipvs0 is as upstream makes it.
func checkLinks(t *testing.T, ns string, k4, k6 linkKernel) {
	for range 2 {
		if err := k4.EnsureDummyLink(); err != nil {
			t.Fatal(err)
		}
	}
	if out := testutil.InNetns(t, ns, "ip", "-o", "link", "show", DummyLink); strings.Contains(out, ",UP") || strings.Contains(out, "<UP") {
		t.Errorf("%s is up: %s", DummyLink, out)
	}

	// The node's other addresses: on a veth pair, on lo (up, so it has
	// 127.0.0.1 and ::1), and one on kube-ipvs0 too.
	for _, cmd := range []string{
		"link add rpxt-eth type veth peer name rpxt-eth-peer",
		"addr add 192.0.2.5/24 dev rpxt-eth",
		"addr add 169.254.1.1/16 dev rpxt-eth",
		"addr add 10.96.0.1/32 dev rpxt-eth",
		"-6 addr add 2001:db8::5/64 dev rpxt-eth nodad",
		"addr add 192.0.2.99/32 dev lo",
		"link set lo up",
		"link set rpxt-eth up",
		"link set rpxt-eth-peer up",
	} {
		testutil.InNetns(t, ns, append([]string{"ip"}, strings.Fields(cmd)...)...)
	}
	if out := testutil.InNetns(t, ns, "ip", "-6", "addr", "show", "dev", "rpxt-eth"); !strings.Contains(out, "inet6 fe80::") {
		t.Fatalf("rpxt-eth has no IPv6 link-local address to leave out:\n%s", out)
	}

	for range 2 {
		for _, a := range []string{"10.96.0.1", "10.96.0.2"} {
			if err := k4.Bind(netip.MustParseAddr(a)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := k6.Bind(netip.MustParseAddr("fd00::1")); err != nil {
		t.Fatal(err)
	}
	if err := k4.Bind(netip.MustParseAddr("fd00::2")); err == nil {
		t.Errorf("the IPv4 kernel bound an IPv6 address")
	}
	check := func(what string, got []netip.Addr, err error, want string) {
		t.Helper()
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("%s = %v, %v; want %s", what, got, err, want)
		}
	}
	got, err := k4.BoundAddresses()
	check("IPv4 BoundAddresses()", got, err, "[10.96.0.1 10.96.0.2]")
	for range 2 {
		if err := k4.Unbind(netip.MustParseAddr("10.96.0.2")); err != nil {
			t.Errorf("Unbind: %v", err)
		}
	}
	got, err = k4.BoundAddresses()
	check("IPv4 BoundAddresses() after the unbind", got, err, "[10.96.0.1]")
	got, err = k6.BoundAddresses()
	check("IPv6 BoundAddresses()", got, err, "[fd00::1]")
	out := testutil.InNetns(t, ns, "ip", "addr", "show", "dev", DummyLink)
	for _, want := range []string{"inet 10.96.0.1/32 ", "inet6 fd00::1/128 "} {
		if !strings.Contains(out, want) {
			t.Errorf("%s has no %q:\n%s", DummyLink, want, out)
		}
	}

	// Upstream's GetAllLocalAddressesExcept: loopback and IPv6 link-local
	// addresses left out, kube-ipvs0's too unless another link has them.
	got, err = k4.NodeAddresses()
	check("IPv4 NodeAddresses()", got, err, "[10.96.0.1 169.254.1.1 192.0.2.5 192.0.2.99]")
	got, err = k6.NodeAddresses()
	check("IPv6 NodeAddresses()", got, err, "[2001:db8::5]")
}

// TestNewWithoutIPVS checks the error on a kernel without IPVS, which
// github.com/moby/ipvs alone would not give. The kernel's answers are
// replaced: on a host whose kernel has ip_vs as a module, the real
// modprobe would load it (and leave it loaded).
func TestNewWithoutIPVS(t *testing.T) {
	family, load := ipvsFamily, loadIPVSModule
	t.Cleanup(func() { ipvsFamily, loadIPVSModule = family, load })
	lookups, loads := 0, 0
	ipvsFamily = func() error {
		lookups++
		return errors.New("no such file or directory")
	}
	loadIPVSModule = func() []byte {
		loads++
		return []byte("modprobe: FATAL: Module ip_vs not found in directory /lib/modules/test\n")
	}
	k, err := New(false)
	if err == nil {
		k.Close()
		t.Fatal("New succeeded on a kernel without IPVS")
	}
	if lookups != 2 || loads != 1 {
		t.Errorf("looked the IPVS family up %d times and ran modprobe %d times, want before and after one modprobe", lookups, loads)
	}
	for _, want := range []string{"kernel module ip_vs", "modprobe ip_vs: modprobe: FATAL: Module ip_vs not found"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}
