package framework

import (
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Outcomes of a probed connection.
const (
	ProbeOK      = "ok"
	ProbeReset   = "reset"   // refused or reset
	ProbeTimeout = "timeout" // no connection within the probe's timeout
	ProbeError   = "error"   // anything else, such as unreachable
)

// stallThreshold tells a lost SYN: the first retransmission of a SYN
// leaves after 1 s (the initial RTO), so a connection that took this long
// or more lost at least one.
const stallThreshold = 900 * time.Millisecond

// Connection is one probed TCP connection.
type Connection struct {
	Start   time.Time
	Connect time.Duration // until connected, or failed
	Outcome string
	// Detail is the pod that answered, or the error.
	Detail string
}

// LostSYN tells whether the connection lost a SYN (or its answer): it
// connected only after a retransmission, or never.
func (c Connection) LostSYN() bool {
	return c.Outcome == ProbeTimeout || (c.Outcome == ProbeOK && c.Connect >= stallThreshold)
}

// Probe is a stream of fresh TCP connections running in a namespace.
type Probe struct {
	cmd *exec.Cmd
	out strings.Builder
}

// probeLimit ends a probe nobody stopped.
const probeLimit = 30 * time.Minute

// StartProbe opens a new TCP connection to hostPort every interval until
// Stop, from the namespace, each without waiting for the previous ones
// and given timeout to connect and be answered.
func (n *Netns) StartProbe(hostPort string, interval, timeout time.Duration) (*Probe, error) {
	p := &Probe{cmd: n.Command(podserverPath(), "-client", "tcp://"+hostPort,
		"-probe", probeLimit.String(), "-interval", interval.String(), "-timeout", timeout.String())}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// Stop opens no more connections, waits for the last to end and returns
// every connection in the order they started.
func (p *Probe) Stop() ([]Connection, error) {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return nil, err
	}
	if err := p.cmd.Wait(); err != nil {
		return nil, fmt.Errorf("prober: %w: %s", err, p.out.String())
	}
	var conns []Connection
	for _, line := range strings.Split(strings.TrimSpace(p.out.String()), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			return nil, fmt.Errorf("prober said %q", line)
		}
		start, err1 := strconv.ParseInt(f[0], 10, 64)
		connect, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("prober said %q", line)
		}
		conns = append(conns, Connection{Start: time.Unix(0, start), Connect: time.Duration(connect) * time.Microsecond, Outcome: f[2], Detail: f[3]})
	}
	slices.SortFunc(conns, func(a, b Connection) int { return a.Start.Compare(b.Start) })
	return conns, nil
}

// ProbeCounts are how many probed connections ended each way.
type ProbeCounts struct {
	Total, OK, LostSYN, Reset, Timeout, Error int
	// Clean connected on their first SYN and were answered.
	Clean int
}

// CountConnections counts connections by outcome; LostSYN counts those
// that lost a SYN, timeouts included.
func CountConnections(conns []Connection) ProbeCounts {
	c := ProbeCounts{Total: len(conns)}
	for _, conn := range conns {
		switch conn.Outcome {
		case ProbeOK:
			c.OK++
		case ProbeReset:
			c.Reset++
		case ProbeTimeout:
			c.Timeout++
		default:
			c.Error++
		}
		if conn.LostSYN() {
			c.LostSYN++
		} else if conn.Outcome == ProbeOK {
			c.Clean++
		}
	}
	return c
}

func (c ProbeCounts) String() string {
	return fmt.Sprintf("%d connections: %d lost a SYN (%d of them timed out), %d reset, %d other errors", c.Total, c.LostSYN, c.Timeout, c.Reset, c.Error)
}

// LineUpFailures describes each connection that did not simply succeed
// (lost a SYN, reset, timed out, failed) with the last change made before
// it started, to tell which kind of change it followed and how closely.
func LineUpFailures(conns []Connection, changes []EndpointChange) []string {
	var out []string
	for _, c := range conns {
		if c.Outcome == ProbeOK && !c.LostSYN() {
			continue
		}
		outcome := c.Outcome
		if outcome == ProbeOK {
			outcome = "connected" // late
		}
		line := fmt.Sprintf("%s %s after %s: %s", c.Start.Format("15:04:05.000"), outcome, c.Connect.Round(time.Millisecond), c.Detail)
		k, _ := slices.BinarySearchFunc(changes, c.Start, func(ch EndpointChange, t time.Time) int { return ch.At.Compare(t) })
		if k > 0 {
			ch := changes[k-1]
			line += fmt.Sprintf("; %s after change %d (%s %s)", c.Start.Sub(ch.At).Round(time.Millisecond), k, ch.Kind, ch.Pod)
		}
		out = append(out, line)
	}
	return out
}
