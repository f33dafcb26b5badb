package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(seconds float64) time.Time { return t0.Add(time.Duration(seconds * float64(time.Second))) }

func TestDue(t *testing.T) {
	cases := []struct {
		name  string
		sched schedule
		want  time.Time
	}{
		{"idle: the periodic run", schedule{minInterval: time.Second, maxInterval: 30 * time.Second, lastRun: at(0)}, at(30)},
		{"no periodic run, nothing pending: never", schedule{minInterval: time.Second, lastRun: at(0)}, farFuture},
		{"request right after a run waits for the minimum interval", schedule{minInterval: time.Second, maxInterval: 30 * time.Second, lastRun: at(0), pending: true, pendingSince: at(0.2)}, at(1)},
		{"request long after a run goes at once", schedule{minInterval: time.Second, maxInterval: 30 * time.Second, lastRun: at(0), pending: true, pendingSince: at(10)}, at(10)},
		{"minimum interval 0: at once", schedule{maxInterval: 30 * time.Second, lastRun: at(0), pending: true, pendingSince: at(0.1)}, at(0.1)},
		{"a retry comes before the periodic run", schedule{minInterval: time.Second, maxInterval: 30 * time.Second, lastRun: at(0), retryAt: at(2)}, at(2)},
		{"a retry still respects the minimum interval", schedule{minInterval: 5 * time.Second, maxInterval: 30 * time.Second, lastRun: at(0), retryAt: at(2)}, at(5)},
		{"the periodic run wins when sooner", schedule{minInterval: time.Second, maxInterval: 3 * time.Second, lastRun: at(0), retryAt: at(10)}, at(3)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.sched.due(); !got.Equal(tc.want) {
				t.Errorf("due = %v, want %v", got, tc.want)
			}
		})
	}
	// The zero schedule of a new runner is due immediately.
	s := schedule{minInterval: time.Second, maxInterval: 30 * time.Second, pending: true}
	if !s.due().Before(t0) {
		t.Errorf("a new runner's first run is not due at once: %v", s.due())
	}
}

func TestBackoff(t *testing.T) {
	s := schedule{minInterval: 0, maxInterval: time.Hour}
	fail := errors.New("boom")
	var got []time.Duration
	now := t0
	for i := 0; i < 9; i++ {
		s.started(now)
		s.finished(now, fail)
		got = append(got, s.retryAt.Sub(now))
		now = s.retryAt
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60, 60}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("retry delays %v, want %v seconds", got, want)
		}
	}
	s.started(now)
	s.finished(now, nil)
	if !s.retryAt.IsZero() || s.failures != 0 {
		t.Errorf("a success must clear the retry: %+v", s)
	}
}

func TestRequestsDuringARunAreServedByTheNextRun(t *testing.T) {
	s := schedule{minInterval: time.Second, maxInterval: time.Minute}
	s.started(at(0))
	// A request arrives while fn runs; it must not be lost.
	s.pending, s.pendingSince = true, at(0.5)
	s.finished(at(0.6), nil)
	if got := s.due(); !got.Equal(at(1)) {
		t.Errorf("due = %v, want the minimum interval after the run", got)
	}
}

// fakeClock only moves when the test says so.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	return ch
}

func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

func TestLoopRunsAtOnceThenOnRequestAndPeriodically(t *testing.T) {
	clock := &fakeClock{now: t0}
	runs := make(chan time.Time, 10)
	r := NewWithClock(func() error { runs <- clock.Now(); return nil }, time.Second, 10*time.Second, clock)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Loop(ctx)

	expectRun(t, runs, t0)
	r.Run()
	r.Run() // coalesced with the first request
	// Not before the minimum interval: step in small steps up to it.
	for i := 0; i < 10; i++ {
		clock.step(100 * time.Millisecond)
		waitForWaiter(clock)
	}
	expectRun(t, runs, at(1))
	select {
	case got := <-runs:
		t.Fatalf("the two requests ran twice (second at %v)", got)
	default:
	}
	clock.step(10 * time.Second)
	expectRun(t, runs, at(11))
}

func expectRun(t *testing.T, runs <-chan time.Time, want time.Time) {
	t.Helper()
	select {
	case got := <-runs:
		if !got.Equal(want) {
			t.Fatalf("ran at %v, want %v", got.Sub(t0), want.Sub(t0))
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no run (wanted one at %v)", want.Sub(t0))
	}
}

// waitForWaiter lets the loop goroutine reach its next wait.
func waitForWaiter(c *fakeClock) {
	for i := 0; i < 1000; i++ {
		c.mu.Lock()
		n := len(c.waiters)
		c.mu.Unlock()
		if n > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
