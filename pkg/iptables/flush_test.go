package iptables

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
)

// probeKernel answers each table's generation and lists chains with the
// jumps our rules put there, unless the table was flushed.
type probeKernel struct {
	recordingKernel
	jumps       []iptableskernel.Jump
	generations map[string]uint64
	flushed     map[string]bool
	listed      map[string]int
	// whileSaving, if set, runs in the middle of Save.
	whileSaving func()
}

func (k *probeKernel) Generation(table string) (uint64, error) { return k.generations[table], nil }

func (k *probeKernel) Save(read func(io.Reader) error) error {
	if k.whileSaving != nil {
		k.whileSaving()
	}
	return read(strings.NewReader(""))
}

// Restore moves the generation of each table the input writes.
func (k *probeKernel) Restore(input io.Reader) error {
	data, err := io.ReadAll(input)
	for _, line := range strings.Split(string(data), "\n") {
		if table, ok := strings.CutPrefix(line, "*"); ok {
			k.generations[table]++
		}
	}
	return err
}

func (k *probeKernel) ListRules(table, chain string) ([]string, error) {
	k.listed[table]++
	if k.flushed[table] {
		return nil, errors.New("no such chain")
	}
	var rules []string
	for _, j := range k.jumps {
		if string(j.Table) == table && string(j.From) == chain {
			rules = append(rules, string(j.Rule))
		}
	}
	return rules, nil
}

// newProbedProxier is a proxier over a probeKernel holding all our jumps.
func newProbedProxier(t *testing.T) (testProxier, *probeKernel) {
	kernel := &probeKernel{
		generations: map[string]uint64{"mangle": 1, "filter": 1, "nat": 1},
		flushed:     map[string]bool{}, listed: map[string]int{},
	}
	p := newTestProxier(t, kernel)
	kernel.jumps = p.cfg.Params.StaticRules().Jumps
	return p, kernel
}

// A probe lists its chain only when its table's generation moved, and at
// most at its own pace: the slow ones once per sync period. A change to
// the nat table is reported at the next tick, for a verifying full sync.
func TestFlushProbesRunOnlyWhenTheirTableChanged(t *testing.T) {
	p, kernel := newProbedProxier(t)
	slow := int(p.cfg.SyncPeriod / flushCheckInterval)
	changes := 0
	ticks := func(from, to int) {
		t.Helper()
		for tick := from; tick < to; tick++ {
			probe, flushed, changed := p.watch.check(tick)
			if flushed {
				t.Fatalf("tick %d: probe %s/%s fired with nothing flushed", tick, probe.table, probe.chain)
			}
			if changed {
				changes++
			}
		}
	}

	ticks(0, 1)
	changes = 0
	if want := map[string]int{"mangle": 1, "filter": 1, "nat": 1}; !maps.Equal(kernel.listed, want) {
		t.Fatalf("first check listed %v, want %v", kernel.listed, want)
	}
	ticks(1, 2*slow)
	if want := map[string]int{"mangle": 1, "filter": 1, "nat": 1}; !maps.Equal(kernel.listed, want) {
		t.Errorf("with no change, two sync periods listed %v, want nothing more", kernel.listed)
	}

	if changes != 0 {
		t.Errorf("with no change, %d ticks reported a nat change", changes)
	}
	kernel.generations["nat"]++
	ticks(2*slow, 2*slow+1)
	if changes != 1 {
		t.Errorf("after a nat change, %d ticks reported it, want 1", changes)
	}
	kernel.generations["filter"]++
	ticks(2*slow+1, 2*slow+2)
	if want := map[string]int{"mangle": 1, "filter": 2, "nat": 2}; !maps.Equal(kernel.listed, want) {
		t.Errorf("after a nat and a filter change: listed %v, want %v", kernel.listed, want)
	}

	kernel.flushed["filter"] = true
	kernel.generations["filter"]++
	probe, flushed, _ := p.watch.check(2*slow + 2)
	if !flushed || probe.table != iptableskernel.TableFilter || probe.chain != "FORWARD" {
		t.Errorf("a filter flush: got %v %s/%s, want the FORWARD probe to fire", flushed, probe.table, probe.chain)
	}
}

