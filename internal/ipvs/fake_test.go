package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func vsKey(addrPort string, proto v1.Protocol) VirtualServerKey {
	ap := netip.MustParseAddrPort(addrPort)
	return VirtualServerKey{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto}
}

func realServer(addrPort string, weight int) RealServer {
	ap := netip.MustParseAddrPort(addrPort)
	return RealServer{Addr: ap.Addr(), Port: ap.Port(), Weight: weight}
}

// wantErrno fails the test unless err wraps the errno.
func wantErrno(t *testing.T, what string, err error, errno syscall.Errno) {
	t.Helper()
	if !errors.Is(err, errno) {
		t.Errorf("%s: got %v, want %v", what, err, errno)
	}
}

func TestFakeVirtualServers(t *testing.T) {
	f := NewFake()
	web := vsKey("10.96.0.1:80", v1.ProtocolTCP)
	vs := VirtualServer{VirtualServerKey: web, Scheduler: "rr", Flags: FlagHashed}
	if err := f.AddVirtualServer(vs); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "adding it again", f.AddVirtualServer(vs), syscall.EEXIST)
	wantErrno(t, "an unknown scheduler", f.AddVirtualServer(VirtualServer{VirtualServerKey: vsKey("10.96.0.2:80", v1.ProtocolTCP), Scheduler: "nope"}), syscall.ENOENT)
	if err := f.AddVirtualServer(VirtualServer{VirtualServerKey: vsKey("10.96.0.2:80", "ICMP"), Scheduler: "rr"}); err == nil {
		t.Errorf("a virtual server with protocol ICMP was added")
	}
	missing := vsKey("10.96.0.9:80", v1.ProtocolTCP)
	wantErrno(t, "updating a missing one", f.UpdateVirtualServer(VirtualServer{VirtualServerKey: missing, Scheduler: "rr"}), syscall.ESRCH)
	wantErrno(t, "deleting a missing one", f.DeleteVirtualServer(missing), syscall.ESRCH)

	affinity := VirtualServer{VirtualServerKey: web, Scheduler: "wrr", Flags: FlagPersistent, Timeout: 10800}
	if err := f.UpdateVirtualServer(affinity); err != nil {
		t.Fatal(err)
	}
	got, err := f.VirtualServers()
	if err != nil || !slices.Equal(got, []VirtualServer{affinity}) {
		t.Errorf("VirtualServers() = %v, %v; want %v", got, err, affinity)
	}

	wantErrno(t, "a real server of a missing virtual server", f.AddRealServer(missing, realServer("10.244.0.5:8080", 1)), syscall.ESRCH)
	if err := f.AddRealServer(web, realServer("10.244.0.5:8080", 1)); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "adding a real server again", f.AddRealServer(web, realServer("10.244.0.5:8080", 1)), syscall.EEXIST)
	wantErrno(t, "an IPv6 real server of an IPv4 virtual server", f.AddRealServer(web, realServer("[fd00::5]:8080", 1)), syscall.EINVAL)
	wantErrno(t, "a negative weight", f.AddRealServer(web, realServer("10.244.0.6:8080", -1)), syscall.ERANGE)
	wantErrno(t, "updating a missing real server", f.UpdateRealServer(web, realServer("10.244.0.7:8080", 1)), syscall.ENOENT)
	wantErrno(t, "deleting a missing real server", f.DeleteRealServer(web, netip.MustParseAddrPort("10.244.0.7:8080")), syscall.ENOENT)

	// Connections stay over a weight change, as in the kernel.
	if err := f.SetConnections(web, netip.MustParseAddrPort("10.244.0.5:8080"), 3, 7); err != nil {
		t.Fatal(err)
	}
	if err := f.UpdateRealServer(web, realServer("10.244.0.5:8080", 0)); err != nil {
		t.Fatal(err)
	}
	rss, err := f.RealServers(web)
	want := RealServer{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080, Weight: 0, ActiveConns: 3, InactiveConns: 7}
	if err != nil || !slices.Equal(rss, []RealServer{want}) {
		t.Errorf("RealServers() = %v, %v; want %v", rss, err, want)
	}
	// The kernel's dump of a missing virtual server's destinations is empty.
	if rss, err := f.RealServers(missing); err != nil || len(rss) != 0 {
		t.Errorf("RealServers(missing) = %v, %v; want nothing", rss, err)
	}
	if err := f.DeleteVirtualServer(web); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.VirtualServers(); len(got) != 0 {
		t.Errorf("after the delete: %v", got)
	}
}

