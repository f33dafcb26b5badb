package ipvs

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// benchSetEntries are n entries of a set of the type and family, as the
// IPVS mode writes them.
func benchSetEntries(typ SetType, ipv6 bool, n int) []string {
	protos := []string{"tcp", "udp", "sctp"}
	addr := func(base string, i int) string {
		a := netip.MustParseAddr(base)
		b := a.AsSlice()
		b[len(b)-2], b[len(b)-1] = byte(i>>8), byte(i)
		a, _ = netip.AddrFromSlice(b)
		return a.String()
	}
	ip, ip2, net := "10.96.0.0", "10.244.0.0", "10.0.0.0"
	if ipv6 {
		ip, ip2, net = "fd00:96::", "fd00:244::", "fd00:1::"
	}
	entries := make([]string, 0, n)
	for i := range n {
		var e string
		switch typ {
		case HashIP:
			e = addr(ip, i)
		case HashIPPort:
			e = fmt.Sprintf("%s,%s:%d", addr(ip, i), protos[i%3], 80+i%7)
		case HashIPPortIP:
			e = fmt.Sprintf("%s,%s:%d,%s", addr(ip2, i), protos[i%3], 8080+i%7, addr(ip2, i))
		case HashIPPortNet:
			// Every other source a whole address, which ipset prints
			// without its prefix length.
			bits := 8
			if ipv6 {
				bits = 64
			}
			if i%2 == 1 {
				bits = netip.MustParseAddr(net).BitLen()
			}
			e = fmt.Sprintf("%s,%s:%d,%s/%d", addr(ip, i), protos[i%3], 80+i%7, addr(net, i), bits)
		case BitmapPort:
			e = fmt.Sprint(30000 + i)
		}
		entries = append(entries, e)
	}
	return entries
}

// ipsetListEntries reads one set with vishvananda/netlink's IpsetList and
// prints its entries as listedEntries does (as `ipset save` prints them,
// sorted), so that the two do the same work.
func ipsetListEntries(ipsetList func(string) (*netlink.IPSetResult, error), name string) ([]string, error) {
	res, err := ipsetList(name)
	if err != nil {
		return nil, err
	}
	typ := SetType(res.TypeName)
	list := make([]string, 0, len(res.Entries))
	for _, e := range res.Entries {
		var f entryFields
		f.ip, _ = netip.AddrFromSlice(e.IP)
		f.ip2, _ = netip.AddrFromSlice(e.IP2)
		f.cidr2 = int(e.CIDR2)
		if e.Port != nil {
			f.port = *e.Port
		}
		if e.Protocol != nil {
			f.proto = *e.Protocol
		}
		s, err := f.text(typ)
		if err != nil {
			return nil, err
		}
		list = append(list, s)
	}
	slices.Sort(list)
	return list, nil
}

// benchSetSpecs are one set of each type the IPVS mode uses, of both
// families (bitmap:port has none).
func benchSetSpecs() []SetSpec {
	types := []SetType{HashIP, HashIPPort, HashIPPortIP, HashIPPortNet, BitmapPort}
	var specs []SetSpec
	for _, ipv6 := range []bool{false, true} {
		for _, typ := range types {
			if ipv6 && typ == BitmapPort {
				continue
			}
			name := fmt.Sprintf("RPXB-%d-%t", slices.Index(types, typ), ipv6)
			specs = append(specs, SetSpec{Name: name, Type: typ, IPv6: ipv6})
		}
	}
	return specs
}

// fillSets creates the sets in a fresh network namespace, n entries each,
// and returns the namespace.
func fillSets(tb testing.TB, specs []SetSpec, n int) string {
	ns := testutil.NewNetns(tb)
	testutil.RequireCommands(tb, "ipset")
	var kernel ipsets
	testutil.DoInNetns(tb, ns, func() {
		if err := kernel.EnsureSets(specs); err != nil {
			tb.Fatal(err)
		}
		var changes []SetChange
		for _, s := range specs {
			for _, e := range benchSetEntries(s.Type, s.IPv6, n) {
				changes = append(changes, SetChange{Set: s.Name, Entry: e})
			}
		}
		if err := kernel.ChangeSets(changes); err != nil {
			tb.Fatal(err)
		}
	})
	return ns
}

