package config

import (
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// The gates whose setting this build acts on.
const (
	// GateKubeProxyIPVS allows the ipvs mode (on by default).
	GateKubeProxyIPVS featuregate.Feature = "KubeProxyIPVS"
	// GateNFTablesNetlink makes the nftables mode talk to the kernel over
	// netlink (on by default); off, every transaction and read goes
	// through the nft program.
	GateNFTablesNetlink featuregate.Feature = "NFTablesNetlink"
	// GateNFTablesLocalhostNodePorts serves TCP NodePorts on loopback in
	// nftables mode through a userspace proxy (pkg/localnodeport) when
	// nodePortAddresses holds loopback, and rejects and counts the rest of
	// the localhost NodePort traffic (alpha, off by default).
	GateNFTablesLocalhostNodePorts featuregate.Feature = "KubeProxyNFTablesLocalhostNodePorts"
)

// Enabled tells whether a gate is on in cfg's featureGates, defaults
// applied; a gate map that does not validate counts as unset.
func Enabled(cfg *Config, name featuregate.Feature) bool {
	gate := NewFeatureGate()
	_ = gate.SetFromMap(cfg.FeatureGates)
	return gate.Enabled(name)
}

// NewFeatureGate returns a feature gate that knows exactly the gates
// upstream kube-proxy v1.37 accepts, so an unknown or locked gate is refused
// as upstream refuses it.
func NewFeatureGate() featuregate.MutableVersionedFeatureGate {
	gate := featuregate.NewFeatureGate()
	// Both only fail on a gate registered twice with different specs, which
	// the generated table and the logging library never do.
	if err := gate.AddVersioned(upstreamFeatureGates); err != nil {
		panic(err)
	}
	if err := logsapi.AddFeatureGates(gate); err != nil {
		panic(err)
	}
	return gate
}
