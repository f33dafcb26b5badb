package server

import (
	"slices"
	"testing"

	"github.com/rapidproxy/rapidproxy/pkg/config"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// What every start warns of, --init-only's included, as upstream's
// v1.37 does: the mode left to its default in iptables mode, and IPVS.
func TestModeWarningsAsUpstreams(t *testing.T) {
	for _, tc := range []struct {
		mode      kpconfig.ProxyMode
		defaulted bool
		want      []string
	}{
		{config.ModeIPTables, false, nil},
		{config.ModeIPTables, true, []string{modeDefaulted}},
		{config.ModeIPVS, false, []string{ipvsDeprecated}},
		{config.ModeNFTables, false, nil},
	} {
		var got []string
		for _, w := range logModeWarnings(tc.mode, tc.defaulted) {
			got = append(got, w.message)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s (defaulted %v): %q, want %q", tc.mode, tc.defaulted, got, tc.want)
		}
	}
}
