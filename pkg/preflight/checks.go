package preflight

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/internal/kernel"
)

const (
	checkNameUnreachable = "kube-proxy"
	checkNameKernel      = "nftables-kernel"
	checkNameNFT         = "nft-tool"
	checkNameLocalhost   = "localhost-nodeports"
	checkNameForeign     = "foreign-references"
	checkNameScheduler   = "ipvs-scheduler"
	checkNameStrictARP   = "ipvs-strict-arp"
	checkNameExclude     = "ipvs-exclude-cidrs"
	checkNameTimeouts    = "ipvs-timeouts"
	checkNameLeftovers   = "ipvs-draining"
	checkNameDeprecated  = "ipvs-deprecated"
	checkNameFirewalld   = "firewalld"
	checkNameLegacy      = "iptables-legacy"
)

// LocalhostNodePortsMetric counts the packets the iptables mode accepted
// to NodePorts on 127.0.0.1 (upstream's name; ours serves it too).
const LocalhostNodePortsMetric = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"

func one(f Finding) []Finding { return []Finding{f} }

// checkKubeProxyReachable: without the running mode, the checks of its
// settings and counters cannot run, so the answer is incomplete.
func checkKubeProxyReachable(m move) []Finding {
	if m.ModeErr == nil && m.ConfigErr != nil {
		return one(Finding{
			Check: checkNameUnreachable, Level: Warning,
			Summary: "could not read the running kube-proxy's configuration",
			Reason: fmt.Sprintf("%v. The checks of its IPVS settings did not run, and localhost NodePorts are taken "+
				"to be on, as by default.", m.ConfigErr),
			Action: "Compare the configuration kube-proxy runs with (its ConfigMap) with the IPVS settings this command checks.",
		})
	}
	if m.ModeErr == nil {
		return nil
	}
	return one(Finding{
		Check: checkNameUnreachable, Level: Blocker,
		Summary: "could not ask the running kube-proxy for its mode",
		Reason: fmt.Sprintf("%v. Without the mode and configuration kube-proxy runs with, the checks of its settings "+
			"and counters (localhost NodePorts, IPVS settings) could not run; the node's checks did.", m.ModeErr),
		Action: "Run this on the node, e.g. by kubectl exec into its kube-proxy pod, with --address set to kube-proxy's " +
			"metricsBindAddress if that is not " + DefaultAddress + ".",
	})
}

// checkNFTablesKernel is upstream's kernel check for the nftables mode.
func checkNFTablesKernel(m move) []Finding {
	if m.to != nftablesMode {
		return nil
	}
	err := kernel.CheckNFTables(m.SkipKernelCheck, func() (string, error) { return m.KernelRelease, m.KernelErr })
	if err == nil {
		return nil
	}
	return one(Finding{
		Check: checkNameKernel, Level: Blocker,
		Summary: "the kernel is too old for the nftables mode",
		Reason:  "kube-proxy would not start: " + err.Error() + ".",
		Action: fmt.Sprintf("Upgrade the node's kernel to %s or later first. %s lets kube-proxy start anyway, on a kernel "+
			"whose nftables features it has not been tested with.", kernel.NFTablesMin, kernel.SkipNFTablesCheckEnv),
	})
}

// checkNFTTool: the nftables mode drives the nft tool, v1.0.1 or later.
func checkNFTTool(m move) []Finding {
	if m.to != nftablesMode || m.NFTErr == nil {
		return nil
	}
	return one(Finding{
		Check: checkNameNFT, Level: Blocker,
		Summary: "the nft tool is missing, too old or not working",
		Reason:  "kube-proxy would not start in the nftables mode: " + m.NFTErr.Error() + ".",
		Action: "Run kube-proxy from an image with nft v1.0.1 or later (this project's image has it) and nf_tables " +
			"in the node's kernel (modprobe nf_tables).",
		Details: nonEmpty(m.NFTVersion),
	})
}

