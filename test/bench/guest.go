package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
)

// In mode ipvs each proxy runs in a VM of its own (test/vm: Debian's
// kernel, which has IPVS, under qemu) as the cluster's node: the API
// objects stay on the host, as in mode iptables. The VM's script starts the
// agent (test/bench/agent), through which the bench starts and stops
// kube-proxy and reads its /proc files; it reads the metrics from
// kube-proxy itself, through the tap.

// agentAddr is where the agent listens in the guest.
var agentAddr = vm.GuestIP + ":9000"

// guestPollInterval is how often the bench reads metrics from a VM's
// kube-proxy while it waits for a sync: each read costs the guest's one
// CPU, which TCG makes slow, time that the proxy measured would miss.
// Timestamps come from the metrics, so reading less often delays only
// when the bench notices a sync.
const guestPollInterval = 100 * time.Millisecond

// agentClient bounds the agent's short answers; a guest busy with a large
// sync under TCG may take seconds to give one.
var agentClient = &http.Client{Timeout: time.Minute}

// guest is a VM, booted for one proxy's run.
type guest struct {
	machine *vm.Machine
	config  string // the config file's path, the same on both sides
}

// bootGuest boots a VM whose kube-proxy is binary with the given config
// file content, and returns once its agent answers.
func (b *bench) bootGuest(ctx context.Context, binary, config string) (*guest, error) {
	g := &guest{config: filepath.Join(b.cluster.Dir, "kube-proxy-ipvs.yaml")}
	if err := os.WriteFile(g.config, []byte(config), 0o644); err != nil {
		return nil, err
	}
	files := vm.NodeFiles(b.cluster, binary, g.config)
	files["/usr/local/bin/agent"] = b.opts.agent
	start := time.Now()
	var err error
	g.machine, err = vm.Start(vm.Config{
		Modules: vm.IPVSModules,
		Network: true,
		Files:   files,
		Script:  vm.NodeAddresses + "agent -listen " + agentAddr + "\n",
		// The script ends when the bench tells the agent to quit.
		Timeout: 24 * time.Hour,
	}, b.logf)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		offset, roundTrip, err := g.clockOffset()
		if err == nil {
			b.logf("  VM up after %s; its clock is %+.3f s off ours (+-%.1f ms)",
				time.Since(start).Round(time.Millisecond), offset, roundTrip/2*1e3)
			return g, nil
		}
		if time.Now().After(deadline) {
			g.stop()
			return nil, fmt.Errorf("the VM's agent does not answer: %w", err)
		}
		select {
		case <-g.machine.Done():
			g.stop()
			return nil, errors.New("the VM's script ended before its agent answered")
		case <-ctx.Done():
			g.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop ends the VM: the agent stops kube-proxy and quits, so the script
// ends and the guest powers off.
func (g *guest) stop() {
	if resp, err := agentClient.Post("http://"+agentAddr+"/quit", "", nil); err == nil {
		resp.Body.Close()
		_, _ = g.machine.Wait()
	}
	g.machine.Stop()
}

// get fetches one of the agent's answers.
func (g *guest) get(path string, query url.Values) ([]byte, error) {
	resp, err := agentClient.Get("http://" + agentAddr + path + "?" + query.Encode())
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

// clockOffset is the guest's clock minus the host's, in seconds, from the
// quickest of five readings: it is off by at most half that reading's
// round trip, which it returns too.
func (g *guest) clockOffset() (offset, roundTrip float64, err error) {
	roundTrip = -1
	for range 5 {
		before := time.Now()
		body, err := g.get("/clock", nil)
		after := time.Now()
		if err != nil {
			return 0, 0, err
		}
		ns, err := strconv.ParseInt(string(body), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("agent: clock %q: %w", body, err)
		}
		if rt := after.Sub(before).Seconds(); roundTrip < 0 || rt < roundTrip {
			mid := before.Add(after.Sub(before) / 2)
			offset, roundTrip = float64(ns-mid.UnixNano())/1e9, rt
		}
	}
	return offset, roundTrip, nil
}

// startProxy starts the VM's kube-proxy, logging to name.log in the VM's
// /out.
func (g *guest) startProxy(name string) (proxyProcess, error) {
	// Again at each start: the guest's clock may drift from ours.
	offset, _, err := g.clockOffset()
	if err != nil {
		return nil, err
	}
	q := url.Values{"arg": {"/usr/local/bin/kube-proxy", "--config=" + g.config}, "log": {"/out/" + name + ".log"}}
	// No timeout: the answer lasts as long as the process.
	resp, err := http.Post("http://"+agentAddr+"/start?"+q.Encode(), "", nil)
	if err != nil {
		return nil, err
	}
	answer := bufio.NewReader(resp.Body)
	line, err := answer.ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil || resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("agent: starting kube-proxy: %s: %q (%v)", resp.Status, line, err)
	}
	p := &guestProxy{g: g, pid: pid, offset: offset,
		log: filepath.Join(g.machine.OutDir, name+".log"), exited: make(chan struct{})}
	go func() {
		defer resp.Body.Close()
		rest, _ := io.ReadAll(answer)
		p.err = fmt.Errorf("in the VM: %s", strings.TrimSpace(string(rest)))
		close(p.exited)
	}()
	return p, nil
}

// guestProxy is a kube-proxy in the VM.
type guestProxy struct {
	g      *guest
	pid    int
	offset float64 // the guest's clock minus ours (s), measured at the start
	log    string  // its log, as the host sees it
	exited chan struct{}
	err    error
}

func (p *guestProxy) Exited() <-chan struct{}     { return p.exited }
func (p *guestProxy) Err() error                  { return p.err }
func (p *guestProxy) LogTail(lines int) string    { return framework.FileTail(p.log, lines) }
func (p *guestProxy) metricsURL() string          { return "http://" + vm.GuestIP + ":10249" }
func (p *guestProxy) hostTime(t float64) float64  { return t - p.offset }
func (p *guestProxy) pollInterval() time.Duration { return guestPollInterval }

func (p *guestProxy) Stop() {
	if resp, err := agentClient.Post("http://"+agentAddr+"/stop", "", nil); err == nil {
		resp.Body.Close()
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute): // the VM's end will stop it
	}
}

func (p *guestProxy) usage() (framework.ProcUsage, error) {
	var files [2][]byte
	for i, name := range []string{"status", "stat"} {
		var err error
		if files[i], err = p.g.get("/read", url.Values{"path": {fmt.Sprintf("/proc/%d/%s", p.pid, name)}}); err != nil {
			return framework.ProcUsage{}, err
		}
	}
	return framework.ParseProcUsage(files[0], files[1])
}
