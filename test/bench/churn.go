// Churn: endpoints changed at a steady rate, each timed until the kernel
// holds its new DNAT destination.

package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// pending is one churn change until its endpoint chain (in mode
// nftables: its destination in the service's chain) is seen.
type pending struct {
	chain   string
	dest    string // mode nftables
	written time.Time
	seen    time.Time
	dropped bool
}

// findChains calls found, as soon as it knows, for each change whose
// chain the node's nat table holds. On nft each chain is listed alone,
// which stays cheap at any table size; on legacy listing even one chain
// copies the whole table, so one iptables-save answers for all of them (a
// time is then late by up to one save, about 0.6 s at 10,000 services, for
// both proxies alike). In mode nftables (nft, not nil) the service's
// chain, whose DNAT map holds the endpoints, is read over netlink
// (framework.NFTablesReader: `nft list chain` reads every set first, 2.7 s
// at 10,000 services).
func (b *bench) findChains(column string, nft *framework.NFTablesReader, todo []*pending, found func(*pending)) {
	if nft != nil {
		for _, p := range todo {
			ok, err := nft.ChainSendsTo(p.chain, p.dest)
			if err != nil {
				b.logf("  churn: reading %s: %v", p.chain, err)
			}
			if ok {
				found(p)
			}
		}
		return
	}
	backend := framework.IPTablesBackend(column)
	if backend == framework.IPTablesLegacy && len(todo) > 0 {
		chains, err := b.cluster.Node.NATChains(backend)
		if err != nil {
			b.logf("  churn: %v", err)
		}
		for _, p := range todo {
			if chains[p.chain] {
				found(p)
			}
		}
		return
	}
	for _, p := range todo {
		if b.cluster.Node.HasNATChain(backend, p.chain) {
			found(p)
		}
	}
}

// churn changes one endpoint of a different service at a steady rate and
// times each change from the API write to the new endpoint's KUBE-SEP
// chain (and so its DNAT rule) appearing in the kernel, in mode nftables
// to its address and port appearing in the service chain's DNAT map. A poller checks
// every change not yet seen (see findChains), then sleeps pollInterval: a
// time is late by up to one round. A change that a later
// change to the same service replaced before it was seen is left out.
// The result is not fatal: changes never seen leave p99 as a lower bound.
func (b *bench) churn(ctx context.Context, column string, r results) error {
	var nft *framework.NFTablesReader
	if column == modeNFTables {
		var err error
		if nft, err = b.cluster.Node.NFTablesReader(); err != nil {
			return err
		}
		defer nft.Close()
	}
	var mu sync.Mutex
	var all []*pending
	lastOf := map[int]*pending{}
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	var polling sync.WaitGroup
	polling.Add(1)
	go func() {
		defer polling.Done()
		for pollCtx.Err() == nil {
			mu.Lock()
			var todo []*pending
			for _, p := range all {
				if p.seen.IsZero() && !p.dropped {
					todo = append(todo, p)
				}
			}
			mu.Unlock()
			b.findChains(column, nft, todo, func(p *pending) {
				at := time.Now()
				mu.Lock()
				p.seen = at
				mu.Unlock()
			})
			_ = sleep(pollCtx, pollInterval)
		}
	}()

	total := int(b.opts.churnFor.Seconds() * float64(b.opts.churnRate))
	start := time.Now()
	for k := range total {
		if err := sleep(ctx, time.Until(start.Add(time.Duration(k)*time.Second/time.Duration(b.opts.churnRate)))); err != nil {
			return err
		}
		i := ((b.runs-1)*total + k) % b.n
		err := b.replaceEndpoint(ctx, i, func(dest string) {
			p := &pending{chain: framework.EndpointChain(framework.DefaultNamespace, serviceName(i), framework.ServicePortName, "tcp", dest),
				written: time.Now()}
			if nft != nil {
				p.chain = framework.NFTablesServiceChain(framework.DefaultNamespace, serviceName(i), framework.ServicePortName, "tcp")
				p.dest = dest
			}
			mu.Lock()
			defer mu.Unlock()
			if prev := lastOf[i]; prev != nil && prev.seen.IsZero() {
				prev.dropped = true
			}
			all, lastOf[i] = append(all, p), p
		})
		if err != nil {
			return err
		}
	}
	b.logf("  churn: %d changes written in %s", total, time.Since(start).Round(time.Millisecond))

	deadline := time.Now().Add(b.opts.cap)
	var latencies []float64
	missing := 0
	for {
		mu.Lock()
		latencies, missing = latencies[:0], 0
		for _, p := range all {
			switch {
			case !p.seen.IsZero():
				latencies = append(latencies, p.seen.Sub(p.written).Seconds())
			case !p.dropped:
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	stopPolling()
	polling.Wait()
	note := ""
	if len(latencies) < total {
		note = fmt.Sprintf("%d of %d seen", len(latencies), total)
	}
	for _, p := range all {
		if p.seen.IsZero() && !p.dropped {
			b.logf("  churn: never seen, for one: chain %s %s", p.chain, p.dest)
			break
		}
	}
	if len(latencies) == 0 {
		r["churnP99"] = cell{value: b.opts.cap.Seconds(), capped: true, note: note}
		b.logf("  churn: no change reached the kernel within %s", b.opts.cap)
		return nil
	}
	r["churnP50"] = cell{value: quantile(latencies, 0.5), note: note}
	r["churnP99"] = cell{value: quantile(latencies, 0.99), capped: missing > 0, note: note}
	b.logf("  churn latency p50 %.3f s, p99 %s s", r["churnP50"].value, r["churnP99"].format(3))
	return nil
}
