//go:build realnode

package node

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// phaseCounts is what the traffic saw during one phase, summed over the
// nodes and targets.
type phaseCounts struct {
	newConns, failed  int
	longestGap        time.Duration
	held, broken      int
	flows, moved      int
	udpAsked, udpLost int
	took              time.Duration
	errors            []string
}

// udpFlow is one UDP flow: a fixed source port from a client pod to the
// ClusterIP, asked every second which endpoint answers.
type udpFlow struct {
	from  string
	netns *framework.Netns
	sport int
	pod   string
}

// target is where a client sends its connections, and from where.
type target struct {
	what     string
	from     *framework.Netns
	hostPort string
}

// traffic runs to each target a new TCP connection every 20 ms (after
// each answer) and two long-lived connections, and the UDP flows.
type traffic struct {
	loads []*framework.Load
	held  []*framework.Held
	what  []string
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	udp   phaseCounts
}

func startTraffic(t *testing.T, targets []target, flows []*udpFlow, udpTarget string) *traffic {
	t.Helper()
	tr := &traffic{stop: make(chan struct{})}
	for _, tg := range targets {
		load, err := tg.from.StartLoad("tcp", tg.hostPort, 30*time.Minute, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		held, err := tg.from.HoldConnections(tg.hostPort, 2)
		if err != nil {
			t.Fatal(err)
		}
		tr.loads, tr.held, tr.what = append(tr.loads, load), append(tr.held, held), append(tr.what, tg.what)
	}
	tr.udp.flows = len(flows)
	for _, f := range flows {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			moved := false
			for {
				select {
				case <-tr.stop:
					return
				case <-time.After(time.Second):
				}
				r, err := f.netns.RequestFrom(f.sport, "udp", udpTarget, time.Second)
				tr.mu.Lock()
				tr.udp.udpAsked++
				switch {
				case err != nil:
					tr.udp.udpLost++
					tr.udp.errors = append(tr.udp.errors, fmt.Sprintf("%s UDP from port %d: no answer at %s: %v",
						f.from, f.sport, time.Now().Format("15:04:05.000"), err))
				case r.Pod != f.pod:
					if !moved {
						tr.udp.moved++
						moved = true
					}
					tr.udp.errors = append(tr.udp.errors, fmt.Sprintf("%s UDP from port %d: answered by %s, before by %s",
						f.from, f.sport, r.Pod, f.pod))
					f.pod = r.Pod
				}
				tr.mu.Unlock()
			}
		}()
	}
	return tr
}

func (tr *traffic) finish(t *testing.T) phaseCounts {
	t.Helper()
	close(tr.stop)
	tr.wg.Wait()
	c := tr.udp
	for i := range tr.loads {
		seen, err := tr.loads[i].Stop()
		if err != nil {
			t.Fatal(err)
		}
		kept, err := tr.held[i].Stop()
		if err != nil {
			t.Fatal(err)
		}
		c.newConns += seen.OK + seen.Failed
		c.failed += seen.Failed
		c.longestGap = max(c.longestGap, seen.LongestGap)
		c.held += kept.Held
		c.broken += kept.Broken
		if seen.Failed > 0 || kept.Broken > 0 {
			c.errors = append(c.errors, fmt.Sprintf("%s: %s; %s\n%s%s", tr.what[i], seen, kept, seen.Errors, kept.Errors))
		}
	}
	return c
}
