package iptables

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

func TestBackendOverride(t *testing.T) {
	for value, want := range map[string]Backend{"legacy": Legacy, "nft": NFT} {
		t.Setenv(BackendEnv, value)
		if got, err := DetectBackend(); err != nil || got != want {
			t.Errorf("%s=%s: got %q, %v", BackendEnv, value, got, err)
		}
	}
	t.Setenv(BackendEnv, "xtables")
	if _, err := DetectBackend(); err == nil || !strings.Contains(err.Error(), BackendEnv) {
		t.Errorf("a bad override gave %v, want an error naming %s", err, BackendEnv)
	}
}

// detectHelperEnv makes the test binary, run inside a namespace, print
// what DetectBackend picks there.
const detectHelperEnv = "RAPIDPROXY_TEST_DETECT_BACKEND"

func TestMain(m *testing.M) {
	if os.Getenv(detectHelperEnv) != "" {
		b, err := DetectBackend()
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Stdout.WriteString(string(b))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The backend holding the kubelet's or kube-proxy's marker chains wins,
// whatever the other holds; an untouched host gets nft.
func TestBackendFollowsTheHost(t *testing.T) {
	testutil.RequireCommands(t, "iptables-legacy", "iptables-nft")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	detect := func(netns string) Backend {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", netns, self)
		cmd.Env = append(os.Environ(), detectHelperEnv+"=1", BackendEnv+"=")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("detecting in %s: %v", netns, err)
		}
		return Backend(out)
	}

	empty := testutil.NewNetns(t)
	if got := detect(empty); got != NFT {
		t.Errorf("no rules anywhere: got %q, want nft", got)
	}

	marked := testutil.NewNetns(t)
	testutil.InNetns(t, marked, "iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
	for i := 0; i < 3; i++ {
		testutil.InNetns(t, marked, "iptables-nft", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT")
	}
	if got := detect(marked); got != Legacy {
		t.Errorf("kubelet hint in legacy, more rules in nft: got %q, want legacy", got)
	}

	counted := testutil.NewNetns(t)
	testutil.InNetns(t, counted, "iptables-legacy", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT")
	if got := detect(counted); got != Legacy {
		t.Errorf("rules only in legacy: got %q, want legacy", got)
	}
}
