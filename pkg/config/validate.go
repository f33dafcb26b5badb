package config

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/component-base/metrics"
	netutils "k8s.io/utils/net"
)

// Validate checks a defaulted configuration with upstream's rules and
// returns every problem at once. Paths are the field names of the file
// (e.g. iptables.masqueradeBit), so an operator can find them.
func Validate(cfg *Config) field.ErrorList {
	var errs field.ErrorList
	gate := NewFeatureGate()
	if err := gate.SetFromMap(cfg.FeatureGates); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("featureGates"), cfg.FeatureGates, err.Error()))
	}
	errs = append(errs, validateMode(cfg, gate)...)
	errs = append(errs, validateMasqueradeBit(cfg.IPTables.MasqueradeBit, field.NewPath("iptables", "masqueradeBit"))...)
	if cfg.Mode == ModeNFTables {
		errs = append(errs, validateMasqueradeBit(cfg.NFTables.MasqueradeBit, field.NewPath("nftables", "masqueradeBit"))...)
	}
	if cfg.Mode == ModeIPVS {
		errs = append(errs, validateIPVS(cfg)...)
	}
	errs = append(errs, validateSyncPeriods(cfg)...)
	errs = append(errs, validateConntrack(cfg)...)
	if cfg.OOMScoreAdj != nil && (*cfg.OOMScoreAdj < -1000 || *cfg.OOMScoreAdj > 1000) {
		errs = append(errs, field.Invalid(field.NewPath("oomScoreAdj"), *cfg.OOMScoreAdj, "must be within the range [-1000, 1000]"))
	}
	if cfg.ClientConnection.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("clientConnection", "burst"), cfg.ClientConnection.Burst, "must be greater than or equal to 0"))
	}
	errs = append(errs, nonNegative(cfg.ConfigSyncPeriod, field.NewPath("configSyncPeriod"), true)...)
	if !parseIP(cfg.BindAddress).IsValid() {
		errs = append(errs, field.Invalid(field.NewPath("bindAddress"), cfg.BindAddress, "must be a valid IP address"))
	}
	if cfg.HealthzBindAddress != "" {
		errs = append(errs, validateHostPort(cfg.HealthzBindAddress, field.NewPath("healthzBindAddress"))...)
	}
	errs = append(errs, validateHostPort(cfg.MetricsBindAddress, field.NewPath("metricsBindAddress"))...)
	errs = append(errs, validateNodePortAddresses(cfg.NodePortAddresses, field.NewPath("nodePortAddresses"))...)
	for _, err := range metrics.ValidateShowHiddenMetricsVersion(cfg.ShowHiddenMetricsForVersion) {
		errs = append(errs, field.Invalid(field.NewPath("showHiddenMetricsForVersion"), cfg.ShowHiddenMetricsForVersion, err.Error()))
	}
	errs = append(errs, validateDetectLocal(cfg)...)
	errs = append(errs, logsapi.Validate(&cfg.Logging, gate, field.NewPath("logging"))...)
	return errs
}

// validateMode accepts the modes this build runs; IPVS only while the
// KubeProxyIPVS gate is on, as upstream (which turns it off by default in
// a later release).
func validateMode(cfg *Config, gate featuregate.FeatureGate) field.ErrorList {
	valid := []string{string(ModeIPTables), string(ModeNFTables)}
	if gate.Enabled(GateKubeProxyIPVS) {
		valid = append(valid, string(ModeIPVS))
	}
	if slices.Contains(valid, string(cfg.Mode)) {
		return nil
	}
	if cfg.Mode == ModeIPVS {
		return field.ErrorList{field.Invalid(field.NewPath("mode"), string(cfg.Mode), "the ipvs mode needs the KubeProxyIPVS feature gate, which featureGates turns off; remove that setting or choose iptables or nftables")}
	}
	return field.ErrorList{field.NotSupported(field.NewPath("mode"), string(cfg.Mode), valid)}
}

func validateMasqueradeBit(bit *int32, path *field.Path) field.ErrorList {
	if bit != nil && (*bit < 0 || *bit > 31) {
		return field.ErrorList{field.Invalid(path, *bit, "must be within the range [0, 31]")}
	}
	return nil
}

// validateSyncPeriods checks the periods of the active mode, the only ones in force.
func validateSyncPeriods(cfg *Config) field.ErrorList {
	section := map[string]string{string(ModeIPVS): "ipvs", string(ModeNFTables): "nftables"}[string(cfg.Mode)]
	if section == "" {
		section = "iptables"
	}
	syncPath, minPath := field.NewPath(section, "syncPeriod"), field.NewPath(section, "minSyncPeriod")
	syncPeriod, minSyncPeriod := SyncPeriods(cfg)
	errs := nonNegative(metav1.Duration{Duration: syncPeriod}, syncPath, true)
	errs = append(errs, nonNegative(metav1.Duration{Duration: minSyncPeriod}, minPath, false)...)
	// Against a period that is itself invalid the comparison says nothing new.
	if syncPeriod > 0 && minSyncPeriod > syncPeriod {
		errs = append(errs, field.Invalid(minPath, minSyncPeriod.String(), fmt.Sprintf("must be less than or equal to %s (%s)", syncPath, syncPeriod)))
	}
	return errs
}

