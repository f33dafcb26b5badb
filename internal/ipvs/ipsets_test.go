package ipvs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// testSets are one set of each type and family, named with a random
// prefix so that the check that the host namespace does not see them
// cannot be fooled by someone else's set.
func testSets(t *testing.T) []SetSpec {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	prefix := "RPXT-" + strings.ToUpper(hex.EncodeToString(b)) + "-"
	var sets []SetSpec
	for _, ipv6 := range []bool{false, true} {
		for _, typ := range []SetType{HashIP, HashIPPort, HashIPPortIP, HashIPPortNet} {
			name := prefix + strings.ReplaceAll(strings.TrimPrefix(string(typ), "hash:"), ",", "-")
			if ipv6 {
				name += "-6"
			}
			sets = append(sets, SetSpec{Name: name, Type: typ, IPv6: ipv6})
		}
	}
	return append(sets, SetSpec{Name: prefix + "PORTS", Type: BitmapPort})
}

// setsNetns is a fresh network namespace, whose sets of these names are
// destroyed when the test ends.
func setsNetns(t *testing.T, sets ...SetSpec) string {
	ns := testutil.NewNetns(t)
	testutil.RequireCommands(t, "ipset")
	t.Cleanup(func() {
		for _, s := range sets {
			_ = exec.Command("ip", "netns", "exec", ns, "ipset", "destroy", s.Name).Run()
		}
	})
	return ns
}

// testChanges writes to each set entries in the forms ipset rewrites
// (upper-case names, no protocol, host bits, full-length prefixes), adds
// some twice and deletes some that are not there.
func testChanges(sets []SetSpec) []SetChange {
	entries := map[SetType]map[bool][]string{
		HashIP: {
			false: {"10.96.0.1", "10.96.0.2", "255.255.255.255", "10.96.0.99"},
			true:  {"fd00::1", "FD00:0::0002", "::ffff:1.2.3.4", "fd00::99"},
		},
		HashIPPort: {
			false: {"10.96.0.1,tcp:80", "10.96.0.1,UDP:53", "10.96.0.1,sctp:0", "10.96.0.2,8080", "10.96.0.99,udp:99"},
			true:  {"fd00::1,tcp:80", "fd00::1,udp:53", "fd00::1,SCTP:9", "fd00::99,tcp:99"},
		},
		HashIPPortIP: {
			false: {"10.244.0.5,tcp:8080,10.244.0.5", "0.0.0.0,tcp:80,0.0.0.0", "10.244.0.6,udp:53,10.96.0.1", "10.244.0.99,tcp:99,10.244.0.99"},
			true:  {"fd00:244::5,tcp:8080,fd00:244::5", "::,sctp:9,::", "fd00:244::6,udp:53,fd00::1", "fd00:244::99,tcp:99,fd00:244::99"},
		},
		HashIPPortNet: {
			false: {"10.96.0.1,tcp:80,10.0.0.0/8", "10.96.0.1,tcp:80,10.2.0.5/24", "10.96.0.1,udp:53,10.1.0.0/32", "10.96.0.1,tcp:443,192.168.1.1", "10.96.0.99,tcp:99,10.99.0.0/16"},
			true:  {"fd00::1,tcp:80,fd00::/64", "fd00::1,tcp:80,fd00::3/128", "fd00::1,tcp:80,::ffff:1.2.3.4/120", "fd00::99,tcp:99,fd99::/16"},
		},
		BitmapPort: {false: {"0", "30080", "65535", "99"}},
	}
	var changes []SetChange
	for _, s := range sets {
		list := entries[s.Type][s.IPv6]
		for _, e := range list {
			changes = append(changes, SetChange{Set: s.Name, Entry: e})
		}
		changes = append(changes,
			SetChange{Set: s.Name, Entry: list[0]},                         // there already
			SetChange{Set: s.Name, Entry: list[1], Delete: true},           // deleted
			SetChange{Set: s.Name, Entry: list[1], Delete: true},           // not there any more
			SetChange{Set: s.Name, Entry: list[1]},                         // back
			SetChange{Set: s.Name, Entry: list[len(list)-1], Delete: true}) // gone for good
	}
	return changes
}

