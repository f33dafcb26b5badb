package framework

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// A run that was killed leaves namespaces and processes behind; the next
// run's clean-up must remove them all.
func TestLeftoversOfAKilledRunAreRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the machine's local cluster lock")
	}
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "ip", "sleep")
	lock, err := lockMachine()
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	dir := t.TempDir()
	ns, err := newNetns("leftover")
	if err != nil {
		t.Fatal(err)
	}
	if err := link(nil, namePrefix+"left0", ns, "eth0"); err != nil {
		t.Fatal(err)
	}
	orphan, err := startProcess(dir, "orphan", ns.Command("sleep", "600"))
	if err != nil {
		t.Fatal(err)
	}
	// The next run: kill what the state file names, remove what the prefix marks.
	killRecorded()
	if err := cleanupLeftovers(); err != nil {
		t.Fatal(err)
	}
	<-orphan.Exited()
	if out, _ := run("ip", "netns", "list"); strings.Contains(out, ns.Name) {
		t.Errorf("namespace %s is still there", ns.Name)
	}
	if err := exec.Command("ip", "link", "show", namePrefix+"left0").Run(); err == nil {
		t.Errorf("host link %sleft0 is still there", namePrefix)
	}
	if _, err := os.Stat(pidFile()); !os.IsNotExist(err) {
		t.Errorf("state file still there: %v", err)
	}
}
