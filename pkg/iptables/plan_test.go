package iptables

import (
	"errors"
	"io"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/iptables/iptablestest"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// earlyFailingKernel fails its restores after reading a little, as
// iptables-restore does at a bad line.
type earlyFailingKernel struct{ recordingKernel }

func (k *earlyFailingKernel) Restore(input io.Reader) error {
	io.ReadFull(input, make([]byte, 16))
	return errors.New("iptables-restore: line 2 failed")
}

// A full sync whose one restore fails early ends with the restore's error
// and is tried again.
func TestFullSyncRestoreThatFailsEarlyEndsTheSync(t *testing.T) {
	kernel := &earlyFailingKernel{}
	p := newTestProxier(t, kernel)
	feed(p, 500)
	done := make(chan error, 1)
	go func() { done <- p.sync() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "line 2 failed") {
			t.Errorf("sync returned %v, want the restore's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sync is stuck writing to a restore that ended")
	}
	if !p.FullSyncPending() {
		t.Error("after a failed full sync, the next sync is not a full one")
	}
}

var serviceChainName = regexp.MustCompile(`KUBE-(SEP|SVC|SVL|EXT|FW)-[A-Z0-9]+`)

// A split full sync bounds the chain names each input refers to, jump
// targets included, not only the chains it declares: a service with many
// endpoints has one SVC chain that jumps to all of them, and a new
// KUBE-SERVICES jumps to every service.
func TestSplitFullSyncBoundsTheChainNamesOfEachInput(t *testing.T) {
	const limit, services, endpoints = 50, 100, 40
	kernel := &recordingKernel{}
	p := newTestProxier(t, kernel)
	p.cfg.ChainRefsPerRestore = limit
	feedClusterIPs(p, services, endpoints)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	// A batch closes after the service that fills it, so it may exceed the
	// limit by one service's names: its SVC chain and the chains it jumps to.
	const most = limit + 1 + endpoints + 1
	inputs := strings.Split(kernel.written.String(), "# restore\n")[1:]
	for i, input := range inputs {
		names := map[string]bool{}
		for _, name := range serviceChainName.FindAllString(input, -1) {
			names[name] = true
		}
		if len(names) > most {
			t.Errorf("restore %d of %d refers to %d service chains, want at most %d", i+1, len(inputs), len(names), most)
		}
	}
}

// An unsplit (legacy) full sync declares every service chain before any
// of their rules, in descending name order: libiptc then puts each new
// chain at the head of its sorted list instead of walking to its place.
func TestUnsplitFullSyncDeclaresServiceChainsInDescendingOrder(t *testing.T) {
	kernel := &recordingKernel{}
	p := newTestProxier(t, kernel)
	feed(p, 50)
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	inputs := strings.Split(kernel.written.String(), "# restore\n")[1:]
	if len(inputs) != 1 {
		t.Fatalf("%d restores, want 1", len(inputs))
	}
	nat := inputs[0][strings.Index(inputs[0], "*nat\n"):]
	var declared []string
	firstRule := -1
	for i, line := range strings.Split(nat, "\n") {
		if name, ok := strings.CutPrefix(line, ":"); ok && serviceChainName.MatchString(name) {
			if firstRule >= 0 {
				t.Fatalf("line %d declares %s after a service chain's rule", i, name)
			}
			declared = append(declared, strings.Fields(name)[0])
		}
		if strings.HasPrefix(line, "-A ") && serviceChainName.MatchString(strings.Fields(line)[1]) && firstRule < 0 {
			firstRule = i
		}
	}
	if len(declared) < 150 { // 50 services: SVC, EXT and two SEP chains each
		t.Fatalf("%d service chains declared, want at least 150", len(declared))
	}
	if !slices.IsSortedFunc(declared, func(a, b string) int { return strings.Compare(b, a) }) {
		t.Errorf("service chains not declared in descending order: %v", declared)
	}
}

// The counted localhost NodePort rule must match before its service's
// general NodePort rule, which would take its packets. A sync adding both
// writes them in that order; a full sync over rules written without
// nfacct, which hold the general rule already, puts it at the top.
func TestCountedLocalhostNodePortRuleGoesFirst(t *testing.T) {
	params := Params{MasqueradeBit: 14, LocalhostNodePorts: true, NFAcct: true}
	var want []iptableskernel.Rule
	var rules []ServiceRules
	for i, name := range []string{"a", "b"} {
		svc := &state.ServicePort{Name: state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "p", Protocol: v1.ProtocolTCP},
			Protocol: v1.ProtocolTCP, Port: 80, ClusterIP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), NodePort: int32(30080 + i)}
		eps := []*state.Endpoint{{IP: netip.MustParseAddr("10.244.0.5"), Port: 8080, Ready: true, Serving: true, NodeName: "node-1"}}
		r := params.ServiceRules(svc, state.Select(svc, eps, state.Node{Name: "node-1"}))
		rules = append(rules, r)
		for _, s := range r.Shared {
			if s.Table == iptableskernel.TableNAT && s.Chain == chainNodePorts {
				want = append(want, s.Rule)
			}
		}
	}
	if len(want) != 4 || !strings.Contains(string(want[0]), "-d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts") {
		t.Fatalf("KUBE-NODEPORTS rules: %q, want each service's counted localhost rule, then its general one", want)
	}

	partial := iptableskernel.NewRestoreInput()
	planService(appliedService{}, summarize(rules[0]), rules[0]).render(partial)
	if got, expect := partial.String(), "-A KUBE-NODEPORTS "+string(want[0])+"\n-A KUBE-NODEPORTS "+string(want[1])+"\n"; !strings.Contains(got, expect) {
		t.Errorf("a new service's NodePort rules:\n%s\nwant, in this order:\n%s", got, expect)
	}

	full := iptableskernel.NewRestoreInput()
	diffSharedChain(full, iptableskernel.TableNAT, fingerprintsOf(want[1], want[3]), iptableskernel.OwnChain{Name: chainNodePorts, Rules: want}, 0)
	if got, expect := full.String(), "*nat\n-I KUBE-NODEPORTS 1 "+string(want[2])+"\n-I KUBE-NODEPORTS 1 "+string(want[0])+"\nCOMMIT\n"; got != expect {
		t.Errorf("a full sync over the general rules writes:\n%s\nwant:\n%s", got, expect)
	}
	// A new service after those in place is appended, in order.
	full = iptableskernel.NewRestoreInput()
	diffSharedChain(full, iptableskernel.TableNAT, fingerprintsOf(want[:2]...), iptableskernel.OwnChain{Name: chainNodePorts, Rules: want}, 0)
	if got, expect := full.String(), "*nat\n-A KUBE-NODEPORTS "+string(want[2])+"\n-A KUBE-NODEPORTS "+string(want[3])+"\nCOMMIT\n"; got != expect {
		t.Errorf("a full sync adding a service writes:\n%s\nwant:\n%s", got, expect)
	}
	// One before them goes to the top, in order.
	full = iptableskernel.NewRestoreInput()
	diffSharedChain(full, iptableskernel.TableNAT, fingerprintsOf(want[2:]...), iptableskernel.OwnChain{Name: chainNodePorts, Rules: want}, 0)
	if got, expect := full.String(), "*nat\n-I KUBE-NODEPORTS 1 "+string(want[1])+"\n-I KUBE-NODEPORTS 1 "+string(want[0])+"\nCOMMIT\n"; got != expect {
		t.Errorf("a full sync adding a service ahead of the others writes:\n%s\nwant:\n%s", got, expect)
	}
}

