package app

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/rapidproxy/rapidproxy/pkg/config"
)

// options are the command line: the flags that fill the configuration when
// no --config is given, and those that steer the run whatever the file says.
type options struct {
	configFile    string
	writeConfigTo string
	cleanup       bool
	initOnly      bool
	master        string
	version       versionFlag

	hostnameOverride string
	// modeDefaulted: neither the file nor --proxy-mode chose the mode.
	modeDefaulted bool

	// cfg starts defaulted; the config-mapped flags write into it.
	cfg *config.Config

	// Flags whose meaning depends on the proxy mode, applied after parsing.
	iptablesSyncPeriod, iptablesMinSyncPeriod time.Duration
	ipvsSyncPeriod, ipvsMinSyncPeriod         time.Duration
	// Deprecated ports; 0 disables the server.
	healthzPort, metricsPort int32
}

func newOptions() *options {
	cfg := config.New()
	syncPeriod, minSyncPeriod := config.SyncPeriods(cfg)
	return &options{
		cfg:                   cfg,
		iptablesSyncPeriod:    syncPeriod,
		iptablesMinSyncPeriod: minSyncPeriod,
		ipvsSyncPeriod:        syncPeriod,
		ipvsMinSyncPeriod:     minSyncPeriod,
		healthzPort:           10256,
		metricsPort:           10249,
	}
}

const ignoredWithConfig = " This parameter is ignored if a config file is specified by --config."

