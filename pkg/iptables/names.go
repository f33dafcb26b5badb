// Package iptables is the iptables mode: it decides which rules the node
// needs (a pure function of the desired service state, in rules.go), works
// out the smallest change from what the kernel holds (plan.go; a full
// sync's, fullsync.go), drives the sync (proxier.go) and looks for other
// programs' flushes (flush.go).
package iptables

import (
	"crypto/sha256"
	"encoding/base32"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Chains shared by all services, named as upstream so that a node can move
// between upstream kube-proxy and this project in either direction.
const (
	chainServices         iptableskernel.Chain = "KUBE-SERVICES"
	chainExternalServices iptableskernel.Chain = "KUBE-EXTERNAL-SERVICES"
	chainNodePorts        iptableskernel.Chain = "KUBE-NODEPORTS"
	chainPostrouting      iptableskernel.Chain = "KUBE-POSTROUTING"
	chainMarkMasq         iptableskernel.Chain = "KUBE-MARK-MASQ"
	chainForward          iptableskernel.Chain = "KUBE-FORWARD"
	chainProxyFirewall    iptableskernel.Chain = "KUBE-PROXY-FIREWALL"
	chainCanary           iptableskernel.Chain = "KUBE-PROXY-CANARY"
	chainLocalnetGuard    iptableskernel.Chain = "KUBE-FIREWALL"
)

// hashedChain is prefix and the first 16 characters of base32(sum) (of
// 10 bytes, exactly), where sum is sha256 of the chain's key: upstream's
// per-service chain names, made in one allocation (a full sync names
// every chain of every service port).
func hashedChain(prefix string, sum *[sha256.Size]byte) iptableskernel.Chain {
	var name [32]byte
	n := copy(name[:], prefix)
	base32.StdEncoding.Encode(name[n:n+16], sum[:10])
	return iptableskernel.Chain(name[:n+16])
}

// serviceChains are the names of one service port's chains.
type serviceChains struct {
	cluster, local, external, firewall iptableskernel.Chain
	// key is "ns/name:port" + lowercase protocol, the hash input.
	key string
}

func chainsFor(name state.ServicePortName) serviceChains {
	var buf [128]byte
	key := append(append(append(buf[:0], name.Namespace...), '/'), name.Name...)
	if name.Port != "" {
		key = append(append(key, ':'), name.Port...)
	}
	key = append(key, protocolOf(name.Protocol)...)
	sum := sha256.Sum256(key)
	return serviceChains{
		cluster:  hashedChain(iptableskernel.PrefixClusterPolicy, &sum),
		local:    hashedChain(iptableskernel.PrefixLocalPolicy, &sum),
		external: hashedChain(iptableskernel.PrefixExternal, &sum),
		firewall: hashedChain(iptableskernel.PrefixFirewall, &sum),
		key:      string(key),
	}
}

// endpointChain is the KUBE-SEP chain of one endpoint of a service port:
// the hash of the key and the endpoint's "ip:port".
func (c serviceChains) endpointChain(ep *state.Endpoint) iptableskernel.Chain {
	var buf [192]byte
	sum := sha256.Sum256(ep.AddrPort().AppendTo(append(buf[:0], c.key...)))
	return hashedChain(iptableskernel.PrefixEndpoint, &sum)
}
