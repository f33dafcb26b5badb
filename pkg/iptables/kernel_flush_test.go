package iptables

import (
	"fmt"
	"maps"
	"os/exec"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Flush probes and foreign changes to our chains on the real kernel.

// Each flush probe notices its own kind of flush, and a full sync puts
// everything back.
func TestFlushProbesNoticeFlushesAndAFullSyncRepairs(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	p, _, backend := syncedProxier(t, 3)
	tool := "iptables-" + string(backend)
	for _, flush := range [][]string{
		{"-t", "filter", "-F"},
		{"-t", "nat", "-F", "PREROUTING"},
		{"-t", "mangle", "-X", "KUBE-PROXY-CANARY"},
	} {
		for _, probe := range p.flushProbes() {
			if p.flushed(probe) {
				t.Fatalf("%s: before %v, probe %s/%s already fires", backend, flush, probe.table, probe.chain)
			}
		}
		if out, err := exec.Command(tool, flush...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", tool, flush, err, out)
		}
		fired := 0
		for _, probe := range p.flushProbes() {
			if p.flushed(probe) {
				fired++
			}
		}
		if fired != 1 {
			t.Errorf("%s: after %v, %d probes fired, want 1", backend, flush, fired)
		}
		p.RequestFullSync()
		if err := p.sync(); err != nil {
			t.Fatalf("%s: full sync after %v: %v", backend, flush, err)
		}
	}
}

// Another program's change to our service chains (a rule inserted into
// one, a NodePort's external chain deleted with its jump) is reported by the watch, and the
// full sync it asks for restores them, counting one repair; a full sync
// that only writes a service change of ours counts none.
func TestForeignChangesToOurChainsAreRepairedAndCounted(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	p, real, backend := syncedProxier(t, 3)
	name := func(i int) state.ServicePortName {
		return state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}, Port: "p", Protocol: v1.ProtocolTCP}
	}
	inserted, deleted := chainsFor(name(0)).cluster, chainsFor(name(1)).external
	rules, err := real.ListRules("nat", string(chainNodePorts))
	if err != nil {
		t.Fatal(err)
	}
	position := 0
	for i, r := range rules {
		if strings.HasSuffix(r, "-j "+string(deleted)) {
			position = i + 1
		}
	}
	var before []iptableskernel.TableGeneration
	fullSync := func(verifying bool) int {
		t.Helper()
		if verifying {
			p.ruleState.askRepair()
		}
		p.RequestFullSync()
		if err := p.sync(); err != nil {
			t.Fatal(err)
		}
		return p.repairs
	}
	tick := 0
	changed := func() bool {
		tick++
		_, _, changed := p.watch.check(tick)
		return changed
	}
	changed()
	before = p.watch.generations()
	tamper := exec.Command("iptables-"+string(backend)+"-restore", "--noflush")
	tamper.Stdin = strings.NewReader(fmt.Sprintf("*nat\n-I %s 1 -j RETURN\n-D %s %d\n-F %s\n-X %s\nCOMMIT\n", inserted, chainNodePorts, position, deleted, deleted))
	if out, err := tamper.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !changed() {
		t.Errorf("%s: the watch did not report another program's change (generations %v -> %v)", backend, before, p.watch.generations())
	}
	if n := fullSync(true); n != 2 {
		t.Errorf("%s: the full sync repaired %d chains (%v), want 2", backend, n, p.rewritten)
	}
	if changed() {
		t.Errorf("%s: the repair was taken for another program's change", backend)
	}
	feedService(p, 7)
	if n := fullSync(false); n != 0 || len(p.rewritten) == 0 {
		t.Errorf("%s: a full sync with a new service repaired %d chains and rewrote %v, want none and some", backend, n, p.rewritten)
	}
	if after := fullSync(false); after != 0 || len(p.rewritten) != 0 {
		t.Errorf("%s: a full sync over rules in place rewrote %v", backend, p.rewritten)
	}
}

// listingKernel counts the chain listings per table.
type listingKernel struct {
	iptableskernel.Kernel
	listed map[string]int
}

func (k *listingKernel) ListRules(table, chain string) ([]string, error) {
	k.listed[table]++
	return k.Kernel.ListRules(table, chain)
}

// With the real tools, our syncs, full and partial, do not make the flush
// probes list their chains nor report a change, while another program's
// write does (on nft, into any table).
func TestFlushProbesSkipOurOwnWritesOnTheRealKernel(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	p, real, backend := syncedProxier(t, 3)
	kernel := &listingKernel{Kernel: real, listed: map[string]int{}}
	p.cfg.Kernel = kernel
	slow := int(p.cfg.SyncPeriod / flushCheckInterval)
	check := func(tick int, want map[string]int, wantChanged bool) {
		t.Helper()
		probe, flushed, changed := p.watch.check(tick)
		if flushed {
			t.Fatalf("%s: probe %s/%s fired with nothing flushed", backend, probe.table, probe.chain)
		}
		if changed != wantChanged {
			t.Errorf("%s: at tick %d another program's change reported: %v, want %v", backend, tick, changed, wantChanged)
		}
		if !maps.Equal(kernel.listed, want) {
			t.Errorf("%s: at tick %d listed %v, want %v", backend, tick, kernel.listed, want)
		}
	}
	check(0, map[string]int{}, false)
	feedService(p, 3)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	check(slow, map[string]int{}, false)
	foreign := []string{"-t", "nat", "-A", "PREROUTING", "-s", "192.0.2.1/32", "-j", "RETURN"}
	if out, err := exec.Command("iptables-"+string(backend), foreign...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", foreign, err, out)
	}
	want := map[string]int{"nat": 1}
	if backend == iptableskernel.NFT {
		// One generation counts the changes of the whole nftables ruleset.
		want = map[string]int{"mangle": 1, "filter": 1, "nat": 1}
	}
	check(2*slow, want, true)
}
