// Package runner runs a sync function at a bounded frequency: on request
// but never more often than once per minimum interval, at least once per
// maximum interval, and again soon after a failure, backing off.
package runner

import (
	"context"
	"sync"
	"time"
)

// Clock is the time source; tests supply their own.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Runner calls fn as Run requests, within its bounds.
type Runner struct {
	fn    func() error
	clock Clock
	wake  chan struct{}

	mu    sync.Mutex
	sched schedule
}

// New returns a runner; minInterval may be 0 (run at once on request).
// A maxInterval of 0 disables periodic runs.
func New(fn func() error, minInterval, maxInterval time.Duration) *Runner {
	return NewWithClock(fn, minInterval, maxInterval, realClock{})
}

// NewWithClock is New with a given clock.
func NewWithClock(fn func() error, minInterval, maxInterval time.Duration, clock Clock) *Runner {
	return &Runner{
		fn:    fn,
		clock: clock,
		wake:  make(chan struct{}, 1),
		sched: schedule{minInterval: minInterval, maxInterval: maxInterval, pending: true},
	}
}

// Run asks for a run as soon as the minimum interval allows. Requests made
// before the run starts are served by that one run.
func (r *Runner) Run() {
	r.mu.Lock()
	if !r.sched.pending {
		r.sched.pending, r.sched.pendingSince = true, r.clock.Now()
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Loop runs until the context ends. The first run happens at once.
func (r *Runner) Loop(ctx context.Context) {
	for {
		r.mu.Lock()
		wait := r.sched.due().Sub(r.clock.Now())
		r.mu.Unlock()
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
				continue // a request may bring the next run forward
			case <-r.clock.After(wait):
				continue // re-check: the due time is recomputed from the state
			}
		}
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		r.sched.started(r.clock.Now())
		r.mu.Unlock()
		err := r.fn()
		r.mu.Lock()
		r.sched.finished(r.clock.Now(), err)
		r.mu.Unlock()
	}
}

// schedule is the runner's decision state, kept apart so the timing rules
// are plain functions of it.
type schedule struct {
	minInterval, maxInterval time.Duration
	lastRun                  time.Time
	pending                  bool
	pendingSince             time.Time
	// retryAt is set after a failure; failures counts them in a row.
	retryAt  time.Time
	failures int
}

const (
	firstRetry = time.Second
	maxRetry   = time.Minute
)

// farFuture stands for "no run due".
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// due is when the next run should start.
func (s *schedule) due() time.Time {
	next := farFuture
	if s.maxInterval > 0 {
		next = s.lastRun.Add(s.maxInterval)
	}
	earliest := s.lastRun.Add(s.minInterval)
	if s.pending {
		next = earlier(next, later(earliest, s.pendingSince))
	}
	if !s.retryAt.IsZero() {
		next = earlier(next, later(earliest, s.retryAt))
	}
	return next
}

// started records that a run begins: it serves every request so far.
func (s *schedule) started(now time.Time) {
	s.lastRun = now
	s.pending = false
	s.retryAt = time.Time{}
}

// finished records the result: a failure schedules a retry, backing off
// from one second, doubling, to a minute at most.
func (s *schedule) finished(now time.Time, err error) {
	if err == nil {
		s.failures = 0
		return
	}
	backoff := firstRetry << min(s.failures, 6)
	s.failures++
	s.retryAt = now.Add(min(backoff, maxRetry))
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
