package iptables

import (
	"context"
	"io"
	"sync"
	"time"

	"k8s.io/klog/v2"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
)

// flushCheckInterval is how often the proxier checks that no other program
// flushed its rules (a firewalld reload, iptables -F).
const flushCheckInterval = time.Second

// flushProbe is one thing a flush would remove: a rule in a chain, or,
// with no rule, the chain itself.
type flushProbe struct {
	table iptableskernel.Table
	chain iptableskernel.Chain
	rule  iptableskernel.Rule
	// every is how many check intervals apart the probe runs.
	every int
	// verify: when another program changed the table, whatever the
	// probe finds, have a full sync compare our chains with the kernel.
	verify bool
}

// flushProbes: the filter FORWARD jump is checked every second (gone with
// `iptables -F`, a firewall reload or a reset of the whole ruleset), and
// so is the nat table's generation: when another program changed the nat
// table (where the service chains are), a full sync compares every chain
// with the kernel (a service chain deleted, a rule inserted into one);
// the nat PREROUTING jump is listed at the sync period, as is the mangle
// canary (gone when a program deletes the tables' chains, what upstream
// checks): reading even one nat chain costs iptables-legacy a copy of the
// whole table.
func (p *Syncer) flushProbes() []flushProbe {
	slow := max(1, int(p.cfg.SyncPeriod/flushCheckInterval))
	probes := []flushProbe{{table: iptableskernel.TableMangle, chain: chainCanary, every: slow}}
	for _, j := range p.cfg.Params.StaticRules().Jumps {
		switch {
		case j.Table == iptableskernel.TableFilter && j.From == "FORWARD" && iptableskernel.JumpTarget(string(j.Rule)) == chainForward:
			probes = append(probes, flushProbe{table: j.Table, chain: j.From, rule: j.Rule, every: 1})
		case j.Table == iptableskernel.TableNAT && j.From == "PREROUTING":
			probes = append(probes, flushProbe{table: j.Table, chain: j.From, rule: j.Rule, every: slow},
				flushProbe{table: j.Table, every: 1, verify: true})
		}
	}
	return probes
}

// flushed tells whether the probe finds its rule or chain gone; a
// verifying probe lists nothing.
func (p *Syncer) flushed(probe flushProbe) bool {
	if probe.verify {
		return false
	}
	rules, err := p.cfg.Kernel.ListRules(string(probe.table), string(probe.chain))
	if err != nil {
		return true
	}
	if probe.rule == "" {
		return false
	}
	return !iptableskernel.ContainsRule(asRules(rules), probe.rule)
}

// ProbeInterval is how often the core runs Probe.
func (p *Syncer) ProbeInterval() time.Duration { return flushCheckInterval }

// Probe runs the flush probes due at this tick: gone names the chain of
// ours a probe found flushed, changed says another program changed the
// nat table (on nft, every change to any table moves the generation the
// probes read). Nothing is probed until a full sync has written
// everything, and again after each repair.
func (p *Syncer) Probe(context.Context) (gone string, changed bool) {
	tick := p.probeTick
	p.probeTick++
	if !p.ruleState.watched() {
		return "", false
	}
	probe, flushed, changed := p.watch.check(tick)
	if !flushed {
		return "", changed
	}
	klog.InfoS("Our iptables rules were flushed by another program; restoring them", "ipFamily", p.cfg.Family, "table", probe.table, "chain", probe.chain)
	return string(probe.table) + " " + string(probe.chain), changed
}

// RepairNext has the next full sync count what it rewrites as repairs,
// and stops the probes until it has written everything.
func (p *Syncer) RepairNext() {
	p.ruleState.askRepair()
}

// flushRecheckPeriod bounds how long a probe trusts that the generation
// changes since it last looked were all our own writes: a foreign write in
// the moments between reading a generation and our restore starting or
// ending would otherwise go unseen until the table changes again.
const flushRecheckPeriod = time.Hour

// flushWatch runs each flush probe (a process start, and on legacy a copy
// of the table: 1.6 s for the nat table at 30k services) only when its
// table's generation moved since the probe last looked, and not by our
// own writes alone: nothing can have been flushed from a table that did
// not change, and a restore of ours leaves the jumps it found in place.
type flushWatch struct {
	p       *Syncer
	probes  []flushProbe
	recheck int

	mu sync.Mutex
	// seen is, per probe, the generation at which it last found its rule,
	// moved on by our own writes from there; listed is the tick it last
	// listed its chain.
	seen   []uint64
	listed []int
}

func (p *Syncer) newFlushWatch() *flushWatch {
	probes := p.flushProbes()
	return &flushWatch{
		p: p, probes: probes, recheck: int(flushRecheckPeriod / flushCheckInterval),
		seen: make([]uint64, len(probes)), listed: make([]int, len(probes)),
	}
}

// check runs the probes due at this tick and returns the first that finds
// our rules gone; changed tells whether another program changed a table a
// verifying probe watches.
func (w *flushWatch) check(tick int) (_ flushProbe, flushed, changed bool) {
	for i, probe := range w.probes {
		if tick%probe.every != 0 {
			continue
		}
		generation, err := w.p.cfg.Kernel.Generation(string(probe.table))
		w.mu.Lock()
		unchanged := err == nil && generation == w.seen[i] && tick-w.listed[i] < w.recheck
		if !unchanged {
			w.seen[i], w.listed[i] = generation, tick
		}
		w.mu.Unlock()
		switch {
		case unchanged:
		case probe.verify:
			changed = true
		case w.p.flushed(probe):
			return probe, true, changed
		}
	}
	return flushProbe{}, false, changed
}

// generations reads each probe's table generation.
func (w *flushWatch) generations() []iptableskernel.TableGeneration {
	tables := make([]iptableskernel.Table, len(w.probes))
	for i, probe := range w.probes {
		tables[i] = probe.table
	}
	return iptableskernel.ReadGenerations(w.p.cfg.Kernel, tables)
}

// ownWrite records that a restore of ours moved the tables from the
// generations before to those after: a probe that had found its rule at
// before still has it at after.
func (w *flushWatch) ownWrite(before, after []iptableskernel.TableGeneration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.probes {
		if before[i].OK && after[i].OK && before[i].Value == w.seen[i] {
			w.seen[i] = after[i].Value
		}
	}
}

// fullSyncRead records that a full sync read the tables, which did not
// change while it read them: what the probes look for is either there or
// written by that sync (and if the sync fails, the next full one writes
// it, while the watch waits), so the probes need not list their chains
// after the first sync or the recovery from a flush.
func (w *flushWatch) fullSyncRead(before, after []iptableskernel.TableGeneration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.probes {
		if before[i].OK && after[i].OK && before[i].Value == after[i].Value {
			w.seen[i] = before[i].Value
		}
	}
}

// restore writes one input and tells the flush watch the generation
// change was ours.
func (p *Syncer) restore(in io.Reader) error {
	before := p.watch.generations()
	if err := p.cfg.Kernel.Restore(in); err != nil {
		return err
	}
	p.watch.ownWrite(before, p.watch.generations())
	return nil
}
