package ipvs

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

func portName(n string) state.ServicePortName {
	return state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: n}, Port: "p", Protocol: v1.ProtocolTCP}
}

// objects is a service port with one virtual server at addr:80 (TCP
// unless proto says otherwise) and the given real servers, bound, with
// its KUBE-CLUSTER-IP entry.
func objects(addr string, proto v1.Protocol, reals ...string) ServiceObjects {
	a := netip.MustParseAddr(addr)
	s := Server{VirtualServer: ipvskernel.VirtualServer{VirtualServerKey: ipvskernel.VirtualServerKey{Addr: a, Port: 80, Protocol: proto}, Scheduler: "rr"}}
	for _, r := range reals {
		s.Reals = append(s.Reals, netip.MustParseAddrPort(r))
	}
	return ServiceObjects{Servers: []Server{s}, Bound: []netip.Addr{a},
		Entries: []SetEntry{{Set: "KUBE-CLUSTER-IP", Entry: addr + "," + strings.ToLower(string(proto)) + ":80"}}}
}

func key(addr string, proto v1.Protocol) ipvskernel.VirtualServerKey {
	return ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr(addr), Port: 80, Protocol: proto}
}

// planLines renders a plan with the chains' line shortened: their content
// is TestChains'.
func planLines(pl *plan) []string {
	lines := pl.lines()
	for i, l := range lines {
		if strings.HasPrefix(l, "chains ") {
			lines[i] = "chains"
		}
	}
	return lines
}

func testSyncer(t *testing.T) *Syncer {
	return New(Config{Family: v1.IPv4Protocol, Params: testParams(t, false),
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}})
}

