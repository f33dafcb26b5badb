package config

import (
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
)

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