// fingerprintsOf is what a full sync keeps of a shared chain's rules.
func fingerprintsOf(rules ...iptableskernel.Rule) []uint64 {
	out := make([]uint64, len(rules))
	for i, r := range rules {
		out[i] = iptableskernel.RuleFingerprint(r)
	}
	return out
}

// A full sync keeps only fingerprints of the shared chains' rules: a rule
// no service wants any more is deleted with the text the kernel lists it
// in, and a chain with nothing to delete is not listed.
func TestFullSyncDeletesSharedRulesAsTheKernelListsThem(t *testing.T) {
	p := newTestProxier(t, nil)
	var save strings.Builder
	save.WriteString("*nat\n")
	for _, c := range p.cfg.Params.StaticRules().Shared[iptableskernel.TableNAT] {
		save.WriteString(":" + string(c.Name) + " - [0:0]\n")
	}
	gone := `-d 10.96.0.99/32 -p tcp -m comment --comment "ns/gone:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-GONE`
	save.WriteString("-A KUBE-SERVICES " + gone + "\n")
	for _, c := range p.cfg.Params.StaticRules().Shared[iptableskernel.TableNAT] {
		for _, r := range c.Rules {
			save.WriteString("-A " + string(c.Name) + " " + string(r) + "\n")
		}
	}
	save.WriteString("COMMIT\n")
	kernel := &listingKernel{Kernel: &iptablestest.SavedKernel{Saved: save.String()}, listed: map[string]int{}}
	p.cfg.Kernel = kernel
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	written := kernel.Kernel.(*iptablestest.SavedKernel).Written.String()
	if !strings.Contains(written, "-D KUBE-SERVICES "+gone+"\n") {
		t.Errorf("the stale rule is not deleted as the kernel lists it:\n%s", written)
	}
	if kernel.listed["nat"] != 1 {
		t.Errorf("%d nat chains listed, want 1 (KUBE-SERVICES)", kernel.listed["nat"])
	}
}
