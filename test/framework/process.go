package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a program the framework started; its output goes to a log
// file in the cluster's directory.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// startProcess starts cmd, logging to dir/name.log, and records its PID in
// the state file so a later run can kill it if this one dies.
func startProcess(dir, name string, cmd *exec.Cmd) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a Ctrl-C to the test does not reach it
	// before the framework stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	recordPID(cmd.Process.Pid)
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited is closed when the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Err is how the process ended; only meaningful once Exited is closed.
func (p *Process) Err() error { return p.err }

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop ends the process: SIGTERM, then SIGKILL after a grace period.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// LogTail returns the last lines of the process's log.
func (p *Process) LogTail(lines int) string { return FileTail(p.LogPath, lines) }

// FileTail returns the last lines of a file, or what there is of them.
func FileTail(path string, lines int) string {
	data, _ := os.ReadFile(path)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// waitForLog waits until the process's log contains text.
func waitForLog(p *Process, text string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if data, _ := os.ReadFile(p.LogPath); strings.Contains(string(data), text) {
			return nil
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("%s exited: %v\n%s", p.Name, p.Err(), p.LogTail(10))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not log %q within %s", p.Name, text, timeout)
		}
	}
}

// machineState holds what every run on this machine shares, whichever
// checkout it comes from: the lock and the processes to kill after a crash
// (namespace, link and address names are machine-wide too).
var machineState = "/run/rapidproxy"

// pidFile lists the processes the framework started.
func pidFile() string { return filepath.Join(machineState, "pids") }

// recordPID appends "pid starttime" so that only that very process is
// killed later, never one that reused its PID.
func recordPID(pid int) {
	f, err := os.OpenFile(pidFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintln(f, ProcessID(pid))
}

// ProcessID names a running process uniquely over a boot ("pid
// starttime"), so that a record of it never matches a later process that
// reused its PID.
func ProcessID(pid int) string { return fmt.Sprintf("%d %s", pid, startTime(pid)) }

// Running tells whether the process a ProcessID names still runs.
func Running(id string) bool {
	var pid int
	var start string
	if _, err := fmt.Sscanf(id, "%d %s", &pid, &start); err != nil || pid <= 1 {
		return false
	}
	return startTime(pid) == start
}

// killRecorded kills every process a previous run recorded that still runs.
func killRecorded() {
	data, _ := os.ReadFile(pidFile())
	for _, line := range strings.Split(string(data), "\n") {
		if Running(line) {
			pid, _ := strconv.Atoi(strings.Fields(line)[0])
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = os.Remove(pidFile())
}

// startTime is field 22 of /proc/PID/stat, unique per process over a boot.
func startTime(pid int) string {
	f := statFields(pid)
	if len(f) < 20 {
		return ""
	}
	return f[19]
}
