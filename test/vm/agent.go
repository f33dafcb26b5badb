package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// AgentPort is where a guest's script runs the agent (test/vm/agent):
// "agent -listen " + the guest's IP + ":" + AgentPort; AgentAddr with
// Config.Network.
const AgentPort = "9000"

// AgentAddr is the agent's address in a guest with Config.Network.
var AgentAddr = GuestIP + ":" + AgentPort

// agentClient bounds the agent's short answers; a guest busy with a large
// sync under TCG may take seconds to give one.
var agentClient = &http.Client{Timeout: time.Minute}

// Agent is the client of the agent in a networked VM: it starts and stops
// one process at a time there and reads the guest's files.
type Agent struct {
	m    *Machine
	addr string
}

// AgentOf is the agent m's script runs, on AgentPort of the guest's IP.
func AgentOf(m *Machine) *Agent {
	ip := GuestIP
	if m.cfg.Underlay != nil {
		ip = m.cfg.Underlay.GuestIP()
	}
	return &Agent{m: m, addr: ip + ":" + AgentPort}
}

// WaitReady returns once the agent answers, or fails if it does not
// within timeout or the VM's script ends first.
func (a *Agent) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := a.Get("/clock", nil)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the VM's agent does not answer: %w", err)
		}
		select {
		case <-a.m.Done():
			return errors.New("the VM's script ended before its agent answered")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Get fetches one of the agent's answers.
func (a *Agent) Get(path string, query url.Values) ([]byte, error) {
	resp, err := agentClient.Get("http://" + a.addr + path + "?" + query.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("agent: GET %s: %s: %s", path, resp.Status, body)
	}
	return body, err
}

// Read is the content of a file in the guest.
func (a *Agent) Read(path string) ([]byte, error) {
	return a.Get("/read", url.Values{"path": {path}})
}

// GuestProcess is a process the agent started.
type GuestProcess struct {
	Pid    int
	exited chan struct{}
	err    error
}

// Exited is closed when the process has ended; Err then says how.
func (p *GuestProcess) Exited() <-chan struct{} { return p.exited }

// Err is how the process ended ("in the VM: exit status 1"), once Exited
// is closed.
func (p *GuestProcess) Err() error { return p.err }

// Start runs args in the guest with their output in the guest file log
// (a file under /out is on the host, in Machine.OutDir); one process runs
// at a time.
func (a *Agent) Start(log string, args ...string) (*GuestProcess, error) {
	q := url.Values{"arg": args, "log": {log}}
	// No timeout: the answer lasts as long as the process.
	resp, err := http.Post("http://"+a.addr+"/start?"+q.Encode(), "", nil)
	if err != nil {
		return nil, err
	}
	answer := bufio.NewReader(resp.Body)
	line, err := answer.ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil || resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("agent: starting %s: %s: %q (%v)", args[0], resp.Status, line, err)
	}
	p := &GuestProcess{Pid: pid, exited: make(chan struct{})}
	go func() {
		defer resp.Body.Close()
		rest, _ := io.ReadAll(answer)
		p.err = fmt.Errorf("in the VM: %s", strings.TrimSpace(string(rest)))
		close(p.exited)
	}()
	return p, nil
}

// Run runs args in the guest to their end, as Start does, and fails
// unless they exit 0.
func (a *Agent) Run(ctx context.Context, log string, args ...string) error {
	p, err := a.Start(log, args...)
	if err != nil {
		return err
	}
	select {
	case <-p.Exited():
	case <-ctx.Done():
		a.Stop(p)
		return ctx.Err()
	}
	if msg := p.err.Error(); !strings.HasSuffix(msg, "exit status 0") {
		return fmt.Errorf("%s: %s", strings.Join(args, " "), msg)
	}
	return nil
}

// Stop ends p (SIGTERM, SIGKILL after 10 s) and waits for it, at most a
// minute: the VM's end stops it anyway.
func (a *Agent) Stop(p *GuestProcess) {
	if resp, err := agentClient.Post("http://"+a.addr+"/stop", "", nil); err == nil {
		resp.Body.Close()
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
	}
}

// Quit stops the agent's process, if any, and the agent, which ends the
// VM's script; it then waits for the guest's result (at most the
// machine's timeout).
func (a *Agent) Quit() error {
	resp, err := agentClient.Post("http://"+a.addr+"/quit", "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	_, err = a.m.Wait()
	return err
}
