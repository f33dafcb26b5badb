package ipvs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/vm"
)

// guestEnv marks the run of this package's tests inside the VM.
const guestEnv = "RPXT_IPVS_GUEST"

// TestKernelInVM runs this package's test binary in a VM booting Debian's
// kernel, which has IPVS and dummy links: TestKernelInGuest there, and
// the namespace tests of ipsets and links on that kernel too. ip_vs is not
// loaded beforehand: New loads it.
func TestKernelInVM(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	testutil.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "ipvs.test")
	build := exec.Command("go", "test", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}
	res := vm.Run(t, vm.Config{
		Files: map[string]string{"/usr/local/bin/ipvs.test": bin},
		Script: fmt.Sprintf(`
if grep -q '^ip_vs ' /proc/modules; then echo "ip_vs is loaded before the test"; exit 1; fi
%s=1 %s=1 ipvs.test -test.v -test.count=1 -test.skip 'InVM|WithoutIPVS'
`, guestEnv, testutil.StrictEnv),
		Timeout: 10 * time.Minute,
	})
	if !strings.Contains(res.Console, "--- PASS: TestKernelInGuest") {
		t.Errorf("TestKernelInGuest did not pass in the VM")
	}
}

// TestKernelInGuest checks every Kernel method against the real kernel,
// in a namespace: kube-ipvs0 and the node's addresses (checkLinks), IPVS
// against the fake (the same calls, the same errors, the same state,
// ipvsadm's listing against Dump), connection counts from real traffic,
// and SetTimeouts.
func TestKernelInGuest(t *testing.T) {
	if os.Getenv(guestEnv) == "" {
		t.Skip("runs in the VM TestKernelInVM boots")
	}
	ns := testutil.NewNetns(t)
	var k4, k6 *Kernel
	testutil.DoInNetns(t, ns, func() {
		var err error
		if k4, err = New(false); err != nil {
			t.Fatal(err)
		}
		if k6, err = New(true); err != nil {
			t.Fatal(err)
		}
	})
	defer k4.Close()
	defer k6.Close()

	checkLinks(t, ns, k4, k6)
	if out, err := exec.Command("ip", "link", "show", DummyLink).CombinedOutput(); err == nil {
		t.Errorf("%s is in the VM's own namespace: %s", DummyLink, out)
	}
	if out := testutil.InNetns(t, ns, "ip", "-d", "link", "show", DummyLink); !strings.Contains(out, "dummy") {
		t.Errorf("%s is not a dummy link:\n%s", DummyLink, out)
	}

	checkIPVSAgainstFake(t, ns, k4, k6)
	if out, err := exec.Command("ipvsadm", "-Ln").CombinedOutput(); err != nil || strings.Count(string(out), "\n") != 3 {
		t.Errorf("the VM's own namespace has virtual servers (%v):\n%s", err, out)
	}

	checkConnections(t, ns, k4)

	testutil.DoInNetns(t, ns, func() {
		if err := SetTimeouts(900*time.Second, 120*time.Second, 300*time.Second); err != nil {
			t.Error(err)
		}
	})
	if out := testutil.InNetns(t, ns, "ipvsadm", "-L", "--timeout"); !strings.Contains(out, "Timeout (tcp tcpfin udp): 900 120 300") {
		t.Errorf("the timeouts are not set: %s", out)
	}
}

var (
	web   = vsKey("10.96.0.1:80", v1.ProtocolTCP)
	dns   = vsKey("10.96.0.10:53", v1.ProtocolUDP)
	sctp  = vsKey("10.96.0.3:9", v1.ProtocolSCTP)
	web6  = vsKey("[fd00::1]:80", v1.ProtocolTCP)
	nokey = vsKey("10.96.0.99:80", v1.ProtocolTCP)
)

