package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
)

// guestNode is node-1 in a VM booting Debian's kernel, which has IPVS
// (test/vm): our kube-proxy runs there in IPVS mode, and the pods are
// namespaces in the guest (the framework's pods are on this machine), so
// the services have no selector and hand-written EndpointSlices. The
// guest's script makes the requests and leaves the answers in its /out.
type guestNode struct {
	cluster *framework.Cluster
	machine *vm.Machine
	console *os.File // the guest's serial console
}

// The guest's pods; the client outside the cluster is a namespace wired
// like them, at the address the framework's external namespace has.
var guestPods = []struct{ name, ip string }{{"web-1", "10.244.0.11"}, {"web-2", "10.244.0.12"}, {"web-3", "10.244.0.13"}}

// guestNamespaces are the namespaces in the guest that requests are made from.
var guestNamespaces = map[string]string{fromClient: "client", fromExternal: "external"}

const guestClientIP = "10.244.0.150"

func (g *guestNode) addPods(context.Context) ([]string, error) {
	var endpoints []string
	for _, p := range guestPods {
		endpoints = append(endpoints, p.ip)
	}
	return endpoints, nil // the guest starts them
}

func (g *guestNode) run(ctx context.Context, rs []request) ([]framework.Reply, error) {
	config := filepath.Join(g.cluster.Dir, "kube-proxy-ipvs.yaml")
	if err := os.WriteFile(config, []byte(g.cluster.KubeProxyConfig("mode: ipvs\n")), 0o644); err != nil {
		return nil, err
	}
	files := vm.NodeFiles(g.cluster, g.cluster.KubeProxy(), config)
	files["/usr/local/bin/podserver"] = g.cluster.Podserver()
	var err error
	if g.console, err = os.Create(filepath.Join(g.cluster.Dir, "vm-console.log")); err != nil {
		return nil, err
	}
	say("Booting a VM with Debian's kernel (qemu without KVM: a minute or more) to run our kube-proxy in IPVS mode as %s, with the pods; its console: %s",
		framework.NodeName, g.console.Name())
	g.machine, err = vm.Start(vm.Config{
		Modules: vm.IPVSModules,
		Network: true,
		Files:   files,
		Script:  guestScript(config, rs),
		Timeout: 24 * time.Hour, // the script runs until the demo ends
	}, g.logf)
	if err != nil {
		return nil, err
	}
	answers := filepath.Join(g.machine.OutDir, "answers")
	for {
		if data, err := os.ReadFile(answers); err == nil {
			say("kube-proxy in the VM synced and the guest made the requests.")
			return parseAnswers(string(data), len(rs))
		}
		select {
		case <-g.machine.Done():
			return nil, fmt.Errorf("the VM ended before it answered: %s", g.why())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// guestScript sets the guest up as the node with its pods, starts
// kube-proxy, makes the requests, writes the answers (one line each: the
// reply, or "FAILED" and the error) and ipvsadm's table to /out, and then
// runs as long as kube-proxy does.
func guestScript(config string, rs []request) string {
	var b strings.Builder
	b.WriteString("CONFIG=" + config + "\n" + vm.NodeAddresses + vm.NodeHelpers)
	for _, p := range guestPods {
		fmt.Fprintf(&b, "pod %s %s\nserve %s\n", p.name, p.ip, p.name)
	}
	fmt.Fprintf(&b, "pod %s %s\npod %s %s\n", guestNamespaces[fromClient], guestClientIP, guestNamespaces[fromExternal], framework.ExternalIPv4)
	b.WriteString(`start kube-proxy
answer() {
	if reply=$(request "$1" "$2"); then echo "$reply"; else echo "FAILED $(echo "$reply" | tr '\n' ' ')"; fi
}
{
`)
	for _, r := range rs {
		fmt.Fprintf(&b, "\tanswer %s %s://%s\n", guestNamespaces[r.from], r.proto, r.addr)
	}
	b.WriteString(`} >/out/answers.new
ipvsadm -Ln >/out/ipvsadm.txt
mv /out/answers.new /out/answers
status=0
wait $KUBE_PROXY || status=$?
fail "kube-proxy exited with status $status"
`)
	return b.String()
}

// parseAnswers reads guestScript's answers, one line a request.
func parseAnswers(data string, n int) ([]framework.Reply, error) {
	lines := strings.Split(strings.TrimSuffix(data, "\n"), "\n")
	if len(lines) != n {
		return nil, fmt.Errorf("the guest gave %d answers to %d requests: %q", len(lines), n, data)
	}
	replies := make([]framework.Reply, n)
	for i, line := range lines {
		if !strings.HasPrefix(line, "FAILED") {
			replies[i].Pod, replies[i].Source, _ = strings.Cut(line, " ")
		}
	}
	return replies, nil
}

func (g *guestNode) more() {
	table, err := os.ReadFile(filepath.Join(g.machine.OutDir, "ipvsadm.txt"))
	if err != nil {
		say("No ipvsadm table from the VM: %v", err)
	} else {
		fmt.Println()
		say("ipvsadm -Ln in the VM, after the requests:")
		fmt.Print(string(table))
		fmt.Println()
	}
	say("kube-proxy's log: %s", filepath.Join(g.machine.OutDir, "kube-proxy.log"))
}

func (g *guestNode) ended() <-chan struct{} { return g.machine.Done() }

func (g *guestNode) why() string {
	_, err := g.machine.Wait()
	return fmt.Sprintf("%v; the VM's console ends with:\n%s", err, framework.FileTail(g.console.Name(), 20))
}

func (g *guestNode) stop() {
	if g.machine != nil {
		say("Stopping the VM...")
		g.machine.Stop()
	}
	if g.console != nil {
		g.console.Close()
	}
}

// logf writes the guest's console to its file, and says the rest.
func (g *guestNode) logf(format string, args ...any) {
	if console, ok := strings.CutPrefix(format, "vm| "); ok {
		fmt.Fprintf(g.console, console+"\n", args...)
		return
	}
	say(format, args...)
}
