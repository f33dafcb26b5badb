package ipvs

import (
	"errors"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/iptables/iptablestest"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// cloneCounts is a copy of o that no later change of o reaches.
func cloneCounts(o objectCounts) objectCounts {
	return objectCounts{entries: maps.Clone(o.entries), setSizes: maps.Clone(o.setSizes), waiting: maps.Clone(o.waiting),
		waitingIn: maps.Clone(o.waitingIn), seq: o.seq, outFilter: maps.Clone(o.outFilter)}
}

// filtered is objects with a KUBE-IPVS-OUT-FILTER rule.
func filtered(o ServiceObjects, addr string) ServiceObjects {
	o.OutFilter = []iptables.Rule{iptables.Rule("-s " + addr + "/32 -m ipvs --vproto 6 --vaddr " + addr + " --vport 80 -j DROP")}
	return o
}

// Planning a sync, partial or full, changes nothing of the syncer's nor
// of what the kernel was read to hold: the same inputs give the same plan
// again, and what the syncer applied and counts is as before, entries
// waiting for room in a full set included.
func TestPlanningLeavesTheSyncerAsItWas(t *testing.T) {
	tcp := v1.ProtocolTCP
	web, dns, db := portName("web"), portName("dns"), portName("db")
	params := testParams(t, false)
	params.MaxSetEntries = 2
	p := New(Config{Family: v1.IPv4Protocol, Params: params})
	seed := p.newDiff(nil, nil)
	seed.replace(web, ServiceObjects{}, objects("10.96.0.10", tcp, "10.244.1.5:8080"))
	seed.replace(dns, ServiceObjects{}, filtered(objects("10.96.0.11", tcp, "10.244.1.6:8080"), "10.96.0.11"))
	seed.replace(db, ServiceObjects{}, objects("10.96.0.12", tcp, "10.244.1.7:8080"))
	p.commit(seed.finish(false).next)
	if p.left == nil {
		t.Fatal("with room for two entries a set, no entry of three service ports waits")
	}
	// A full sync's kernel: dns's server as applied, a leftover one.
	kernel := func() *kernelObjects {
		dnsServer := objects("10.96.0.11", tcp).Servers[0].VirtualServer
		return &kernelObjects{
			servers: map[ipvskernel.VirtualServerKey]ipvskernel.VirtualServer{
				key("10.96.0.99", tcp): {VirtualServerKey: key("10.96.0.99", tcp), Scheduler: "rr"}, dnsServer.VirtualServerKey: dnsServer},
			bound:   map[netip.Addr]bool{netip.MustParseAddr("10.96.0.99"): true, netip.MustParseAddr("10.96.0.11"): true},
			entries: map[string]map[string]bool{"KUBE-IPVS-IPS": {"10.96.0.99": true, "10.96.0.11": true}, "KUBE-CLUSTER-IP": {"10.96.0.12,tcp:80": true}},
		}
	}
	read := kernel()
	for _, tc := range []struct {
		name string
		plan func() *plan
		// want is a line the plan must have.
		want string
	}{{
		name: "partial",
		plan: func() *plan {
			d := p.newDiff(nil, nil)
			d.replace(db, p.applied[db], objects("10.96.0.12", tcp, "10.244.1.8:8080"))
			d.replace(web, p.applied[web], ServiceObjects{})
			return d.finish(false)
		},
		want: "ipset +KUBE-CLUSTER-IP 10.96.0.12,tcp:80", // waited, and has web's room
	}, {
		name: "full",
		plan: func() *plan {
			d := p.newDiff(read, read.reals)
			d.replace(db, ServiceObjects{}, objects("10.96.0.12", tcp, "10.244.1.8:8080"))
			d.replace(dns, ServiceObjects{}, filtered(objects("10.96.0.11", tcp, "10.244.1.6:8080"), "10.96.0.11"))
			return d.finish(true)
		},
		want: "delete server 10.96.0.99:80/TCP",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			applied, counts, last, left := maps.Clone(p.applied), cloneCounts(p.objects), p.last, p.left
			first := tc.plan().lines()
			if second := tc.plan().lines(); !slices.Equal(first, second) {
				t.Errorf("planned twice:\n  %s\nthen:\n  %s", strings.Join(first, "\n  "), strings.Join(second, "\n  "))
			}
			if !slices.Contains(first, tc.want) {
				t.Errorf("the plan lacks %q:\n  %s", tc.want, strings.Join(first, "\n  "))
			}
			if !reflect.DeepEqual(p.applied, applied) {
				t.Errorf("planning changed what was applied: %v, was %v", p.applied, applied)
			}
			if !reflect.DeepEqual(p.objects, counts) {
				t.Errorf("planning changed the counts: %+v, were %+v", p.objects, counts)
			}
			if p.last != last || p.left != left {
				t.Error("planning changed the last snapshot or what was left out")
			}
			if !reflect.DeepEqual(read, kernel()) {
				t.Errorf("planning changed what the kernel was read to hold: %+v", read)
			}
		})
	}
}

