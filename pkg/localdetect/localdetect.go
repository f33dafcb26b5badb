// Package localdetect tells the iptables and nftables rules which traffic
// comes from this cluster's pods, per detectLocalMode: by source CIDR (ClusterCIDR,
// NodeCIDR), by bridge (BridgeInterface) or by interface name prefix
// (InterfaceNamePrefix).
package localdetect

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Detector gives iptables match arguments and nftables match expressions
// for pod-originated traffic. The zero Detector detects nothing: both
// matches are nil (and the nftables ones "").
type Detector struct {
	ifLocal, ifNotLocal       []string
	ifLocalNFT, ifNotLocalNFT string
}

// Implemented tells whether local traffic can be told apart at all.
func (d Detector) Implemented() bool { return d.ifLocal != nil }

// IfLocal matches traffic from local pods.
func (d Detector) IfLocal() []string { return d.ifLocal }

// IfNotLocal matches traffic not from local pods.
func (d Detector) IfNotLocal() []string { return d.ifNotLocal }

// IfLocalNFT matches traffic from local pods in an nftables rule, as
// `nft list` prints it back (interface names quoted).
func (d Detector) IfLocalNFT() string { return d.ifLocalNFT }

// IfNotLocalNFT matches traffic not from local pods in an nftables rule.
func (d Detector) IfNotLocalNFT() string { return d.ifNotLocalNFT }

// Settings are the configuration's detect-local inputs.
type Settings struct {
	Mode string
	// CIDRs are the cluster CIDRs (ClusterCIDR mode) or the node's pod
	// CIDRs (NodeCIDR mode), any family; only the detector's family is used.
	CIDRs               []string
	BridgeInterface     string
	InterfaceNamePrefix string
}

// New returns the detector for one IP family. A CIDR mode without a CIDR of
// the family detects nothing, as upstream (it logs, it does not fail).
func New(s Settings, family v1.IPFamily) (Detector, error) {
	switch s.Mode {
	case "ClusterCIDR", "NodeCIDR":
		for _, c := range s.CIDRs {
			p, err := netip.ParsePrefix(strings.TrimSpace(c))
			if err != nil {
				return Detector{}, fmt.Errorf("detect-local %s: %q is not a CIDR", s.Mode, c)
			}
			if p.Addr().Is4() == (family == v1.IPv4Protocol) {
				cidr := p.Masked().String()
				ip := "ip"
				if family == v1.IPv6Protocol {
					ip = "ip6"
				}
				return Detector{ifLocal: []string{"-s", cidr}, ifNotLocal: []string{"!", "-s", cidr},
					ifLocalNFT: ip + " saddr " + cidr, ifNotLocalNFT: ip + " saddr != " + cidr}, nil
			}
		}
		return Detector{}, nil
	case "BridgeInterface":
		if s.BridgeInterface == "" {
			return Detector{}, fmt.Errorf("detect-local BridgeInterface needs a bridge name")
		}
		name := strconv.Quote(s.BridgeInterface)
		return Detector{ifLocal: []string{"-i", s.BridgeInterface}, ifNotLocal: []string{"!", "-i", s.BridgeInterface},
			ifLocalNFT: "iifname " + name, ifNotLocalNFT: "iifname != " + name}, nil
	case "InterfaceNamePrefix":
		if s.InterfaceNamePrefix == "" {
			return Detector{}, fmt.Errorf("detect-local InterfaceNamePrefix needs a prefix")
		}
		match := s.InterfaceNamePrefix + "+"
		// nft's wildcard is a trailing "*" inside the quoted name.
		wildcard := strconv.Quote(s.InterfaceNamePrefix + "*")
		return Detector{ifLocal: []string{"-i", match}, ifNotLocal: []string{"!", "-i", match},
			ifLocalNFT: "iifname " + wildcard, ifNotLocalNFT: "iifname != " + wildcard}, nil
	case "":
		return Detector{}, nil
	}
	return Detector{}, fmt.Errorf("unknown detect-local mode %q", s.Mode)
}
