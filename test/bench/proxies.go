// The proxies a run starts: on the cluster's node or in a VM, with the
// config and wrapper each needs.

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// proxyProcess is a running kube-proxy: in the cluster's node namespace
// (localProxy) or in a VM (guestProxy).
type proxyProcess interface {
	Exited() <-chan struct{}
	Err() error // how it ended, once Exited is closed
	LogTail(lines int) string
	Stop()
	usage() (framework.ProcUsage, error)
	metricsURL() string
	// hostTime turns a time of the process's clock (Unix seconds, as its
	// metrics give it) into one of ours.
	hostTime(unix float64) float64
	// pollInterval is how often the bench reads its metrics while it
	// waits for a sync.
	pollInterval() time.Duration
}

// localProxy is a kube-proxy in the cluster's node namespace.
type localProxy struct{ *framework.KubeProxy }

func (p localProxy) usage() (framework.ProcUsage, error) { return framework.ReadProcUsage(p.Pid()) }
func (localProxy) metricsURL() string                    { return framework.MetricsURL }
func (localProxy) hostTime(unix float64) float64         { return unix }
func (localProxy) pollInterval() time.Duration           { return pollInterval }

// exitError says that kp has exited, and how.
func exitError(kp proxyProcess) error {
	return fmt.Errorf("kube-proxy exited: %v\n%s", kp.Err(), kp.LogTail(20))
}

// node prepares where the run's kube-proxy runs, with a config that
// serves metrics to the bench (and profiles, if profile), and returns what
// starts it there (name tells its log apart) and what ends the node.
func (b *bench) node(ctx context.Context, proxy, column string, profile bool) (startProxy func(name string) (proxyProcess, error), stop func(), err error) {
	if columnMode(column) == modeIPVS {
		binary := b.cluster.KubeProxy()
		if proxy == upstream {
			binary = b.cluster.UpstreamKubeProxy()
		}
		g, err := b.bootGuest(ctx, binary, b.cluster.KubeProxyConfig("mode: ipvs\n"+proxyConfig(profile)))
		if err != nil {
			return nil, nil, err
		}
		return g.startProxy, g.stop, nil
	}
	if err := b.resetNode(column); err != nil {
		return nil, nil, err
	}
	var backend framework.IPTablesBackend
	if columnMode(column) == modeIPTables {
		backend = framework.IPTablesBackend(column)
	}
	start, err := b.localStarter(proxy, column, backend, profile)
	if err != nil {
		return nil, nil, err
	}
	return func(name string) (proxyProcess, error) { return start(name) }, func() {}, nil
}

// proxyConfig is the config every run adds: metrics served to the bench
// and, if profile, profiles.
func proxyConfig(profile bool) string {
	config := "metricsBindAddress: 0.0.0.0:10249\n"
	if profile {
		// Verbosity 2 logs each sync with its time, for the logs kept
		// beside the profiles.
		config += "enableProfiling: true\nlogging:\n  verbosity: 2\n"
	}
	return config
}

// resetNode empties the node namespace's kernel for a run that starts in
// the column's mode: no nftables table (nft flush ruleset) and no iptables
// rule of either backend; in mode iptables, the backend is then marked
// as the one in use.
func (b *bench) resetNode(column string) error {
	if err := b.cluster.Node.ResetIPTables(); err != nil {
		return err
	}
	if columnMode(column) != modeIPTables {
		return nil
	}
	return b.cluster.Node.PreferIPTablesBackend(framework.IPTablesBackend(column))
}

// localStarter returns what starts the proxy in the node namespace in the
// column's mode (iptables or nftables) over whatever the kernel holds;
// upstream's runs `iptables` of backend, if set, else the system's.
func (b *bench) localStarter(proxy, column string, backend framework.IPTablesBackend, profile bool) (func(name string) (localProxy, error), error) {
	binary := b.cluster.KubeProxy()
	if proxy == upstream {
		binary = b.cluster.UpstreamKubeProxy()
	}
	mode := columnMode(column)
	if backend != "" && proxy == upstream {
		var err error
		if binary, err = b.upstreamWrapper(backend); err != nil {
			return nil, err
		}
	}
	// Inside a network namespace nf_conntrack_max is read-only: leave it.
	config := b.cluster.KubeProxyConfig("mode: " + mode + "\n" + proxyConfig(profile) + "conntrack:\n  maxPerCore: 0\n")
	return func(name string) (localProxy, error) {
		kp, err := b.cluster.StartKubeProxy(name, binary, config)
		return localProxy{kp}, err
	}, nil
}

// upstreamWrapper runs upstream's kube-proxy on an iptables backend. Ours
// picks its backend itself (by counting rules, see
// PreferIPTablesBackend); upstream's runs plain `iptables`, so the wrapper
// puts the backend's commands first in PATH, as upstream's image does with
// its iptables-wrapper.
func (b *bench) upstreamWrapper(backend framework.IPTablesBackend) (string, error) {
	dir := filepath.Join(b.cluster.Dir, "iptables-"+string(backend))
	if err := framework.IPTablesAlternatives(dir, backend); err != nil {
		return "", err
	}
	wrapper := filepath.Join(b.cluster.Dir, "kube-proxy-upstream-"+string(backend))
	script := fmt.Sprintf("#!/bin/sh\nPATH=%s:$PATH exec %s \"$@\"\n", dir, b.cluster.UpstreamKubeProxy())
	return wrapper, os.WriteFile(wrapper, []byte(script), 0o755)
}
