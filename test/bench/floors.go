// The floors under a single-change sync: what the tools alone take to
// rewrite one service chain, unchanged.

package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// restoreFloor times what the iptables tools alone need to rewrite one
// service chain, unchanged, over the proxy's rules: the floor under any
// single-change sync. Median of 5 runs of iptables-restore --noflush
// (started through ip netns exec, a few ms more than the proxy's own).
func (b *bench) restoreFloor(backend framework.IPTablesBackend, r results) error {
	chain := framework.ServiceChain(framework.DefaultNamespace, serviceName(b.n/2), framework.ServicePortName, "tcp")
	listed, err := b.cluster.Node.Exec("iptables-"+string(backend), "-w", "-t", "nat", "-S", chain)
	if err != nil {
		return fmt.Errorf("listing %s: %w", chain, err)
	}
	input := "*nat\n:" + chain + " - [0:0]\n"
	for _, line := range strings.Split(listed, "\n") {
		if strings.HasPrefix(line, "-A ") {
			input += line + "\n"
		}
	}
	input += "COMMIT\n"
	floor, err := b.medianRun(input, "restoring "+chain+" alone", "iptables-"+string(backend)+"-restore", "-w", "--noflush")
	if err != nil {
		return err
	}
	r["restoreFloor"] = cell{value: floor}
	b.logf("  floor: %s rewritten alone in %.3f s", chain, r["restoreFloor"].value)
	return nil
}

// nftFloor is restoreFloor in mode nftables: the service's chain in table
// ip kube-proxy, flushed and written again as nft lists it, in one
// `nft -f -` (median of 5, through ip netns exec too). Each nft process
// pays for reading the table it writes into, as each of the proxies'
// transactions does.
func (b *bench) nftFloor(r results) error {
	chain := framework.NFTablesServiceChain(framework.DefaultNamespace, serviceName(b.n/2), framework.ServicePortName, "tcp")
	listed, err := b.cluster.Node.Exec("nft", "list", "chain", "ip", "kube-proxy", chain)
	if err != nil {
		return fmt.Errorf("listing %s: %w", chain, err)
	}
	input := "flush chain ip kube-proxy " + chain + "\n" + listed
	floor, err := b.medianRun(input, "rewriting "+chain+" alone", "nft", "-f", "-")
	if err != nil {
		return err
	}
	r["nftFloor"] = cell{value: floor}
	b.logf("  floor: %s rewritten alone in %.3f s", chain, r["nftFloor"].value)
	return nil
}

// medianRun is the median time, in seconds, of 5 runs of the command on
// the node, each fed input; what names the command in an error.
func (b *bench) medianRun(input, what string, command ...string) (float64, error) {
	var times []float64
	for range 5 {
		cmd := b.cluster.Node.Command(command...)
		cmd.Stdin = strings.NewReader(input)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("%s: %w: %s", what, err, out)
		}
		times = append(times, time.Since(start).Seconds())
	}
	return quantile(times, 0.5), nil
}
