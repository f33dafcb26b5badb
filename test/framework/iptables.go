package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// IPTablesBackend is the kernel interface the iptables tools drive.
type IPTablesBackend string

const (
	IPTablesNFT    IPTablesBackend = "nft"
	IPTablesLegacy IPTablesBackend = "legacy"
)

// emptyLegacyTables, restored without --noflush, empties every table and
// deletes every user chain.
const emptyLegacyTables = "*filter\nCOMMIT\n*nat\nCOMMIT\n*mangle\nCOMMIT\n*raw\nCOMMIT\n"

// ResetIPTables removes every rule and chain of both backends and both
// families in the namespace, so the next kube-proxy starts from nothing.
func (n *Netns) ResetIPTables() error {
	if _, err := n.Exec("nft", "flush", "ruleset"); err != nil {
		return err
	}
	for _, tool := range []string{"iptables-legacy-restore", "ip6tables-legacy-restore"} {
		cmd := n.Command(tool, "-w")
		cmd.Stdin = strings.NewReader(emptyLegacyTables)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", tool, err, out)
		}
	}
	return nil
}

// PreferIPTablesBackend adds a rule to the backend's filter table, so that
// a program choosing the backend that already holds more rules (upstream's
// image wrapper, our kube-proxy) picks it in an otherwise empty namespace.
func (n *Netns) PreferIPTablesBackend(b IPTablesBackend) error {
	tool := "iptables-" + string(b)
	return runAll(
		[]string{"ip", "netns", "exec", n.Name, tool, "-w", "-N", "RPX-BACKEND-MARK"},
		[]string{"ip", "netns", "exec", n.Name, tool, "-w", "-A", "RPX-BACKEND-MARK", "-j", "RETURN"},
	)
}

// IPTablesAlternatives fills dir with iptables, ip6tables and their -save
// and -restore commands of one backend, as symlinks to its multi-call
// binary: put first in PATH, it chooses the backend of a program that runs
// plain `iptables`, as Debian's alternatives do.
func IPTablesAlternatives(dir string, b IPTablesBackend) error {
	multi, err := exec.LookPath("xtables-" + string(b) + "-multi")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			link := filepath.Join(dir, base+suffix)
			_ = os.Remove(link)
			if err := os.Symlink(multi, link); err != nil {
				return err
			}
		}
	}
	return nil
}
