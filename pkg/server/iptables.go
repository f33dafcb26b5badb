// The iptables mode's construction, next to the other modes'.

package server

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/sysctl"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/pkg/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

func newIPTablesMode(cfg *kpconfig.KubeProxyConfiguration, f familySetup) (proxy.Mode, error) {
	// Before the first sync: the rules that count packets in nfacct
	// objects cannot be written until the objects exist.
	nfacctErr := iptables.EnsureNFAcctObjects()
	if nfacctErr != nil {
		klog.InfoS("nfacct is not usable here: the rules count no packets, and the nfacct metrics are not served", "ipFamily", f.family, "err", nfacctErr)
	} else {
		metrics.ServeNFAcctCounters()
	}
	params := iptables.Params{
		IPv6:               f.family == v1.IPv6Protocol,
		MasqueradeBit:      int(*cfg.IPTables.MasqueradeBit),
		MasqueradeAll:      config.MasqueradeAll(cfg),
		LocalhostNodePorts: f.family == v1.IPv4Protocol && localhostNodePorts(cfg),
		LocalDetector:      f.detector,
		NodeIP:             f.nodeIP,
		NodePortAddresses:  f.nodePortAddrs,
		TCPBeLiberal:       cfg.Conntrack.TCPBeLiberal,
		NFAcct:             nfacctErr == nil,
	}
	if params.LocalhostNodePorts && f.family == v1.IPv4Protocol {
		if err := (routeLocalnet{}).enable(); err != nil {
			klog.ErrorS(err, "Could not enable route_localnet; NodePorts on localhost will not work")
		}
	}
	return iptables.New(iptables.Config{
		Family: f.family, Kernel: f.iptables, Params: params, SyncPeriod: f.syncPeriod,
		ChainRefsPerRestore: chainRefsPerRestore(f.iptables.Backend()),
		EnsureNFAcct:        iptables.EnsureNFAcctObjects,
	}), nil
}

// localhostNodePorts is whether IPv4 NodePorts answer on 127.0.0.0/8,
// decided as upstream does: iptables.localhostNodePorts is set, and
// nodePortAddresses has no IPv4 CIDR (all addresses) or one that holds a
// loopback address (keywords already expanded to CIDRs).
func localhostNodePorts(cfg *kpconfig.KubeProxyConfiguration) bool {
	if !*cfg.IPTables.LocalhostNodePorts {
		return false
	}
	anyIPv4 := false
	for _, c := range cfg.NodePortAddresses {
		p, err := netip.ParsePrefix(c)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		anyIPv4 = true
		if p.Addr().IsLoopback() || p.Contains(netip.AddrFrom4([4]byte{127})) {
			return true
		}
	}
	return !anyIPv4
}

// chainRefsPerRestore is how a full sync splits its work for the backend.
func chainRefsPerRestore(b iptableskernel.Backend) int {
	if b == iptableskernel.NFT {
		return iptables.ChainRefsPerRestoreNFT
	}
	return 0
}

// routeLocalnet lets IPv4 NodePorts answer on 127.0.0.1; the KUBE-FIREWALL
// guard keeps others from using that to reach local services.
type routeLocalnet struct{}

func (routeLocalnet) enable() error {
	const name = "net/ipv4/conf/all/route_localnet"
	s := sysctl.Proc{}
	if v, err := s.Get(name); err == nil && v == 1 {
		return nil
	}
	return s.Set(name, 1)
}