// checkLocalhostNodePorts: only the iptables mode serves NodePorts on
// 127.0.0.1, and it counts the packets it accepts there.
func checkLocalhostNodePorts(m move) []Finding {
	if m.from != iptablesMode || m.to == iptablesMode || !servesLocalhostNodePorts(m.Facts) {
		return nil
	}
	f := Finding{
		Check:   checkNameLocalhost,
		Summary: "NodePorts on 127.0.0.1 stop working",
		Reason: "The iptables mode also serves NodePorts on 127.0.0.1 (iptables.localhostNodePorts, with " +
			"net.ipv4.conf.all.route_localnet=1); the " + m.to + " mode does not, so a client on this node " +
			"connecting to 127.0.0.1:NODEPORT would be refused after the switch.",
	}
	count, known := m.Metrics[LocalhostNodePortsMetric]
	switch {
	case m.MetricsErr != nil || !known:
		why := "kube-proxy does not serve " + LocalhostNodePortsMetric + " (it needs nfacct in the kernel)"
		if m.MetricsErr != nil {
			why = "its metrics could not be read: " + m.MetricsErr.Error()
		}
		f.Level = Warning
		f.Reason += " Whether a client uses them cannot be told: " + why + "."
		f.Action = "Make sure no client on this node connects to 127.0.0.1:NODEPORT (ss -tn dst 127.0.0.1); " +
			"point any that does at the node's IP or the service's cluster IP."
	case count > 0:
		f.Level = Blocker
		f.Reason += fmt.Sprintf(" kube-proxy has accepted %.0f packets there (%s): something uses them.", count, LocalhostNodePortsMetric)
		f.Action = "Find the client (ss -tn dst 127.0.0.1, conntrack -L -d 127.0.0.1) and point it at the node's IP " +
			"or the service's cluster IP. The counter keeps its old count: once the client is moved and the counter " +
			"stays put, run this again with --allow " + checkNameLocalhost + "."
	default:
		f.Level = Warning
		f.Reason += " kube-proxy has accepted no packet there since it began counting, so nothing seems to use them; " +
			"a client that connects rarely (at boot, from a cron job) would still fail."
		f.Action = "Nothing, unless a client on this node connects to 127.0.0.1:NODEPORT; point any that does at " +
			"the node's IP or the service's cluster IP."
	}
	return one(f)
}

// servesLocalhostNodePorts tells whether the iptables mode serves
// NodePorts on 127.0.0.1 with the running configuration (the default, if
// it is not known): localhostNodePorts on, and nodePortAddresses either
// unset or including 127.0.0.1.
func servesLocalhostNodePorts(f *Facts) bool {
	if f.Config == nil {
		return true
	}
	if on := f.Config.IPTables.LocalhostNodePorts; on != nil && !*on {
		return false
	}
	if len(f.Config.NodePortAddresses) == 0 {
		return true
	}
	for _, a := range f.Config.NodePortAddresses {
		if p, err := netip.ParsePrefix(a); err == nil && p.Contains(netip.MustParseAddr("127.0.0.1")) {
			return true
		}
	}
	return false
}

// leavingIPVS tells whether the move leaves the IPVS mode with its
// configuration known.
func (m move) leavingIPVS() bool {
	return m.from == ipvsMode && m.to != ipvsMode && m.Config != nil
}

// checkIPVSScheduler: the other modes have no IPVS schedulers.
func checkIPVSScheduler(m move) []Finding {
	if !m.leavingIPVS() {
		return nil
	}
	s := m.Config.IPVS.Scheduler
	if s == "" || s == "rr" {
		return nil
	}
	return one(Finding{
		Check: checkNameScheduler, Level: Warning,
		Summary: fmt.Sprintf("ipvs.scheduler %q has no equivalent", s),
		Reason: "The " + m.to + " mode picks an endpoint at random for each new connection; what the " + s +
			" scheduler does (least connections, weights, source hashing) is lost.",
		Action: "If clients must stick to an endpoint (sh, mh), set sessionAffinity: ClientIP on the services that " +
			"need it; spreading by load has no equivalent outside the IPVS mode.",
	})
}

