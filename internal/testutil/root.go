// Package testutil holds small helpers shared by the project's tests.
package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// StrictEnv names the variable that turns a skipped privileged test into a
// failure. CI sets it so that a test needing root or a kernel feature can
// never pass by silently not running.
const StrictEnv = "RAPIDPROXY_NO_SKIP"

// Skip skips the test with the reason, or fails it when StrictEnv is set.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(StrictEnv) != "" {
		t.Fatalf("%s (and %s is set, so this cannot be skipped)", reason, StrictEnv)
	}
	t.Skip(reason)
}

// RequireRoot skips (or, under StrictEnv, fails) a test that is not run as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root")
	}
}

// RequireCommands skips (or, under StrictEnv, fails) a test when any of the
// named programs is not on PATH.
func RequireCommands(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Skip(t, "needs "+n+" on PATH")
		}
	}
}

// LineDiff lists the lines only in want (-) and only in got (+), each as
// often as it is missing, for test failures that compare rule sets.
func LineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(got, "\n") {
		count[l]++
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if count[l] > 0 {
			count[l]--
			continue
		}
		b.WriteString("- " + l + "\n")
	}
	for _, l := range strings.Split(got, "\n") {
		if count[l] > 0 {
			count[l]--
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// Golden compares got with the file at path, or rewrites the file when
// update is set (after a review of the change).
func Golden(t testing.TB, path, got string, update bool) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (go test -update rewrites it after review):\n%s", path, LineDiff(string(want), got))
	}
}
