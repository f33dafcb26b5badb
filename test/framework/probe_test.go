package framework

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// A connection that connected only after a SYN retransmission counts as a
// lost SYN, and each failure is lined up with the change made before it.
func TestProbedConnectionsAreCountedAndLinedUpWithChanges(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, int64(ms)*int64(time.Millisecond)) }
	conns := []Connection{
		{Start: at(0), Connect: time.Millisecond, Outcome: ProbeOK, Detail: "a"},
		{Start: at(5), Connect: 1010 * time.Millisecond, Outcome: ProbeOK, Detail: "b"},
		{Start: at(310), Connect: 5 * time.Second, Outcome: ProbeTimeout, Detail: "i/o_timeout"},
		{Start: at(320), Connect: time.Millisecond, Outcome: ProbeReset, Detail: "connection_refused"},
	}
	counts := CountConnections(conns)
	want := ProbeCounts{Total: 4, OK: 2, Clean: 1, LostSYN: 2, Timeout: 1, Reset: 1}
	if counts != want {
		t.Errorf("counts %+v, want %+v", counts, want)
	}
	changes := []EndpointChange{{At: at(1), Kind: ChangeAdd, Pod: "p1"}, {At: at(300), Kind: ChangeRemove, Pod: "p0"}}
	lines := LineUpFailures(conns, changes)
	wantSuffixes := []string{
		"connected after 1.01s: b; 4ms after change 1 (add p1)",
		"timeout after 5s: i/o_timeout; 10ms after change 2 (remove p0)",
		"reset after 1ms: connection_refused; 20ms after change 2 (remove p0)",
	}
	if len(lines) != len(wantSuffixes) || !slices.EqualFunc(lines, wantSuffixes, strings.HasSuffix) {
		t.Errorf("lined up:\n%s\nwant lines ending:\n%s", strings.Join(lines, "\n"), strings.Join(wantSuffixes, "\n"))
	}
}