// checkIPVSStrictARP: strictARP sets two sysctls that nothing reverts.
func checkIPVSStrictARP(m move) []Finding {
	if !m.leavingIPVS() || !m.Config.IPVS.StrictARP {
		return nil
	}
	return one(Finding{
		Check: checkNameStrictARP, Level: Warning,
		Summary: "ipvs.strictARP is set",
		Reason: "With it kube-proxy set net.ipv4.conf.all.arp_ignore=1 and arp_announce=2, so that the node does " +
			"not answer ARP for the service addresses it binds to kube-ipvs0 (MetalLB's layer-2 mode asks for it " +
			"in the IPVS mode). The " + m.to + " mode binds no service address to an interface, so it needs " +
			"neither and sets neither: they stay as they are until the node reboots, and then nothing sets them.",
		Action: "Nothing for MetalLB or kube-proxy. If something else on the node relies on these sysctls, set them " +
			"in /etc/sysctl.d.",
	})
}

// checkIPVSExcludeCIDRs: other programs' virtual servers.
func checkIPVSExcludeCIDRs(m move) []Finding {
	if !m.leavingIPVS() || len(m.Config.IPVS.ExcludeCIDRs) == 0 {
		return nil
	}
	f := Finding{
		Check: checkNameExclude, Level: Warning,
		Summary: "ipvs.excludeCIDRs is set: other programs' virtual servers",
		Details: m.Config.IPVS.ExcludeCIDRs,
	}
	f.Reason = "When kube-proxy starts in the " + m.to + " mode it removes what the IPVS mode left, IPVS virtual " +
		"servers included; it spares those in ipvs.excludeCIDRs only if the new configuration still lists them."
	f.Action = "Keep ipvs.excludeCIDRs in the new configuration, and check with ipvsadm -Ln after the switch " +
		"that the other programs' virtual servers are still there."
	return one(f)
}

// checkIPVSTimeouts: IPVS's own connection timeouts.
func checkIPVSTimeouts(m move) []Finding {
	if !m.leavingIPVS() {
		return nil
	}
	ipvs, ct := m.Config.IPVS, m.Config.Conntrack
	var set []string
	for _, t := range []struct {
		name       string
		d          time.Duration
		instead    string
		insteadNow string
	}{
		{"tcpTimeout", ipvs.TCPTimeout.Duration, "conntrack.tcpEstablishedTimeout", durationPtr(ct.TCPEstablishedTimeout)},
		{"tcpFinTimeout", ipvs.TCPFinTimeout.Duration, "conntrack.tcpCloseWaitTimeout", durationPtr(ct.TCPCloseWaitTimeout)},
		{"udpTimeout", ipvs.UDPTimeout.Duration, "conntrack.udpTimeout", durationOrKernel(ct.UDPTimeout.Duration)},
	} {
		if t.d != 0 {
			set = append(set, fmt.Sprintf("ipvs.%s: %s (in the %s mode: %s, now %s)", t.name, t.d, m.to, t.instead, t.insteadNow))
		}
	}
	if len(set) == 0 {
		return nil
	}
	return one(Finding{
		Check: checkNameTimeouts, Level: Warning,
		Summary: "IPVS connection timeouts are set",
		Reason: "IPVS keeps its own connection table, with these timeouts; the " + m.to + " mode keeps connections " +
			"in conntrack only, whose timeouts kube-proxy sets from the conntrack settings.",
		Action:  "If the IPVS timeouts were set for a reason (idle connections through a load balancer), set the conntrack ones to match.",
		Details: set,
	})
}

// checkIPVSLeftovers: leaving the IPVS mode, the connections IPVS
// forwards keep their virtual servers for at most 15 minutes.
func checkIPVSLeftovers(m move) []Finding {
	if !m.leavingIPVS() {
		return nil
	}
	return one(Finding{
		Check: checkNameLeftovers, Level: Warning,
		Summary: "connections IPVS forwards keep their virtual servers for at most 15 minutes",
		Reason: "IPVS keeps its own connection table. After the " + m.to + " mode's first sync, kube-proxy removes " +
			"the IPVS mode's rules and ipsets, but keeps each virtual server that still forwards connections, with its " +
			"address on kube-ipvs0, until they end, checked every 10 s; after 15 minutes it removes them too, and a " +
			"connection still open through one is cut. New connections go through the " + m.to + " mode's rules at once.",
		Action: "Watch kubeproxy_mode_switch_draining_ipvs_virtual_servers fall to 0. Long-lived connections (database " +
			"pools, streams) that must not be cut past the bound should reconnect before it.",
	})
}

