// Package iptables is the kernel side of the modes that write iptables
// rules (the iptables and IPVS modes). It runs the iptables tools:
// iptables-restore to change rules atomically, iptables-save to read them,
// and iptables for single checks, with the backend (legacy or nft) the
// host already uses (iptables.go, generation.go). And it holds what both
// modes write through them: chains and rules (rules.go), restore input
// (restore.go), the kernel's tables as a full sync compares them
// (kernelstate.go, canonical.go), a fixed set of whole chains kept in
// place (chainset.go), and the removal of kube-proxy's chains
// (cleanup.go). It imports no mode.
package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/rapidproxy/rapidproxy/internal/nfgen"
)

// Backend is the kernel interface the iptables tools drive.
type Backend string

const (
	Legacy Backend = "legacy"
	NFT    Backend = "nft"
)

// Runner runs the tools of one backend and one IP family.
type Runner struct {
	ipv6    bool
	backend Backend
	// Restores and checks are serialized: -w already waits for the
	// xtables lock, this just keeps our own calls from queueing on it.
	mu sync.Mutex

	// infoSocket is the raw socket legacy table generations are read
	// through, opened at the first read (-1 before) and kept: opening and
	// closing one was most of the cost of a once-a-second flush probe.
	infoMu     sync.Mutex
	infoSocket int
}

// New returns a runner for the family and backend.
func New(ipv6 bool, backend Backend) *Runner {
	return &Runner{ipv6: ipv6, backend: backend, infoSocket: -1}
}

// IPv6 tells the runner's family.
func (r *Runner) IPv6() bool { return r.ipv6 }

// Backend tells the runner's backend.
func (r *Runner) Backend() Backend { return r.backend }

func (r *Runner) tool(suffix string) string {
	base := "iptables"
	if r.ipv6 {
		base = "ip6tables"
	}
	return base + "-" + string(r.backend) + suffix
}

// Restore feeds input to iptables-restore without flushing other
// programs' rules. Each table in the input is applied atomically; when one
// fails, the error quotes the line iptables complained about (legacy's
// message gives only its number), if it was within the first
// keptInput bytes.
func (r *Runner) Restore(input io.Reader) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmd := exec.Command(r.tool("-restore"), "-w", "--noflush", "--counters")
	sent := &headBuffer{limit: keptInput}
	cmd.Stdin = io.TeeReader(input, sent)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	run := cmd.Run
	if r.backend == NFT {
		run = func() error { return nfgen.Write(cmd.Run) }
	}
	if err := run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		return fmt.Errorf("%s: %w: %s%s", r.tool("-restore"), err, msg, offendingLine(msg, sent.Bytes()))
	}
	return nil
}

// keptInput bounds the copy of a restore input kept to quote a failing
// line: a partial sync's input is far smaller, a full sync's at 10k
// services some 18 MB.
const keptInput = 1 << 20

// headBuffer keeps the first limit bytes written to it.
type headBuffer struct {
	bytes.Buffer
	limit int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

var restoreLineNumber = regexp.MustCompile(`line (\d+)`)

// offendingLine quotes the input line an iptables-restore message names,
// "" when it names none or input does not reach it.
func offendingLine(msg string, input []byte) string {
	m := restoreLineNumber.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.SplitN(string(input), "\n", n+1)
	if n < 1 || len(lines) <= n {
		return ""
	}
	return fmt.Sprintf(" (input line %d: %q)", n, lines[n-1])
}

// Save hands iptables-save output of every table to read as the tool
// prints it, so that it is never held whole: at 10k services it is some
// 18 MB of text. read's error is returned unless the tool failed; what
// read leaves unread is discarded.
func (r *Runner) Save(read func(io.Reader) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmd := exec.Command(r.tool("-save"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", r.tool("-save"), err)
	}
	readErr := read(out)
	// The tool blocks on a full pipe until its output is read to the end.
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s: %w: %s", r.tool("-save"), err, strings.TrimSpace(stderr.String()))
	}
	return readErr
}

// ListRules returns the rules of one chain, without their "-A CHAIN"; it
// fails when the chain or the table does not exist. Listing one chain is
// cheap where a rule check is not: iptables-nft resolves the whole table
// for -C.
func (r *Runner) ListRules(table, chain string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, err := exec.Command(r.tool(""), "-w", "-t", table, "-S", chain).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -t %s -S %s: %w", r.tool(""), table, chain, exitDetail(err))
	}
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "-A "+chain+" "); ok {
			rules = append(rules, rest)
		}
	}
	return rules, nil
}

