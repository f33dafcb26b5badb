// Package config loads, defaults, validates and writes kube-proxy's
// configuration file, the published KubeProxyConfiguration type of
// kubeproxy.config.k8s.io/v1alpha1, so that an operator's existing file
// works unchanged.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Config is kube-proxy's configuration, in the form of its file.
type Config = kpconfig.KubeProxyConfiguration

const (
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"

	ModeIPTables = kpconfig.ProxyMode("iptables")
	ModeIPVS     = kpconfig.ProxyMode("ipvs")
	ModeNFTables = kpconfig.ProxyMode("nftables")

	LocalModeClusterCIDR         = kpconfig.LocalMode("ClusterCIDR")
	LocalModeNodeCIDR            = kpconfig.LocalMode("NodeCIDR")
	LocalModeBridgeInterface     = kpconfig.LocalMode("BridgeInterface")
	LocalModeInterfaceNamePrefix = kpconfig.LocalMode("InterfaceNamePrefix")

	// The nodePortAddresses keywords, which may stand beside CIDRs:
	// "primary" is the node's primary IP of each family (none for a family
	// whose node IP is loopback), "localhost" the loopback ranges, "all"
	// every address of both families. ExpandNodePortAddresses turns them
	// into CIDRs.
	NodePortAddressesPrimary   = "primary"
	NodePortAddressesLocalhost = "localhost"
	NodePortAddressesAll       = "all"

	defaultHealthzPort = "10256"
	defaultMetricsPort = "10249"
)

// New returns a configuration with every default applied, as upstream's
// `--write-config-to` prints it when given nothing else.
func New() *Config {
	cfg := &Config{}
	Default(cfg)
	return cfg
}

// Load reads a configuration file (YAML or JSON), strictly: an unknown or
// repeated field, a value of the wrong type, or a wrong apiVersion or kind is
// an error naming the field and the file. The result is defaulted but not
// validated.
func Load(path string) (*Config, error) {
	cfg, _, err := LoadFile(path)
	return cfg, err
}

// LoadFile is Load that also tells whether the file left the mode unset
// (defaulted to iptables), which upstream warns about.
func LoadFile(path string) (cfg *Config, modeDefaulted bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false, fmt.Errorf("reading config file: %w", err)
	}
	cfg, err = decode(data)
	if err != nil {
		return nil, false, fmt.Errorf("config file %s: %w", path, err)
	}
	modeDefaulted = cfg.Mode == ""
	Default(cfg)
	return cfg, modeDefaulted, nil
}

// Decode parses a configuration document strictly and defaults it.
func Decode(data []byte) (*Config, error) {
	cfg, err := decode(data)
	if err != nil {
		return nil, err
	}
	Default(cfg)
	return cfg, nil
}