// badLines are changes both ipset and the fake refuse, each written alone
// to a set of the given type.
var badLines = []struct {
	typ   SetType
	ipv6  bool
	entry string
}{
	{HashIP, false, "0.0.0.0"},
	{HashIP, false, "fd00::1"},
	{HashIP, true, "10.0.0.1"},
	{HashIP, true, "fe80::1%lo"},
	{HashIPPort, false, "10.0.0.1"},
	{HashIPPort, false, "10.0.0.1,Tcp:80"},
	{HashIPPort, false, "10.0.0.1,tcp:080"},
	{HashIPPort, false, "10.0.0.1,tcp:65536"},
	{HashIPPortIP, false, "10.0.0.1,tcp:80"},
	{HashIPPortNet, false, "10.0.0.1,tcp:80,10.0.0.0/0"},
	{HashIPPortNet, false, "10.0.0.1,tcp:80,10.0.0.0/33"},
	{BitmapPort, false, "65536"},
	{BitmapPort, false, "0080"},
}

// setKernel is the ipset part of pkg/ipvs.Kernel.
type setKernel interface {
	EnsureSets([]SetSpec) error
	SetEntries([]string) (map[string][]string, error)
	SetSizes([]string) (map[string]int, error)
	ChangeSets([]SetChange) error
}

// TestIPSetsKernel writes every set type of both families through ipset in
// a fresh namespace and through the fake, and compares what each lists.
func TestIPSetsKernel(t *testing.T) {
	sets := testSets(t)
	ns := setsNetns(t, sets...)
	var names []string
	for _, s := range sets {
		names = append(names, s.Name)
	}
	fake := NewFake()
	var kernel ipsets
	testutil.DoInNetns(t, ns, func() {
		for _, k := range []setKernel{fake, kernel} {
			for range 2 {
				if err := k.EnsureSets(sets); err != nil {
					t.Fatalf("%T: EnsureSets: %v", k, err)
				}
			}
		}
		if out := testutil.InNetns(t, ns, "ipset", "save"); !strings.Contains(out, "create "+sets[1].Name+" hash:ip,port family inet hashsize 1024 maxelem 65536 ") ||
			!strings.Contains(out, "create "+sets[len(sets)-1].Name+" bitmap:port range 0-65535\n") {
			t.Errorf("the sets were not created as upstream creates them:\n%s", out)
		}

		changes := testChanges(sets)
		for _, k := range []setKernel{fake, kernel} {
			if err := k.ChangeSets(changes); err != nil {
				t.Fatalf("%T: ChangeSets: %v", k, err)
			}
		}
		want, err := fake.SetEntries(names)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kernel.SetEntries(append(names, "RPXT-MISSING"))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ipset lists\n%v\nthe fake lists\n%v", got, want)
		}
		wantSizes, err := fake.SetSizes(names)
		if err != nil {
			t.Fatal(err)
		}
		gotSizes, err := kernel.SetSizes(append(names, "RPXT-MISSING"))
		if err != nil || !reflect.DeepEqual(gotSizes, wantSizes) {
			t.Errorf("ipset counts %v (%v), the fake %v", gotSizes, err, wantSizes)
		}
		for _, n := range names {
			if wantSizes[n] != len(want[n]) {
				t.Errorf("the fake counts %d entries in %s and lists %d", wantSizes[n], n, len(want[n]))
			}
		}

		for _, bad := range badLines {
			set := ""
			for _, s := range sets {
				if s.Type == bad.typ && s.IPv6 == bad.ipv6 {
					set = s.Name
				}
			}
			change := []SetChange{{Set: set, Entry: bad.entry}}
			errReal, errFake := kernel.ChangeSets(change), fake.ChangeSets(change)
			if errReal == nil || errFake == nil {
				t.Errorf("%s %q: ipset says %v, the fake says %v; want both to refuse it", bad.typ, bad.entry, errReal, errFake)
			} else if !strings.Contains(errReal.Error(), set) {
				t.Errorf("%s %q: the error does not name the set: %v", bad.typ, bad.entry, errReal)
			}
		}

		// The error quotes the line ipset names.
		err = kernel.ChangeSets([]SetChange{
			{Set: sets[0].Name, Entry: "10.96.0.7"}, {Set: "RPXT-MISSING", Entry: "10.96.0.8"}, {Set: sets[0].Name, Entry: "10.96.0.9"},
		})
		if err == nil || !strings.Contains(err.Error(), `line 2 "add RPXT-MISSING 10.96.0.8": The set with the given name does not exist`) {
			t.Errorf("adding to a missing set: %v", err)
		}
		other := []SetSpec{{Name: sets[0].Name, Type: HashIPPort}}
		if err := kernel.EnsureSets(other); err == nil || !strings.Contains(err.Error(), `line 1 "create `+sets[0].Name+` hash:ip,port`) {
			t.Errorf("re-creating a set with another type: %v", err)
		}
	})
	// ipsets belong to a network namespace.
	if out, err := exec.Command("ipset", "list", "-n", sets[0].Name).CombinedOutput(); err == nil {
		t.Errorf("the host namespace sees the test namespace's set %s: %s", sets[0].Name, out)
	}
}

