package proxy

import (
	"context"
	"sync"
	"testing"
	"time"
)

// scriptedProber answers each Probe with what the test set, and counts
// RepairNext.
type scriptedProber struct {
	mu      sync.Mutex
	gone    string
	changed bool
	repairs int
}

func (p *scriptedProber) ProbeInterval() time.Duration { return time.Millisecond }

func (p *scriptedProber) Probe(context.Context) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gone, p.changed
}

func (p *scriptedProber) RepairNext() {
	p.mu.Lock()
	p.repairs++
	p.mu.Unlock()
}

// Ours gone asks for a repair at every look; another program's changes
// alone ask for at most one per repairPace times the last full sync's
// duration, and each repair is marked before it is asked for.
func TestWatchKernelPacesRepairs(t *testing.T) {
	for _, tc := range []struct {
		name         string
		gone         string
		changed      bool
		fullSyncTook time.Duration
		min, max     int
	}{
		{"nothing changed", "", false, 0, 0, 0},
		{"ours gone", "nat KUBE-SERVICES", false, time.Hour, 20, 1000},
		{"another program's changes, fast syncs", "", true, 0, 20, 1000},
		{"another program's changes, a slow full sync", "", true, 20 * time.Millisecond, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &scriptedProber{gone: tc.gone, changed: tc.changed}
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			resyncs := 0
			WatchKernel(ctx, p, func() time.Duration { return tc.fullSyncTook }, func() {
				resyncs++
				if p.repairs != resyncs {
					t.Errorf("resync %d asked for after %d repairs marked", resyncs, p.repairs)
				}
			})
			if resyncs < tc.min || resyncs > tc.max {
				t.Errorf("%d resyncs in 300 ms, want %d to %d", resyncs, tc.min, tc.max)
			}
		})
	}
}
