package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// On a node where nothing decides the iptables backend yet (no marker
// chain, no rule in either), ours writes through the backend of the
// `iptables` first on PATH, as upstream's binary does by running it by
// name; a kubelet marker chain in the other backend wins for ours, as in
// upstream's image (its wrapper looks for the markers; its bare binary
// does not, and follows PATH whatever the markers say).
func TestIPTablesBackendFollowsTheHostsCommand(t *testing.T) {
	alternatives := map[framework.IPTablesBackend]string{}
	for _, b := range []framework.IPTablesBackend{framework.IPTablesNFT, framework.IPTablesLegacy} {
		alternatives[b] = filepath.Join(cluster.Dir, "path-iptables-"+string(b))
		if err := framework.IPTablesAlternatives(alternatives[b], b); err != nil {
			t.Fatal(err)
		}
	}
	reset := func() {
		stopProxy()
		if err := cluster.Node.ResetIPTables(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(reset)
	for _, tc := range []struct {
		name           string
		path, marker   framework.IPTablesBackend // marker: "" for none
		ours, upstream framework.IPTablesBackend
	}{
		{"iptables is legacy", framework.IPTablesLegacy, "", framework.IPTablesLegacy, framework.IPTablesLegacy},
		{"iptables is nft", framework.IPTablesNFT, "", framework.IPTablesNFT, framework.IPTablesNFT},
		{"iptables is legacy, the kubelet's marker in nft", framework.IPTablesLegacy, framework.IPTablesNFT, framework.IPTablesNFT, framework.IPTablesLegacy},
		{"iptables is nft, the kubelet's marker in legacy", framework.IPTablesNFT, framework.IPTablesLegacy, framework.IPTablesLegacy, framework.IPTablesNFT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, ours := range []bool{true, false} {
				reset()
				if tc.marker != "" {
					if _, err := cluster.Node.Exec("iptables-"+string(tc.marker), "-w", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"); err != nil {
						t.Fatal(err)
					}
				}
				wrapper := []string{"env", "PATH=" + alternatives[tc.path] + ":" + os.Getenv("PATH"), iptables.BackendEnv + "=", iptables.FallbackEnv + "="}
				proxyMu.Lock()
				startProxyLocked(t, ours, iptablesMode, wrapper, proxyConfig(iptablesMode))
				proxy := running
				proxyMu.Unlock()
				got := backendsWithServices(t)
				want, who := tc.upstream, "upstream's"
				if ours {
					want, who = tc.ours, "ours"
				}
				if got != string(want) {
					t.Errorf("%s wrote KUBE-SERVICES through %q, want %s", who, got, want)
				}
				if ours {
					log, err := os.ReadFile(proxy.LogPath)
					if err != nil {
						t.Fatal(err)
					}
					line := ""
					for _, l := range strings.Split(string(log), "\n") {
						if strings.Contains(l, "Chose the iptables backend") {
							line = l
						}
					}
					t.Logf("ours: %s", line)
					if !strings.Contains(line, `backend="`+string(want)+`"`) || !strings.Contains(line, "reason=") {
						t.Errorf("the start does not log the backend %s and why: %q", want, line)
					}
				}
			}
		})
	}
}

// backendsWithServices names the iptables backends whose nat table holds
// KUBE-SERVICES, comma separated.
func backendsWithServices(t *testing.T) string {
	t.Helper()
	var with []string
	for _, b := range []string{"legacy", "nft"} {
		if _, err := cluster.Node.Exec("iptables-"+b, "-w", "-t", "nat", "-S", "KUBE-SERVICES"); err == nil {
			with = append(with, b)
		}
	}
	return strings.Join(with, ",")
}