// TestIPSetsKernelFull fills a hash set to its maxelem through ipset. The
// kernel counts per region of its table, so a set grown past hashsize
// takes a few entries more than maxelem before it refuses them (4099 at
// maxelem 4096, measured on 6.18); the fake refuses the first one over.
func TestIPSetsKernelFull(t *testing.T) {
	set := testSets(t)[0]
	ns := setsNetns(t, set)
	var kernel ipsets
	testutil.DoInNetns(t, ns, func() {
		if err := kernel.EnsureSets([]SetSpec{set}); err != nil {
			t.Fatal(err)
		}
		changes := make([]SetChange, MaxSetEntries+8)
		for i := range changes {
			changes[i] = SetChange{Set: set.Name, Entry: fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&0xff, i&0xff)}
		}
		if err := kernel.ChangeSets(changes[:MaxSetEntries]); err != nil {
			t.Fatal(err)
		}
		if err := kernel.ChangeSets(changes[:1]); err != nil {
			t.Errorf("re-adding an entry to a full set: %v", err)
		}
		// The header counts them all, without listing them.
		if sizes, err := kernel.SetSizes([]string{set.Name}); err != nil || sizes[set.Name] != MaxSetEntries {
			t.Errorf("a full set counts %v (%v), want %d", sizes, err, MaxSetEntries)
		}
		err := kernel.ChangeSets(changes[MaxSetEntries:])
		if err == nil || !strings.Contains(err.Error(), `"add `+set.Name+` 10.1.0.`) || !strings.Contains(err.Error(), "Hash is full") {
			t.Errorf("adding 8 entries to a full set: %v", err)
		}
	})
}

// TestIPSetsKernelMaxElem creates a set with a small maxelem: ipset and the
// fake refuse the same line of a restore with the same words, having
// applied the lines before it.
func TestIPSetsKernelMaxElem(t *testing.T) {
	set := testSets(t)[1]
	set.MaxElem = 2
	ns := setsNetns(t, set)
	var changes []SetChange
	for i := range 4 {
		changes = append(changes, SetChange{Set: set.Name, Entry: fmt.Sprintf("10.96.0.%d,tcp:80", i+1)})
	}
	fake := NewFake()
	if err := fake.EnsureSets([]SetSpec{set}); err != nil {
		t.Fatal(err)
	}
	fakeErr := fake.ChangeSets(changes)
	fakeEntries, _ := fake.SetEntries([]string{set.Name})
	var kernel ipsets
	testutil.DoInNetns(t, ns, func() {
		if err := kernel.EnsureSets([]SetSpec{set}); err != nil {
			t.Fatal(err)
		}
		if out := testutil.InNetns(t, ns, "ipset", "list", "-t", set.Name); !strings.Contains(out, " maxelem 2 ") {
			t.Errorf("the set is not created with maxelem 2:\n%s", out)
		}
		err := kernel.ChangeSets(changes)
		want := fmt.Sprintf(`ipset restore: line 3 "add %s 10.96.0.3,tcp:80": Hash is full, cannot add more elements`, set.Name)
		if err == nil || err.Error() != want || fakeErr == nil || fakeErr.Error() != want {
			t.Errorf("adding 4 entries to a set of maxelem 2:\nipset: %v\nfake:  %v\nwant:  %s", err, fakeErr, want)
		}
		entries, err := kernel.SetEntries([]string{set.Name})
		if err != nil || !reflect.DeepEqual(entries, fakeEntries) {
			t.Errorf("ipset holds %v (%v), the fake %v", entries, err, fakeEntries)
		}
	})
}

