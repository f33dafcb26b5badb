package ipvs_test

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// Once per check period the mode looks for what another program undid
// (a virtual server, an address, the iptables jump) and asks for a full
// sync, which puts it back.
func TestDriftAsksForAFullSync(t *testing.T) {
	for _, tc := range []struct {
		name string
		undo func(n *node) error
	}{
		{"virtual server deleted", func(n *node) error {
			return n.kernel.DeleteVirtualServer(ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP})
		}},
		{"real server deleted", func(n *node) error {
			return n.kernel.DeleteRealServer(ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP},
				netip.MustParseAddrPort("10.244.1.5:8080"))
		}},
		{"address unbound", func(n *node) error { return n.kernel.Unbind(netip.MustParseAddr("10.96.0.10")) }},
		{"set entry deleted", func(n *node) error {
			return n.kernel.ChangeSets([]ipvskernel.SetChange{{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.10,tcp:80", Delete: true}})
		}},
		{"set entry added", func(n *node) error {
			return n.kernel.ChangeSets([]ipvskernel.SetChange{{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.99,tcp:80"}})
		}},
		{"iptables flushed", func(n *node) error { n.iptables.flush(); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, core, mode := fedNode(t)
			checks := n.kernel.Calls()["SetSizes"]
			resyncs, stop := watch(t, mode)
			checksRan(t, n, checks, 2)
			select {
			case <-resyncs:
				t.Fatal("a resync was asked for while nothing changed")
			default:
			}
			if err := tc.undo(n); err != nil {
				t.Fatal(err)
			}
			resynced(t, resyncs, "")
			// The full sync it asked for puts everything back, and counts
			// the repair.
			repairs := ipvsRepairs(t)
			n.iptables.flushed.Store(false)
			core.RequestFullSync()
			sync(t, core)
			if got := ipvsRepairs(t); got != repairs+1 {
				t.Errorf("%s went from %v to %v, want one more", "sync_proxy_rules_ipvs_repairs_total", repairs, got)
			}
			stop()
			requireAsFirstSyncLeavesIt(t, n, "after the repair")
		})
	}
}

// watch runs the mode's watch until stop (which waits for its end) or
// the test's end, and returns the resyncs it asks for.
func watch(t *testing.T, mode *ipvs.Syncer) (resyncs <-chan struct{}, stop func()) {
	asked := make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		mode.Watch(ctx, func() {
			select {
			case asked <- struct{}{}:
			default: // enough asked
			}
		})
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return asked, stop
}

// resynced waits for the watch to ask for a resync; why ends the failure.
func resynced(t *testing.T, resyncs <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-resyncs:
	case <-time.After(time.Minute): // a check runs every 5 ms: the watch has stopped
		t.Fatal("no resync was asked for in a minute" + why)
	}
}

// checksRan waits until the node's kernel has had SetSizes called more
// times than since (a count of Calls), which each drift check does once,
// one check after another: with more = 2, at least one whole check ran
// after since was read. A watch that ran none in a minute has stopped.
func checksRan(t *testing.T, n *node, since, more int) {
	t.Helper()
	calledAgain(t, n, "SetSizes", since, more)
}

// calledAgain waits until method has been called more times on the
// node's kernel than the count since.
func calledAgain(t *testing.T, n *node, method string, since, more int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for n.kernel.Calls()[method] < since+more {
		if time.Now().After(deadline) {
			t.Fatalf("%s called %d times in a minute, want %d more than %d: the watch is not running", method, n.kernel.Calls()[method], more, since)
		}
		time.Sleep(time.Millisecond)
	}
}

// ipvsRepairs is the IPv4 family's count of repairs.
func ipvsRepairs(t *testing.T) float64 {
	return ipv4Count(t, metrics.IPVSRepairsTotal)
}

// watchUnchanged runs the mode's watch over a kernel no one changes until
// it has made checks whole drift checks, and returns the calls it made.
func watchUnchanged(t *testing.T, n *node, mode *ipvs.Syncer, checks int) map[string]int {
	t.Helper()
	n.kernel.ResetCalls()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		mode.Watch(ctx, func() { t.Error("a resync was asked for while nothing changed") })
	}()
	defer func() { cancel(); <-done }()
	checksRan(t, n, 0, checks+1)
	return n.kernel.Calls()
}

// A family that owns no virtual server (the IPv6 one on a node whose
// services are all IPv4) checks for drift without dumping the others'.
func TestDriftWithoutVirtualServersReadsNone(t *testing.T) {
	n := newNode()
	core, mode := n.proxier(t)
	synced(core)
	sync(t, core)
	calls := watchUnchanged(t, n, mode, 3)
	if calls["BoundAddresses"] == 0 {
		t.Fatal("no drift check ran")
	}
	if calls["VirtualServers"]+calls["EachVirtualServer"] != 0 {
		t.Errorf("%d dumps of the virtual servers, want none", calls["VirtualServers"]+calls["EachVirtualServer"])
	}
}

// The drift check lists the nat PREROUTING chain, which starts a process,
// only when the table's generation moved since it last saw the jump there:
// once at first, and again after another program's change.
func TestDriftListsTheNatChainOnlyWhenItsGenerationMoved(t *testing.T) {
	n, _, mode := fedNode(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		mode.Watch(ctx, func() {})
	}()
	defer func() { cancel(); <-done }()
	checksRan(t, n, n.kernel.Calls()["SetSizes"], 6) // five whole checks
	if got := n.iptables.lists.Load(); got != 1 {
		t.Errorf("%d listings over unchanged checks, want 1", got)
	}
	checks := n.kernel.Calls()["SetSizes"]
	n.iptables.generation.Add(1) // another program's change elsewhere in the table
	checksRan(t, n, checks, 6)
	if got := n.iptables.lists.Load(); got != 2 {
		t.Errorf("%d listings after the generation moved once, want 2", got)
	}
}

// The drift check never takes the syncer's lock: it compares what it
// lists with the snapshot the syncs publish. A sync that starts right
// after the listing, or a partial sync during it, runs at once; a full
// sync that starts during the listing, which must list the virtual
// servers itself, is not deadlocked by the check, which gives up. Either
// way the check leaves out what it read of the changed service before the
// sync instead of taking the real server the sync added for one another
// program deleted.
func TestDriftCheckNeitherHoldsUpNorMisreadsASync(t *testing.T) {
	for _, tc := range []struct {
		name string
		// during starts the sync during the listing (after its first
		// virtual server), else right after it, the check waiting for the
		// sync's end.
		during, full bool
	}{
		{"partial sync after the listing", false, false},
		{"partial sync during the listing", true, false},
		{"full sync during the listing", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, core, mode := fedNode(t)
			synced := make(chan error, 1)
			startSync := func() {
				endpoints(core, "web", v1.ProtocolTCP, "10.244.0.5@local", "10.244.1.5", "10.244.1.9")
				if tc.full {
					core.RequestFullSync()
				}
				done := make(chan error, 1)
				go func() { done <- core.SyncOnce() }()
				wait := func() {
					select {
					case err := <-done:
						synced <- err
					case <-time.After(5 * time.Second):
						synced <- errors.New("the sync waited for the drift check")
					}
				}
				if tc.during {
					go wait()
					time.Sleep(20 * time.Millisecond) // the sync holds the lock now
				} else {
					wait()
				}
			}
			if tc.during {
				n.duringListing.Store(&startSync)
			} else {
				n.afterListing.Store(&startSync)
			}
			var resyncs atomic.Int32
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				mode.Watch(ctx, func() { resyncs.Add(1) })
			}()
			defer func() {
				cancel()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Error("the drift check never ended: deadlocked with the sync")
				}
			}()
			select {
			case err := <-synced:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no drift check listed the real servers")
			}
			// Whole checks begun after the sync, of the state it left.
			checksRan(t, n, n.kernel.Calls()["SetSizes"], 3)
			if got := resyncs.Load(); got != 0 {
				t.Errorf("%d resyncs asked for, want none: the check compared what it read before a sync with what the sync wrote", got)
			}
			if !realServer(n.kernel.Dump(), "10.244.1.9:8080", 1, 0) {
				t.Errorf("the sync during the check did not add its real server:\n%s", n.kernel.Dump())
			}
		})
	}
}

