// Package preflight tells what would break on a node if its kube-proxy
// moved from the mode it runs in to another: each check is a pure
// function of the node's Facts (gather.go reads them from the node and
// the running kube-proxy, ours or upstream's), and says what it found,
// why it matters and what to do.
package preflight

import (
	"slices"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// Level tells whether a finding stops the switch.
type Level string

const (
	// Blocker: something on the node would break; the command exits 1.
	Blocker Level = "blocker"
	// Warning: something changes or cannot be told; the switch may go on.
	Warning Level = "warning"
)

// Finding is one check's result.
type Finding struct {
	// Check names the check, for --allow.
	Check   string `json:"check"`
	Level   Level  `json:"level"`
	Summary string `json:"summary"`
	Reason  string `json:"reason"`
	Action  string `json:"action"`
	// Details are what the check found, one item each (rules, settings).
	Details []string `json:"details,omitempty"`
	// Allowed tells that --allow turned this blocker into a warning.
	Allowed bool `json:"allowed,omitempty"`
}

// Modes are the modes a node can move between.
var Modes = []string{iptablesMode, ipvsMode, nftablesMode}

// ValidMode tells whether mode is one of Modes.
func ValidMode(mode string) bool { return slices.Contains(Modes, mode) }

// The modes' names, as in config.Mode* (not imported: this package is in
// kube-proxy-explain, which needs none of pkg/config's dependencies).
const (
	iptablesMode = "iptables"
	ipvsMode     = "ipvs"
	nftablesMode = "nftables"
)

// Facts are what the checks look at: what the running kube-proxy says
// about itself and what the node holds. A field's error says why it is
// not known; a check that needs it then says it could not tell.
type Facts struct {
	// Address is the metrics server asked (metricsBindAddress).
	Address string
	// Mode is the running kube-proxy's mode, from /proxyMode.
	Mode    string
	ModeErr error
	// Config is its running configuration, from /configz.
	Config    *kpconfig.KubeProxyConfiguration
	ConfigErr error
	// Metrics are its /metrics samples, summed over labels per name.
	Metrics    map[string]float64
	MetricsErr error

	KernelRelease string
	KernelErr     error
	// SkipKernelCheck is the value of KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK.
	SkipKernelCheck string
	// NFTVersion is what `nft --version` prints; NFTErr why the nftables
	// mode could not use nft (knftables' own check), nil if it can.
	NFTVersion string
	NFTErr     error

	// Saved are the iptables rules per backend and family.
	Saved []SavedRules
	// Firewalld is the evidence that firewalld runs, none if it does not.
	Firewalld []string
}

// SavedRules is what one iptables-save tool printed; the rules of
// kube-proxy's own chains may be left out (chain declarations stay).
type SavedRules struct {
	// Backend is "nft" or "legacy".
	Backend string
	IPv6    bool
	Text    string
	Err     error
}

// Source names the tool the rules came from.
func (s SavedRules) Source() string {
	if s.IPv6 {
		return "ip6tables-" + s.Backend
	}
	return "iptables-" + s.Backend
}

// Report is the answer for one move.
type Report struct {
	Address string `json:"address"`
	// From is the running mode, "" when it is not known.
	From     string    `json:"from"`
	To       string    `json:"to"`
	Findings []Finding `json:"findings"`
	// Note is said instead of findings when there is nothing to check.
	Note string `json:"note,omitempty"`
}

// Blocked tells whether a finding stops the switch.
func (r Report) Blocked() bool {
	return slices.ContainsFunc(r.Findings, func(f Finding) bool { return f.Level == Blocker })
}

// Count is how many findings are at the level.
func (r Report) Count(l Level) int {
	n := 0
	for _, f := range r.Findings {
		if f.Level == l {
			n++
		}
	}
	return n
}

// move is one check's view: the facts, and the modes from and to.
type move struct {
	*Facts
	from, to string
}

// checks run in this order, which is the order of the report.
var checks = []func(m move) []Finding{
	checkKubeProxyReachable,
	checkNFTablesKernel,
	checkNFTTool,
	checkLocalhostNodePorts,
	checkForeignReferences,
	checkIPVSScheduler,
	checkIPVSStrictARP,
	checkIPVSExcludeCIDRs,
	checkIPVSTimeouts,
	checkIPVSLeftovers,
	checkIPVSDeprecated,
	checkFirewalld,
	checkLegacyBackend,
}

// Check runs every check for a move to the mode to (one of Modes), and
// turns the blockers of the checks named in allow into warnings.
func Check(f *Facts, to string, allow []string) Report {
	r := Report{Address: f.Address, From: f.Mode, To: to, Findings: []Finding{}}
	if f.ModeErr == nil && f.Mode == to {
		r.Note = "kube-proxy already runs in the " + to + " mode: nothing to do"
		return r
	}
	m := move{Facts: f, from: f.Mode, to: to}
	if f.ModeErr != nil {
		m.from = ""
	}
	for _, c := range checks {
		for _, finding := range c(m) {
			if finding.Level == Blocker && slices.Contains(allow, finding.Check) {
				finding.Level, finding.Allowed = Warning, true
			}
			r.Findings = append(r.Findings, finding)
		}
	}
	return r
}

// CheckNames are the checks' names, for --allow.
var CheckNames = []string{
	checkNameUnreachable, checkNameKernel, checkNameNFT, checkNameLocalhost, checkNameForeign,
	checkNameScheduler, checkNameStrictARP, checkNameExclude, checkNameTimeouts, checkNameLeftovers,
	checkNameDeprecated, checkNameFirewalld, checkNameLegacy,
}