func (o *options) addFlags(fs *pflag.FlagSet) {
	c := o.cfg
	fs.StringVar(&o.configFile, "config", "", "The path to the configuration file.")
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "If set, write the default configuration values to this file and exit.")
	fs.BoolVar(&o.cleanup, "cleanup", false, "If true cleanup iptables and ipvs rules and exit.")
	fs.BoolVar(&o.initOnly, "init-only", false, "If true, perform any initialization steps that must be done with full root privileges, and then exit. After doing this, you can run kube-proxy again with only the CAP_NET_ADMIN capability.")
	fs.Var(&o.version, "version", "--version, --version=raw prints version information and quits; --version=vX.Y.Z... is accepted for compatibility")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig)")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")

	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "A set of key=value pairs that describe feature gates for alpha/experimental features."+ignoredWithConfig)
	fs.StringVar(&c.ClientConnection.Kubeconfig, "kubeconfig", c.ClientConnection.Kubeconfig, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&c.ClientConnection.ContentType, "kube-api-content-type", c.ClientConnection.ContentType, "Content type of requests sent to apiserver.")
	fs.Int32Var(&c.ClientConnection.Burst, "kube-api-burst", c.ClientConnection.Burst, "Burst to use while talking with kubernetes apiserver")
	fs.Float32Var(&c.ClientConnection.QPS, "kube-api-qps", c.ClientConnection.QPS, "QPS to use while talking with kubernetes apiserver")
	fs.Var(&ipValue{&c.BindAddress}, "bind-address", "Overrides kube-proxy's idea of what its node's primary IP is."+ignoredWithConfig)
	fs.Var(&ipPortValue{&c.HealthzBindAddress}, "healthz-bind-address", "The IP address and port for the health check server to serve on, defaulting to \"0.0.0.0:10256\"."+ignoredWithConfig)
	fs.Var(&ipPortValue{&c.MetricsBindAddress}, "metrics-bind-address", "The IP address and port for the metrics server to serve on, defaulting to \"127.0.0.1:10249\". Use 0.0.0.0:10249 (or [::]:10249) to serve on all interfaces."+ignoredWithConfig)
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "If true kube-proxy will treat failure to bind to a port as fatal and exit")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "If true enables profiling via web interface on /debug/pprof handler."+ignoredWithConfig)
	fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", c.ShowHiddenMetricsForVersion, "The previous version for which you want to show hidden metrics, as <major>.<minor>."+ignoredWithConfig)
	fs.Var((*proxyModeValue)(&c.Mode), "proxy-mode", "Which proxy mode to use: 'iptables' (the default), 'nftables' or 'ipvs' (deprecated upstream)."+ignoredWithConfig)
	fs.Int32Var(c.IPTables.MasqueradeBit, "iptables-masquerade-bit", *c.IPTables.MasqueradeBit, "The bit of the fwmark space to mark packets requiring SNAT with. Must be within the range [0, 31].")
	fs.BoolVar(&c.IPTables.MasqueradeAll, "masquerade-all", c.IPTables.MasqueradeAll, "SNAT all traffic sent via Service cluster IPs.")
	fs.BoolVar(c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *c.IPTables.LocalhostNodePorts, "If false, NodePort services are not reachable via localhost (iptables mode and IPv4 only).")
	fs.DurationVar(&o.iptablesSyncPeriod, "iptables-sync-period", o.iptablesSyncPeriod, "How often rules are fully re-synchronized (e.g. '5s', '1m', '2h22m'). Must be greater than 0.")
	fs.DurationVar(&o.iptablesMinSyncPeriod, "iptables-min-sync-period", o.iptablesMinSyncPeriod, "The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). 0 means every change is synced at once.")
	fs.DurationVar(&o.ipvsSyncPeriod, "ipvs-sync-period", o.ipvsSyncPeriod, "How often IPVS rules are fully re-synchronized (e.g. '5s', '1m', '2h22m'). Must be greater than 0.")
	fs.DurationVar(&o.ipvsMinSyncPeriod, "ipvs-min-sync-period", o.ipvsMinSyncPeriod, "The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). 0 means every change is synced at once.")
	fs.StringVar(&c.IPVS.Scheduler, "ipvs-scheduler", c.IPVS.Scheduler, "The ipvs scheduler type when proxy mode is ipvs")
	fs.StringSliceVar(&c.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", c.IPVS.ExcludeCIDRs, "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.")
	fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", c.IPVS.StrictARP, "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2")
	fs.DurationVar(&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", 0, "The timeout for idle IPVS TCP connections, 0 to leave as-is.")
	fs.DurationVar(&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", 0, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is.")
	fs.DurationVar(&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", 0, "The timeout for IPVS UDP packets, 0 to leave as-is.")
	fs.Var((*localModeValue)(&c.DetectLocalMode), "detect-local-mode", "Mode to use to detect local traffic."+ignoredWithConfig)
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", "", "A bridge interface name. With --detect-local-mode=BridgeInterface, traffic from this bridge is local.")
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", "", "An interface name prefix. With --detect-local-mode=InterfaceNamePrefix, traffic from interfaces with this prefix is local.")
	fs.StringVar(&c.ClusterCIDR, "cluster-cidr", "", "The CIDR range of the pods in the cluster (a comma-separated dual-stack pair for dual-stack clusters)."+ignoredWithConfig)
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", nil, "CIDR ranges and/or keywords naming the node IPs that accept NodePort connections: 'primary' (the Node's primary IPv4 and/or IPv6 address), 'localhost' (127.0.0.0/8 and ::1/128) and 'all' (0.0.0.0/0 and ::/0), in any combination with CIDRs. NodePorts on loopback are served only in iptables mode (IPv4, see --iptables-localhost-nodeports), and, TCP only, in nftables mode with the KubeProxyNFTablesLocalhostNodePorts feature gate on and loopback explicitly in the list (e.g. 'localhost'). Unset: 'all' in iptables and ipvs mode, 'primary' in nftables mode."+ignoredWithConfig)
	fs.Int32Var(c.OOMScoreAdj, "oom-score-adj", *c.OOMScoreAdj, "The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]."+ignoredWithConfig)
	fs.Int32Var(c.Conntrack.MaxPerCore, "conntrack-max-per-core", *c.Conntrack.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(c.Conntrack.Min, "conntrack-min", *c.Conntrack.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.")
	fs.DurationVar(&c.Conntrack.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", c.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout for established TCP connections (0 to leave as-is)")
	fs.DurationVar(&c.Conntrack.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", c.Conntrack.TCPCloseWaitTimeout.Duration, "NAT timeout for TCP connections in the CLOSE_WAIT state")
	fs.BoolVar(&c.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1")
	fs.DurationVar(&c.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", 0, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", 0, "Idle timeout for ASSURED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.ConfigSyncPeriod.Duration, "config-sync-period", c.ConfigSyncPeriod.Duration, "How often configuration from the apiserver is refreshed. Must be greater than 0.")

	fs.Int32Var(&o.healthzPort, "healthz-port", o.healthzPort, "The port to bind the health check server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "use --healthz-bind-address instead.")
	fs.Int32Var(&o.metricsPort, "metrics-port", o.metricsPort, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("metrics-port", "use --metrics-bind-address instead.")

	logsapi.AddFlags(&c.Logging, fs)
}

// applyModeFlags resolves the flags whose target depends on the proxy mode,
// as upstream does when no config file is given.
func (o *options) applyModeFlags(fs *pflag.FlagSet) {
	c := o.cfg
	sync, minSync := &c.IPTables.SyncPeriod, &c.IPTables.MinSyncPeriod
	switch c.Mode {
	case config.ModeIPVS:
		sync, minSync = &c.IPVS.SyncPeriod, &c.IPVS.MinSyncPeriod
	case config.ModeNFTables:
		sync, minSync = &c.NFTables.SyncPeriod, &c.NFTables.MinSyncPeriod
		c.NFTables.MasqueradeAll = c.IPTables.MasqueradeAll
	}
	// Defaulting cleared the periods of modes not in use: start from the
	// values in force, then let the mode's own flags override them.
	sync.Duration, minSync.Duration = o.iptablesSyncPeriod, o.iptablesMinSyncPeriod
	if c.Mode == config.ModeIPVS {
		sync.Duration, minSync.Duration = o.ipvsSyncPeriod, o.ipvsMinSyncPeriod
	}
	if fs.Changed("healthz-port") && !fs.Changed("healthz-bind-address") {
		c.HealthzBindAddress = withPort(c.HealthzBindAddress, o.healthzPort)
	}
	if fs.Changed("metrics-port") && !fs.Changed("metrics-bind-address") {
		c.MetricsBindAddress = withPort(c.MetricsBindAddress, o.metricsPort)
	}
}

// withPort replaces the port of a host:port address; port 0 disables the server.
func withPort(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// copyChangedLoggingFlags applies the logging flags given on the command
// line over the file's logging settings: upstream lets them win.
func copyChangedLoggingFlags(from *pflag.FlagSet, to *config.Config) error {
	target := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	logsapi.AddFlags(&to.Logging, target)
	var firstErr error
	target.VisitAll(func(f *pflag.Flag) {
		given := from.Lookup(f.Name)
		if firstErr != nil || given == nil || !given.Changed {
			return
		}
		if f.Name == "vmodule" {
			to.Logging.VModule = nil
		}
		if err := f.Value.Set(given.Value.String()); err != nil {
			firstErr = fmt.Errorf("--%s: %w", f.Name, err)
		}
	})
	return firstErr
}

// ipValue is a flag holding one IP address ("ip" in --help, as upstream).
type ipValue struct{ target *string }

func (v *ipValue) String() string { return ptr.Deref(v.target, "") }
func (v *ipValue) Type() string   { return "ip" }
func (v *ipValue) Set(s string) error {
	if _, err := netip.ParseAddr(s); err != nil {
		return fmt.Errorf("%q is not a valid IP address", s)
	}
	*v.target = s
	return nil
}

// ipPortValue is a flag holding an IP or IP:port ("ipport" in --help).
type ipPortValue struct{ target *string }

func (v *ipPortValue) String() string { return ptr.Deref(v.target, "") }
func (v *ipPortValue) Type() string   { return "ipport" }
func (v *ipPortValue) Set(s string) error {
	if _, err := netip.ParseAddr(s); err == nil {
		*v.target = s
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not IP or IP:port", s)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q is not a valid IP address", host)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%q is not a valid port", port)
	}
	*v.target = s
	return nil
}

type proxyModeValue kpconfig.ProxyMode

func (v *proxyModeValue) String() string     { return string(*v) }
func (v *proxyModeValue) Type() string       { return "ProxyMode" }
func (v *proxyModeValue) Set(s string) error { *v = proxyModeValue(s); return nil }

type localModeValue kpconfig.LocalMode

func (v *localModeValue) String() string     { return string(*v) }
func (v *localModeValue) Type() string       { return "LocalMode" }
func (v *localModeValue) Set(s string) error { *v = localModeValue(s); return nil }