// ipvsCalls are calls to IPVS and the errno each must end with (0: none).
// Each gets the IPv4 and the IPv6 kernel, or the fake twice.
var ipvsCalls = []struct {
	name  string
	errno syscall.Errno
	do    func(k4, k6 Interface) error
}{
	{"add web", 0, func(k4, _ Interface) error {
		return k4.AddVirtualServer(VirtualServer{VirtualServerKey: web, Scheduler: "rr"})
	}},
	{"add web again", syscall.EEXIST, func(k4, _ Interface) error {
		return k4.AddVirtualServer(VirtualServer{VirtualServerKey: web, Scheduler: "rr"})
	}},
	{"add dns with affinity", 0, func(k4, _ Interface) error {
		return k4.AddVirtualServer(VirtualServer{VirtualServerKey: dns, Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800})
	}},
	{"add sctp with mh", 0, func(k4, _ Interface) error {
		return k4.AddVirtualServer(VirtualServer{VirtualServerKey: sctp, Scheduler: "mh", Flags: FlagSourceHash})
	}},
	{"add web6", 0, func(_, k6 Interface) error {
		return k6.AddVirtualServer(VirtualServer{VirtualServerKey: web6, Scheduler: "rr"})
	}},
	{"add with an unknown scheduler", syscall.ENOENT, func(k4, _ Interface) error {
		return k4.AddVirtualServer(VirtualServer{VirtualServerKey: nokey, Scheduler: "nope"})
	}},
	{"update web", 0, func(k4, _ Interface) error {
		return k4.UpdateVirtualServer(VirtualServer{VirtualServerKey: web, Scheduler: "wrr", Flags: FlagPersistent, Timeout: 60})
	}},
	{"update a missing one", syscall.ESRCH, func(k4, _ Interface) error {
		return k4.UpdateVirtualServer(VirtualServer{VirtualServerKey: nokey, Scheduler: "rr"})
	}},
	{"delete a missing one", syscall.ESRCH, func(k4, _ Interface) error { return k4.DeleteVirtualServer(nokey) }},
	{"add a real server", 0, func(k4, _ Interface) error { return k4.AddRealServer(web, realServer("10.244.0.5:8080", 1)) }},
	{"add it again", syscall.EEXIST, func(k4, _ Interface) error { return k4.AddRealServer(web, realServer("10.244.0.5:8080", 1)) }},
	{"add another", 0, func(k4, _ Interface) error { return k4.AddRealServer(web, realServer("10.244.0.6:8080", 2)) }},
	{"add one with a negative weight", syscall.ERANGE, func(k4, _ Interface) error {
		return k4.AddRealServer(web, realServer("10.244.0.7:8080", -1))
	}},
	{"add one to a missing virtual server", syscall.ESRCH, func(k4, _ Interface) error {
		return k4.AddRealServer(nokey, realServer("10.244.0.5:8080", 1))
	}},
	{"drain one", 0, func(k4, _ Interface) error { return k4.UpdateRealServer(web, realServer("10.244.0.6:8080", 0)) }},
	{"update a missing one", syscall.ENOENT, func(k4, _ Interface) error {
		return k4.UpdateRealServer(web, realServer("10.244.0.7:8080", 1))
	}},
	{"delete a missing one", syscall.ENOENT, func(k4, _ Interface) error {
		return k4.DeleteRealServer(web, netip.MustParseAddrPort("10.244.0.7:8080"))
	}},
	{"add to dns", 0, func(k4, _ Interface) error { return k4.AddRealServer(dns, realServer("10.244.0.20:53", 1)) }},
	{"add to dns, to delete", 0, func(k4, _ Interface) error { return k4.AddRealServer(dns, realServer("10.244.0.21:53", 1)) }},
	{"delete it", 0, func(k4, _ Interface) error {
		return k4.DeleteRealServer(dns, netip.MustParseAddrPort("10.244.0.21:53"))
	}},
	{"add to web6", 0, func(_, k6 Interface) error { return k6.AddRealServer(web6, realServer("[fd00:244::5]:8080", 1)) }},
	{"add to sctp", 0, func(k4, _ Interface) error { return k4.AddRealServer(sctp, realServer("10.244.0.9:9", 1)) }},
	{"delete sctp", 0, func(k4, _ Interface) error { return k4.DeleteVirtualServer(sctp) }},
	{"add sctp back", 0, func(k4, _ Interface) error {
		return k4.AddVirtualServer(VirtualServer{VirtualServerKey: sctp, Scheduler: "mh", Flags: FlagSourceHash})
	}},
}