func TestFakeLinks(t *testing.T) {
	f := NewFake()
	a := netip.MustParseAddr("10.96.0.1")
	if err := f.Bind(a); err == nil {
		t.Errorf("Bind before EnsureDummyLink succeeded")
	}
	if _, err := f.BoundAddresses(); err == nil {
		t.Errorf("BoundAddresses before EnsureDummyLink succeeded")
	}
	for range 2 {
		if err := f.EnsureDummyLink(); err != nil {
			t.Fatal(err)
		}
		if err := f.Bind(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Bind(netip.MustParseAddr("fd00::1")); err != nil {
		t.Fatal(err)
	}
	got, err := f.BoundAddresses()
	if err != nil || fmt.Sprint(got) != "[10.96.0.1 fd00::1]" {
		t.Errorf("BoundAddresses() = %v, %v", got, err)
	}
	for range 2 {
		if err := f.Unbind(a); err != nil {
			t.Errorf("Unbind: %v", err)
		}
	}
	f.SetNodeAddresses(netip.MustParseAddr("192.0.2.5"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("169.254.1.1"),
		netip.MustParseAddr("::1"), netip.MustParseAddr("fe80::1"), netip.MustParseAddr("2001:db8::5"), netip.MustParseAddr("192.0.2.5"))
	got, err = f.NodeAddresses()
	if err != nil || fmt.Sprint(got) != "[169.254.1.1 192.0.2.5 2001:db8::5]" {
		t.Errorf("NodeAddresses() = %v, %v; want loopback and IPv6 link-local addresses left out", got, err)
	}
}

// TestCanonicalEntry is the entry syntax per set type; entries the host
// kernel test also writes through ipset are in ipsetCases.
func TestCanonicalEntry(t *testing.T) {
	for _, tc := range []struct {
		typ   SetType
		ipv6  bool
		entry string
		want  string // "" for an error
	}{
		{HashIP, false, "10.0.0.1", "10.0.0.1"},
		{HashIP, false, "0.0.0.0", ""},
		{HashIP, false, "10.0.0.0/30", ""},
		{HashIP, false, "010.0.0.1", ""},
		{HashIP, false, "fd00::1", ""},
		{HashIP, true, "FD00:0::0001", "fd00::1"},
		{HashIP, true, "fe80::1%eth0", ""},
		{HashIPPort, false, "10.0.0.1,tcp:80", "10.0.0.1,tcp:80"},
		{HashIPPort, false, "10.0.0.1,UDP:53", "10.0.0.1,udp:53"},
		{HashIPPort, false, "10.0.0.1,80", "10.0.0.1,tcp:80"},
		{HashIPPort, false, "10.0.0.1,Tcp:80", ""},
		{HashIPPort, false, "10.0.0.1,icmp:ping", ""},
		{HashIPPort, false, "10.0.0.1,tcp:080", ""},
		{HashIPPort, false, "10.0.0.1,tcp:65536", ""},
		{HashIPPort, false, "10.0.0.1,tcp:http", ""},
		{HashIPPort, false, "10.0.0.1,tcp:1-3", ""},
		{HashIPPort, false, "0.0.0.0,tcp:80", ""},
		{HashIPPort, false, "10.0.0.1", ""},
		{HashIPPort, true, "fd00::1,sctp:0", "fd00::1,sctp:0"},
		{HashIPPortIP, false, "10.0.0.1,tcp:80,10.0.0.1", "10.0.0.1,tcp:80,10.0.0.1"},
		{HashIPPortIP, false, "0.0.0.0,tcp:80,0.0.0.0", "0.0.0.0,tcp:80,0.0.0.0"},
		{HashIPPortIP, false, "10.0.0.1,tcp:80", ""},
		{HashIPPortIP, false, "10.0.0.1,tcp:80,fd00::1", ""},
		{HashIPPortNet, false, "10.0.0.1,tcp:80,10.2.0.5/24", "10.0.0.1,tcp:80,10.2.0.0/24"},
		{HashIPPortNet, false, "10.0.0.1,tcp:80,10.1.0.0/32", "10.0.0.1,tcp:80,10.1.0.0"},
		{HashIPPortNet, false, "10.0.0.1,tcp:80,10.1.0.0", "10.0.0.1,tcp:80,10.1.0.0"},
		{HashIPPortNet, false, "10.0.0.1,tcp:80,10.0.0.0/0", ""},
		{HashIPPortNet, false, "10.0.0.1,tcp:80,10.0.0.0/33", ""},
		{HashIPPortNet, false, "10.0.0.1,tcp:80,10.0.0.0/08", ""},
		{HashIPPortNet, true, "fd00::1,tcp:80,fd00::3/128", "fd00::1,tcp:80,fd00::3"},
		{HashIPPortNet, true, "fd00::1,tcp:80,::ffff:1.2.3.4/120", "fd00::1,tcp:80,::ffff:1.2.3.0/120"},
		{BitmapPort, false, "30000", "30000"},
		{BitmapPort, false, "0", "0"},
		{BitmapPort, false, "65536", ""},
		{BitmapPort, false, "0080", ""},
		{BitmapPort, false, "tcp:80", ""},
		{BitmapPort, false, "10.0.0.1", ""},
	} {
		got, err := canonicalEntry(tc.typ, tc.ipv6, tc.entry)
		if tc.want == "" && err == nil {
			t.Errorf("%s (IPv6 %t) %q: accepted as %q", tc.typ, tc.ipv6, tc.entry, got)
		}
		if tc.want != "" && (err != nil || got != tc.want) {
			t.Errorf("%s (IPv6 %t) %q: got %q, %v; want %q", tc.typ, tc.ipv6, tc.entry, got, err, tc.want)
		}
	}
}

func TestFakeSets(t *testing.T) {
	f := NewFake()
	specs := []SetSpec{
		{Name: "KUBE-CLUSTER-IP", Type: HashIPPort},
		{Name: "KUBE-NODE-PORT-TCP", Type: BitmapPort},
	}
	for range 2 {
		if err := f.EnsureSets(specs); err != nil {
			t.Fatal(err)
		}
	}
	err := f.EnsureSets([]SetSpec{{Name: "KUBE-LOOP-BACK", Type: HashIPPortIP}, {Name: "KUBE-CLUSTER-IP", Type: HashIP}})
	if err == nil || !strings.Contains(err.Error(), `line 2 "create KUBE-CLUSTER-IP hash:ip `) {
		t.Errorf("re-creating a set with another type: %v", err)
	}
	if err := f.EnsureSets([]SetSpec{{Name: "KUBE-NODE-PORT-TCP", Type: BitmapPort, IPv6: true}}); err != nil {
		t.Errorf("re-creating a bitmap:port set with the other family: %v", err)
	}
	if err := f.EnsureSets([]SetSpec{{Name: strings.Repeat("X", 32), Type: HashIP}}); err == nil {
		t.Errorf("a 32-character set name was accepted")
	}

	err = f.ChangeSets([]SetChange{
		{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.1,TCP:443"},
		{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.1,tcp:443"},              // there already: fine
		{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.9,udp:53", Delete: true}, // not there: fine
		{Set: "KUBE-NODE-PORT-TCP", Entry: "30080"},
		{Set: "KUBE-MISSING", Entry: "30080"},
		{Set: "KUBE-NODE-PORT-TCP", Entry: "30081"},
	})
	if err == nil || !strings.Contains(err.Error(), `line 5 "add KUBE-MISSING 30080"`) {
		t.Errorf("adding to a missing set: %v", err)
	}
	got, err := f.SetEntries([]string{"KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP", "KUBE-LOOP-BACK", "KUBE-MISSING"})
	want := map[string][]string{
		"KUBE-CLUSTER-IP": {"10.96.0.1,tcp:443"}, "KUBE-NODE-PORT-TCP": {"30080"}, "KUBE-LOOP-BACK": {},
	}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("SetEntries() = %v, %v; want %v (the lines before the bad one applied)", got, err, want)
	}
	if err := f.ChangeSets([]SetChange{{Set: "KUBE-NODE-PORT-TCP", Entry: "tcp:80"}}); err == nil {
		t.Errorf("a bitmap:port entry that is not a port was accepted")
	}
}

func TestFakeHashSetIsFull(t *testing.T) {
	f := NewFake()
	if err := f.EnsureSets([]SetSpec{{Name: "KUBE-6-CLUSTER-IP", Type: HashIP, IPv6: true}}); err != nil {
		t.Fatal(err)
	}
	changes := make([]SetChange, MaxSetEntries)
	for i := range changes {
		changes[i] = SetChange{Set: "KUBE-6-CLUSTER-IP", Entry: fmt.Sprintf("fd00::1:%x", i)}
	}
	if err := f.ChangeSets(changes); err != nil {
		t.Fatal(err)
	}
	// Adding what is there still works when full; a new entry does not.
	if err := f.ChangeSets(changes[:1]); err != nil {
		t.Errorf("re-adding an entry to a full set: %v", err)
	}
	if err := f.ChangeSets([]SetChange{{Set: "KUBE-6-CLUSTER-IP", Entry: "fd00::ffff:1"}}); err == nil {
		t.Errorf("entry %d was accepted", MaxSetEntries+1)
	}
}

// A set created with a lower maxelem refuses the entry past it with
// ipset's words, and the restore stops there.
func TestFakeSetMaxElem(t *testing.T) {
	f := NewFake()
	spec := SetSpec{Name: "KUBE-CLUSTER-IP", Type: HashIPPort, MaxElem: 2}
	if err := f.EnsureSets([]SetSpec{spec}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.Dump(), "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 2\n") {
		t.Errorf("the set is not created with maxelem 2:\n%s", f.Dump())
	}
	var changes []SetChange
	for i := range 4 {
		changes = append(changes, SetChange{Set: spec.Name, Entry: fmt.Sprintf("10.96.0.%d,tcp:80", i+1)})
	}
	err := f.ChangeSets(changes)
	if want := `ipset restore: line 3 "add KUBE-CLUSTER-IP 10.96.0.3,tcp:80": Hash is full, cannot add more elements`; err == nil || err.Error() != want {
		t.Errorf("adding 4 entries to a set of maxelem 2: %v, want %s", err, want)
	}
	if got, _ := f.SetEntries([]string{spec.Name}); len(got[spec.Name]) != 2 {
		t.Errorf("the set holds %v, want the first 2", got)
	}
}

func TestFakeCallsAndFailures(t *testing.T) {
	f := NewFake()
	boom := errors.New("boom")
	f.FailNext("EnsureDummyLink", boom)
	if err := f.EnsureDummyLink(); err != boom {
		t.Errorf("first EnsureDummyLink: %v, want the injected error", err)
	}
	if err := f.EnsureDummyLink(); err != nil {
		t.Errorf("second EnsureDummyLink: %v", err)
	}
	_ = f.Bind(netip.MustParseAddr("10.96.0.1"))
	if got := fmt.Sprint(f.Calls()); got != "map[Bind:1 EnsureDummyLink:2]" {
		t.Errorf("Calls() = %s", got)
	}
	f.ResetCalls()
	f.Dump()
	if got := f.Calls(); len(got) != 0 {
		t.Errorf("after ResetCalls and Dump: %v", got)
	}
}

func TestFakeDump(t *testing.T) {
	f := NewFake()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	dns := vsKey("10.96.0.10:53", v1.ProtocolUDP)
	web6 := vsKey("[fd00::1]:80", v1.ProtocolTCP)
	must(f.AddVirtualServer(VirtualServer{VirtualServerKey: web6, Scheduler: "mh", Flags: FlagSourceHash}))
	must(f.AddVirtualServer(VirtualServer{VirtualServerKey: dns, Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800}))
	must(f.AddVirtualServer(VirtualServer{VirtualServerKey: vsKey("10.96.0.10:53", v1.ProtocolTCP), Scheduler: "rr"}))
	must(f.AddRealServer(dns, realServer("10.244.1.3:53", 1)))
	must(f.AddRealServer(dns, realServer("10.244.0.20:53", 0)))
	must(f.SetConnections(dns, netip.MustParseAddrPort("10.244.0.20:53"), 2, 15))
	must(f.AddRealServer(web6, realServer("[fd00:244::5]:8080", 1)))
	must(f.EnsureSets([]SetSpec{
		{Name: "KUBE-NODE-PORT-TCP", Type: BitmapPort},
		{Name: "KUBE-CLUSTER-IP", Type: HashIPPort},
		{Name: "KUBE-6-LOOP-BACK", Type: HashIPPortIP, IPv6: true},
	}))
	must(f.ChangeSets([]SetChange{
		{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.10,udp:53"},
		{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.10,tcp:53"},
		{Set: "KUBE-NODE-PORT-TCP", Entry: "30080"},
	}))
	must(f.EnsureDummyLink())
	must(f.Bind(netip.MustParseAddr("fd00::1")))
	must(f.Bind(netip.MustParseAddr("10.96.0.10")))
	want := `Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.10:53 rr
UDP  10.96.0.10:53 rr persistent 10800
  -> 10.244.0.20:53               Masq    0      2          15
  -> 10.244.1.3:53                Masq    1      0          0
TCP  [fd00::1]:80 mh (mh-port)
  -> [fd00:244::5]:8080           Masq    1      0          0
create KUBE-6-LOOP-BACK hash:ip,port,ip family inet6 hashsize 1024 maxelem 65536
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.10,tcp:53
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
add KUBE-NODE-PORT-TCP 30080
link kube-ipvs0
    inet 10.96.0.10/32
    inet6 fd00::1/128
`
	if got := f.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}
}
