package iptables

import (
	"bufio"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Everything the rule generator can write, restored into a namespace and
// read back with iptables-save, must compare equal chain by chain;
// otherwise every restart would rewrite those chains.
func TestGeneratedRulesSurviveARoundTripThroughTheKernel(t *testing.T) {
	netns := testutil.NewNetns(t)
	testutil.RequireCommands(t, "iptables-legacy-restore", "iptables-nft-restore", "ip6tables-nft-restore")
	// The counting rules need their nfacct objects; without them (a kernel
	// without nfnetlink_acct) the rules written instead are checked, and
	// the test ends as skipped (under CI, failed): the counting rules were
	// not.
	var nfacctErr error
	testutil.DoInNetns(t, netns, func() { nfacctErr = EnsureNFAcctObjects() })
	if nfacctErr != nil {
		t.Logf("checking the rules without nfacct: %v", nfacctErr)
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, backend := range []string{"legacy", "nft"} {
			chains := sampleRuleSet(t, family, nfacctErr == nil)
			in := iptableskernel.NewRestoreInput()
			for table, cs := range chains {
				for _, c := range cs {
					in.WriteChain(table, c)
				}
			}
			tool := "iptables-" + backend
			if family == v1.IPv6Protocol {
				tool = "ip6tables-" + backend
			}
			restore := exec.Command("ip", "netns", "exec", netns, tool+"-restore", "--noflush")
			restore.Stdin = in.Reader()
			if out, err := restore.CombinedOutput(); err != nil {
				t.Fatalf("%s: restoring: %v: %s\n%s", tool, err, out, in)
			}
			for table, cs := range chains {
				// Standard output only: iptables-nft-save warns about legacy tables on stderr.
				save, err := exec.Command("ip", "netns", "exec", netns, tool+"-save", "-t", string(table)).Output()
				if err != nil {
					t.Fatalf("%s-save: %v", tool, err)
				}
				saved := savedChains(t, string(save))
				for _, c := range cs {
					if !slices.EqualFunc(c.Rules, saved[c.Name], iptableskernel.SameRule) {
						t.Errorf("%s %s %s reads back differently:\nwritten:\n%s\nsaved:\n%s", tool, table, c.Name, joinRules(c.Rules), joinRules(saved[c.Name]))
					}
				}
			}
		}
	}
	if nfacctErr != nil {
		testutil.Skip(t, "no nfacct here, so the rules counting in it were not round-tripped: "+nfacctErr.Error())
	}
}

func joinRules(rules []iptableskernel.Rule) string {
	var b strings.Builder
	for _, r := range rules {
		b.WriteString("  " + string(r) + "\n")
	}
	return b.String()
}

func savedChains(t *testing.T, save string) map[iptableskernel.Chain][]iptableskernel.Rule {
	t.Helper()
	out := map[iptableskernel.Chain][]iptableskernel.Rule{}
	sc := bufio.NewScanner(strings.NewReader(save))
	for sc.Scan() {
		if chain, rest, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "-A "), " "); ok && strings.HasPrefix(sc.Text(), "-A ") {
			out[iptableskernel.Chain(chain)] = append(out[iptableskernel.Chain(chain)], iptableskernel.Rule(rest))
		}
	}
	return out
}

// sampleRuleSet exercises every kind of rule the generator writes: static
// chains, and services with each feature, their shared rules gathered
// into the shared chains; with nfacct, the rules that count packets.
func sampleRuleSet(t *testing.T, family v1.IPFamily, nfacct bool) map[iptableskernel.Table][]iptableskernel.OwnChain {
	t.Helper()
	v6 := family == v1.IPv6Protocol
	addr := func(v4, v6addr string) netip.Addr {
		if v6 {
			return netip.MustParseAddr(v6addr)
		}
		return netip.MustParseAddr(v4)
	}
	cidr := "10.244.0.0/16"
	if v6 {
		cidr = "fd00:244::/56"
	}
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{cidr}}, family)
	if err != nil {
		t.Fatal(err)
	}
	params := Params{IPv6: v6, MasqueradeBit: 14, LocalhostNodePorts: true, LocalDetector: detector,
		NodeIP: addr("10.255.0.2", "fd00:255::2"), NFAcct: nfacct}
	static := params.StaticRules()
	chains := map[iptableskernel.Table][]iptableskernel.OwnChain{}
	for table, cs := range static.Chains {
		chains[table] = append(chains[table], cs...)
	}
	var generated [][]SharedRule
	endpoints := []*state.Endpoint{
		{IP: addr("10.244.0.5", "fd00:244::5"), Port: 8080, Ready: true, Serving: true, IsLocal: true, NodeName: "node-1"},
		{IP: addr("10.244.0.6", "fd00:244::6"), Port: 8080, Ready: true, Serving: true, NodeName: "node-2"},
		{IP: addr("10.244.0.7", "fd00:244::7"), Port: 8080, Ready: true, Serving: true, NodeName: "node-2"},
	}
	services := []*state.ServicePort{
		{Protocol: v1.ProtocolTCP, Port: 80, ClusterIP: addr("10.96.0.10", "fd00:10:96::a"), NodePort: 30080,
			ExternalIPs: []netip.Addr{addr("10.255.2.10", "fd00:255:2::a")}, AffinityTimeoutSeconds: 10800},
		{Protocol: v1.ProtocolUDP, Port: 53, ClusterIP: addr("10.96.0.11", "fd00:10:96::b"), NodePort: 30053,
			LoadBalancerIPs:          []netip.Addr{addr("10.255.3.11", "fd00:255:3::b")},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix(map[bool]string{false: "10.255.0.0/16", true: "fd00:255::/32"}[v6])},
			ExternalPolicyLocal:      true, HealthCheckNodePort: 31000},
		{Protocol: v1.ProtocolSCTP, Port: 9, ClusterIP: addr("10.96.0.12", "fd00:10:96::c"), InternalPolicyLocal: true},
		{Protocol: v1.ProtocolTCP, Port: 81, ClusterIP: addr("10.96.0.13", "fd00:10:96::d"), NodePort: 30081},
	}
	for i, svc := range services {
		svc.Name = state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "svc" + string(rune('a'+i))}, Port: "p", Protocol: svc.Protocol}
		eps := endpoints
		if i == len(services)-1 {
			eps = nil // no endpoints: REJECT rules
		}
		rules := params.ServiceRules(svc, state.Select(svc, eps, state.Node{Name: "node-1"}))
		chains[iptableskernel.TableNAT] = append(chains[iptableskernel.TableNAT], rules.Chains...)
		generated = append(generated, rules.Shared)
	}
	for table, cs := range sharedChainContents(static, generated) {
		chains[table] = append(chains[table], cs...)
	}
	return chains
}
