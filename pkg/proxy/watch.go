package proxy

import (
	"context"
	"time"
)

// Prober is a mode whose kernel objects another program may change (a
// firewall reload, `nft flush ruleset`, an admin's rule) and which the core
// watches for it: it asks Probe once a ProbeInterval, and has a full sync,
// which compares everything with what the state asks for, repair what
// another program did.
type Prober interface {
	ProbeInterval() time.Duration
	// Probe is one cheap look at the kernel: gone names what of ours
	// another program removed ("" when all is there, or when nothing was
	// written yet; the mode logs what it found), changed says another
	// program changed what the mode writes to since the last look.
	Probe(ctx context.Context) (gone string, changed bool)
	// RepairNext marks the next full sync as a repair: what it rewrites,
	// another program changed, and the mode logs and counts it so.
	RepairNext()
}

// repairPace bounds the full syncs a foreign change alone asks for to one
// per this many times the last full sync's duration: a program changing
// its own rules all the time then costs a bounded share of a core.
const repairPace = 10

// WatchKernel runs p's probes until ctx ends, and asks resync for a full
// sync when one finds our objects gone (at once) or changed by another
// program (at most once per repairPace times fullSyncTook()).
func WatchKernel(ctx context.Context, p Prober, fullSyncTook func() time.Duration, resync func()) {
	tick := time.NewTicker(p.ProbeInterval())
	defer tick.Stop()
	var pending bool
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		gone, changed := p.Probe(ctx)
		pending = pending || changed
		due := time.Since(last) >= repairPace*fullSyncTook()
		if gone == "" && !(pending && due) {
			continue
		}
		pending, last = false, time.Now()
		p.RepairNext()
		resync()
	}
}
