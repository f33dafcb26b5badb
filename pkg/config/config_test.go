package config

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func TestDefaultsMatchUpstream(t *testing.T) {
	want, err := os.ReadFile("testdata/upstream-defaults-v1alpha1.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Marshal(New())
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("defaulted config differs from upstream's --write-config-to output:\n--- got\n%s\n--- want\n%s", got, want)
	}
}

func TestUpstreamDefaultsRoundTrip(t *testing.T) {
	data, err := os.ReadFile("testdata/upstream-defaults-v1alpha1.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Decode(data)
	if err != nil {
		t.Fatalf("upstream's own defaults do not load: %v", err)
	}
	if errs := Validate(cfg); len(errs) > 0 {
		t.Fatalf("upstream's own defaults do not validate: %v", errs)
	}
	again, _ := Marshal(cfg)
	if string(again) != string(data) {
		t.Errorf("loading and writing changed the file:\n%s", again)
	}
}

func TestDefaulting(t *testing.T) {
	cases := []struct {
		name  string
		file  string
		check func(*Config) string
	}{
		{"mode defaults to iptables", "", func(c *Config) string { return want(c.Mode, ModeIPTables) }},
		{"detect-local defaults to ClusterCIDR", "", func(c *Config) string { return want(c.DetectLocalMode, LocalModeClusterCIDR) }},
		{"healthz on all IPv4", "", func(c *Config) string { return want(c.HealthzBindAddress, "0.0.0.0:10256") }},
		{"metrics on IPv4 loopback", "", func(c *Config) string { return want(c.MetricsBindAddress, "127.0.0.1:10249") }},
		{"IPv6 bind address moves the servers to IPv6", "bindAddress: '::'\n", func(c *Config) string {
			return want(c.HealthzBindAddress+" "+c.MetricsBindAddress, "[::]:10256 [::1]:10249")
		}},
		{"bare healthz IP gets the port", "healthzBindAddress: 10.0.0.1\n", func(c *Config) string { return want(c.HealthzBindAddress, "10.0.0.1:10256") }},
		{"bare metrics IP gets the port", "metricsBindAddress: 0.0.0.0\n", func(c *Config) string { return want(c.MetricsBindAddress, "0.0.0.0:10249") }},
		{"explicit port is kept", "metricsBindAddress: 0.0.0.0:9999\n", func(c *Config) string { return want(c.MetricsBindAddress, "0.0.0.0:9999") }},
		{"iptables sync periods", "", func(c *Config) string {
			s, m := SyncPeriods(c)
			return want(s.String()+" "+m.String(), "30s 1s")
		}},
		{"ipvs mode: ipvs sync 30s, min 0, iptables periods cleared", "mode: ipvs\n", func(c *Config) string {
			s, m := SyncPeriods(c)
			return want(s.String()+" "+m.String()+" "+c.IPTables.SyncPeriod.Duration.String(), "30s 0s 0s")
		}},
		{"ipvs mode keeps its own periods", "mode: ipvs\nipvs:\n  syncPeriod: 10s\n  minSyncPeriod: 2s\n", func(c *Config) string {
			s, m := SyncPeriods(c)
			return want(s.String()+" "+m.String(), "10s 2s")
		}},
		{"nftables mode: nodePortAddresses primary", "mode: nftables\n", func(c *Config) string {
			return want(strings.Join(c.NodePortAddresses, ","), "primary")
		}},
		{"masquerade bit 14", "", func(c *Config) string { return want(*c.IPTables.MasqueradeBit, int32(14)) }},
		{"explicit masquerade bit 0 is kept", "iptables:\n  masqueradeBit: 0\n", func(c *Config) string { return want(*c.IPTables.MasqueradeBit, int32(0)) }},
		{"localhost node ports on", "", func(c *Config) string { return want(*c.IPTables.LocalhostNodePorts, true) }},
		{"localhost node ports off is kept", "iptables:\n  localhostNodePorts: false\n", func(c *Config) string { return want(*c.IPTables.LocalhostNodePorts, false) }},
		{"oomScoreAdj -999", "", func(c *Config) string { return want(*c.OOMScoreAdj, int32(-999)) }},
		{"conntrack", "", func(c *Config) string {
			return want([]any{*c.Conntrack.MaxPerCore, *c.Conntrack.Min, c.Conntrack.TCPEstablishedTimeout.Duration, c.Conntrack.TCPCloseWaitTimeout.Duration},
				[]any{int32(32768), int32(131072), 24 * time.Hour, time.Hour})
		}},
		{"conntrack max-per-core 0 is kept", "conntrack:\n  maxPerCore: 0\n", func(c *Config) string { return want(*c.Conntrack.MaxPerCore, int32(0)) }},
		{"client connection", "", func(c *Config) string {
			return want([]any{c.ClientConnection.QPS, c.ClientConnection.Burst, c.ClientConnection.ContentType}, []any{float32(5), int32(10), "application/vnd.kubernetes.protobuf"})
		}},
		{"config sync period 15m", "", func(c *Config) string { return want(c.ConfigSyncPeriod.Duration, 15*time.Minute) }},
		{"logging text, flush 5s", "", func(c *Config) string {
			return want(c.Logging.Format+" "+c.Logging.FlushFrequency.Duration.Duration.String(), "text 5s")
		}},
		{"masqueradeAll follows the mode", "mode: iptables\niptables:\n  masqueradeAll: true\n", func(c *Config) string { return want(MasqueradeAll(c), true) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Decode([]byte(header + tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if msg := tc.check(cfg); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func want[T any](got, expected T) string {
	if g, e := toString(got), toString(expected); g != e {
		return "got " + g + ", want " + e
	}
	return ""
}

func toString(v any) string { return fmt.Sprint(v) }

func TestValidation(t *testing.T) {
	cases := []struct {
		name string
		file string
		// wantErr is a substring of the single expected error; "" means valid.
		wantErr string
	}{
		{"defaults are valid", "", ""},
		{"masqueradeBit 40", "iptables:\n  masqueradeBit: 40\n", "iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31]"},
		{"masqueradeBit -1", "iptables:\n  masqueradeBit: -1\n", "iptables.masqueradeBit: Invalid value: -1"},
		{"masqueradeBit 31", "iptables:\n  masqueradeBit: 31\n", ""},
		{"nftables masqueradeBit checked in nftables mode", "mode: nftables\nnftables:\n  masqueradeBit: 32\n", "nftables.masqueradeBit: Invalid value: 32"},
		{"oomScoreAdj 1001", "oomScoreAdj: 1001\n", "oomScoreAdj: Invalid value: 1001: must be within the range [-1000, 1000]"},
		{"oomScoreAdj -1000", "oomScoreAdj: -1000\n", ""},
		{"negative sync period", "iptables:\n  syncPeriod: -1s\n", "iptables.syncPeriod: Invalid value: \"-1s\": must be greater than 0"},
		{"negative min sync period", "iptables:\n  minSyncPeriod: -1s\n", "iptables.minSyncPeriod: Invalid value: \"-1s\": must be greater than or equal to 0"},
		{"minSyncPeriod > syncPeriod", "iptables:\n  syncPeriod: 10s\n  minSyncPeriod: 20s\n", "iptables.minSyncPeriod: Invalid value: \"20s\": must be less than or equal to iptables.syncPeriod (10s)"},
		{"minSyncPeriod == syncPeriod", "iptables:\n  syncPeriod: 10s\n  minSyncPeriod: 10s\n", ""},
		{"ipvs periods checked in ipvs mode", "mode: ipvs\nipvs:\n  syncPeriod: 1s\n  minSyncPeriod: 2s\n", "ipvs.minSyncPeriod"},
		{"iptables periods ignored in ipvs mode", "mode: ipvs\niptables:\n  syncPeriod: 1s\n  minSyncPeriod: 2s\n", ""},
		{"negative config sync period", "configSyncPeriod: -1m\n", "configSyncPeriod: Invalid value: \"-1m0s\": must be greater than 0"},
		{"unknown mode", "mode: userspace\n", "mode: Unsupported value: \"userspace\""},
		{"bad bind address", "bindAddress: 1.2.3\n", "bindAddress: Invalid value: \"1.2.3\""},
		{"healthz not ip:port", "healthzBindAddress: foo:bar:baz\n", "healthzBindAddress: Invalid value: \"foo:bar:baz\": must be IP:port"},
		{"healthz bad host", "healthzBindAddress: foo:80\n", "\"foo\" must be a valid IP"},
		{"metrics port 0", "metricsBindAddress: 127.0.0.1:0\n", "metricsBindAddress: Invalid value: \"127.0.0.1:0\": \"0\" must be a valid port"},
		{"metrics port 70000", "metricsBindAddress: 127.0.0.1:70000\n", "must be a valid port"},
		{"nodePortAddresses bad CIDR", "nodePortAddresses: [10.0.0.0/8, 300.0.0.0/8]\n", "nodePortAddresses[1]: Invalid value: \"300.0.0.0/8\": must be a valid CIDR"},
		{"nodePortAddresses primary", "nodePortAddresses: [primary]\n", ""},
		{"nodePortAddresses keywords and CIDRs", "nodePortAddresses: [primary, localhost, all, 10.0.0.0/8, fd00::/64]\n", ""},
		{"nodePortAddresses keyword twice", "nodePortAddresses: [localhost, 10.0.0.0/8, localhost]\n", "nodePortAddresses[2]: Duplicate value: \"localhost\""},
		{"nodePortAddresses unknown keyword", "nodePortAddresses: [everywhere]\n", "nodePortAddresses[0]: Invalid value: \"everywhere\": must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"},
		{"KubeProxyIPVS gate accepted", "mode: ipvs\nfeatureGates:\n  KubeProxyIPVS: true\n  NFTablesNetlink: true\n", ""},
		{"ipvs mode needs the KubeProxyIPVS gate", "mode: ipvs\nfeatureGates:\n  KubeProxyIPVS: false\n", "mode: Invalid value: \"ipvs\": the ipvs mode needs the KubeProxyIPVS feature gate"},
		{"KubeProxyIPVS off is fine in other modes", "mode: nftables\nfeatureGates:\n  KubeProxyIPVS: false\n", ""},
		{"localhost NodePorts gate accepted in nftables mode", "mode: nftables\nnodePortAddresses: [localhost]\nfeatureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n", ""},
		{"localhost NodePorts gate harmless in iptables mode", "mode: iptables\nfeatureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n", ""},
		{"clusterCIDR bad", "clusterCIDR: 10.0.0.0/33\n", "clusterCIDR: Invalid value: \"10.0.0.0/33\""},
		{"clusterCIDR dual-stack", "clusterCIDR: 10.0.0.0/8,fd00::/64\n", ""},
		{"clusterCIDR two IPv4", "clusterCIDR: 10.0.0.0/8,11.0.0.0/8\n", "two CIDRs must be one IPv4 and one IPv6"},
		{"clusterCIDR three", "clusterCIDR: 10.0.0.0/8,fd00::/64,11.0.0.0/8\n", "must be a single CIDR or a dual-stack pair"},
		{"unknown detect-local mode", "detectLocalMode: Magic\n", "detectLocalMode: Unsupported value: \"Magic\""},
		{"BridgeInterface needs the bridge", "detectLocalMode: BridgeInterface\n", "detectLocal.bridgeInterface: Required value"},
		{"BridgeInterface with bridge", "detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n", ""},
		{"InterfaceNamePrefix needs the prefix", "detectLocalMode: InterfaceNamePrefix\n", "detectLocal.interfaceNamePrefix: Required value"},
		{"NodeCIDR alone", "detectLocalMode: NodeCIDR\n", ""},
		{"conntrack negative maxPerCore", "conntrack:\n  maxPerCore: -1\n", "conntrack.maxPerCore: Invalid value: -1"},
		{"conntrack negative min", "conntrack:\n  min: -1\n", "conntrack.min: Invalid value: -1"},
		{"conntrack negative tcp established", "conntrack:\n  tcpEstablishedTimeout: -1s\n", "conntrack.tcpEstablishedTimeout"},
		{"conntrack negative close wait", "conntrack:\n  tcpCloseWaitTimeout: -1s\n", "conntrack.tcpCloseWaitTimeout"},
		{"conntrack negative udp", "conntrack:\n  udpTimeout: -1s\n", "conntrack.udpTimeout"},
		{"conntrack negative udp stream", "conntrack:\n  udpStreamTimeout: -1s\n", "conntrack.udpStreamTimeout"},
		{"negative burst", "clientConnection:\n  burst: -1\n", "clientConnection.burst: Invalid value: -1"},
		{"ipvs negative tcp timeout", "mode: ipvs\nipvs:\n  tcpTimeout: -1s\n", "ipvs.tcpTimeout"},
		{"ipvs negative tcpfin timeout", "mode: ipvs\nipvs:\n  tcpFinTimeout: -1s\n", "ipvs.tcpFinTimeout"},
		{"ipvs negative udp timeout", "mode: ipvs\nipvs:\n  udpTimeout: -1s\n", "ipvs.udpTimeout"},
		{"ipvs bad exclude CIDR", "mode: ipvs\nipvs:\n  excludeCIDRs: [foo]\n", "ipvs.excludeCIDRs[0]: Invalid value: \"foo\""},
		{"unknown feature gate", "featureGates:\n  NoSuchGate: true\n", "unrecognized feature gate: NoSuchGate"},
		{"known feature gate", "featureGates:\n  AllAlpha: true\n", ""},
		{"bad hidden metrics version", "showHiddenMetricsForVersion: foo\n", "showHiddenMetricsForVersion: Invalid value: \"foo\""},
		{"bad logging format", "logging:\n  format: xml\n", "logging.format: Invalid value: \"xml\": Unsupported log format"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Decode([]byte(header + tc.file))
			if err != nil {
				t.Fatal(err)
			}
			errs := Validate(cfg)
			switch {
			case tc.wantErr == "" && len(errs) > 0:
				t.Errorf("want valid, got %v", errs)
			case tc.wantErr != "" && len(errs) != 1:
				t.Errorf("want exactly one error containing %q, got %d: %v", tc.wantErr, len(errs), errs)
			case tc.wantErr != "" && !strings.Contains(errs[0].Error(), tc.wantErr):
				t.Errorf("want an error containing %q, got %q", tc.wantErr, errs[0].Error())
			}
		})
	}
}

func TestValidationReportsEveryError(t *testing.T) {
	cfg, err := Decode([]byte(header + "iptables:\n  masqueradeBit: 40\n  minSyncPeriod: 1h\noomScoreAdj: 5000\nclusterCIDR: nope\n"))
	if err != nil {
		t.Fatal(err)
	}
	if errs := Validate(cfg); len(errs) != 4 {
		t.Errorf("want 4 errors at once, got %d: %v", len(errs), errs)
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name, data, wantErr string
	}{
		{"empty", "", "the file is empty"},
		{"whitespace only", "\n  \n", "the file is empty"},
		{"binary garbage", "\x7fELF\x02\x01\x01\x00\x00\x00", "not valid YAML or JSON"},
		{"unknown top-level field", header + "foo: 1\n", `unknown field "foo"`},
		{"misspelt nested field", header + "iptables:\n  masqueradeBitt: 3\n", `unknown field "iptables.masqueradeBitt"`},
		{"duplicate field", header + "mode: ipvs\nmode: iptables\n", `key "mode" already set`},
		{"wrong type", header + "iptables:\n  masqueradeBit: fourteen\n", `iptables.masqueradeBit: invalid value "fourteen": want an integer (int32)`},
		{"bad duration", header + "iptables:\n  syncPeriod: 5x\n", `iptables.syncPeriod: invalid duration "5x"`},
		{"bad conntrack duration", header + "conntrack:\n  tcpCloseWaitTimeout: soon\n", `conntrack.tcpCloseWaitTimeout: invalid duration "soon"`},
		{"wrong apiVersion", "apiVersion: kubeproxy.config.k8s.io/v1beta9\nkind: KubeProxyConfiguration\n", `apiVersion "kubeproxy.config.k8s.io/v1beta9"`},
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: Pod\n", `kind "Pod"`},
		{"no type at all", "mode: ipvs\n", `apiVersion "" and kind ""`},
		{"a list, not an object", "- a\n- b\n", "not a KubeProxyConfiguration object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("want an error containing %q, got %v", tc.wantErr, err)
			}
		})
	}
}

func TestJSONFile(t *testing.T) {
	cfg, err := Decode([]byte(`{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"ipvs","ipvs":{"scheduler":"wrr"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Mode != ModeIPVS || cfg.IPVS.Scheduler != "wrr" {
		t.Errorf("got mode %q scheduler %q", cfg.Mode, cfg.IPVS.Scheduler)
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(header+"bogus: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("want an error naming %s and the field, got %v", path, err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("want a directory error, got %v", err)
	}
}

func TestWriteRoundTrip(t *testing.T) {
	cfg, err := Decode([]byte(header + "mode: ipvs\nclusterCIDR: 10.244.0.0/16\nipvs:\n  scheduler: lc\n  excludeCIDRs: [10.0.0.0/8]\nfeatureGates:\n  AllAlpha: false\n"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "out.yaml")
	if err := Write(cfg, path); err != nil {
		t.Fatal(err)
	}
	again, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := Marshal(cfg)
	b, _ := Marshal(again)
	if string(a) != string(b) {
		t.Errorf("round trip changed the config:\n%s\n---\n%s", a, b)
	}
	if *again.IPTables.MasqueradeBit != 14 || ptr.Deref(again.IPTables.LocalhostNodePorts, false) != true {
		t.Error("defaults lost in the round trip")
	}
}

// The nodePortAddresses keywords stand for CIDRs of this node, as
// upstream expands them; CIDRs stay as they are, in order.
func TestExpandNodePortAddresses(t *testing.T) {
	v4, v6, lo := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		setting []string
		nodeIPs []netip.Addr
		want    string
	}{
		{nil, []netip.Addr{v4}, "[]"},
		{[]string{"primary"}, []netip.Addr{v4, v6}, "[10.0.0.2/32 fd00::2/128]"},
		{[]string{"primary"}, []netip.Addr{v4, {}}, "[10.0.0.2/32]"},
		{[]string{"primary"}, []netip.Addr{lo}, "[]"}, // no routable node IP: nothing to pin to
		{[]string{"localhost"}, []netip.Addr{v4}, "[127.0.0.0/8 ::1/128]"},
		{[]string{"all"}, []netip.Addr{v4}, "[0.0.0.0/0 ::/0]"},
		{[]string{"192.168.0.0/16", "primary", "localhost"}, []netip.Addr{v4}, "[192.168.0.0/16 10.0.0.2/32 127.0.0.0/8 ::1/128]"},
	} {
		if got := fmt.Sprint(ExpandNodePortAddresses(tc.setting, tc.nodeIPs)); got != tc.want {
			t.Errorf("%v with node IPs %v: %s, want %s", tc.setting, tc.nodeIPs, got, tc.want)
		}
	}
}

// A value of the wrong type is named by its path in the file, with the
// value given and what the field wants, as the validation errors are.
func TestWrongTypeNamesFieldValueAndType(t *testing.T) {
	const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for doc, want := range map[string]string{
		"conntrack:\n  maxPerCore: lots\n":        `conntrack.maxPerCore: invalid value "lots": want an integer (int32)`,
		"conntrack:\n  maxPerCore: 3.5\n":         `conntrack.maxPerCore: invalid value 3.5: want an integer (int32)`,
		"conntrack:\n  maxPerCore: 99999999999\n": `conntrack.maxPerCore: invalid value 99999999999: want an integer from -2147483648 to 2147483647 (int32)`,
		"conntrack: lots\n":                       `conntrack: invalid value "lots": want a mapping`,
		"configSyncPeriod: 5\n":                   `configSyncPeriod: invalid value 5: want a duration (a number and a unit, e.g. 30s, 5m, 1h)`,
		"featureGates:\n  Foo: maybe\n":           `featureGates.Foo: invalid value "maybe": want true or false`,
		"nodePortAddresses: 10.0.0.0/8\n":         `nodePortAddresses: invalid value "10.0.0.0/8": want a list`,
		"nodePortAddresses: [primary, 10]\n":      `nodePortAddresses[1]: invalid value 10: want a string`,
		"ipvs:\n  excludeCIDRs: [{a: 1}]\n":       `ipvs.excludeCIDRs[0]: invalid value {"a":1}: want a string`,
		"enableProfiling: \"true\"\n":             `enableProfiling: invalid value "true": want true or false`,
		"clientConnection:\n  qps: fast\n":        `clientConnection.qps: invalid value "fast": want a number`,
		"iptables:\n  localhostNodePorts: 1\n":    `iptables.localhostNodePorts: invalid value 1: want true or false`,
		"logging:\n  verbosity: high\n":           `logging.verbosity: invalid value "high": want an integer of 0 or more (uint32)`,
		`{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "oomScoreAdj": "x"}`: `oomScoreAdj: invalid value "x": want an integer (int32)`,
	} {
		if !strings.HasPrefix(doc, "{") {
			doc = header + doc
		}
		_, err := Decode([]byte(doc))
		if err == nil || err.Error() != want {
			t.Errorf("%q: %v\nwant %s", doc, err, want)
		}
	}
}
