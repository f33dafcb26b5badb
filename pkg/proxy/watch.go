package proxy

import (
	"context"
	"time"
)

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