// Available tells whether this backend's tools are installed and work.
func (r *Runner) Available() error {
	if _, err := exec.LookPath(r.tool("-restore")); err != nil {
		return fmt.Errorf("%s is not installed (Debian package iptables)", r.tool("-restore"))
	}
	if r.backend == Legacy {
		if err := LegacyPermitted(); err != nil {
			return err
		}
	}
	// One built-in chain of the nat table: a whole-table read takes
	// seconds at 10k services, and starting up must not wait for it.
	if out, err := exec.Command(r.tool(""), "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput(); err != nil {
		return fmt.Errorf("%s does not work here: %w: %s", r.tool(""), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// BackendEnv overrides the backend choice: "legacy" or "nft".
const BackendEnv = "KUBE_PROXY_IPTABLES_BACKEND"

// markerChains are chains only kube-proxy and the kubelet create in the
// mangle table; finding one tells the backend in use. Each is looked up
// alone: iptables-nft-save, even of the small mangle table, fetches the
// whole ruleset (1.3 s at 100k chains), where listing one chain takes ms.
var markerChains = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY", "KUBE-PROXY-CANARY"}

// FallbackEnv names the backend to use when neither marker chains nor
// rule counts decide. rapidproxy's image sets it to nft, as upstream's
// image's iptables wrapper decides; unset (a binary on a bare-metal node)
// the host's own `iptables` command decides, as upstream's binary, which
// runs `iptables` by name, writes through whatever backend that is.
const FallbackEnv = "KUBE_PROXY_IPTABLES_BACKEND_FALLBACK"

// DetectBackend picks the backend the host's other programs use, and says
// why: the override if set; else the one whose mangle table holds kubelet
// or kube-proxy marker chains; else the one holding more rules; else
// FallbackEnv, or the backend of the `iptables` on PATH. Without
// CAP_NET_RAW it cannot look at the legacy backend's tables
// (LegacyPermitted), nor use them: nft.
func DetectBackend() (Backend, string, error) {
	switch b := Backend(os.Getenv(BackendEnv)); b {
	case Legacy, NFT:
		return b, BackendEnv + " is set", nil
	case "":
	default:
		return "", "", fmt.Errorf("%s=%q: want %q or %q", BackendEnv, b, Legacy, NFT)
	}
	fallback := Backend(os.Getenv(FallbackEnv))
	if fallback != "" && fallback != Legacy && fallback != NFT {
		return "", "", fmt.Errorf("%s=%q: want %q or %q", FallbackEnv, fallback, Legacy, NFT)
	}
	if err := LegacyPermitted(); err != nil {
		return NFT, "the legacy backend cannot be used without CAP_NET_RAW", nil
	}
	tools := func(b Backend) []string { return []string{"iptables-" + string(b), "ip6tables-" + string(b)} }
	hasMarker := func(b Backend) bool {
		for _, tool := range tools(b) {
			for _, chain := range markerChains {
				if exec.Command(tool, "-w", "-t", "mangle", "-S", chain).Run() == nil {
					return true
				}
			}
		}
		return false
	}
	rules := func(b Backend) int {
		n := 0
		for _, tool := range tools(b) {
			out, _ := exec.Command(tool + "-save").Output()
			n += strings.Count(string(out), "\n-A ")
		}
		return n
	}
	// Without a legacy table the legacy backend holds no marker and no
	// rule, and is not asked (a legacy tool listing a chain would make
	// its table; each process costs 0.1-0.3 s under emulation).
	legacyTables := LegacyHoldsTables()
	legacyMarked, nftMarked := legacyTables && hasMarker(Legacy), hasMarker(NFT)
	if legacyMarked != nftMarked {
		if legacyMarked {
			return Legacy, "the kubelet's or kube-proxy's marker chains are in it", nil
		}
		return NFT, "the kubelet's or kube-proxy's marker chains are in it", nil
	}
	legacyRules, nftRules := 0, rules(NFT)
	if legacyTables {
		legacyRules = rules(Legacy)
	}
	if legacyRules != nftRules {
		if legacyRules > nftRules {
			return Legacy, fmt.Sprintf("it holds more rules (%d against nft's %d)", legacyRules, nftRules), nil
		}
		return NFT, fmt.Sprintf("it holds more rules (%d against legacy's %d)", nftRules, legacyRules), nil
	}
	if fallback != "" {
		return fallback, "no marker chain or rule decides, and " + FallbackEnv + " (set in the image) says so", nil
	}
	return hostBackend()
}

// hostBackend is the backend of the host's `iptables` command: the first
// on PATH, as Debian's alternatives or the distribution resolve it.
// iptables before 1.8 had only the legacy backend; without any, nft.
func hostBackend() (Backend, string, error) {
	path, err := exec.LookPath("iptables")
	if err != nil {
		return NFT, "no marker chain or rule decides, and there is no iptables command on PATH", nil
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return NFT, fmt.Sprintf("no marker chain or rule decides, and %s --version fails (%v)", path, err), nil
	}
	version := strings.TrimSpace(string(out))
	if strings.Contains(version, "nf_tables") {
		return NFT, fmt.Sprintf("no marker chain or rule decides, and the host's iptables (%s: %s) uses it", path, version), nil
	}
	return Legacy, fmt.Sprintf("no marker chain or rule decides, and the host's iptables (%s: %s) uses it", path, version), nil
}

// LegacyHoldsTables tells whether the legacy backend has a table in the
// calling thread's network namespace: the kernel names them in
// ip_tables_names and ip6_tables_names, which are missing or empty while
// none exists (listing a chain with a legacy tool creates its table).
func LegacyHoldsTables() bool {
	for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
		names, err := os.ReadFile(f)
		if (err != nil && !errors.Is(err, fs.ErrNotExist)) || len(bytes.TrimSpace(names)) > 0 {
			return true
		}
	}
	return false
}

func exitDetail(err error) error {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}