// checkIPVSAgainstFake makes the same calls to the kernel and to the fake
// and compares their errors and what they list.
func checkIPVSAgainstFake(t *testing.T, ns string, k4, k6 *Kernel) {
	fake := NewFake()
	for _, c := range ipvsCalls {
		errKernel, errFake := c.do(k4, k6), c.do(fake, fake)
		for _, r := range []struct {
			who string
			err error
		}{{"the kernel", errKernel}, {"the fake", errFake}} {
			if c.errno == 0 && r.err != nil || c.errno != 0 && !errors.Is(r.err, c.errno) {
				t.Errorf("%s: %s says %v, want errno %d (%v)", c.name, r.who, r.err, c.errno, c.errno)
			}
		}
	}

	// Only the adapter knows a family.
	if err := k4.AddVirtualServer(VirtualServer{VirtualServerKey: web6, Scheduler: "rr"}); err == nil {
		t.Errorf("the IPv4 kernel added an IPv6 virtual server")
	}
	if err := k4.AddRealServer(web, realServer("[fd00::5]:80", 1)); err == nil {
		t.Errorf("the IPv4 kernel added an IPv6 real server")
	}

	servers4, err := k4.VirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	servers6, err := k6.VirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(servers6, func(vs VirtualServer) bool { return vs.VirtualServerKey == web6 }) || len(servers6) != 1 {
		t.Errorf("the IPv6 kernel lists %v", servers6)
	}
	got := sortedServers(append(servers4, servers6...))
	want, _ := fake.VirtualServers()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the kernel lists\n%v\nthe fake\n%v", got, want)
	}
	for _, vs := range append(want, VirtualServer{VirtualServerKey: nokey}) {
		k := k4
		if vs.Addr.Is6() {
			k = k6
		}
		got, errKernel := k.RealServers(vs.VirtualServerKey)
		want, errFake := fake.RealServers(vs.VirtualServerKey)
		slices.SortFunc(got, func(a, b RealServer) int { return a.AddrPort().Compare(b.AddrPort()) })
		if errKernel != nil || errFake != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("real servers of %s: the kernel lists %v (%v), the fake %v (%v)", vs.VirtualServerKey, got, errKernel, want, errFake)
		}
	}

	// The one read of every virtual server's real servers lists what the
	// requests one virtual server at a time list, family by family.
	for _, k := range []*Kernel{k4, k6} {
		all := map[VirtualServerKey][]RealServer{}
		err := k.EachVirtualServer(func(key VirtualServerKey, reals []RealServer) error {
			all[key] = slices.Clone(reals)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var servers int
		for _, vs := range want {
			if vs.Addr.Is6() != k.table.ipv6 {
				continue
			}
			servers++
			got := all[vs.VirtualServerKey]
			slices.SortFunc(got, func(a, b RealServer) int { return a.AddrPort().Compare(b.AddrPort()) })
			if wantReals, _ := fake.RealServers(vs.VirtualServerKey); fmt.Sprint(got) != fmt.Sprint(wantReals) {
				t.Errorf("IPv6 %t: all real servers list %v for %s, the fake %v", k.table.ipv6, got, vs.VirtualServerKey, wantReals)
			}
		}
		if len(all) != servers {
			t.Errorf("IPv6 %t: all real servers list %d virtual servers, want %d: %v", k.table.ipv6, len(all), servers, all)
		}
	}

	// ipvsadm prints services in hash order and pads its columns: the
	// same lines, without the version line, trailing blanks and order.
	listing := testutil.InNetns(t, ns, "ipvsadm", "-Ln")
	dump := fake.Dump() // virtual servers only: it has no sets or link
	if a, b := ipvsadmLines(listing, true), ipvsadmLines(dump, false); !slices.Equal(a, b) {
		t.Errorf("ipvsadm -Ln lists\n%s\nthe fake dumps\n%s", listing, dump)
	}
}

func sortedServers(vss []VirtualServer) []VirtualServer {
	f := NewFake()
	for _, vs := range vss {
		_ = f.AddVirtualServer(vs)
	}
	sorted, _ := f.VirtualServers()
	return sorted
}

func ipvsadmLines(s string, dropVersion bool) []string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if dropVersion && strings.HasPrefix(sc.Text(), "IP Virtual Server version") {
			continue
		}
		lines = append(lines, strings.TrimRight(sc.Text(), " "))
	}
	slices.Sort(lines)
	return lines
}

