// Package nftables is the nftables mode: upstream kube-proxy's tables,
// chains, sets and maps, written as the difference from what the kernel
// holds. plan.go decides the objects (a pure function of the state),
// syncer.go writes them.
package nftables

import (
	"net/netip"

	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
)

// Params are the node-wide inputs of the nftables mode for one IP family.
type Params struct {
	// IPv6 is set by New from Config.Family.
	IPv6          bool
	MasqueradeBit int
	MasqueradeAll bool
	LocalDetector localdetect.Detector
	// NodePortAddresses are the addresses NodePorts answer on; nil means
	// every local address (fib daddr type local).
	NodePortAddresses []netip.Addr
	// ServiceCIDRs are the family's service CIDRs: traffic to their
	// unallocated addresses is dropped.
	ServiceCIDRs []netip.Prefix
	// NodeIP is the node's primary IP: load-balancer source ranges that
	// contain it let the node reach the load-balancer IP itself.
	NodeIP netip.Addr
}
