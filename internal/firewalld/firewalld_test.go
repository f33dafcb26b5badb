package firewalld

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestProcesses(t *testing.T) {
	proc := t.TempDir()
	for pid, comm := range map[string]string{"1": "systemd\n", "812": "firewalld\n", "900": "firewalld-helper\n", "self": "firewalld\n"} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "comm"), []byte(comm), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := Processes(proc), []string{"process firewalld (pid 812)"}; !slices.Equal(got, want) {
		t.Errorf("Processes = %q, want %q", got, want)
	}
	if got := Processes(filepath.Join(proc, "missing")); len(got) != 0 {
		t.Errorf("Processes of no /proc = %q", got)
	}
}
