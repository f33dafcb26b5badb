package iptables

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// planTestService is a ClusterIP service port, and its rules with the
// endpoints of these IPs (on this node).
func planTestService(ips ...string) (*state.ServicePort, []*state.Endpoint, ServiceRules) {
	svc := &state.ServicePort{Name: state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "p", Protocol: v1.ProtocolTCP},
		Protocol: v1.ProtocolTCP, Port: 80, ClusterIP: netip.MustParseAddr("10.96.0.10")}
	var eps []*state.Endpoint
	for _, ip := range ips {
		eps = append(eps, &state.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true, NodeName: "node-1", IsLocal: true})
	}
	params := Params{MasqueradeBit: 14}
	return svc, eps, params.ServiceRules(svc, state.Select(svc, eps, state.Node{Name: "node-1"}))
}

// sharedAt names a shared rule by where it goes.
func sharedAt(rules []SharedRule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, string(r.Table)+" "+string(r.Chain))
	}
	return out
}

func chainNames(chains []iptableskernel.OwnChain) []iptableskernel.Chain {
	var out []iptableskernel.Chain
	for _, c := range chains {
		out = append(out, c.Name)
	}
	return out
}

// A service port's plan rewrites only its changed chains and moves only
// its changed shared rules.
func TestPlanService(t *testing.T) {
	svc, eps, one := planTestService("10.244.0.5")
	_, _, two := planTestService("10.244.0.5", "10.244.0.6")
	_, _, none := planTestService()
	_, eps2, _ := planTestService("10.244.0.5", "10.244.0.6")
	names := chainsFor(svc.Name)
	sep1, sep2 := names.endpointChain(eps[0]), names.endpointChain(eps2[1])

	for _, tc := range []struct {
		name                   string
		old, updated           ServiceRules
		write, drop            []iptableskernel.Chain
		unshare, share         []string
		unshareRule, shareRule string
	}{
		{name: "unchanged", old: one, updated: one},
		{name: "endpoint added", old: one, updated: two, write: []iptableskernel.Chain{names.cluster, sep2}},
		{name: "endpoint removed", old: two, updated: one, write: []iptableskernel.Chain{names.cluster}, drop: []iptableskernel.Chain{sep2}},
		{name: "new service", updated: one, write: []iptableskernel.Chain{names.cluster, sep1}, share: []string{"nat KUBE-SERVICES"}},
		{name: "service gone", old: one, drop: []iptableskernel.Chain{names.cluster, sep1}, unshare: []string{"nat KUBE-SERVICES"}},
		{name: "shared rule moved", old: one, updated: none,
			drop: []iptableskernel.Chain{names.cluster, sep1}, unshare: []string{"nat KUBE-SERVICES"}, share: []string{"filter KUBE-SERVICES"},
			unshareRule: "-j " + string(names.cluster), shareRule: "-j REJECT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := planService(summarize(tc.old), summarize(tc.updated), tc.updated)
			if got := chainNames(sp.write); !slices.Equal(got, tc.write) {
				t.Errorf("writes %v, want %v", got, tc.write)
			}
			if !slices.Equal(sp.drop, tc.drop) {
				t.Errorf("drops %v, want %v", sp.drop, tc.drop)
			}
			if got := sharedAt(sp.unshare); !slices.Equal(got, tc.unshare) {
				t.Errorf("unshares %v, want %v", got, tc.unshare)
			}
			if got := sharedAt(sp.share); !slices.Equal(got, tc.share) {
				t.Errorf("shares %v, want %v", got, tc.share)
			}
			if tc.unshareRule != "" && !contains(sp.unshare[0].Rule, tc.unshareRule) {
				t.Errorf("unshares %q, want a rule with %q", sp.unshare[0].Rule, tc.unshareRule)
			}
			if tc.shareRule != "" && !contains(sp.share[0].Rule, tc.shareRule) {
				t.Errorf("shares %q, want a rule with %q", sp.share[0].Rule, tc.shareRule)
			}
			if sp.empty() != (tc.write == nil && tc.drop == nil && tc.unshare == nil && tc.share == nil) {
				t.Errorf("empty() is %v for %+v", sp.empty(), sp)
			}
		})
	}
}

func contains(r iptableskernel.Rule, part string) bool { return strings.Contains(string(r), part) }

// A rendered plan is the kernel operations in a fixed order: chains
// written, chains deleted, shared rules deleted, shared rules added.
func TestServicePlanRender(t *testing.T) {
	_, _, one := planTestService("10.244.0.5")
	_, _, none := planTestService()
	in := iptableskernel.NewRestoreInput()
	planService(summarize(one), summarize(none), none).render(in)
	svcChain, sepChain := one.Chains[0].Name, one.Chains[1].Name
	want := "*filter\n" +
		"-A KUBE-SERVICES " + string(none.Shared[0].Rule) + "\n" +
		"COMMIT\n" +
		"*nat\n" +
		":" + string(svcChain) + " - [0:0]\n" +
		":" + string(sepChain) + " - [0:0]\n" +
		"-D KUBE-SERVICES " + string(one.Shared[0].Rule) + "\n" +
		"-X " + string(svcChain) + "\n" +
		"-X " + string(sepChain) + "\n" +
		"COMMIT\n"
	if got := in.String(); got != want {
		t.Errorf("rendered:\n%s\nwant:\n%s", got, want)
	}
}

// Planning a partial sync changes nothing in the syncer, and planning it
// twice gives the same plan.
func TestPlanningAPartialSyncTwiceGivesTheSamePlan(t *testing.T) {
	p := newTestProxier(t, &recordingKernel{})
	feed(p, 3)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	changed := map[state.ServicePortName]bool{}
	for name := range p.applied {
		changed[name] = true
	}
	// One service as if never written: its plan writes it whole.
	forgotten := slices.MinFunc(slices.Collect(maps.Keys(changed)), func(a, b state.ServicePortName) int {
		return strings.Compare(a.String(), b.String())
	})
	delete(p.applied, forgotten)
	applied, counts := maps.Clone(p.applied), maps.Clone(p.ruleCounts)

	first, second := p.planPartial(changed), p.planPartial(changed)
	if !reflect.DeepEqual(first, second) {
		t.Errorf("two plans differ:\n%+v\n%+v", first, second)
	}
	if len(first.services) != 1 || len(first.services[0].write) != 4 || len(first.services[0].share) == 0 {
		t.Errorf("plan %+v, want the forgotten service's four chains and its shared rules", first.services)
	}
	if first.render().String() != second.render().String() {
		t.Error("two renderings of the same plan differ")
	}
	if !reflect.DeepEqual(applied, p.applied) || !maps.Equal(counts, p.ruleCounts) {
		t.Error("planning changed the syncer")
	}
}
