package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// A mode switch (-switch): each proxy runs in the path's first mode until
// its first sync, then, stopped each time, in each next mode over the
// rules the one before left. Ours keeps the old mode's rules until the new
// mode's first sync is in place and then removes them; upstream's removes
// them at its start, before anything else.

// switchedLog is what ours logs once nothing of the old mode is left.
const switchedLog = "Switched proxy mode: nothing of the other modes is left"

// switchPath turns -switch (modes, comma-separated) into the columns the
// proxies run in, one after the other; the iptables mode runs on the one
// backend of -backends.
func switchPath(list string, backends []framework.IPTablesBackend) ([]string, error) {
	var path []string
	for _, mode := range strings.Split(list, ",") {
		column := mode
		switch mode {
		case modeIPTables:
			if len(backends) != 1 {
				return nil, fmt.Errorf("-switch runs the iptables mode on one backend, -backends names %d", len(backends))
			}
			column = string(backends[0])
		case modeNFTables:
		default:
			return nil, fmt.Errorf("-switch takes the modes iptables and nftables, not %q", mode)
		}
		if len(path) > 0 && path[len(path)-1] == column {
			return nil, fmt.Errorf("-switch %s: %s follows itself", list, mode)
		}
		path = append(path, column)
	}
	if len(path) < 2 {
		return nil, fmt.Errorf("-switch %s: a switch takes two modes, from and to", list)
	}
	return path, nil
}

// switchColumns are the table's groups of columns for a switch path: one
// per switch.
func switchColumns(path []string) []string {
	var out []string
	for i := 1; i < len(path); i++ {
		out = append(out, switchColumn(path[i-1], path[i]))
	}
	return out
}

func switchColumn(from, to string) string {
	label := func(column string) string {
		if mode := columnMode(column); mode != column {
			return mode + " (" + column + ")"
		}
		return column
	}
	return label(from) + " -> " + label(to)
}

// measureSwitch runs the proxy along the switch path from a clean kernel
// and returns each switch's results, by column.
func (b *bench) measureSwitch(ctx context.Context, proxy string) (map[string]results, error) {
	path := b.opts.switchPath
	all := map[string]results{}
	if err := b.resetNode(path[0]); err != nil {
		return all, err
	}
	start := time.Now()
	kp, err := b.startIn(proxy, path[0], fmt.Sprintf("%s-switch-%s", proxy, path[0]))
	if err != nil {
		return all, err
	}
	defer func() { kp.Stop() }()
	first, err := b.firstSync(ctx, kp, start)
	if err != nil {
		return all, err
	}
	b.logf("  %s: first sync %s s", path[0], first.format(3))
	if first.capped {
		return all, nil
	}
	for i := 1; i < len(path); i++ {
		from, to := path[i-1], path[i]
		r := results{}
		all[switchColumn(from, to)] = r
		kp.Stop()
		start = time.Now()
		next, err := b.startIn(proxy, to, fmt.Sprintf("%s-switch-%d-%s", proxy, i, to))
		if err != nil {
			return all, err
		}
		kp = next
		if err := b.timeSwitch(ctx, kp, proxy, from, to, start, r); err != nil || r["switchSync"].capped || r["switchEnd"].capped {
			return all, err
		}
		b.keepLog(kp, proxy, to, "switch-from-"+from+".log")
	}
	return all, nil
}

// startIn starts the proxy in the column's mode; upstream's runs the
// switch's iptables backend in every mode, as its image's iptables-wrapper
// would pick the backend that holds rules.
func (b *bench) startIn(proxy, column, name string) (localProxy, error) {
	start, err := b.localStarter(proxy, column, b.opts.backends[0], false)
	if err != nil {
		return localProxy{}, err
	}
	return start(name)
}

// timeSwitch fills r for a process started at start in the to column's
// mode over the rules of the from column's: its first sync, the end of the
// switch, /healthz's first 200 (polled from the start on, alongside) and
// the peak RSS.
func (b *bench) timeSwitch(ctx context.Context, kp localProxy, proxy, from, to string, start time.Time, r results) error {
	healthCtx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	type waited struct {
		c   cell
		err error
	}
	health := make(chan waited, 1)
	go func() {
		c, err := b.waitFor(healthCtx, kp, start, func() (float64, bool) {
			code, _, err := kp.Healthz()
			return unixSeconds(time.Now()), err == nil && code == http.StatusOK
		})
		health <- waited{c, err}
	}()
	var err error
	if r["switchSync"], err = b.firstSync(ctx, kp, start); err != nil {
		return err
	}
	if r["switchSync"].capped {
		return nil
	}
	if r["switchEnd"], err = b.switchEnd(ctx, kp, proxy, from, start, r["switchSync"]); err != nil {
		return err
	}
	h := <-health
	if h.err != nil {
		return h.err
	}
	r["switchHealthy"] = h.c
	if r["switchPeakRSS"], err = settledPeakRSS(ctx, kp); err != nil {
		return err
	}
	b.logf("  %s: first sync %s s, switch over %s s, healthy %s s, RSS peak %.0f MB", switchColumn(from, to),
		r["switchSync"].format(3), r["switchEnd"].format(3), r["switchHealthy"].format(3), r["switchPeakRSS"].value)
	return nil
}

// switchEnd waits, after the first sync (sync), for the end of the
// switch: ours says it (kubeproxy_mode_switch_in_progress back to 0, seen
// by polling); upstream's removed the old mode's rules before anything
// else, so its first sync ends it. What the kernel still holds of the old
// mode then goes into the cell's note.
func (b *bench) switchEnd(ctx context.Context, kp localProxy, proxy, from string, start time.Time, sync cell) (cell, error) {
	end := sync
	if proxy == ours {
		var err error
		end, err = b.waitFor(ctx, kp, start, func() (float64, bool) {
			m, err := framework.FetchMetrics(kp.metricsURL() + "/metrics")
			if err != nil {
				return 0, false
			}
			v, ok := m.Get("kubeproxy_mode_switch_in_progress")
			return unixSeconds(time.Now()), ok && v == 0
		})
		if err != nil || end.capped {
			return end, err
		}
		if !strings.Contains(kp.LogTail(1<<20), switchedLog) {
			end.note = "no switch logged"
		}
	}
	left, err := b.leftOf(from)
	if err != nil || len(left) == 0 {
		return end, err
	}
	b.logf("  left of the old mode at the end of the switch: %s", strings.Join(left, ", "))
	end.note = strings.TrimPrefix(end.note+"; ", "; ") + fmt.Sprintf("%d of the old mode's chains or tables left", len(left))
	return end, nil
}

// leftOf names what the kernel still holds of the column's mode: the
// nftables mode's tables, or the iptables mode's chains in the backend's
// IPv4 nat table (all but the canaries, which neither proxy removes). At
// the end of a switch the table is small.
func (b *bench) leftOf(column string) ([]string, error) {
	var left []string
	if columnMode(column) == modeNFTables {
		out, err := b.cluster.Node.Exec("nft", "list", "tables")
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasSuffix(line, " kube-proxy") {
				left = append(left, line)
			}
		}
		return left, nil
	}
	chains, err := b.cluster.Node.NATChains(framework.IPTablesBackend(column))
	if err != nil {
		return nil, err
	}
	for chain := range chains {
		if strings.HasPrefix(chain, "KUBE-") && !strings.HasSuffix(chain, "-CANARY") {
			left = append(left, chain)
		}
	}
	return left, nil
}
