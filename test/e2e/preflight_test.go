package e2e

import (
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/pkg/preflight"
)

// kube-proxy-explain preflight on the node, against our kube-proxy in the
// iptables mode: nothing blocks the nftables mode on the test node, and
// once another program's chain jumps into KUBE-SERVICES that rule is a
// blocker, named as iptables-save prints it.
func TestPreflightOnTheNode(t *testing.T) {
	useOurProxy(t, iptablesMode)
	// Other tests of the run connect to NodePorts on 127.0.0.1, which the
	// counter remembers: that check is allowed, and only its presence is
	// checked.
	run := func(args ...string) (string, int) {
		t.Helper()
		args = append([]string{"preflight", "--to", nftablesMode, "--allow", "localhost-nodeports"}, args...)
		out, err := cluster.Node.Command(append([]string{cluster.KubeProxyExplain()}, args...)...).Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out), exit.ExitCode()
		} else if err != nil {
			t.Fatalf("kube-proxy-explain %q: %v", args, err)
		}
		return string(out), 0
	}
	report := func(out string) (r struct {
		preflight.Report
		Blockers int `json:"blockers"`
	}) {
		t.Helper()
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		return r
	}

	out, code := run("--output", "json")
	r := report(out)
	if code != 0 || r.Blockers != 0 || r.From != iptablesMode || r.To != nftablesMode {
		t.Fatalf("clean node: exit %d:\n%s", code, out)
	}
	if !slices.ContainsFunc(r.Findings, func(f preflight.Finding) bool { return f.Check == "localhost-nodeports" }) {
		t.Errorf("no finding of localhost NodePorts, which the iptables mode serves:\n%s", out)
	}

	const chain = "RPXT-PREFLIGHT"
	t.Cleanup(func() {
		_, _ = cluster.Node.Exec("iptables-nft", "-w", "-t", "nat", "-F", chain)
		_, _ = cluster.Node.Exec("iptables-nft", "-w", "-t", "nat", "-X", chain)
	})
	for _, args := range [][]string{{"-N", chain}, {"-A", chain, "-j", "KUBE-SERVICES"}} {
		if out, err := cluster.Node.Exec(append([]string{"iptables-nft", "-w", "-t", "nat"}, args...)...); err != nil {
			t.Fatalf("iptables-nft %q: %v: %s", args, err, out)
		}
	}
	want := "iptables-nft nat: -A " + chain + " -j KUBE-SERVICES"
	out, code = run("--output", "json")
	r = report(out)
	if code != 1 || r.Blockers != 1 || !slices.ContainsFunc(r.Findings, func(f preflight.Finding) bool {
		return f.Check == "foreign-references" && f.Level == preflight.Blocker && slices.Equal(f.Details, []string{want})
	}) {
		t.Errorf("with a foreign jump: exit %d, want 1 and a blocker naming %q:\n%s", code, want, out)
	}
	text, code := run()
	if code != 1 || !strings.Contains(text, "BLOCKER foreign-references:") || !strings.Contains(text, "    - "+want+"\n") {
		t.Errorf("the text report: exit %d:\n%s", code, text)
	}
	t.Logf("kube-proxy-explain preflight --to nftables:\n%s", text)
}
