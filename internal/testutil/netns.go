package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// NetnsPrefix marks the namespaces unit tests make; it differs from the
// local cluster's "rpx-" so that a cluster starting in parallel, which
// removes its own leftovers, never deletes a namespace a test is using.
const NetnsPrefix = "rpxt-"

// NewNetns creates a network namespace for the test and deletes it when
// the test ends. It needs root and the ip tool.
func NewNetns(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	RequireCommands(t, "ip")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := NetnsPrefix + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("creating namespace %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
	return name
}

// InNetns runs a command in the namespace and fails the test if it fails.
func InNetns(t testing.TB, netns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", netns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v: %s", netns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNetnsEnv marks the copy of a test binary that runs inside a fresh
// network namespace.
const inNetnsEnv = "RAPIDPROXY_TEST_IN_NETNS"

// RerunInNetns re-runs the calling test inside a new namespace once per
// variant (its name and extra environment, in order), and tells whether
// this is that inner run.
func RerunInNetns(t *testing.T, variants [][2]string) (inner bool) {
	t.Helper()
	if os.Getenv(inNetnsEnv) != "" {
		return true
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var skipped []string
	for _, v := range variants {
		netns := NewNetns(t)
		cmd := exec.Command("ip", "netns", "exec", netns, self, "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
		if v[1] != "" {
			cmd.Env = append(cmd.Env, v[1])
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", v[0], err, out)
		} else if reason, ok := innerSkip(string(out), t.Name()); ok {
			skipped = append(skipped, v[0]+": "+reason)
		}
	}
	// An inner run's skip (which fails it under StrictEnv) is the outer
	// test's too: otherwise it would pass having checked nothing.
	if len(skipped) > 0 && !t.Failed() {
		Skip(t, strings.Join(skipped, "; "))
	}
	return false
}

// innerSkip tells whether the verbose output of an inner run shows the
// test skipped, and the reason it logged.
func innerSkip(out, name string) (string, bool) {
	_, after, ok := strings.Cut(out, "--- SKIP: "+name+" (")
	if !ok {
		return "", false
	}
	lines := strings.Split(after, "\n")
	if len(lines) > 1 {
		return strings.TrimSpace(lines[1]), true
	}
	return "skipped", true
}