func validateIPVS(cfg *Config) field.ErrorList {
	path := field.NewPath("ipvs")
	errs := nonNegative(cfg.IPVS.TCPTimeout, path.Child("tcpTimeout"), false)
	errs = append(errs, nonNegative(cfg.IPVS.TCPFinTimeout, path.Child("tcpFinTimeout"), false)...)
	errs = append(errs, nonNegative(cfg.IPVS.UDPTimeout, path.Child("udpTimeout"), false)...)
	for i, cidr := range cfg.IPVS.ExcludeCIDRs {
		if _, _, err := netutils.ParseCIDRSloppy(cidr); err != nil {
			errs = append(errs, field.Invalid(path.Child("excludeCIDRs").Index(i), cidr, "must be a valid CIDR"))
		}
	}
	return errs
}

func validateConntrack(cfg *Config) field.ErrorList {
	path := field.NewPath("conntrack")
	var errs field.ErrorList
	if c := cfg.Conntrack.MaxPerCore; c != nil && *c < 0 {
		errs = append(errs, field.Invalid(path.Child("maxPerCore"), *c, "must be greater than or equal to 0"))
	}
	if c := cfg.Conntrack.Min; c != nil && *c < 0 {
		errs = append(errs, field.Invalid(path.Child("min"), *c, "must be greater than or equal to 0"))
	}
	if d := cfg.Conntrack.TCPEstablishedTimeout; d != nil {
		errs = append(errs, nonNegative(*d, path.Child("tcpEstablishedTimeout"), false)...)
	}
	if d := cfg.Conntrack.TCPCloseWaitTimeout; d != nil {
		errs = append(errs, nonNegative(*d, path.Child("tcpCloseWaitTimeout"), false)...)
	}
	errs = append(errs, nonNegative(cfg.Conntrack.UDPTimeout, path.Child("udpTimeout"), false)...)
	errs = append(errs, nonNegative(cfg.Conntrack.UDPStreamTimeout, path.Child("udpStreamTimeout"), false)...)
	return errs
}

// nonNegative checks d >= 0, or d > 0 when strict.
func nonNegative(d metav1.Duration, path *field.Path, strict bool) field.ErrorList {
	switch {
	case strict && d.Duration <= 0:
		return field.ErrorList{field.Invalid(path, d.Duration.String(), "must be greater than 0")}
	case d.Duration < 0:
		return field.ErrorList{field.Invalid(path, d.Duration.String(), "must be greater than or equal to 0")}
	}
	return nil
}

func validateHostPort(addr string, path *field.Path) field.ErrorList {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return field.ErrorList{field.Invalid(path, addr, "must be IP:port")}
	}
	var errs field.ErrorList
	if !parseIP(host).IsValid() {
		errs = append(errs, field.Invalid(path, addr, fmt.Sprintf("%q must be a valid IP", host)))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		errs = append(errs, field.Invalid(path, addr, fmt.Sprintf("%q must be a valid port (1-65535)", port)))
	}
	return errs
}

func validateNodePortAddresses(addrs []string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, a := range addrs {
		switch a {
		case NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll:
			if seen[a] {
				errs = append(errs, field.Duplicate(path.Index(i), a))
			}
			seen[a] = true
			continue
		}
		if _, _, err := netutils.ParseCIDRSloppy(a); err != nil {
			errs = append(errs, field.Invalid(path.Index(i), a, "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'"))
		}
	}
	return errs
}

var validLocalModes = []string{string(LocalModeClusterCIDR), string(LocalModeNodeCIDR), string(LocalModeBridgeInterface), string(LocalModeInterfaceNamePrefix)}

func validateDetectLocal(cfg *Config) field.ErrorList {
	path := field.NewPath("detectLocal")
	switch cfg.DetectLocalMode {
	case LocalModeClusterCIDR:
		if cfg.ClusterCIDR != "" {
			return validateClusterCIDRs(cfg.ClusterCIDR, field.NewPath("clusterCIDR"))
		}
	case LocalModeNodeCIDR:
	case LocalModeBridgeInterface:
		if cfg.DetectLocal.BridgeInterface == "" {
			return field.ErrorList{field.Required(path.Child("bridgeInterface"), "detectLocalMode BridgeInterface needs the bridge's name")}
		}
	case LocalModeInterfaceNamePrefix:
		if cfg.DetectLocal.InterfaceNamePrefix == "" {
			return field.ErrorList{field.Required(path.Child("interfaceNamePrefix"), "detectLocalMode InterfaceNamePrefix needs the interface name prefix")}
		}
	default:
		return field.ErrorList{field.NotSupported(field.NewPath("detectLocalMode"), string(cfg.DetectLocalMode), validLocalModes)}
	}
	return nil
}

// validateClusterCIDRs accepts one CIDR or a dual-stack pair, comma separated.
func validateClusterCIDRs(value string, path *field.Path) field.ErrorList {
	cidrs := strings.Split(value, ",")
	if len(cidrs) > 2 {
		return field.ErrorList{field.Invalid(path, value, "must be a single CIDR or a dual-stack pair of CIDRs (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)")}
	}
	var errs field.ErrorList
	for _, c := range cidrs {
		if _, _, err := netutils.ParseCIDRSloppy(c); err != nil {
			errs = append(errs, field.Invalid(path, value, fmt.Sprintf("%q must be a valid CIDR (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)", c)))
		}
	}
	if len(errs) == 0 && len(cidrs) == 2 {
		if dual, _ := netutils.IsDualStackCIDRStrings(cidrs); !dual {
			errs = append(errs, field.Invalid(path, value, "two CIDRs must be one IPv4 and one IPv6"))
		}
	}
	return errs
}
