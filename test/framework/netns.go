package framework

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// namePrefix marks every namespace and host link the framework creates.
const namePrefix = "rpx-"

// Netns is a network namespace the framework created: the node, a pod, or
// the external client.
type Netns struct {
	Name string
}

func newNetns(name string) (*Netns, error) {
	full := namePrefix + name
	if err := runAll(
		[]string{"ip", "netns", "add", full},
		[]string{"ip", "-n", full, "link", "set", "lo", "up"},
	); err != nil {
		return nil, err
	}
	return &Netns{Name: full}, nil
}

// Exec runs a command inside the namespace and returns its output.
func (n *Netns) Exec(args ...string) (string, error) {
	return run("ip", append([]string{"netns", "exec", n.Name}, args...)...)
}

// Command returns a command that runs inside the namespace.
func (n *Netns) Command(args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name}, args...)...)
}

// Sysctl sets a sysctl inside the namespace.
func (n *Netns) Sysctl(key, value string) error {
	_, err := n.Exec("sysctl", "-qw", key+"="+value)
	return err
}

// Reply is what a pod server answered: its name and the client address it saw.
type Reply struct {
	Pod    string
	Source string
}

// Request sends one request from the namespace to proto ("tcp" or "udp")
// at host:port and returns who answered.
func (n *Netns) Request(proto, hostPort string, timeout time.Duration) (Reply, error) {
	return n.RequestFrom(0, proto, hostPort, timeout)
}

// RequestFrom is Request sent from a given local port (0: any), so that
// successive UDP requests share one conntrack flow.
func (n *Netns) RequestFrom(sport int, proto, hostPort string, timeout time.Duration) (Reply, error) {
	out, err := n.Exec(podserverPath(), "-client", proto+"://"+hostPort, "-sport", strconv.Itoa(sport), "-timeout", timeout.String())
	if err != nil {
		return Reply{}, err
	}
	pod, source, _ := strings.Cut(out, " ")
	return Reply{Pod: pod, Source: source}, nil
}

// Load is a stream of requests running in a namespace.
type Load struct {
	cmd *exec.Cmd
	out strings.Builder
}

// StartLoad sends a new TCP or UDP request to hostPort every interval for
// duration, from the namespace, each with a 1 s timeout.
func (n *Netns) StartLoad(proto, hostPort string, duration, interval time.Duration) (*Load, error) {
	l := &Load{cmd: n.Command(podserverPath(), "-client", proto+"://"+hostPort,
		"-load", duration.String(), "-interval", interval.String(), "-timeout", "1s")}
	l.cmd.Stdout, l.cmd.Stderr = &l.out, &l.out
	if err := l.cmd.Start(); err != nil {
		return nil, err
	}
	return l, nil
}

// LoadResult is what a load saw.
type LoadResult struct {
	OK, Failed int
	// LongestGap is the longest time without an answer: between two
	// answered requests, or from the start to the first, or from the
	// last to the end.
	LongestGap time.Duration
	// Errors are the first failures, one per line with its time.
	Errors string
}

// String is the line the tests log: sent, failed, longest gap.
func (r LoadResult) String() string {
	return fmt.Sprintf("%d requests sent, %d failed, longest gap between answers %s", r.OK+r.Failed, r.Failed, r.LongestGap)
}

// Stop ends the load before its duration (SIGTERM) and returns what it
// saw.
func (l *Load) Stop() (LoadResult, error) {
	_ = l.cmd.Process.Signal(syscall.SIGTERM)
	return l.Wait()
}

// Wait waits for the load to end and returns what it saw.
func (l *Load) Wait() (LoadResult, error) {
	if err := l.cmd.Wait(); err != nil {
		return LoadResult{}, fmt.Errorf("load generator: %w: %s", err, l.out.String())
	}
	first, rest, _ := strings.Cut(l.out.String(), "\n")
	var r LoadResult
	var gap string
	if _, err := fmt.Sscanf(first, "ok=%d failed=%d gap=%s", &r.OK, &r.Failed, &gap); err != nil {
		return LoadResult{}, fmt.Errorf("load generator said %q", l.out.String())
	}
	var err error
	if r.LongestGap, err = time.ParseDuration(gap); err != nil {
		return LoadResult{}, fmt.Errorf("load generator said %q: %w", first, err)
	}
	r.Errors = rest
	return r, nil
}

// Held is a set of long-lived TCP connections running in a namespace.
type Held struct {
	cmd *exec.Cmd
	out strings.Builder
}

