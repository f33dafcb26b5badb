package iptables

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

func TestBackendOverride(t *testing.T) {
	for value, want := range map[string]Backend{"legacy": Legacy, "nft": NFT} {
		t.Setenv(BackendEnv, value)
		if got, _, err := DetectBackend(); err != nil || got != want {
			t.Errorf("%s=%s: got %q, %v", BackendEnv, value, got, err)
		}
	}
	t.Setenv(BackendEnv, "xtables")
	if _, _, err := DetectBackend(); err == nil || !strings.Contains(err.Error(), BackendEnv) {
		t.Errorf("a bad override gave %v, want an error naming %s", err, BackendEnv)
	}
}

// detectHelperEnv makes the test binary, run inside a namespace, print
// what DetectBackend picks there.
const detectHelperEnv = "RAPIDPROXY_TEST_DETECT_BACKEND"

// generationHelperEnv makes the test binary print Generation() of a table
// for a backend ("nft", "legacy"; "6" appended for IPv6), as
// "BACKEND[6]/TABLE", inside a namespace.
const generationHelperEnv = "RAPIDPROXY_TEST_GENERATION"

// availableHelperEnv makes the test binary print what Available() says of
// a backend's IPv4 tools ("ok" when they work).
const availableHelperEnv = "RAPIDPROXY_TEST_AVAILABLE"

