package iptables

import (
	"errors"
	"maps"
	"testing"
)

// probeKernel answers each table's generation and lists chains with the
// jumps our rules put there, unless the table was flushed.
type probeKernel struct {
	recordingKernel
	jumps       []Jump
	generations map[string]uint64
	flushed     map[string]bool
	listed      map[string]int
}

func (k *probeKernel) Generation(table string) (uint64, error) { return k.generations[table], nil }

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

// A probe lists its chain only when its table's generation moved, and at
// most at its own pace: the slow ones once per sync period.
func TestFlushProbesRunOnlyWhenTheirTableChanged(t *testing.T) {
	kernel := &probeKernel{
		generations: map[string]uint64{"mangle": 1, "filter": 1, "nat": 1},
		flushed:     map[string]bool{}, listed: map[string]int{},
	}
	p := newTestProxier(t, kernel)
	kernel.jumps = p.cfg.Params.StaticRules().Jumps
	slow := int(p.cfg.SyncPeriod / flushCheckInterval)
	watch := p.newFlushWatch()
	ticks := func(from, to int) {
		t.Helper()
		for tick := from; tick < to; tick++ {
			if probe, flushed := watch.check(tick); flushed {
				t.Fatalf("tick %d: probe %s/%s fired with nothing flushed", tick, probe.table, probe.chain)
			}
		}
	}

	ticks(0, 1)
	if want := map[string]int{"mangle": 1, "filter": 1, "nat": 1}; !maps.Equal(kernel.listed, want) {
		t.Fatalf("first check listed %v, want %v", kernel.listed, want)
	}
	ticks(1, 2*slow)
	if want := map[string]int{"mangle": 1, "filter": 1, "nat": 1}; !maps.Equal(kernel.listed, want) {
		t.Errorf("with no change, two sync periods listed %v, want nothing more", kernel.listed)
	}

	kernel.generations["nat"]++
	ticks(2*slow, 2*slow+1)
	kernel.generations["filter"]++
	ticks(2*slow+1, 2*slow+2)
	if want := map[string]int{"mangle": 1, "filter": 2, "nat": 2}; !maps.Equal(kernel.listed, want) {
		t.Errorf("after a nat and a filter change: listed %v, want %v", kernel.listed, want)
	}

	kernel.flushed["filter"] = true
	kernel.generations["filter"]++
	probe, flushed := watch.check(2*slow + 2)
	if !flushed || probe.table != TableFilter || probe.chain != "FORWARD" {
		t.Errorf("a filter flush: got %v %s/%s, want the FORWARD probe to fire", flushed, probe.table, probe.chain)
	}
}
