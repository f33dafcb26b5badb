// Package nftables is the nftables mode: upstream kube-proxy's tables,
// chains, sets and maps, written as the difference from what the kernel
// holds. plan.go decides the objects (a pure function of the state),
// syncer.go writes them.
package nftables

import (
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

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
	// LocalhostNodePorts is what becomes of NodePort traffic to the
	// loopback address (gate KubeProxyNFTablesLocalhostNodePorts).
	LocalhostNodePorts LocalhostNodePorts
}

// LocalhostNodePorts is how the nftables mode treats NodePort traffic to
// 127.0.0.0/8 or ::1, which it cannot DNAT.
type LocalhostNodePorts int

const (
	// LocalhostNodePortsOff, the gate off: no rule of ours sees it; no
	// program listens there, so it is refused by the kernel.
	LocalhostNodePortsOff LocalhostNodePorts = iota
	// LocalhostNodePortsReject, the gate on without loopback in
	// nodePortAddresses: rejected, and counted, for every protocol.
	LocalhostNodePortsReject
	// LocalhostNodePortsProxy, the gate on with loopback explicitly in
	// nodePortAddresses: TCP served by a userspace proxy
	// (pkg/localnodeport), UDP and SCTP rejected and counted.
	LocalhostNodePortsProxy
)

// rejectsLocalhost tells whether NodePort traffic of the protocol to the
// loopback address is rejected, as upstream's rejectsLocalhostNodePort.
func (p *Params) rejectsLocalhost(protocol v1.Protocol) bool {
	switch p.LocalhostNodePorts {
	case LocalhostNodePortsReject:
		return true
	case LocalhostNodePortsProxy:
		return protocol != v1.ProtocolTCP
	}
	return false
}

// rejectedLocalhostProtocols are the protocols rejectsLocalhost rejects,
// in upstream's order.
func (p *Params) rejectedLocalhostProtocols() []v1.Protocol {
	var out []v1.Protocol
	for _, proto := range LocalhostNodePortProtocols {
		if p.rejectsLocalhost(proto) {
			out = append(out, proto)
		}
	}
	return out
}

// LocalhostNodePortProtocols are the NodePort protocols whose localhost
// traffic may be rejected and counted.
var LocalhostNodePortProtocols = []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}

// LocalhostRejectedCounter is the named counter of the localhost NodePort
// packets of a protocol rejected, as upstream names it.
func LocalhostRejectedCounter(protocol v1.Protocol) string {
	return prefixLocalhostRejectedCounter + strings.ToLower(string(protocol))
}

// localhostRejectChain is the chain that counts and rejects them.
func localhostRejectChain(protocol v1.Protocol) string {
	return prefixLocalhostRejectChain + strings.ToLower(string(protocol))
}

const (
	prefixLocalhostRejectedCounter = "localhost-nodeport-rejected-"
	prefixLocalhostRejectChain     = "localhost-nodeport-reject-"
)
