package preflight

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/firewalld"
	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/kernel"
	"github.com/rapidproxy/rapidproxy/pkg/metricsaddr"
)

// DefaultAddress is kube-proxy's default metricsBindAddress.
const DefaultAddress = metricsaddr.Default

// nftablesTable is nftables.TableName, not imported: that would bring the
// mode's netlink code into kube-proxy-explain.
const nftablesTable = "kube-proxy"

// configzGroup is the key /configz serves the configuration under.
const configzGroup = "kubeproxy.config.k8s.io"

// Gather reads the facts from this node and from the kube-proxy whose
// metrics server is at address. It changes nothing.
func Gather(ctx context.Context, address string) *Facts {
	f := &Facts{Address: address}
	gatherKubeProxy(ctx, f)
	f.KernelRelease, f.KernelErr = kernel.Release()
	f.SkipKernelCheck = os.Getenv(kernel.SkipNFTablesCheckEnv)
	if out, err := exec.CommandContext(ctx, "nft", "--version").Output(); err == nil {
		f.NFTVersion = strings.TrimSpace(string(out))
	}
	// knftables' own check, as the nftables mode makes it at start: the
	// tool is there, v1.0.1 or later, and works (a --check, which
	// changes nothing).
	_, f.NFTErr = knftables.New(knftables.IPv4Family, nftablesTable)
	f.Saved = gatherIPTables()
	f.Firewalld = firewalld.Evidence(ctx)
	return f
}

// gatherKubeProxy asks kube-proxy's metrics server for its mode,
// configuration and metrics.
func gatherKubeProxy(ctx context.Context, f *Facts) {
	client := &http.Client{Timeout: 10 * time.Second}
	var mode string
	if mode, f.ModeErr = get(ctx, client, f.Address, "/proxyMode"); f.ModeErr == nil {
		// An unset mode is the iptables mode, as kube-proxy defaults it.
		if f.Mode = strings.TrimSpace(mode); f.Mode == "" {
			f.Mode = iptablesMode
		}
	}
	if f.ModeErr != nil {
		f.ConfigErr, f.MetricsErr = f.ModeErr, f.ModeErr
		return
	}
	var configz string
	if configz, f.ConfigErr = get(ctx, client, f.Address, "/configz"); f.ConfigErr == nil {
		f.Config, f.ConfigErr = parseConfigz(configz)
	}
	var metrics string
	if metrics, f.MetricsErr = get(ctx, client, f.Address, "/metrics"); f.MetricsErr == nil {
		f.Metrics = parseMetrics(metrics)
	}
}

func get(ctx context.Context, client *http.Client, address, path string) (string, error) {
	base, err := metricsaddr.Parse(address)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsaddr.URL(base, path, nil), nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("asking kube-proxy at %s: %w", address, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("reading %s from %s: %w", path, address, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s from %s: %s", path, address, resp.Status)
	}
	return string(body), nil
}

// parseConfigz reads the configuration /configz serves (ours and
// upstream's: v1alpha1's fields, defaulted, under the group's name).
func parseConfigz(body string) (*kpconfig.KubeProxyConfiguration, error) {
	var groups map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &groups); err != nil {
		return nil, fmt.Errorf("/configz: %w", err)
	}
	raw, ok := groups[configzGroup]
	if !ok {
		return nil, fmt.Errorf("/configz has no %s", configzGroup)
	}
	cfg := &kpconfig.KubeProxyConfiguration{}
	if err := json.Unmarshal(raw, cfg); err != nil {
		return nil, fmt.Errorf("/configz: %w", err)
	}
	return cfg, nil
}

// parseMetrics sums the samples of each metric of a Prometheus text
// exposition over their labels.
func parseMetrics(body string) map[string]float64 {
	sums := map[string]float64{}
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			// Label values may hold spaces, but not an unescaped "}".
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			sums[name] += v
		}
	}
	return sums
}

// gatherIPTables reads the rules of each backend and family whose save
// tool is installed, but the legacy backend's when it holds no table
// (reading it may load its modules).
func gatherIPTables() []SavedRules {
	var saved []SavedRules
	for _, backend := range []iptableskernel.Backend{iptableskernel.NFT, iptableskernel.Legacy} {
		for _, ipv6 := range []bool{false, true} {
			s := SavedRules{Backend: string(backend), IPv6: ipv6}
			if _, err := exec.LookPath(s.Source() + "-save"); err != nil {
				continue
			}
			if backend == iptableskernel.Legacy {
				if err := iptableskernel.LegacyPermitted(); err != nil {
					s.Err = err
					saved = append(saved, s)
					continue
				}
				if !iptableskernel.LegacyHoldsTables() {
					continue
				}
			}
			s.Text, s.Err = save(iptableskernel.New(ipv6, backend))
			saved = append(saved, s)
		}
	}
	return saved
}

// save reads a backend's rules, less the rules of kube-proxy's own
// chains: at 10k services those are some 18 MB.
func save(r *iptableskernel.Runner) (string, error) {
	var kept strings.Builder
	err := r.Save(func(out io.Reader) error {
		lines := bufio.NewScanner(out)
		lines.Buffer(make([]byte, 64*1024), 16*1024*1024)
		for lines.Scan() {
			if line := lines.Text(); keepSavedLine(line) {
				kept.WriteString(line + "\n")
			}
		}
		return lines.Err()
	})
	if err != nil && errors.Is(err, exec.ErrNotFound) {
		return "", nil
	}
	return kept.String(), err
}
