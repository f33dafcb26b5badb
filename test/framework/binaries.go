package framework

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// binaries are the programs a cluster runs.
type binaries struct {
	root      string // the repository
	tools     string // kube-apiserver, kube-controller-manager, kube-proxy-upstream
	etcd      string
	podserver string
	kubeProxy string // ours
	explain   string // kube-proxy-explain
}

var (
	binariesOnce   sync.Once
	binariesCached binaries
	binariesErr    error
)

// findBinaries locates (and, the first time, builds) every program. The
// Makefile passes their paths in RAPIDPROXY_* variables; without them the
// framework builds what is missing itself, so `go test` alone works too.
func findBinaries() (binaries, error) {
	binariesOnce.Do(func() { binariesCached, binariesErr = locate() })
	return binariesCached, binariesErr
}

func locate() (binaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return binaries{}, err
	}
	b := binaries{root: root}
	if b.etcd, err = exec.LookPath("etcd"); err != nil {
		return b, errors.New("etcd is not installed (Debian package etcd-server; hack/install-deps.sh installs it)")
	}
	if b.tools = os.Getenv("RAPIDPROXY_TOOLS_DIR"); b.tools == "" {
		out, err := exec.Command(filepath.Join(root, "hack", "build-tools.sh")).Output()
		if err != nil {
			return b, fmt.Errorf("building the upstream tools: %w", err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		b.tools = lines[len(lines)-1]
	}
	bin := filepath.Join(root, "_output", "bin")
	if b.podserver, err = goBuild(root, "RAPIDPROXY_PODSERVER", filepath.Join(bin, "podserver"), "./test/podserver"); err != nil {
		return b, err
	}
	if b.kubeProxy, err = goBuild(root, "RAPIDPROXY_KUBE_PROXY", filepath.Join(bin, "kube-proxy"), "./cmd/kube-proxy"); err != nil {
		return b, err
	}
	if b.explain, err = goBuild(root, "RAPIDPROXY_KUBE_PROXY_EXPLAIN", filepath.Join(bin, "kube-proxy-explain"), "./cmd/kube-proxy-explain"); err != nil {
		return b, err
	}
	return b, nil
}

// goBuild returns the path in env if set and present, else builds pkg to out.
func goBuild(root, env, out, pkg string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return out, nil
}

// RepoRoot finds the repository by walking up to its go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(data, []byte("module github.com/rapidproxy/rapidproxy\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the rapidproxy repository above the working directory")
		}
		dir = parent
	}
}

// podserverPath is the pod server binary, for Netns.Request.
func podserverPath() string { return binariesCached.podserver }

// UpstreamKubeProxy is the path of upstream's kube-proxy, built from the tools module.
func (c *Cluster) UpstreamKubeProxy() string {
	return filepath.Join(c.bins.tools, "kube-proxy-upstream")
}

// KubeProxy is the path of our kube-proxy binary.
func (c *Cluster) KubeProxy() string { return c.bins.kubeProxy }

// Podserver is the path of the pod server binary (test/podserver), for
// pods the framework does not run (those in a VM).
func (c *Cluster) Podserver() string { return c.bins.podserver }

// KubeProxyExplain is the path of our kube-proxy-explain binary.
func (c *Cluster) KubeProxyExplain() string { return c.bins.explain }
