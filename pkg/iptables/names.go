// Package iptables is the iptables mode: it decides which rules the node
// needs (a pure function of the desired service state, in rules.go), works
// out the smallest change from what the kernel holds (plan.go), and drives
// the sync (proxier.go).
package iptables

import (
	"crypto/sha256"
	"encoding/base32"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Chain is an iptables chain name.
type Chain string

// Table is an iptables table.
type Table string

const (
	TableFilter Table = "filter"
	TableNAT    Table = "nat"
	TableMangle Table = "mangle"
)

// kubeTables are the tables kube-proxy writes to, in the order it writes and
// reads them.
var kubeTables = []Table{TableMangle, TableFilter, TableNAT}

// Chains shared by all services, named as upstream so that a node can move
// between upstream kube-proxy and this project in either direction.
const (
	chainServices         Chain = "KUBE-SERVICES"
	chainExternalServices Chain = "KUBE-EXTERNAL-SERVICES"
	chainNodePorts        Chain = "KUBE-NODEPORTS"
	chainPostrouting      Chain = "KUBE-POSTROUTING"
	chainMarkMasq         Chain = "KUBE-MARK-MASQ"
	chainForward          Chain = "KUBE-FORWARD"
	chainProxyFirewall    Chain = "KUBE-PROXY-FIREWALL"
	chainCanary           Chain = "KUBE-PROXY-CANARY"
	chainLocalnetGuard    Chain = "KUBE-FIREWALL"
)

// Prefixes of the per-service chains.
const (
	prefixClusterPolicy = "KUBE-SVC-"
	prefixLocalPolicy   = "KUBE-SVL-"
	prefixExternal      = "KUBE-EXT-"
	prefixFirewall      = "KUBE-FW-"
	prefixEndpoint      = "KUBE-SEP-"
)

// IsServiceChain tells whether a chain is one of the per-service chains
// this mode (or upstream) creates, which may be deleted when unused.
func IsServiceChain(c Chain) bool { return isServiceChainName(c) }

func isServiceChainName[T Chain | []byte](c T) bool {
	for _, p := range []string{prefixClusterPolicy, prefixLocalPolicy, prefixExternal, prefixFirewall, prefixEndpoint} {
		if len(c) >= len(p) && string(c[:len(p)]) == p {
			return true
		}
	}
	return false
}

// hash16 is the first 16 characters of base32(sha256(s)), upstream's chain suffix.
func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// serviceChains are the names of one service port's chains.
type serviceChains struct {
	cluster, local, external, firewall Chain
	// key is "ns/name:port" + lowercase protocol, the hash input.
	key string
}

func chainsFor(name state.ServicePortName) serviceChains {
	key := name.String() + protocolOf(name.Protocol)
	h := hash16(key)
	return serviceChains{
		cluster:  Chain(prefixClusterPolicy + h),
		local:    Chain(prefixLocalPolicy + h),
		external: Chain(prefixExternal + h),
		firewall: Chain(prefixFirewall + h),
		key:      key,
	}
}

// endpointChain is the KUBE-SEP chain of one endpoint of a service port.
func (c serviceChains) endpointChain(ep *state.Endpoint) Chain {
	return Chain(prefixEndpoint + hash16(c.key+ep.String()))
}