// Both readers BenchmarkSetEntries10k compares, ours over netlink
// (listedEntries, what SetEntries does) and vishvananda/netlink's
// IpsetList turned into the same text, read every type of set the IPVS
// mode uses, of both families, as `ipset save` prints it; 2,000 entries
// each take several netlink messages.
func TestSetReadersAgreeWithIpsetSave(t *testing.T) {
	const n = 2000
	specs := benchSetSpecs()
	ns := fillSets(t, specs, n)
	// IpsetList logs what it does not know; shown once, below.
	var logged bytes.Buffer
	log.SetOutput(&logged)
	defer log.SetOutput(os.Stderr)
	testutil.DoInNetns(t, ns, func() {
		for _, s := range specs {
			saved, err := savedEntries([]string{s.Name})
			if err != nil {
				t.Fatal(err)
			}
			if len(saved[s.Name]) != n {
				t.Fatalf("%s IPv6 %t: ipset save lists %d entries, want %d", s.Type, s.IPv6, len(saved[s.Name]), n)
			}
			ours, err := listedEntries([]string{s.Name})
			if err != nil || !reflect.DeepEqual(ours, saved) {
				t.Errorf("%s IPv6 %t: ours differs from ipset save (%v)", s.Type, s.IPv6, err)
			}
			lib, err := ipsetListEntries(netlink.IpsetList, s.Name)
			if err != nil || !reflect.DeepEqual(lib, saved[s.Name]) {
				t.Errorf("%s IPv6 %t: IpsetList differs from ipset save (%v)", s.Type, s.IPv6, err)
			}
		}
	})
	if logged.Len() > 0 {
		t.Logf("IpsetList logged:\n%s", logged.String())
	}
}

// BenchmarkSetEntries10k reads, in a fresh network namespace, one set of
// 10,000 entries of each type the IPVS mode uses, over netlink with our
// decoder (listedEntries, what SetEntries does) and with
// vishvananda/netlink's IpsetList turned into the same text; that both
// read what `ipset save` prints is TestSetReadersAgreeWithIpsetSave's. As
// root:
//
//	go test -run '^$' -bench SetEntries10k -benchmem -count 3 -benchtime 10x ./internal/ipvs
func BenchmarkSetEntries10k(b *testing.B) {
	const n = 10000
	specs := benchSetSpecs()
	ns := fillSets(b, specs, n)
	// IpsetList logs what it does not know (TestSetReadersAgreeWithIpsetSave shows it).
	log.SetOutput(io.Discard)
	defer log.SetOutput(os.Stderr)
	// IpsetList on a handle whose socket is in the namespace runs on any
	// thread; on the locked thread DoInNetns gives it (as the drift check's
	// reads run, pkg/ipvs/drift.go), each of its attribute walks hands a
	// goroutine over to another thread.
	target, err := netns.GetFromPath("/run/netns/" + ns)
	if err != nil {
		b.Fatal(err)
	}
	defer target.Close()
	h, err := netlink.NewHandleAt(target, unix.NETLINK_NETFILTER)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	for _, s := range specs {
		if s.IPv6 {
			continue
		}
		for _, r := range []struct {
			name   string
			locked bool
			read   func() (int, error)
		}{
			{"ours", true, func() (int, error) {
				got, err := listedEntries([]string{s.Name})
				return len(got[s.Name]), err
			}},
			{"IpsetList-locked", true, func() (int, error) {
				got, err := ipsetListEntries(netlink.IpsetList, s.Name)
				return len(got), err
			}},
			{"IpsetList-handle", false, func() (int, error) {
				got, err := ipsetListEntries(h.IpsetList, s.Name)
				return len(got), err
			}},
		} {
			b.Run(fmt.Sprintf("type=%s/reader=%s", s.Type, r.name), func(b *testing.B) {
				b.ReportAllocs()
				loop := func() {
					for b.Loop() {
						if got, err := r.read(); err != nil || got != n {
							b.Fatal(got, err)
						}
					}
				}
				if r.locked {
					testutil.DoInNetns(b, ns, loop)
				} else {
					loop()
				}
			})
		}
	}
}