// HoldConnections opens count TCP connections to hostPort from the
// namespace and keeps them until Stop (at most an hour), each sending a
// line every second that the server echoes, within 2 s.
func (n *Netns) HoldConnections(hostPort string, count int) (*Held, error) {
	h := &Held{cmd: n.Command(podserverPath(), "-client", "tcp://"+hostPort, "-hold", strconv.Itoa(count),
		"-load", "1h", "-interval", "1s", "-timeout", "2s")}
	h.cmd.Stdout, h.cmd.Stderr = &h.out, &h.out
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	return h, nil
}

// HeldResult is what long-lived connections saw.
type HeldResult struct {
	Held, Broken int
	// Errors are the first failures, one per line with its time.
	Errors string
}

func (r HeldResult) String() string {
	return fmt.Sprintf("%d long-lived connections, %d broken", r.Held, r.Broken)
}

// Stop closes the connections and returns how many broke meanwhile.
func (h *Held) Stop() (HeldResult, error) {
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	if err := h.cmd.Wait(); err != nil {
		return HeldResult{}, fmt.Errorf("connection holder: %w: %s", err, h.out.String())
	}
	first, rest, _ := strings.Cut(h.out.String(), "\n")
	var r HeldResult
	if _, err := fmt.Sscanf(first, "held=%d broken=%d", &r.Held, &r.Broken); err != nil {
		return HeldResult{}, fmt.Errorf("connection holder said %q", h.out.String())
	}
	r.Errors = rest
	return r, nil
}

func (n *Netns) delete() error {
	// Processes still inside would keep the namespace's sockets alive.
	if pids, err := run("ip", "netns", "pids", n.Name); err == nil {
		for _, pid := range strings.Fields(pids) {
			_, _ = run("kill", "-9", pid)
		}
	}
	_, err := run("ip", "netns", "delete", n.Name)
	return err
}

var linkCounter atomic.Int64

// randomSuffix makes a temporary link name unique within this process.
func randomSuffix() string {
	return strconv.Itoa(os.Getpid()%10000) + "x" + strconv.FormatInt(linkCounter.Add(1), 10)
}

// link connects two namespaces (or the host, when a is nil) with a veth pair.
func link(a *Netns, aName string, b *Netns, bName string) error {
	tmpA, tmpB := namePrefix+"t"+randomSuffix(), namePrefix+"t"+randomSuffix()
	cmds := [][]string{{"ip", "link", "add", tmpA, "type", "veth", "peer", "name", tmpB}}
	cmds = append(cmds, moveLink(a, tmpA, aName)...)
	cmds = append(cmds, moveLink(b, tmpB, bName)...)
	return runAll(cmds...)
}

// moveLink names a link and brings it up, in ns or the host. Duplicate
// address detection is off: until it ends, IPv6 neighbour discovery on the
// link stalls, and the first packets of a test would be lost.
func moveLink(ns *Netns, tmp, name string) [][]string {
	noDAD := "net.ipv6.conf." + name + ".accept_dad=0"
	if ns == nil {
		return [][]string{{"ip", "link", "set", tmp, "name", name}, {"sysctl", "-qw", noDAD}, {"ip", "link", "set", name, "up"}}
	}
	return [][]string{
		{"ip", "link", "set", tmp, "netns", ns.Name},
		{"ip", "-n", ns.Name, "link", "set", tmp, "name", name},
		{"ip", "netns", "exec", ns.Name, "sysctl", "-qw", noDAD},
		{"ip", "-n", ns.Name, "link", "set", name, "up"},
	}
}

// ip runs `ip` inside the namespace (or the host when ns is nil).
func ipCmd(ns *Netns, args ...string) []string {
	if ns == nil {
		return append([]string{"ip"}, args...)
	}
	return append([]string{"ip", "-n", ns.Name}, args...)
}

// cleanupLeftovers removes namespaces, host links and cgroups a killed run left.
func cleanupLeftovers() error {
	cleanupLeftoverCgroups()
	out, err := run("ip", "netns", "list")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], namePrefix) {
			name := f[0]
			if err := (&Netns{Name: name}).delete(); err != nil {
				return fmt.Errorf("removing leftover namespace: %w", err)
			}
		}
	}
	links, _ := run("ip", "-o", "link", "show")
	for _, line := range strings.Split(links, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if strings.HasPrefix(name, namePrefix) {
				_, _ = run("ip", "link", "delete", name)
			}
		}
	}
	return nil
}