// Our own syncs do not make a probe list its chain (on legacy that copies
// the whole table, 1.6 s for nat at 30k services), unless another program
// wrote to the table since the probe last looked, or an hour passed.
func TestFlushProbesSkipTheChangesOfOurOwnSyncs(t *testing.T) {
	p, kernel := newProbedProxier(t)
	slow := int(p.cfg.SyncPeriod / flushCheckInterval)
	tick := 0
	checkUntil := func(to int) (flushProbe, bool) {
		t.Helper()
		for ; tick < to; tick++ {
			if probe, flushed, _ := p.watch.check(tick); flushed {
				tick++
				return probe, true
			}
		}
		return flushProbe{}, false
	}
	sync := func(full bool) {
		t.Helper()
		if full {
			p.RequestFullSync()
		}
		if err := p.sync(); err != nil {
			t.Fatal(err)
		}
	}
	expectListed := func(when string, want map[string]int) {
		t.Helper()
		if !maps.Equal(kernel.listed, want) {
			t.Errorf("%s: listed %v, want %v", when, kernel.listed, want)
		}
	}

	feed(p, 3)
	sync(true)
	checkUntil(slow)
	expectListed("after the first sync", map[string]int{})

	for i := 3; i < 6; i++ {
		feedService(p, i)
		sync(false)
		checkUntil(tick + slow)
	}
	expectListed("after three partial syncs", map[string]int{})

	// Another program's write, then ours, before the probe looks.
	kernel.generations["nat"]++
	feedService(p, 6)
	sync(false)
	checkUntil(tick + slow)
	expectListed("after a foreign nat write", map[string]int{"nat": 1})

	kernel.flushed["nat"] = true
	kernel.generations["nat"]++
	feedService(p, 7)
	sync(false)
	probe, flushed := checkUntil(tick + slow)
	if !flushed || probe.table != iptableskernel.TableNAT || probe.chain != "PREROUTING" {
		t.Errorf("a nat flush followed by a sync of ours: got %v %s/%s, want the PREROUTING probe to fire", flushed, probe.table, probe.chain)
	}
	kernel.flushed["nat"] = false

	// A full sync learns the state from what it reads, unless the table
	// changes while it reads.
	kernel.whileSaving = func() { kernel.generations["nat"]++ }
	sync(true)
	kernel.whileSaving = nil
	checkUntil(tick + slow)
	expectListed("after a full sync that read a changing nat table", map[string]int{"nat": 3})
	kernel.generations["nat"]++
	sync(true)
	checkUntil(tick + slow)
	expectListed("after a full sync", map[string]int{"nat": 3})

	checkUntil(tick + int(flushRecheckPeriod/flushCheckInterval))
	expectListed("after an hour with no change", map[string]int{"mangle": 1, "filter": 1, "nat": 4})
}

// Above LargeClusterEndpoints the endpoint chains and the jumps to them
// carry no comment, as upstream writes them; crossing the line either way
// rewrites them in a full sync.
func TestLargeClusterLeavesEndpointCommentsOut(t *testing.T) {
	kernel := &recordingKernel{}
	p := newTestProxier(t, kernel)
	feed(p, LargeClusterEndpoints/2) // two endpoints each: exactly at the line
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	if written := kernel.written.String(); !strings.Contains(written, `-A KUBE-SEP-`) || strings.Count(written, `--comment "ns/svc-`) < 3*LargeClusterEndpoints {
		t.Fatalf("at %d endpoints the endpoint rules lack their comments", LargeClusterEndpoints)
	}

	kernel.written.Reset()
	feedService(p, LargeClusterEndpoints/2)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	written := kernel.written.String()
	if strings.Count(written, ":KUBE-SEP-") != LargeClusterEndpoints+2 {
		t.Errorf("crossing the line rewrote %d endpoint chains, want all %d", strings.Count(written, ":KUBE-SEP-"), LargeClusterEndpoints+2)
	}
	for _, line := range strings.Split(written, "\n") {
		isEndpointRule := strings.HasPrefix(line, "-A KUBE-SEP-")
		isJump := strings.HasPrefix(line, "-A KUBE-SVC-") && strings.Contains(line, "-j KUBE-SEP-")
		if (isEndpointRule || isJump) && strings.Contains(line, "--comment") {
			t.Fatalf("in a large cluster: %s", line)
		}
	}
	if !strings.Contains(written, `cluster IP" -m tcp`) {
		t.Error("in a large cluster the other rules lost their comments too")
	}

	kernel.written.Reset()
	p.OnService(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc-%d", LargeClusterEndpoints/2)}}, true)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	if strings.Count(kernel.written.String(), `-m comment --comment "ns/svc-1:p" -s `) != 2 {
		t.Errorf("back at the line, the endpoint rules did not get their comments back")
	}
}