// committed is what a sync leaves of the syncer's state, comparable
// between syncers (a snapshot's maps are seeded afresh in each).
type committed struct {
	applied  map[state.ServicePortName]ServiceObjects
	objects  objectCounts
	left     error
	gen      uint64
	settled  bool
	servers  map[ipvskernel.VirtualServerKey]appliedServer
	bound    map[netip.Addr]int
	setSizes map[string]int
}

// A sync whose apply fails commits what one that succeeds does: the
// failed partial sync is followed by a full sync, which reads the kernel.
func TestFailedApplyCommitsAsASuccessfulOne(t *testing.T) {
	tcp := v1.ProtocolTCP
	web, dns := portName("web"), portName("dns")
	after := map[bool]committed{}
	for _, fail := range []bool{false, true} {
		k := ipvskernel.NewFake()
		p := New(Config{Family: v1.IPv4Protocol, Kernel: k, IPTables: &iptablestest.SavedKernel{}, Params: testParams(t, false)})
		if err := k.EnsureDummyLink(); err != nil {
			t.Fatal(err)
		}
		if err := k.EnsureSets(p.cfg.Params.Sets()); err != nil {
			t.Fatal(err)
		}
		d := p.newDiff(nil, nil)
		d.replace(web, ServiceObjects{}, objects("10.96.0.10", tcp, "10.244.1.5:8080"))
		if err := p.run(d, false); err != nil {
			t.Fatal(err)
		}
		if fail {
			k.FailNext("AddVirtualServer", errors.New("file exists"))
		}
		d = p.newDiff(nil, nil)
		d.replace(dns, ServiceObjects{}, objects("10.96.0.11", tcp, "10.244.1.6:8080"))
		if err := p.run(d, false); (err != nil) != fail {
			t.Fatalf("failing: %v; the sync's error: %v", fail, err)
		}
		after[fail] = committed{applied: p.applied, objects: p.objects, left: p.left, gen: p.last.gen, settled: p.last.settled,
			servers: maps.Collect(p.last.servers.all()), bound: maps.Collect(p.last.bound.all()), setSizes: p.last.setSizes}
	}
	if !reflect.DeepEqual(after[true], after[false]) {
		t.Errorf("after a failed apply:\n  %+v\nafter a successful one:\n  %+v", after[true], after[false])
	}
	if len(after[true].applied) != 2 || !after[true].settled {
		t.Errorf("after a failed apply: %d service ports applied, settled %v; want 2, true", len(after[true].applied), after[true].settled)
	}
}

// An edit of a map reads through to it, leaves it alone until done, and
// then holds what the edit made of it; a fresh one writes its own map.
func TestMapEdit(t *testing.T) {
	base := map[string]int{"kept": 1, "changed": 2, "deleted": 3, "deleted and set again": 4}
	before := maps.Clone(base)
	e := overlay(base)
	e.set("changed", 20)
	e.delete("deleted")
	e.delete("deleted and set again")
	e.set("deleted and set again", 40)
	e.set("added", 5)
	e.set("added and deleted", 6)
	e.delete("added and deleted")
	e.delete("never there")
	want := map[string]int{"kept": 1, "changed": 20, "deleted and set again": 40, "added": 5}
	if !reflect.DeepEqual(base, before) {
		t.Errorf("the edit changed its base: %v", base)
	}
	if got := maps.Collect(e.all()); !reflect.DeepEqual(got, want) || e.len() != len(want) {
		t.Errorf("the edit holds %v (len %d), want %v", got, e.len(), want)
	}
	if _, ok := e.get("deleted"); ok {
		t.Error("a deleted key reads through to the base")
	}
	if got := e.copied(); !reflect.DeepEqual(got, want) {
		t.Errorf("copied %v, want %v", got, want)
	}
	if got := e.done(); !reflect.DeepEqual(got, want) {
		t.Errorf("done %v, want %v", got, want)
	}

	own := map[string]int{}
	f := fresh(own)
	f.set("a", 1)
	f.set("b", 2)
	f.delete("b")
	if !reflect.DeepEqual(own, map[string]int{"a": 1}) || f.len() != 1 {
		t.Errorf("a fresh edit holds %v (len %d), want a: 1", own, f.len())
	}
}