func TestMain(m *testing.M) {
	if backend := os.Getenv(availableHelperEnv); backend != "" {
		if err := New(false, Backend(backend)).Available(); err != nil {
			os.Stdout.WriteString(err.Error())
		} else {
			os.Stdout.WriteString("ok")
		}
		os.Exit(0)
	}
	if spec := os.Getenv(generationHelperEnv); spec != "" {
		backend, table, _ := strings.Cut(spec, "/")
		ipv6 := strings.HasSuffix(backend, "6")
		g, err := New(ipv6, Backend(strings.TrimSuffix(backend, "6"))).Generation(table)
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Stdout.WriteString(strconv.FormatUint(g, 10))
		os.Exit(0)
	}
	if os.Getenv(detectHelperEnv) != "" {
		b, why, err := DetectBackend()
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Stdout.WriteString(string(b))
		os.Stderr.WriteString(why)
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
	detectWith := func(netns string, env ...string) Backend {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", netns, self)
		cmd.Env = append(append(os.Environ(), detectHelperEnv+"=1", BackendEnv+"=", FallbackEnv+"="), env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("detecting in %s: %v", netns, err)
		}
		return Backend(out)
	}
	// pathTo puts a directory first in PATH whose iptables is the given
	// backend's, as Debian's alternatives choose it.
	pathTo := func(b Backend) string {
		multi, err := exec.LookPath("xtables-" + string(b) + "-multi")
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := os.Symlink(multi, filepath.Join(dir, "iptables")); err != nil {
			t.Fatal(err)
		}
		return "PATH=" + dir + ":" + os.Getenv("PATH")
	}
	detect := func(netns string) Backend { return detectWith(netns, pathTo(NFT)) }

	empty := testutil.NewNetns(t)
	if got := detect(empty); got != NFT {
		t.Errorf("no rules anywhere, iptables is nft: got %q, want nft", got)
	}
	if got := detectWith(empty, pathTo(Legacy)); got != Legacy {
		t.Errorf("no rules anywhere, iptables is legacy: got %q, want legacy", got)
	}
	if got := detectWith(empty, pathTo(Legacy), FallbackEnv+"=nft"); got != NFT {
		t.Errorf("no rules anywhere, iptables is legacy, %s=nft (the image): got %q, want nft", FallbackEnv, got)
	}
	// Nothing looked at the legacy backend, which has no table: a legacy
	// tool listing a chain would have made the table.
	if names := testutil.InNetns(t, empty, "cat", "/proc/net/ip_tables_names"); names != "" {
		t.Errorf("detection made the legacy tables %q", names)
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

// With CAP_NET_ADMIN alone, as a container granted only that, the legacy
// backend is not usable and says it needs CAP_NET_RAW (iptables-legacy
// opens a raw socket), while the nft backend works; detection then cannot
// see the legacy tables, so the kubelet's hint there goes unseen.
func TestLegacyBackendNeedsNetRaw(t *testing.T) {
	testutil.RequireCommands(t, "iptables-legacy", "iptables-nft", "setpriv")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	netns := testutil.NewNetns(t)
	testutil.InNetns(t, netns, "iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
	withNetAdminOnly := func(env string) string {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", netns, "setpriv", "--inh-caps=-all", "--bounding-set=-all,+net_admin", "--", self)
		cmd.Env = append(os.Environ(), env, BackendEnv+"=")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s with CAP_NET_ADMIN only: %v", env, err)
		}
		return string(out)
	}
	if got := withNetAdminOnly(availableHelperEnv + "=legacy"); !strings.Contains(got, "needs CAP_NET_RAW") {
		t.Errorf("the legacy backend with CAP_NET_ADMIN only: %q, want an error naming CAP_NET_RAW", got)
	}
	if got := withNetAdminOnly(availableHelperEnv + "=nft"); got != "ok" {
		t.Errorf("the nft backend with CAP_NET_ADMIN only: %s", got)
	}
	if got := withNetAdminOnly(detectHelperEnv + "=1"); got != string(NFT) {
		t.Errorf("detection with CAP_NET_ADMIN only, the kubelet's hint in legacy: %q, want nft", got)
	}
}

// A table's generation changes with a rule change in it, and only then.
func TestGenerationFollowsRuleChanges(t *testing.T) {
	testutil.RequireCommands(t, "iptables-legacy", "iptables-nft")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	netns := testutil.NewNetns(t)
	for _, b := range []Backend{NFT, Legacy} {
		for _, ipv6 := range []bool{false, true} {
			for table, chain := range map[string]string{"filter": "INPUT", "nat": "PREROUTING"} {
				spec, tool := string(b), "iptables-"+string(b)
				if ipv6 {
					spec, tool = spec+"6", "ip6tables-"+string(b)
				}
				generation := func() string {
					t.Helper()
					cmd := exec.Command("ip", "netns", "exec", netns, self)
					cmd.Env = append(os.Environ(), generationHelperEnv+"="+spec+"/"+table)
					out, err := cmd.CombinedOutput()
					if err != nil {
						t.Fatalf("%s -t %s: %v: %s", tool, table, err, out)
					}
					return string(out)
				}
				testutil.InNetns(t, netns, tool, "-t", table, "-A", chain, "-j", "ACCEPT")
				before := generation()
				if again := generation(); again != before {
					t.Errorf("%s -t %s: the generation moved without a change: %s -> %s", tool, table, before, again)
				}
				testutil.InNetns(t, netns, tool, "-t", table, "-F")
				if after := generation(); after == before {
					t.Errorf("%s -t %s: the generation did not move with a flush: %s", tool, table, before)
				}
			}
		}
	}
}

// Save hands the tool's output to its reader as it comes, whole when read
// to the end; a reader that stops early gets its error back, and the rest
// is drained so that the tool, blocked on a full pipe, still ends.
func TestSaveStreamsToItsReader(t *testing.T) {
	netns := testutil.NewNetns(t)
	testutil.RequireCommands(t, "iptables-nft-restore")
	const rules = 3000 // some 120 KB of output, beyond a pipe's 64 KiB
	var in strings.Builder
	in.WriteString("*filter\n:RPX-TEST - [0:0]\n")
	for i := range rules {
		fmt.Fprintf(&in, "-A RPX-TEST -s 10.0.%d.%d/32 -j ACCEPT\n", i/250, i%250)
	}
	in.WriteString("COMMIT\n")
	testutil.DoInNetns(t, netns, func() {
		r := New(false, NFT)
		if err := r.Restore(strings.NewReader(in.String())); err != nil {
			t.Fatal(err)
		}
		var whole strings.Builder
		err := r.Save(func(out io.Reader) error {
			_, err := io.Copy(&whole, out)
			return err
		})
		if n := strings.Count(whole.String(), "-A RPX-TEST "); err != nil || n != rules {
			t.Errorf("read to the end: %d rules, %v; want %d", n, err, rules)
		}
		stop := errors.New("stop reading")
		err = r.Save(func(out io.Reader) error {
			_, _ = out.Read(make([]byte, 16))
			return stop
		})
		if err != stop {
			t.Errorf("a reader that stops early: %v, want its error", err)
		}
	})
}

// A failed restore's error quotes the line iptables names, when the
// input kept reaches it whole.
func TestOffendingLineIsQuoted(t *testing.T) {
	input := []byte("*nat\n-X KUBE-SEP-A\nCOMMIT\n")
	for msg, want := range map[string]string{
		"iptables-restore: line 2 failed":                                 ` (input line 2: "-X KUBE-SEP-A")`,
		"iptables-restore v1.8.9 (nf_tables): line 3: RULE_APPEND failed": ` (input line 3: "COMMIT")`,
		"iptables-restore: line 4 failed":                                 "",
		"iptables-restore: line 0 failed":                                 "",
		"Another app is currently holding the xtables lock":               "",
	} {
		if got := offendingLine(msg, input); got != want {
			t.Errorf("%q: got %q, want %q", msg, got, want)
		}
	}
	if got := offendingLine("line 2 failed", []byte("*nat\n-X KUBE-SEP")); got != "" {
		t.Errorf("a line cut short by the kept input's limit was quoted: %q", got)
	}
}