// A partial sync's plan, in the order that keeps traffic flowing.
func TestPartialSyncPlan(t *testing.T) {
	web, dns := portName("web"), portName("dns")
	tcp, udp := v1.ProtocolTCP, v1.ProtocolUDP
	for _, tc := range []struct {
		name    string
		applied map[state.ServicePortName]ServiceObjects
		// listed are the real servers the kernel lists for the virtual
		// servers that stay.
		listed   map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer
		draining []drainKey
		want     map[state.ServicePortName]ServiceObjects
		plan     []string
	}{{
		name: "a new service: its server with its real servers before its address, the entry before the chains",
		want: map[state.ServicePortName]ServiceObjects{web: objects("10.96.0.10", tcp, "10.244.1.5:8080")},
		plan: []string{
			"add server 10.96.0.10:80/TCP -> [10.244.1.5:8080]",
			"bind 10.96.0.10",
			"ipset +KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
			"ipset +KUBE-IPVS-IPS 10.96.0.10",
			"chains",
		},
	}, {
		name: "two service ports on a new address: both servers before the address, both entries before it joins KUBE-IPVS-IPS",
		want: map[state.ServicePortName]ServiceObjects{
			dns: objects("10.96.0.10", udp, "10.244.1.5:53"),
			web: objects("10.96.0.10", tcp, "10.244.1.5:8080"),
		},
		plan: []string{
			"add server 10.96.0.10:80/UDP -> [10.244.1.5:53]",
			"add server 10.96.0.10:80/TCP -> [10.244.1.5:8080]",
			"bind 10.96.0.10",
			"ipset +KUBE-CLUSTER-IP 10.96.0.10,udp:80",
			"ipset +KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
			"ipset +KUBE-IPVS-IPS 10.96.0.10",
			"chains",
		},
	}, {
		name:    "a rolling update: the new real server before the old one drains (TCP, with connections) or goes (none)",
		applied: map[state.ServicePortName]ServiceObjects{web: objects("10.96.0.10", tcp, "10.244.1.5:8080", "10.244.1.6:8080", "10.244.1.7:8080")},
		listed: map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer{key("10.96.0.10", tcp): {
			{Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080, Weight: 1, ActiveConns: 2},
			{Addr: netip.MustParseAddr("10.244.1.6"), Port: 8080, Weight: 1},
			{Addr: netip.MustParseAddr("10.244.1.7"), Port: 8080, Weight: 1},
		}},
		want: map[state.ServicePortName]ServiceObjects{web: objects("10.96.0.10", tcp, "10.244.1.7:8080", "10.244.1.9:8080")},
		plan: []string{
			"add real 10.244.1.9:8080 to 10.96.0.10:80/TCP",
			"drain real 10.244.1.5:8080 of 10.96.0.10:80/TCP",
			"delete real 10.244.1.6:8080 of 10.96.0.10:80/TCP",
			"chains",
		},
	}, {
		name:    "UDP real servers go at once; one left at weight 0 is restored when wanted again",
		applied: map[state.ServicePortName]ServiceObjects{dns: objects("10.96.0.53", udp, "10.244.1.5:53")},
		listed: map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer{key("10.96.0.53", udp): {
			{Addr: netip.MustParseAddr("10.244.1.5"), Port: 53, Weight: 1, ActiveConns: 3},
			{Addr: netip.MustParseAddr("10.244.1.6"), Port: 53, Weight: 0},
		}},
		want: map[state.ServicePortName]ServiceObjects{dns: objects("10.96.0.53", udp, "10.244.1.6:53")},
		plan: []string{
			"restore real 10.244.1.6:53 of 10.96.0.53:80/UDP",
			"delete real 10.244.1.5:53 of 10.96.0.53:80/UDP",
			"chains",
		},
	}, {
		name:    "a real server already draining is left to the drain check; one at weight 0 from an earlier run is followed",
		applied: map[state.ServicePortName]ServiceObjects{web: objects("10.96.0.10", tcp, "10.244.1.5:8080")},
		listed: map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer{key("10.96.0.10", tcp): {
			{Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080, Weight: 0, ActiveConns: 1},
			{Addr: netip.MustParseAddr("10.244.1.6"), Port: 8080, Weight: 0, InactiveConns: 1},
		}},
		draining: []drainKey{{key("10.96.0.10", tcp), netip.MustParseAddrPort("10.244.1.5:8080")}},
		want:     map[state.ServicePortName]ServiceObjects{web: objects("10.96.0.10", tcp, "10.244.1.7:8080")},
		plan: []string{
			"add real 10.244.1.7:8080 to 10.96.0.10:80/TCP",
			"watch draining real 10.244.1.6:8080 of 10.96.0.10:80/TCP",
			"chains",
		},
	}, {
		name:    "a service removed: its entries out, its address unbound before its server goes",
		applied: map[state.ServicePortName]ServiceObjects{web: objects("10.96.0.10", tcp, "10.244.1.5:8080")},
		want:    map[state.ServicePortName]ServiceObjects{web: {}},
		plan: []string{
			"ipset -KUBE-IPVS-IPS 10.96.0.10",
			"ipset -KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
			"chains",
			"unbind 10.96.0.10",
			"delete server 10.96.0.10:80/TCP",
		},
	}, {
		name: "an address and an entry one service port gives up and another takes up stay as they are",
		applied: map[state.ServicePortName]ServiceObjects{
			dns: {Bound: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Entries: objects("10.96.0.10", tcp).Entries},
			web: objects("10.96.0.11", tcp, "10.244.1.5:8080"),
		},
		listed: map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer{key("10.96.0.11", tcp): {{Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080, Weight: 1}}},
		want: map[state.ServicePortName]ServiceObjects{
			dns: {},
			web: {Servers: objects("10.96.0.11", tcp, "10.244.1.5:8080").Servers, Bound: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")},
				Entries: append(objects("10.96.0.10", tcp).Entries, objects("10.96.0.11", tcp).Entries...)},
		},
		plan: []string{"chains"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p := testSyncer(t)
			seed := p.newDiff(nil, nil)
			for _, name := range slices.SortedFunc(func(yield func(state.ServicePortName) bool) {
				for n := range tc.applied {
					if !yield(n) {
						return
					}
				}
			}, state.ServicePortName.Compare) {
				seed.replace(name, ServiceObjects{}, tc.applied[name])
			}
			p.commit(seed.finish(false).next) // as if applied
			for _, d := range tc.draining {
				p.draining[d] = p.now()
			}
			d := p.newDiff(nil, tc.listed)
			for _, name := range []state.ServicePortName{dns, web} {
				if want, ok := tc.want[name]; ok {
					d.replace(name, p.applied[name], want)
				}
			}
			if got := planLines(d.finish(false)); !slices.Equal(got, tc.plan) {
				t.Errorf("plan:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.plan, "\n  "))
			}
		})
	}
}

// A full sync compares with what the kernel holds: what is there already
// is left alone, the previous run's leftovers go, other programs' virtual
// servers (excludeCIDRs) and addresses stay.
func TestFullSyncPlan(t *testing.T) {
	tcp := v1.ProtocolTCP
	p := testSyncer(t)
	web := objects("10.96.0.10", tcp, "10.244.1.5:8080", "10.244.1.6:8080")
	kernel := &kernelObjects{
		servers: map[ipvskernel.VirtualServerKey]ipvskernel.VirtualServer{
			key("10.96.0.10", tcp):  web.Servers[0].VirtualServer,
			key("10.96.0.99", tcp):  {VirtualServerKey: key("10.96.0.99", tcp), Scheduler: "rr"},
			key("10.96.0.100", tcp): {VirtualServerKey: key("10.96.0.100", tcp), Scheduler: "rr"},
			key("10.200.0.1", tcp):  {VirtualServerKey: key("10.200.0.1", tcp), Scheduler: "rr"},
		},
		reals: map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer{key("10.96.0.10", tcp): {
			{Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080, Weight: 1},
		}},
		bound: map[netip.Addr]bool{netip.MustParseAddr("10.96.0.10"): true, netip.MustParseAddr("10.96.0.99"): true, netip.MustParseAddr("192.0.2.1"): true},
		entries: map[string]map[string]bool{
			"KUBE-CLUSTER-IP": {"10.96.0.10,tcp:80": true, "10.96.0.99,tcp:80": true},
			"KUBE-IPVS-IPS":   {"10.96.0.10": true, "10.96.0.99": true},
		},
	}
	d := p.newDiff(kernel, kernel.reals)
	d.replace(portName("web"), ServiceObjects{}, web)
	want := []string{
		"add real 10.244.1.6:8080 to 10.96.0.10:80/TCP",
		"ipset -KUBE-IPVS-IPS 10.96.0.99",
		"ipset -KUBE-CLUSTER-IP 10.96.0.99,tcp:80",
		"chains",
		"unbind 10.96.0.99",
		"delete server 10.96.0.99:80/TCP",
		"delete server 10.96.0.100:80/TCP",
	}
	if got := planLines(d.finish(true)); !slices.Equal(got, want) {
		t.Errorf("plan:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// A published version of a sharded map never changes: the next one copies
// the shards it changes.
func TestShardedMapVersions(t *testing.T) {
	first := newShardedMap[int, string]()
	e := first.edit()
	for i := range 1000 {
		e.set(i, "a")
	}
	second := e.done()
	e = second.edit()
	e.set(1, "b")
	e.delete(2)
	e.delete(5000)
	e.set(1000, "c")
	third := e.done()
	if first.len() != 0 || second.len() != 1000 || third.len() != 1000 {
		t.Fatalf("lengths %d, %d, %d; want 0, 1000, 1000", first.len(), second.len(), third.len())
	}
	if got, _ := second.get(1); got != "a" {
		t.Errorf("the earlier version changed: 1 is %q", got)
	}
	if _, ok := second.get(2); !ok {
		t.Error("the earlier version lost 2")
	}
	if got, _ := third.get(1); got != "b" {
		t.Errorf("1 is %q, want b", got)
	}
	if _, ok := third.get(2); ok {
		t.Error("2 was not deleted")
	}
	n := 0
	for range third.all() {
		n++
	}
	if n != 1000 {
		t.Errorf("all yields %d entries, want 1000", n)
	}
}
