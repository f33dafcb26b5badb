// Package firewalld tells whether firewalld runs on the node, from what a
// kube-proxy pod can see: its process (with the host's process
// namespace), its nftables tables (with the host's network), and its
// systemd unit and D-Bus name where systemctl and busctl are there.
package firewalld

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rapidproxy/rapidproxy/internal/nfgen"
)

// busName is the D-Bus name firewalld owns while it runs.
const busName = "org.fedoraproject.FirewallD1"

// Evidence lists what shows that firewalld runs, nothing when nothing does.
func Evidence(ctx context.Context) []string {
	found := Processes("/proc")
	for _, t := range []struct {
		family uint8
		name   string
	}{{unix.NFPROTO_INET, "inet"}, {unix.NFPROTO_IPV4, "ip"}, {unix.NFPROTO_IPV6, "ip6"}} {
		if ok, err := nfgen.TableExists(t.family, "firewalld"); err == nil && ok {
			found = append(found, "nftables table "+t.name+" firewalld")
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if out, err := run(ctx, "systemctl", "is-active", "firewalld.service"); err == nil && strings.TrimSpace(out) == "active" {
		found = append(found, "systemd unit firewalld.service is active")
	}
	if _, err := run(ctx, "busctl", "--system", "status", busName); err == nil {
		found = append(found, "D-Bus name "+busName+" is owned")
	}
	return found
}

// Processes lists the firewalld processes under a /proc directory.
func Processes(proc string) []string {
	comms, _ := filepath.Glob(filepath.Join(proc, "[0-9]*", "comm"))
	var found []string
	for _, c := range comms {
		if b, err := os.ReadFile(c); err == nil && strings.TrimSpace(string(b)) == "firewalld" {
			found = append(found, "process firewalld (pid "+filepath.Base(filepath.Dir(c))+")")
		}
	}
	return found
}

// run runs a tool that may be missing, as missing tools are in the
// kube-proxy image.
func run(ctx context.Context, name string, args ...string) (string, error) {
	if _, err := exec.LookPath(name); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return string(out), err
}
