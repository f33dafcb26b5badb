package preflight

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/config"
)

// fakeKubeProxy serves a kube-proxy's mode, configuration (as ours and
// upstream's serve it) and metrics.
func fakeKubeProxy(t *testing.T, cfg *kpconfig.KubeProxyConfiguration, metrics string) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(cfg.Mode)) })
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{configzGroup: cfg})
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(metrics)) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

const sampleMetrics = `# HELP kubeproxy_iptables_localhost_nodeports_accepted_packets_total [ALPHA] Number of packets accepted on nodeports of loopback interface
# TYPE kubeproxy_iptables_localhost_nodeports_accepted_packets_total counter
kubeproxy_iptables_localhost_nodeports_accepted_packets_total 17
kubeproxy_sync_proxy_rules_iptables_total{table="filter"} 12
kubeproxy_sync_proxy_rules_iptables_total{table="nat"} 30
rest_client_requests_total{code="200",host="a b}",method="GET"} 4
kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e+09
`

func TestGatherKubeProxy(t *testing.T) {
	cfg := &kpconfig.KubeProxyConfiguration{Mode: config.ModeIPVS}
	config.Default(cfg)
	cfg.IPVS.Scheduler, cfg.IPVS.ExcludeCIDRs = "lc", []string{"10.99.0.0/16"}
	f := &Facts{Address: fakeKubeProxy(t, cfg, sampleMetrics)}
	gatherKubeProxy(context.Background(), f)
	if f.ModeErr != nil || f.ConfigErr != nil || f.MetricsErr != nil {
		t.Fatalf("errors: %v, %v, %v", f.ModeErr, f.ConfigErr, f.MetricsErr)
	}
	if f.Mode != ipvsMode || f.Config.IPVS.Scheduler != "lc" || !slices.Equal(f.Config.IPVS.ExcludeCIDRs, cfg.IPVS.ExcludeCIDRs) ||
		f.Config.IPTables.LocalhostNodePorts == nil || !*f.Config.IPTables.LocalhostNodePorts {
		t.Errorf("mode %q, config %+v", f.Mode, f.Config)
	}
	for name, want := range map[string]float64{
		LocalhostNodePortsMetric:                            17,
		"kubeproxy_sync_proxy_rules_iptables_total":         42,
		"rest_client_requests_total":                        4,
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds": 1.7e9,
	} {
		if got, ok := f.Metrics[name]; !ok || got != want {
			t.Errorf("%s = %v, %v; want %v", name, got, ok, want)
		}
	}

	unreachable := &Facts{Address: "127.0.0.1:1"}
	gatherKubeProxy(context.Background(), unreachable)
	if unreachable.ModeErr == nil || unreachable.ConfigErr == nil || unreachable.MetricsErr == nil || unreachable.Config != nil {
		t.Errorf("unreachable: %+v", unreachable)
	}
	if _, err := parseConfigz(`{"other.group": {}}`); err == nil || !strings.Contains(err.Error(), "no kubeproxy.config.k8s.io") {
		t.Errorf("parseConfigz of another group: %v", err)
	}
}

// On a node (a fresh network namespace) where another program's rules
// jump into KUBE-SERVICES and match on KUBE-CLUSTER-IP, the gatherer
// reads them and the move is blocked; kube-proxy's own jumps, as the
// tools print them back, are not reported.
func TestGatherOnANode(t *testing.T) {
	testutil.RequireRoot(t)
	// iptables-legacy comes with Debian's iptables package (hack/install-deps.sh).
	testutil.RequireCommands(t, "ip", "iptables-nft-restore", "iptables-nft-save", "iptables-legacy", "ipset", "nft")
	if !testutil.RerunInNetns(t, [][2]string{{"fresh namespace", ""}}) {
		return
	}
	sh := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%q: %v: %s", args, err, out)
		}
	}
	sh("", "ip", "link", "set", "lo", "up")
	sh("", "ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port")
	// Both modes' jumps from the built-in chains, then the foreign rules.
	chains := map[string][]string{}
	rules := map[string][]string{}
	for _, j := range ownJumps {
		t := string(j.Table)
		if c := ":" + string(j.Rule[strings.LastIndex(string(j.Rule), " ")+1:]) + " - [0:0]"; !slices.Contains(chains[t], c) {
			chains[t] = append(chains[t], c)
		}
		rules[t] = append(rules[t], "-A "+string(j.From)+" "+string(j.Rule))
	}
	rules["nat"] = append(rules["nat"], "-A RPXT-FOREIGN -j KUBE-SERVICES")
	rules["filter"] = append(rules["filter"], "-A RPXT-FOREIGN -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT")
	var in strings.Builder
	for _, table := range []string{"filter", "nat"} {
		in.WriteString("*" + table + "\n:RPXT-FOREIGN - [0:0]\n" + strings.Join(chains[table], "\n") + "\n" + strings.Join(rules[table], "\n") + "\nCOMMIT\n")
	}
	sh(in.String(), "iptables-nft-restore", "--noflush")
	sh("", "nft", "add", "table", "inet", "firewalld")
	// Our chain in the legacy tables too, which the check names.
	sh("", "iptables-legacy", "-w", "-t", "nat", "-N", "KUBE-SERVICES")

	cfg := &kpconfig.KubeProxyConfiguration{Mode: config.ModeIPTables}
	config.Default(cfg)
	f := Gather(context.Background(), fakeKubeProxy(t, cfg, sampleMetrics))
	if f.ModeErr != nil || f.Mode != iptablesMode || f.Metrics[LocalhostNodePortsMetric] != 17 {
		t.Errorf("kube-proxy's facts: mode %q (%v), metrics %v", f.Mode, f.ModeErr, f.Metrics)
	}
	if f.KernelRelease == "" || f.KernelErr != nil || f.NFTErr != nil || !strings.HasPrefix(f.NFTVersion, "nftables v") {
		t.Errorf("kernel %q (%v), nft %q (%v)", f.KernelRelease, f.KernelErr, f.NFTVersion, f.NFTErr)
	}
	if !slices.Contains(f.Firewalld, "nftables table inet firewalld") {
		t.Errorf("firewalld's evidence: %q", f.Firewalld)
	}

	r := Check(f, nftablesMode, nil)
	var foreign, legacyFinding *Finding
	for i, finding := range r.Findings {
		switch {
		case finding.Check == checkNameForeign && finding.Level == Blocker:
			foreign = &r.Findings[i]
		case finding.Check == checkNameLegacy:
			legacyFinding = &r.Findings[i]
		}
	}
	want := []string{
		"iptables-nft filter: -A RPXT-FOREIGN -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
		"iptables-nft nat: -A RPXT-FOREIGN -j KUBE-SERVICES",
	}
	if foreign == nil || !slices.Equal(foreign.Details, want) {
		t.Errorf("foreign references: %+v, want %q", foreign, want)
	}
	if !r.Blocked() {
		t.Error("not blocked")
	}
	if legacyFinding == nil {
		var checks []string
		for _, finding := range r.Findings {
			checks = append(checks, finding.Check)
		}
		t.Errorf("kube-proxy's chain in the legacy tables is not reported; the findings: %q", checks)
	}
}