// checkIPVSDeprecated: moving to a deprecated mode.
func checkIPVSDeprecated(m move) []Finding {
	if m.to != ipvsMode {
		return nil
	}
	return one(Finding{
		Check: checkNameDeprecated, Level: Warning,
		Summary: "the IPVS mode is deprecated",
		Reason:  "Upstream kube-proxy deprecated the IPVS mode in v1.35: it logs an error and records a Warning event at start.",
		Action:  "Prefer the nftables mode (kernel 5.13 or later), or stay in the " + orUnknown(m.from) + " mode.",
	})
}

// checkFirewalld: firewalld rewrites rules on a reload, and its own
// policy sees the same packets.
func checkFirewalld(m move) []Finding {
	if len(m.Firewalld) == 0 {
		return nil
	}
	f := Finding{
		Check: checkNameFirewalld, Level: Warning,
		Summary: "firewalld runs on this node",
		Action: "Let Kubernetes traffic through firewalld (the pod and service CIDRs in the trusted zone: firewall-cmd " +
			"--permanent --zone=trusted --add-source=CIDR; the NodePort range open: --add-port=30000-32767/tcp and /udp), " +
			"or stop and disable it on Kubernetes nodes; after the switch, check a service across a firewall-cmd --reload.",
		Details: m.Firewalld,
	}
	f.Reason = "firewalld's rules see the same packets as kube-proxy's, and a drop or reject there is final " +
		"whatever kube-proxy's rules accept: NodePort, forwarded pod and service traffic its zones do not allow is dropped."
	if m.to == nftablesMode {
		f.Reason += " On a reload it rewrites its own nftables tables; some old releases flushed the whole ruleset, " +
			"kube-proxy's table included (check firewall-cmd --version)."
	} else {
		f.Reason += " On a reload with its iptables backend, or with direct rules, it flushes the iptables tables, " +
			"kube-proxy's chains included: kube-proxy notices (its canary chains) and restores them, but services " +
			"fail in between."
	}
	return one(f)
}

// checkLegacyBackend: kube-proxy's chains in the legacy iptables backend.
func checkLegacyBackend(m move) []Finding {
	var where []string
	for _, s := range m.Saved {
		if s.Backend == "legacy" && s.Err == nil && holdsKubeProxyChains(s.Text) {
			where = append(where, s.Source())
		}
	}
	if len(where) == 0 {
		return nil
	}
	f := Finding{
		Check: checkNameLegacy, Level: Warning,
		Summary: "kube-proxy's chains are in the legacy iptables backend",
		Reason: "Distributions are dropping the legacy backend (x_tables): RHEL 8 and later ship only iptables-nft, and " +
			"recent kernels build it only as an option (CONFIG_IP_NF_IPTABLES_LEGACY), so an OS or kernel upgrade can remove it.",
		Details: where,
	}
	if m.to == nftablesMode {
		f.Reason += " The nftables mode does not use iptables: the switch moves kube-proxy off the legacy backend, and " +
			"removes its legacy chains at start; other programs' legacy rules (the kubelet's, a CNI plugin's) stay."
		f.Action = "Nothing for kube-proxy. Move the node's other iptables users (kubelet, CNI plugin) to the nft backend " +
			"too before an upgrade removes the legacy one."
	} else {
		f.Reason += " The " + m.to + " mode keeps using the backend kube-proxy detects at start (the one holding the " +
			"kubelet's and kube-proxy's marker chains), so the node stays on the legacy backend."
		f.Action = "Move the node's iptables users (kubelet, CNI plugin, kube-proxy) to the nft backend together, or " +
			"move kube-proxy to the nftables mode."
	}
	return one(f)
}

func nonEmpty(s string) []string {
	if s = strings.TrimSpace(s); s == "" {
		return nil
	}
	return []string{s}
}

func orUnknown(mode string) string {
	if mode == "" {
		return "current"
	}
	return mode
}

func durationPtr(d *metav1.Duration) string {
	if d == nil {
		return "the kernel's"
	}
	return durationOrKernel(d.Duration)
}

func durationOrKernel(d time.Duration) string {
	if d == 0 {
		return "the kernel's"
	}
	return d.String()
}
