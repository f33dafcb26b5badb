package preflight

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func TestCommand(t *testing.T) {
	facts := func(change func(f *Facts)) func(context.Context, string) *Facts {
		return func(_ context.Context, address string) *Facts {
			f := cleanFacts(iptablesMode)
			f.Address = address
			if change != nil {
				change(f)
			}
			return f
		}
	}
	used := facts(func(f *Facts) { f.Metrics[LocalhostNodePortsMetric] = 7 })
	foreign := facts(func(f *Facts) { f.Saved[0].Text += "*nat\n-A CNI-FOO -j KUBE-SERVICES\nCOMMIT\n" })
	for _, tc := range []struct {
		args           []string
		gather         func(context.Context, string) *Facts
		code           int
		stdout, stderr string
	}{
		{[]string{"--to", "nftables"}, facts(nil), 0, "No blocker, 1 warning: read them, then switch to the nftables mode.", ""},
		{[]string{"--to", "iptables"}, facts(nil), 0, "kube-proxy already runs in the iptables mode: nothing to do.", ""},
		{[]string{"--to", "nftables", "--address", "10.0.0.1:10249"}, used, 1, "kube-proxy preflight: iptables -> nftables (kube-proxy at 10.0.0.1:10249)", ""},
		{[]string{"--to", "nftables"}, used, 1, "1 blocker, 0 warnings: do not switch to the nftables mode yet.", ""},
		{[]string{"--to", "nftables", "--allow", "localhost-nodeports"}, used, 0, "WARNING (allowed) localhost-nodeports:", ""},
		{[]string{"--to", "ipvs"}, foreign, 1, "    - iptables-nft nat: -A CNI-FOO -j KUBE-SERVICES\n", ""},
		{[]string{"--to", "nftables", "-o", "json"}, foreign, 1, `"blockers": 1`, ""},
		{nil, facts(nil), 2, "", "--to is required"},
		{[]string{"--to", "userspace"}, facts(nil), 2, "", `--to "userspace": want one of iptables, ipvs, nftables`},
		{[]string{"--to", "nftables", "--output", "yaml"}, facts(nil), 2, "", `--output "yaml"`},
		{[]string{"--to", "nftables", "--allow", "everything"}, facts(nil), 2, "", `--allow "everything"`},
		{[]string{"--to", "nftables", "extra"}, facts(nil), 2, "", "unexpected arguments"},
		{[]string{"--help"}, facts(nil), 0, "Usage: kube-proxy-explain preflight --to MODE", ""},
		{[]string{"--to", "nftables", "--address", "http://10.0.0.1:10249/"}, used, 1, "kube-proxy preflight: iptables -> nftables (kube-proxy at http://10.0.0.1:10249/)", ""},
		{[]string{"--to", "nftables", "--address", "10.0.0.1"}, facts(nil), 2, "", `--address "10.0.0.1" has no port`},
	} {
		var stdout, stderr strings.Builder
		code := run(tc.args, &stdout, &stderr, tc.gather)
		if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%q: exit %d, stdout:\n%s\nstderr:\n%s\nwant %d, %q, %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}

func TestJSON(t *testing.T) {
	f := cleanFacts(iptablesMode)
	f.Metrics[LocalhostNodePortsMetric] = 7
	f.Firewalld = []string{"process firewalld (pid 812)"}
	var out strings.Builder
	if err := WriteJSON(&out, Check(f, nftablesMode, nil)); err != nil {
		t.Fatal(err)
	}
	var got struct {
		From, To           string
		Blockers, Warnings int
		Findings           []Finding
	}
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	if got.From != iptablesMode || got.To != nftablesMode || got.Blockers != 1 || got.Warnings != 1 || len(got.Findings) != 2 ||
		got.Findings[0].Check != checkNameLocalhost || got.Findings[1].Details[0] != "process firewalld (pid 812)" {
		t.Errorf("JSON:\n%s", out.String())
	}
}

// The text fits an 80-column terminal, but for the rules found, which
// are printed whole to be copied.
func TestTextWidth(t *testing.T) {
	f := cleanFacts(ipvsMode)
	f.Config.IPVS.Scheduler, f.Config.IPVS.StrictARP = "sh", true
	f.Firewalld = []string{"process firewalld (pid 812)"}
	var out strings.Builder
	if err := WriteText(&out, Check(f, nftablesMode, nil)); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if len(line) > width && !strings.HasPrefix(line, "    - ") {
			t.Errorf("line of %d columns: %q", len(line), line)
		}
	}
	for _, want := range []string{"WARNING ipvs-scheduler: ipvs.scheduler \"sh\" has no equivalent\n", "  What to do: ", "No blocker, 4 warnings"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, out.String())
		}
	}
}
