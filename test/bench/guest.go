package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
)

// In mode ipvs each proxy runs in a VM of its own (test/vm: Debian's
// kernel, which has IPVS, under qemu) as the cluster's node: the API
// objects stay on the host, as in mode iptables. The VM's script starts the
// agent (test/vm/agent), through which the bench starts and stops
// kube-proxy and reads its /proc files; it reads the metrics from
// kube-proxy itself, through the tap.

// guestPollInterval is how often the bench reads metrics from a VM's
// kube-proxy while it waits for a sync: each read costs the guest's one
// CPU, which TCG makes slow, time that the proxy measured would miss.
// Timestamps come from the metrics, so reading less often delays only
// when the bench notices a sync.
const guestPollInterval = 100 * time.Millisecond

// guest is a VM, booted for one proxy's run.
type guest struct {
	machine *vm.Machine
	agent   *vm.Agent
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
		Script:  vm.NodeAddresses + "agent -listen " + vm.AgentAddr + "\n",
		// The script ends when the bench tells the agent to quit.
		Timeout: 24 * time.Hour,
	}, b.logf)
	if err != nil {
		return nil, err
	}
	g.agent = vm.AgentOf(g.machine)
	if err := g.agent.WaitReady(ctx, 2*time.Minute); err != nil {
		g.stop()
		return nil, err
	}
	offset, roundTrip, err := g.clockOffset()
	if err != nil {
		g.stop()
		return nil, err
	}
	b.logf("  VM up after %s; its clock is %+.3f s off ours (+-%.1f ms)",
		time.Since(start).Round(time.Millisecond), offset, roundTrip/2*1e3)
	return g, nil
}

// stop ends the VM: the agent stops kube-proxy and quits, so the script
// ends and the guest powers off.
func (g *guest) stop() {
	if g.agent != nil {
		_ = g.agent.Quit()
	}
	g.machine.Stop()
}

// clockOffset is the guest's clock minus the host's, in seconds, from the
// quickest of five readings: it is off by at most half that reading's
// round trip, which it returns too.
func (g *guest) clockOffset() (offset, roundTrip float64, err error) {
	roundTrip = -1
	for range 5 {
		before := time.Now()
		body, err := g.agent.Get("/clock", nil)
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
	proc, err := g.agent.Start("/out/"+name+".log", "/usr/local/bin/kube-proxy", "--config="+g.config)
	if err != nil {
		return nil, err
	}
	return &guestProxy{GuestProcess: proc, g: g, offset: offset, log: filepath.Join(g.machine.OutDir, name+".log")}, nil
}

// guestProxy is a kube-proxy in the VM.
type guestProxy struct {
	*vm.GuestProcess
	g      *guest
	offset float64 // the guest's clock minus ours (s), measured at the start
	log    string  // its log, as the host sees it
}

func (p *guestProxy) LogTail(lines int) string    { return framework.FileTail(p.log, lines) }
func (p *guestProxy) metricsURL() string          { return "http://" + vm.GuestIP + ":10249" }
func (p *guestProxy) hostTime(t float64) float64  { return t - p.offset }
func (p *guestProxy) pollInterval() time.Duration { return guestPollInterval }

func (p *guestProxy) Stop() { p.g.agent.Stop(p.GuestProcess) }

func (p *guestProxy) usage() (framework.ProcUsage, error) {
	var files [2][]byte
	for i, name := range []string{"status", "stat"} {
		var err error
		if files[i], err = p.g.agent.Read(fmt.Sprintf("/proc/%d/%s", p.Pid, name)); err != nil {
			return framework.ProcUsage{}, err
		}
	}
	return framework.ParseProcUsage(files[0], files[1])
}