// decode parses a configuration document strictly, leaving it undefaulted.
func decode(data []byte) (*Config, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("the file is empty")
	}
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML or JSON: %w", err)
	}
	var meta metav1.TypeMeta
	if err := kjson.UnmarshalCaseSensitivePreserveInts(jsonData, &meta); err != nil {
		return nil, fmt.Errorf("not a KubeProxyConfiguration object: %w", err)
	}
	if meta.APIVersion != APIVersion || meta.Kind != Kind {
		return nil, fmt.Errorf("apiVersion %q and kind %q: want apiVersion %q and kind %q", meta.APIVersion, meta.Kind, APIVersion, Kind)
	}
	// Durations are checked first: the decoder's own error for a bad one
	// does not say which field holds it.
	errs := checkDurations(jsonData)
	cfg := &Config{}
	strictErrs, err := kjson.UnmarshalStrict(jsonData, cfg)
	if err != nil && len(errs) == 0 {
		errs = append(errs, typeError(jsonData, err))
	}
	errs = append(errs, strictErrs...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// durationFields are the paths of every duration in the file.
var durationFields = [][]string{
	{"configSyncPeriod"},
	{"iptables", "syncPeriod"}, {"iptables", "minSyncPeriod"},
	{"ipvs", "syncPeriod"}, {"ipvs", "minSyncPeriod"},
	{"ipvs", "tcpTimeout"}, {"ipvs", "tcpFinTimeout"}, {"ipvs", "udpTimeout"},
	{"nftables", "syncPeriod"}, {"nftables", "minSyncPeriod"},
	{"conntrack", "tcpEstablishedTimeout"}, {"conntrack", "tcpCloseWaitTimeout"},
	{"conntrack", "udpTimeout"}, {"conntrack", "udpStreamTimeout"},
	{"logging", "flushFrequency"},
}

// checkDurations names each duration field whose text does not parse.
func checkDurations(jsonData []byte) []error {
	var doc map[string]any
	if json.Unmarshal(jsonData, &doc) != nil {
		return nil // the struct decoder reports what is wrong
	}
	var errs []error
	for _, path := range durationFields {
		var value any = doc
		for _, key := range path {
			m, _ := value.(map[string]any)
			value = m[key]
		}
		text, ok := value.(string)
		if !ok {
			continue
		}
		if _, err := time.ParseDuration(text); err != nil {
			errs = append(errs, fmt.Errorf("%s: invalid duration %q (use a number and a unit, e.g. 30s, 5m, 1h)", strings.Join(path, "."), text))
		}
	}
	return errs
}

// Default fills every unset field with upstream's default. Only the active
// mode keeps sync periods and masqueradeAll, because upstream holds one
// mode-independent value for each and writes it back under the active mode.
func Default(cfg *Config) {
	cfg.APIVersion, cfg.Kind = APIVersion, Kind
	if cfg.BindAddress == "" {
		cfg.BindAddress = "0.0.0.0"
	}
	healthzHost, metricsHost := "0.0.0.0", "127.0.0.1"
	if ip := parseIP(cfg.BindAddress); ip.IsValid() && !ip.Is4() {
		healthzHost, metricsHost = "::", "::1"
	}
	cfg.HealthzBindAddress = withDefaultPort(cfg.HealthzBindAddress, healthzHost, defaultHealthzPort)
	cfg.MetricsBindAddress = withDefaultPort(cfg.MetricsBindAddress, metricsHost, defaultMetricsPort)
	if cfg.OOMScoreAdj == nil {
		cfg.OOMScoreAdj = ptr.To[int32](-999)
	}
	if cfg.IPTables.MasqueradeBit == nil {
		cfg.IPTables.MasqueradeBit = ptr.To[int32](14)
	}
	if cfg.NFTables.MasqueradeBit == nil {
		cfg.NFTables.MasqueradeBit = ptr.To[int32](14)
	}
	if cfg.IPTables.LocalhostNodePorts == nil {
		cfg.IPTables.LocalhostNodePorts = ptr.To(true)
	}
	defaultDuration(&cfg.IPTables.SyncPeriod, 30*time.Second)
	defaultDuration(&cfg.IPTables.MinSyncPeriod, time.Second)
	defaultDuration(&cfg.IPVS.SyncPeriod, 30*time.Second)
	defaultDuration(&cfg.NFTables.SyncPeriod, 30*time.Second)
	defaultDuration(&cfg.NFTables.MinSyncPeriod, time.Second)
	defaultDuration(&cfg.ConfigSyncPeriod, 15*time.Minute)
	if cfg.Conntrack.MaxPerCore == nil {
		cfg.Conntrack.MaxPerCore = ptr.To[int32](32 * 1024)
	}
	if cfg.Conntrack.Min == nil {
		cfg.Conntrack.Min = ptr.To[int32](128 * 1024)
	}
	if cfg.Conntrack.TCPEstablishedTimeout == nil {
		cfg.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if cfg.Conntrack.TCPCloseWaitTimeout == nil {
		cfg.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	if cfg.ClientConnection.ContentType == "" {
		cfg.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if cfg.ClientConnection.QPS == 0 {
		cfg.ClientConnection.QPS = 5
	}
	if cfg.ClientConnection.Burst == 0 {
		cfg.ClientConnection.Burst = 10
	}
	logsapi.SetRecommendedLoggingConfiguration(&cfg.Logging)
	if cfg.Mode == "" {
		cfg.Mode = ModeIPTables
	}
	if cfg.DetectLocalMode == "" {
		cfg.DetectLocalMode = LocalModeClusterCIDR
	}
	if cfg.Mode == ModeNFTables && len(cfg.NodePortAddresses) == 0 {
		cfg.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	keepOnlyActiveMode(cfg)
}

// keepOnlyActiveMode clears the sync periods and masqueradeAll of the modes
// not in use, so the written file says exactly what is in force.
func keepOnlyActiveMode(cfg *Config) {
	syncPeriod, minSyncPeriod := SyncPeriods(cfg)
	masqueradeAll := MasqueradeAll(cfg)
	cfg.IPTables.SyncPeriod, cfg.IPTables.MinSyncPeriod, cfg.IPTables.MasqueradeAll = metav1.Duration{}, metav1.Duration{}, false
	cfg.IPVS.SyncPeriod, cfg.IPVS.MinSyncPeriod = metav1.Duration{}, metav1.Duration{}
	cfg.NFTables.SyncPeriod, cfg.NFTables.MinSyncPeriod, cfg.NFTables.MasqueradeAll = metav1.Duration{}, metav1.Duration{}, false
	sync, minSync := metav1.Duration{Duration: syncPeriod}, metav1.Duration{Duration: minSyncPeriod}
	switch cfg.Mode {
	case ModeIPVS:
		cfg.IPVS.SyncPeriod, cfg.IPVS.MinSyncPeriod = sync, minSync
		cfg.IPTables.MasqueradeAll = masqueradeAll
	case ModeNFTables:
		cfg.NFTables.SyncPeriod, cfg.NFTables.MinSyncPeriod = sync, minSync
		cfg.NFTables.MasqueradeAll = masqueradeAll
	default:
		cfg.IPTables.SyncPeriod, cfg.IPTables.MinSyncPeriod = sync, minSync
		cfg.IPTables.MasqueradeAll = masqueradeAll
	}
}

// SyncPeriods returns the periodic and minimum sync periods of the active mode.
func SyncPeriods(cfg *Config) (syncPeriod, minSyncPeriod time.Duration) {
	switch cfg.Mode {
	case ModeIPVS:
		return cfg.IPVS.SyncPeriod.Duration, cfg.IPVS.MinSyncPeriod.Duration
	case ModeNFTables:
		return cfg.NFTables.SyncPeriod.Duration, cfg.NFTables.MinSyncPeriod.Duration
	default:
		return cfg.IPTables.SyncPeriod.Duration, cfg.IPTables.MinSyncPeriod.Duration
	}
}

// MasqueradeAll tells whether all service traffic is masqueraded; the
// nftables mode keeps its own setting, the others share the iptables one.
func MasqueradeAll(cfg *Config) bool {
	if cfg.Mode == ModeNFTables {
		return cfg.NFTables.MasqueradeAll
	}
	return cfg.IPTables.MasqueradeAll
}

// Marshal renders the configuration as YAML, in the same form as upstream's
// `--write-config-to`.
func Marshal(cfg *Config) ([]byte, error) {
	return yaml.Marshal(cfg)
}

// Write writes the configuration to path as YAML.
func Write(cfg *Config, path string) error {
	data, err := Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func defaultDuration(d *metav1.Duration, value time.Duration) {
	if d.Duration == 0 {
		d.Duration = value
	}
}

// withDefaultPort completes a bind address: empty gives host:port, a bare
// IP gets the port appended, anything else is left for validation to judge.
func withDefaultPort(addr, host, port string) string {
	if addr == "" {
		return net.JoinHostPort(host, port)
	}
	if ip := parseIP(addr); ip.IsValid() {
		return net.JoinHostPort(ip.String(), port)
	}
	return addr
}

// parseIP parses an IP address, accepting IPv4 with leading zeros as
// upstream's sloppy parser does; the zero Addr means not an IP.
func parseIP(s string) netip.Addr {
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}
	}
	addr, _ := netip.AddrFromSlice(ip)
	return addr.Unmap()
}

// ExpandNodePortAddresses replaces the nodePortAddresses keywords with the
// CIDRs they stand for on this node, whose primary IPs are nodeIPs (at
// most one per family), keeping CIDRs as they are, in order. An empty
// result restricts nothing: NodePorts answer on every address.
func ExpandNodePortAddresses(setting []string, nodeIPs []netip.Addr) []string {
	var out []string
	for _, entry := range setting {
		switch entry {
		case NodePortAddressesPrimary:
			// A loopback node IP means the node has no address of that
			// family to pin NodePorts to.
			for _, ip := range nodeIPs {
				if ip.IsValid() && !ip.IsLoopback() {
					out = append(out, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()).String())
				}
			}
		case NodePortAddressesLocalhost:
			out = append(out, "127.0.0.0/8", "::1/128")
		case NodePortAddressesAll:
			out = append(out, "0.0.0.0/0", "::/0")
		default:
			out = append(out, entry)
		}
	}
	return out
}