// checkConnections opens a connection through a virtual server to a
// server in a pod's namespace, and reads the real server's connection
// counts while it is open, after it is closed, and while it drains.
func checkConnections(t *testing.T, ns string, k4 *Kernel) {
	pod := testutil.NewNetns(t)
	testutil.InNetns(t, ns, "ip", "link", "add", "rpxt-pod", "type", "veth", "peer", "name", "eth0", "netns", pod)
	testutil.InNetns(t, ns, "ip", "addr", "add", "10.244.0.1/24", "dev", "rpxt-pod")
	testutil.InNetns(t, ns, "ip", "link", "set", "rpxt-pod", "up")
	testutil.InNetns(t, pod, "ip", "link", "set", "lo", "up")
	testutil.InNetns(t, pod, "ip", "addr", "add", "10.244.0.5/24", "dev", "eth0")
	testutil.InNetns(t, pod, "ip", "link", "set", "eth0", "up")
	testutil.InNetns(t, pod, "ip", "route", "add", "default", "via", "10.244.0.1")

	var l net.Listener
	testutil.DoInNetns(t, pod, func() {
		var err error
		if l, err = net.Listen("tcp4", "10.244.0.5:8080"); err != nil {
			t.Fatal(err)
		}
	})
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			fmt.Fprintln(c, "hello")
			accepted <- c
		}
	}()

	// 10.96.0.1 is on kube-ipvs0 (checkLinks).
	key := vsKey("10.96.0.1:8081", v1.ProtocolTCP)
	backend := realServer("10.244.0.5:8080", 1)
	if err := k4.AddVirtualServer(VirtualServer{VirtualServerKey: key, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	if err := k4.AddRealServer(key, backend); err != nil {
		t.Fatal(err)
	}
	var client net.Conn
	testutil.DoInNetns(t, ns, func() {
		var err error
		if client, err = net.DialTimeout("tcp4", "10.96.0.1:8081", 10*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	defer client.Close()
	if line, err := bufio.NewReader(client).ReadString('\n'); err != nil || line != "hello\n" {
		t.Fatalf("through the virtual server: %q, %v", line, err)
	}
	server := <-accepted
	waitConns(t, k4, key, 1, 0)

	// Draining keeps the counts.
	backend.Weight = 0
	if err := k4.UpdateRealServer(key, backend); err != nil {
		t.Fatal(err)
	}
	waitConns(t, k4, key, 1, 0)

	client.Close()
	_, _ = io.Copy(io.Discard, server)
	server.Close()
	waitConns(t, k4, key, 0, 1)
}

// waitConns waits for the only real server's connection counts.
func waitConns(t *testing.T, k *Kernel, key VirtualServerKey, active, inactive int) {
	t.Helper()
	var rss []RealServer
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		if rss, err = k.RealServers(key); err != nil {
			t.Fatal(err)
		}
		if len(rss) == 1 && rss[0].ActiveConns == active && rss[0].InactiveConns == inactive {
			return
		}
	}
	t.Errorf("real servers of %s: %+v; want one with %d active and %d inactive connections", key, rss, active, inactive)
}