// TestEnsuringSetsInPlaceStartsNoProcess: EnsureSets over sets that exist
// as it would create them reads their headers and starts no ipset process
// (a restart's case); a missing set, or one of another size, still goes to
// ipset, which creates the one and refuses the other.
func TestEnsuringSetsInPlaceStartsNoProcess(t *testing.T) {
	sets := testSets(t)
	ns := setsNetns(t, sets...)
	real, err := exec.LookPath("ipset")
	if err != nil {
		t.Fatal(err)
	}
	// An ipset that logs each start, first in PATH.
	dir := t.TempDir()
	log := filepath.Join(dir, "starts")
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >>%s\nexec %s \"$@\"\n", log, real)
	if err := os.WriteFile(filepath.Join(dir, "ipset"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	starts := func() int {
		out, _ := os.ReadFile(log)
		_ = os.Remove(log)
		return strings.Count(string(out), "\n")
	}
	var kernel ipsets
	testutil.DoInNetns(t, ns, func() {
		if err := kernel.EnsureSets(sets); err != nil {
			t.Fatal(err)
		}
		if n := starts(); n != 1 {
			t.Errorf("creating the sets started %d ipset processes, want 1", n)
		}
		if err := kernel.EnsureSets(sets); err != nil {
			t.Fatal(err)
		}
		if n := starts(); n != 0 {
			t.Errorf("ensuring sets in place started %d ipset processes, want none", n)
		}
		testutil.InNetns(t, ns, real, "destroy", sets[2].Name)
		if err := kernel.EnsureSets(sets); err != nil {
			t.Fatal(err)
		}
		if n := starts(); n != 1 {
			t.Errorf("re-creating a missing set started %d ipset processes, want 1", n)
		}
		if sizes, err := kernel.SetSizes([]string{sets[2].Name}); err != nil || len(sizes) != 1 {
			t.Errorf("the missing set was not created: %v (%v)", sizes, err)
		}
		smaller := slices.Clone(sets)
		smaller[0].MaxElem = 2
		if err := kernel.EnsureSets(smaller); err == nil {
			t.Errorf("a set of maxelem %d passed for one of maxelem 2", MaxSetEntries)
		}
		if n := starts(); n != 1 {
			t.Errorf("a set of another size started %d ipset processes, want 1", n)
		}
	})
}

// TestSetEntriesOverNetlinkAreWhatIpsetSaves lists sets of every type and
// family, with entries of every shape and one set large enough to take
// many netlink messages, over netlink and with `ipset save`: the same
// entries in the same words. A set with an extension the decoder does not
// know (comments) goes to `ipset save`.
func TestSetEntriesOverNetlinkAreWhatIpsetSaves(t *testing.T) {
	sets := testSets(t)
	commented := sets[1].Name + "-C"
	ns := setsNetns(t, append(sets, SetSpec{Name: commented})...)
	var names []string
	for _, s := range sets {
		names = append(names, s.Name)
	}
	var kernel ipsets
	testutil.DoInNetns(t, ns, func() {
		if err := kernel.EnsureSets(sets); err != nil {
			t.Fatal(err)
		}
		changes := testChanges(sets)
		for i := range 5000 {
			changes = append(changes, SetChange{Set: sets[2].Name, Entry: fmt.Sprintf("10.244.%d.%d,udp:%d,10.244.%d.%d", i>>8, i&0xff, i, i>>8, i&0xff)})
		}
		if err := kernel.ChangeSets(changes); err != nil {
			t.Fatal(err)
		}
		listed, err := listedEntries(append(names, "RPXT-MISSING"))
		if err != nil {
			t.Fatal(err)
		}
		saved, err := savedEntries(names)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(listed, saved) {
			t.Errorf("netlink lists\n%v\nipset save\n%v", listed, saved)
		}
		for _, n := range names {
			if len(listed[n]) == 0 {
				t.Errorf("netlink lists no entries of %s", n)
			}
		}
		if len(listed[sets[2].Name]) < 5000 {
			t.Errorf("netlink lists %d entries of %s, want over 5000", len(listed[sets[2].Name]), sets[2].Name)
		}

		testutil.InNetns(t, ns, "ipset", "create", commented, "hash:ip,port", "comment")
		testutil.InNetns(t, ns, "ipset", "add", commented, "10.96.0.1,tcp:80", "comment", "hello")
		if _, err := listedEntries([]string{commented}); !errors.Is(err, errUndecoded) {
			t.Errorf("a set with comments listed over netlink: %v, want it undecoded", err)
		}
		got, err := kernel.SetEntries([]string{sets[0].Name, commented})
		want := map[string][]string{sets[0].Name: saved[sets[0].Name], commented: {"10.96.0.1,tcp:80"}}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("with a set of comments, SetEntries lists %v (%v), want ipset save's %v", got, err, want)
		}
	})
}