// On a busy node partial syncs keep coming while the drift check lists the
// real servers (seconds at 10k services under emulation): the listing
// leaves out only the service ports they changed, and still finds what
// another program removed from the others: a real server, a whole
// virtual server.
func TestDriftListingOverlappedByPartialSyncsStillCounts(t *testing.T) {
	lb := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.13"), Port: 80, Protocol: v1.ProtocolTCP}
	t.Run("real server deleted", func(t *testing.T) {
		resyncWhileBusy(t, func(n *node) error { return n.kernel.DeleteRealServer(lb, netip.MustParseAddrPort("10.244.1.8:8080")) })
	})
	t.Run("virtual server deleted", func(t *testing.T) {
		resyncWhileBusy(t, func(n *node) error { return n.kernel.DeleteVirtualServer(lb) })
	})
}

// resyncWhileBusy requires the drift check to ask for a resync after
// another program's change while every listing is overlapped by a
// partial sync of web.
func resyncWhileBusy(t *testing.T, change func(n *node) error) {
	n, core, mode := fedNode(t)
	overlaps := 0
	var overlap func()
	overlap = func() {
		overlaps++
		eps := []string{"10.244.0.5@local", "10.244.1.5"}
		if overlaps%2 == 1 {
			eps = append(eps, "10.244.1.9")
		}
		endpoints(core, "web", v1.ProtocolTCP, eps...)
		if err := core.SyncOnce(); err != nil {
			t.Error(err)
		}
		n.duringListing.Store(&overlap)
	}
	n.duringListing.Store(&overlap)
	if err := change(n); err != nil {
		t.Fatal(err)
	}
	resyncs, stop := watch(t, mode)
	resynced(t, resyncs, ": the partial syncs during the listings hid another program's change")
	stop()
	if overlaps == 0 {
		t.Error("no partial sync ran during a listing")
	}
}

// The drift check's listings, whose cost grows with the services, are read
// again only once a hundred times their CPU time has passed (here 5 ms,
// so 0.5 s), while the rest of the check runs every CheckInterval (5 ms):
// over ten checks, one listing, and one more per 0.5 s they took (on a
// slow machine).
func TestCostlyDriftListingsAreSpacedByTheirCPUTime(t *testing.T) {
	n := newNode()
	n.listingCPU = 5 * time.Millisecond
	core, mode := n.proxier(t)
	feedServices(core)
	sync(t, core)
	start := time.Now()
	calls := watchUnchanged(t, n, mode, 10)
	took := time.Since(start)
	allowed := 1 + int(took/(100*n.listingCPU))
	if got := calls["EachVirtualServer"]; got < 1 || got > allowed || calls["BoundAddresses"] != got {
		t.Errorf("%d listings of the real servers and %d of the addresses over %d checks in %v, want 1 to %d each",
			got, calls["BoundAddresses"], calls["SetSizes"]-1, took.Round(time.Millisecond), allowed)
	}
}
