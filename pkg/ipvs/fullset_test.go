package ipvs_test

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

func fullSetNode(t *testing.T, n *node, services ...int) (*proxy.Core, *ipvs.Syncer) {
	t.Helper()
	n.maxSetEntries = 8
	core, mode := n.proxier(t)
	for _, i := range services {
		service(core, fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.96.0.%d", i+1), twoPorts)
	}
	synced(core)
	sync(t, core)
	return core, mode
}

// clusterIPEntries tells which of the services have their entries in
// KUBE-CLUSTER-IP: all, none, or some (an error).
func clusterIPEntries(t *testing.T, n *node, want bool, services ...int) {
	t.Helper()
	dump := n.kernel.Dump()
	for _, i := range services {
		for _, port := range []int{80, 81} {
			entry := fmt.Sprintf("add KUBE-CLUSTER-IP 10.96.0.%d,tcp:%d\n", i+1, port)
			if strings.Contains(dump, entry) != want {
				t.Errorf("svc-%d: %q in the kernel is %v, want %v:\n%s", i, entry, !want, want, dump)
			}
		}
	}
}

func leftOut(t *testing.T, mode *ipvs.Syncer, want string) {
	t.Helper()
	got := ""
	if err := mode.LeftOut(); err != nil {
		got = err.Error()
	}
	if got != want {
		t.Errorf("left out: %q\nwant %q", got, want)
	}
}

// holdsAllOf checks that the node's kernel holds what a fresh one holds
// for just these services (all of their entries), and that ipset refused
// none of the node's restores.
func holdsAllOf(t *testing.T, n *node, services ...int) {
	t.Helper()
	reference := newNode()
	fullSetNode(t, reference, services...)
	if got, want := n.kernel.Dump(), reference.kernel.Dump(); got != want {
		t.Errorf("the kernel holds:\n%s\nwant:\n%s", got, want)
	}
	if len(n.restoreErrors) > 0 {
		t.Errorf("ipset refused restores: %v", n.restoreErrors)
	}
}

// More service ports than a set holds: the sync succeeds with the
// services that fit, the others miss only the entries that did not fit
// (never a restore that ipset refuses, which would lose every later
// line), and the entries left out are added, oldest first, as removed
// services make room.
func TestFullSetLeavesOutOnlyWhatDoesNotFit(t *testing.T) {
	n := newNode()
	core, mode := fullSetNode(t, n, 0, 1, 2, 3, 4, 5)
	leftOut(t, mode, "ipset KUBE-CLUSTER-IP is full (maxelem 8): 4 entries of 4 service ports not added (ns/svc-4:p, ns/svc-4:q, ns/svc-5:p, ...)")
	clusterIPEntries(t, n, true, 0, 1, 2, 3)
	clusterIPEntries(t, n, false, 4, 5)
	dump := n.kernel.Dump()
	for i := range 6 {
		for _, want := range []string{fmt.Sprintf("TCP  10.96.0.%d:80 rr\n", i+1), fmt.Sprintf("TCP  10.96.0.%d:81 rr\n", i+1),
			fmt.Sprintf("add KUBE-IPVS-IPS 10.96.0.%d\n", i+1), fmt.Sprintf("inet 10.96.0.%d/32\n", i+1)} {
			if !strings.Contains(dump, want) {
				t.Errorf("svc-%d lacks %q:\n%s", i, want, dump)
			}
		}
	}

	// A partial sync leaves out a new service's entries too.
	service(core, "svc-6", "10.96.0.7", twoPorts)
	sync(t, core)
	leftOut(t, mode, "ipset KUBE-CLUSTER-IP is full (maxelem 8): 6 entries of 6 service ports not added (ns/svc-4:p, ns/svc-4:q, ns/svc-5:p, ...)")
	if dump := n.kernel.Dump(); !strings.Contains(dump, "TCP  10.96.0.7:81 rr\n") || !strings.Contains(dump, "inet 10.96.0.7/32\n") {
		t.Errorf("svc-6 lacks its virtual servers or address:\n%s", dump)
	}

	// Room for two entries: the oldest waiting take it.
	core.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "svc-0"}}, true)
	sync(t, core)
	clusterIPEntries(t, n, true, 1, 2, 3, 4)
	clusterIPEntries(t, n, false, 0, 5, 6)
	leftOut(t, mode, "ipset KUBE-CLUSTER-IP is full (maxelem 8): 4 entries of 4 service ports not added (ns/svc-5:p, ns/svc-5:q, ns/svc-6:p, ...)")

	for _, name := range []string{"svc-1", "svc-2"} {
		core.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}, true)
	}
	sync(t, core)
	leftOut(t, mode, "")
	holdsAllOf(t, n, 3, 4, 5, 6)
}

// A restart over a full set keeps what the kernel holds and leaves out the
// new service's entries; one over a full set of entries no service wants
// any more deletes them before adding the new ones.
func TestRestartOverAFullSet(t *testing.T) {
	n := newNode()
	fullSetNode(t, n, 0, 1, 2, 3)

	n.maxSetEntries = 8
	core, mode := n.proxier(t)
	service(core, "a-new", "10.96.1.1", twoPorts)
	for i := range 4 {
		service(core, fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.96.0.%d", i+1), twoPorts)
	}
	synced(core)
	sync(t, core)
	clusterIPEntries(t, n, true, 0, 1, 2, 3)
	leftOut(t, mode, "ipset KUBE-CLUSTER-IP is full (maxelem 8): 2 entries of 2 service ports not added (ns/a-new:p, ns/a-new:q)")

	_, mode = fullSetNode(t, n, 4, 5, 6, 7)
	leftOut(t, mode, "")
	holdsAllOf(t, n, 4, 5, 6, 7)
}
