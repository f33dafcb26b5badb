package app

import (
	"bufio"
	"bytes"
	"context"
	"github.com/spf13/pflag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/pkg/config"
)

// kubeProxy runs the command in-process and returns its exit code and output.
func kubeProxy(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// sampleValues are values each flag type of upstream-flags.txt must accept.
var sampleValues = map[string]string{
	"":               "true",
	"ip":             "10.0.0.1",
	"ipport":         "0.0.0.0:1234",
	"string":         "x",
	"duration":       "5s",
	"int32":          "3",
	"float32":        "2.5",
	"strings":        "10.0.0.0/8,192.168.0.0/16",
	"mapStringBool":  "AllAlpha=true",
	"quantity":       "1Ki",
	"pattern=N,...":  "foo=2",
	"version[=true]": "raw",
}

// untypedValues are for the flags whose type --help does not print.
var untypedValues = map[string]string{"--proxy-mode": "ipvs", "--detect-local-mode": "NodeCIDR", "--v": "2"}

func TestEveryUpstreamFlagIsAcceptedAndParses(t *testing.T) {
	f, err := os.Open("testdata/upstream-flags.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	code, help, _ := kubeProxy(t, "--help")
	if code != 0 {
		t.Fatalf("--help exit code %d", code)
	}
	scanner := bufio.NewScanner(f)
	count := 0
	for scanner.Scan() {
		name, typ, _ := strings.Cut(strings.TrimSpace(scanner.Text()), " ")
		if name == "" {
			continue
		}
		count++
		t.Run(name, func(t *testing.T) {
			line := regexp.MustCompile(`(?m)^\s+(-\w, )?` + regexp.QuoteMeta(name) + `( \S+)?\s`).FindString(help)
			if line == "" {
				t.Fatalf("%s is not in --help", name)
			}
			if typ != "" && !strings.Contains(line, name+" "+typ) {
				t.Errorf("--help shows %q, want type %q", strings.TrimSpace(line), typ)
			}
			value, ok := untypedValues[name]
			if !ok {
				value, ok = sampleValues[typ]
			}
			if !ok {
				t.Fatalf("no sample value for type %q", typ)
			}
			cmd := newCommand()
			if err := cmd.Flags().Parse([]string{name + "=" + value}); err != nil {
				t.Errorf("%s=%s does not parse: %v", name, value, err)
			}
		})
	}
	if count != 54 {
		t.Errorf("read %d upstream flags, want 54", count)
	}
}

func TestWriteConfigToGivesUpstreamDefaults(t *testing.T) {
	out := filepath.Join(t.TempDir(), "defaults.yaml")
	if code, _, stderr := kubeProxy(t, "--write-config-to", out); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, _ := os.ReadFile(out)
	want, err := os.ReadFile("../config/testdata/upstream-defaults-v1alpha1.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("--write-config-to differs from upstream:\n%s", got)
	}
}

func TestFlagsFillTheConfig(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "flags.yaml")
	code, _, stderr := kubeProxy(t, "--proxy-mode=ipvs", "--ipvs-sync-period=10s", "--ipvs-min-sync-period=2s",
		"--iptables-sync-period=7s", "--cluster-cidr=10.244.0.0/16", "--masquerade-all", "--nodeport-addresses=10.0.0.0/8",
		"--hostname-override=Node-A", "--feature-gates=AllAlpha=false", "--write-config-to", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	cfg, err := config.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	sync, minSync := config.SyncPeriods(cfg)
	checks := map[string][2]any{
		"mode":              {cfg.Mode, config.ModeIPVS},
		"sync":              {sync, 10 * time.Second},
		"minSync":           {minSync, 2 * time.Second},
		"iptables periods":  {cfg.IPTables.SyncPeriod.Duration, time.Duration(0)},
		"clusterCIDR":       {cfg.ClusterCIDR, "10.244.0.0/16"},
		"masqueradeAll":     {config.MasqueradeAll(cfg), true},
		"nodePortAddresses": {strings.Join(cfg.NodePortAddresses, ","), "10.0.0.0/8"},
		"hostnameOverride":  {cfg.HostnameOverride, "node-a"},
		"featureGates":      {cfg.FeatureGates["AllAlpha"], false},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s: got %v, want %v", name, c[0], c[1])
		}
	}
	// The written file is a valid config that reproduces itself.
	again := filepath.Join(dir, "again.yaml")
	if code, _, stderr := kubeProxy(t, "--config", out, "--write-config-to", again); code != 0 {
		t.Fatalf("feeding the written config back: exit %d: %s", code, stderr)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Errorf("round trip changed the config:\n%s\n---\n%s", a, b)
	}
}

func TestConfigFileWinsOverFlags(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.yaml")
	out := filepath.Join(dir, "out.yaml")
	writeFile(t, in, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeBit: 9\n")
	code, _, stderr := kubeProxy(t, "--config", in, "--iptables-masquerade-bit=5", "--proxy-mode=ipvs",
		"--hostname-override=NODE1", "--v=3", "--logging-format=json", "--write-config-to", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	cfg, err := config.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if *cfg.IPTables.MasqueradeBit != 9 || cfg.Mode != config.ModeIPTables {
		t.Errorf("config-mapped flags must be ignored with --config: masqueradeBit %d, mode %s", *cfg.IPTables.MasqueradeBit, cfg.Mode)
	}
	if cfg.HostnameOverride != "node1" {
		t.Errorf("--hostname-override must apply over the file: got %q", cfg.HostnameOverride)
	}
	if cfg.Logging.Verbosity != 3 || cfg.Logging.Format != "json" {
		t.Errorf("logging flags must apply over the file: got v=%d format=%s", cfg.Logging.Verbosity, cfg.Logging.Format)
	}
}

func TestBadInputExitsOneWithOneClearError(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, content)
		return p
	}
	const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"unknown field", []string{"--config", file("unknown.yaml", header+"iptables:\n  masqueradeBitt: 1\n")}, `unknown field "iptables.masqueradeBitt"`},
		{"bad duration", []string{"--config", file("duration.yaml", header+"configSyncPeriod: 15 minutes\n")}, `configSyncPeriod: invalid duration "15 minutes"`},
		{"wrong type", []string{"--config", file("type.yaml", header+"conntrack:\n  maxPerCore: lots\n")}, `conntrack.maxPerCore: invalid value "lots": want an integer (int32)`},
		{"bad CIDR", []string{"--config", file("cidr.yaml", header+"clusterCIDR: 10.244.0.0/40\n")}, `clusterCIDR: Invalid value: "10.244.0.0/40"`},
		{"masqueradeBit 40", []string{"--config", file("bit.yaml", header+"iptables:\n  masqueradeBit: 40\n")}, "iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31]"},
		{"minSyncPeriod > syncPeriod", []string{"--config", file("sync.yaml", header+"iptables:\n  syncPeriod: 5s\n  minSyncPeriod: 10s\n")}, "iptables.minSyncPeriod: Invalid value: \"10s\""},
		{"a directory", []string{"--config", dir}, "is a directory"},
		{"an empty file", []string{"--config", file("empty.yaml", "")}, "the file is empty"},
		{"binary garbage", []string{"--config", file("garbage.yaml", "\x00\x01\x02\xff\xfe garbage \x7fELF")}, "not valid YAML or JSON"},
		{"missing file", []string{"--config", filepath.Join(dir, "nope.yaml")}, "no such file or directory"},
		{"wrong kind", []string{"--config", file("kind.yaml", "apiVersion: v1\nkind: ConfigMap\n")}, `want apiVersion "kubeproxy.config.k8s.io/v1alpha1" and kind "KubeProxyConfiguration"`},
		{"positional argument", []string{"extra"}, "takes no positional arguments"},
		{"unknown flag", []string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		{"a flag upstream dropped", []string{"--boot-id-file=/proc/sys/kernel/random/boot_id"}, "unknown flag: --boot-id-file"},
		{"bad flag value", []string{"--bind-address=not-an-ip"}, `"not-an-ip" is not a valid IP address`},
		{"unknown feature gate", []string{"--feature-gates=NoSuchGate=true"}, "unrecognized feature gate: NoSuchGate"},
		{"ipvs mode with its gate off", []string{"--proxy-mode=ipvs", "--feature-gates=KubeProxyIPVS=false"}, "the ipvs mode needs the KubeProxyIPVS feature gate"},
		{"bad flag-built config", []string{"--iptables-masquerade-bit=32"}, "iptables.masqueradeBit: Invalid value: 32"},
		{"empty hostname override", []string{"--hostname-override= ", "--write-config-to", filepath.Join(dir, "x.yaml")}, "empty hostname is invalid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := kubeProxy(t, tc.args...)
			if code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			if !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("stderr does not say %q:\n%s", tc.wantErr, stderr)
			}
			if strings.Count(stderr, "kube-proxy: ") != 1 || strings.Contains(stderr, "goroutine ") {
				t.Errorf("want one error message and no stack trace:\n%s", stderr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := kubeProxy(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "Kubernetes v1.37.2 (rapidproxy ") {
		t.Errorf("--version: exit %d, output %q", code, out)
	}
	code, out, _ = kubeProxy(t, "--version=raw")
	if code != 0 || !strings.Contains(out, `"kubernetesCompatible"`) {
		t.Errorf("--version=raw: exit %d, output %q", code, out)
	}
}

// A changed config file ends the watch with an error, whether it is
// rewritten in place or, as in a ConfigMap mount, reached through a
// symlink that is swapped while the old file stays; both with inotify and
// by polling.
func TestConfigFileChangeEndsTheWatch(t *testing.T) {
	rewrite := func(t *testing.T) (string, func()) {
		path := filepath.Join(t.TempDir(), "config.yaml")
		writeFile(t, path, "a")
		return path, func() { writeFile(t, path, "changed") }
	}
	swapSymlink := func(t *testing.T) (string, func()) {
		dir := t.TempDir()
		for _, version := range []string{"..v1", "..v2"} {
			if err := os.Mkdir(filepath.Join(dir, version), 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, version, "config.conf"), "mode: "+version)
		}
		symlink(t, "..v1", filepath.Join(dir, "..data"))
		symlink(t, filepath.Join("..data", "config.conf"), filepath.Join(dir, "config.conf"))
		return filepath.Join(dir, "config.conf"), func() {
			symlink(t, "..v2", filepath.Join(dir, "..data_tmp"))
			if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}
	}
	waits := map[string]func(*fileWatch, context.Context) error{
		"inotify": func(w *fileWatch, ctx context.Context) error { return w.wait(ctx, time.Hour) },
		"poll":    func(w *fileWatch, ctx context.Context) error { return w.poll(ctx, 10*time.Millisecond) },
	}
	changes := map[string]func(*testing.T) (string, func()){"rewrite": rewrite, "symlink swap": swapSymlink}
	for waitName, wait := range waits {
		for changeName, setUp := range changes {
			t.Run(waitName+"/"+changeName, func(t *testing.T) {
				path, change := setUp(t)
				watch, err := watchFile(path)
				if err != nil {
					t.Fatal(err)
				}
				checks := countChecks(watch)
				done := make(chan error, 1)
				go func() { done <- wait(watch, t.Context()) }()
				// The watch checks the file once it has started: the change
				// below comes after, as an event or a poll.
				checks.await(t, 1, done)
				change()
				select {
				case err := <-done:
					if err == nil || !strings.Contains(err.Error(), "was updated") {
						t.Errorf("want a file-updated error, got %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the change was never noticed")
				}
			})
		}
		// Unchanged: the watch ends quietly with its context.
		t.Run(waitName+"/unchanged", func(t *testing.T) {
			path, _ := rewrite(t)
			watch, err := watchFile(path)
			if err != nil {
				t.Fatal(err)
			}
			checks := countChecks(watch)
			ctx, stop := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- wait(watch, ctx) }()
			checks.await(t, 1, done)
			// An unrelated file in the same directory wakes the watch (with
			// inotify: it polls an hour apart) but is no change.
			writeFile(t, filepath.Join(filepath.Dir(path), "other"), "x")
			checks.await(t, 1, done)
			stop()
			if err := <-done; err != nil {
				t.Errorf("an unchanged file gave %v", err)
			}
		})
	}
}

// watchChecks counts the checks of a watch that found its file unchanged.
type watchChecks chan struct{}

func countChecks(w *fileWatch) watchChecks {
	c := make(watchChecks, 1000)
	w.checked = func() {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	return c
}

// await waits for n more checks of the watch whose end done reports.
func (c watchChecks) await(t *testing.T, n int, done <-chan error) {
	t.Helper()
	for range n {
		select {
		case <-c:
		case err := <-done:
			t.Fatalf("the watch ended, on an unchanged file: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("the watch made no check in 30 s")
		}
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The mode counts as defaulted, which upstream warns about, only when
// neither the file nor --proxy-mode names it.
func TestModeDefaulted(t *testing.T) {
	dir := t.TempDir()
	const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	noMode, withMode := filepath.Join(dir, "no-mode.yaml"), filepath.Join(dir, "mode.yaml")
	writeFile(t, noMode, header)
	writeFile(t, withMode, header+"mode: iptables\n")
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--proxy-mode=iptables"}, false},
		{[]string{"--proxy-mode=nftables"}, false},
		{[]string{"--config", noMode}, true},
		{[]string{"--config", noMode, "--proxy-mode=nftables"}, true}, // ignored with --config
		{[]string{"--config", withMode}, false},
	} {
		o := newOptions()
		fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
		o.addFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := o.complete(fs); err != nil {
			t.Fatal(err)
		}
		if o.modeDefaulted != tc.want {
			t.Errorf("%v: mode defaulted %v, want %v", tc.args, o.modeDefaulted, tc.want)
		}
	}
}
