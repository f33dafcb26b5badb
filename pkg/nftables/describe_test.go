package nftables

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// describeObjects are a ClusterIP service, a NodePort with
// externalTrafficPolicy Local and a service with session affinity, each
// with a local and a remote endpoint.
func describeObjects() []any {
	eps := func(svc string) any {
		return endpointSlice("ns", svc, ep8080, ep("10.244.0.5"), ep("10.244.1.5", "node=node-2"))
	}
	return []any{
		service("ns", "web", "10.96.0.10", http80, nil), eps("web"),
		service("ns", "np", "10.96.0.11", []port{{"http", v1.ProtocolTCP, 80, 30080}}, func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalTrafficPolicy = v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyLocal
		}), eps("np"),
		service("ns", "sticky", "10.96.0.12", http80, func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}), eps("sticky"),
	}
}

func httpPort(svc string) state.ServicePortName {
	return state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: svc}, Port: "http", Protocol: v1.ProtocolTCP}
}

// objectLines are kernel objects as "kind name: summary", each chain's
// rules indented below it.
func objectLines(objects []proxy.KernelObject) []string {
	var out []string
	for _, o := range objects {
		out = append(out, o.String())
		for _, c := range o.Content {
			out = append(out, "  "+c)
		}
	}
	return out
}

func requireLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Describe names each chain with its rules (an endpoint chain with where
// it leads), each affinity set and each element, as a sync writes them.
func TestDescribeNamesTheObjectsOfAServicePort(t *testing.T) {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(describeObjects()...)
	cases := []struct {
		svc  string
		want []string
	}{
		{"web", []string{
			"chain ip kube-proxy service-Y6QD5CCT-ns/web/tcp/http: 2 rules",
			"  meta l4proto tcp numgen random mod 2 0 dnat to 10.244.0.5:8080",
			"  meta l4proto tcp dnat to 10.244.1.5:8080",
			"set element cluster-ips 10.96.0.10",
			"map element service-ips 10.96.0.10 . tcp . 80: goto service-Y6QD5CCT-ns/web/tcp/http",
			"set element hairpin-connections 10.244.0.5 . 10.244.0.5 . tcp . 8080",
		}},
		{"np", []string{
			"chain ip kube-proxy external-4EINRXLW-ns/np/tcp/http: 4 rules",
			`  ip saddr 10.244.0.0/16 goto service-4EINRXLW-ns/np/tcp/http comment "short-circuit pod traffic"`,
			`  fib saddr type local meta mark set meta mark | 0x00004000 comment "masquerade local traffic"`,
			`  fib saddr type local goto service-4EINRXLW-ns/np/tcp/http comment "short-circuit local traffic"`,
			"  goto local-4EINRXLW-ns/np/tcp/http",
			"chain ip kube-proxy service-4EINRXLW-ns/np/tcp/http: 2 rules",
			"  meta l4proto tcp numgen random mod 2 0 dnat to 10.244.0.5:8080",
			"  meta l4proto tcp dnat to 10.244.1.5:8080",
			"chain ip kube-proxy local-4EINRXLW-ns/np/tcp/http: 1 rule",
			"  meta l4proto tcp dnat to 10.244.0.5:8080",
			"set element cluster-ips 10.96.0.11",
			"map element service-ips 10.96.0.11 . tcp . 80: goto service-4EINRXLW-ns/np/tcp/http",
			"map element service-nodeports tcp . 30080: goto external-4EINRXLW-ns/np/tcp/http",
			"set element hairpin-connections 10.244.0.5 . 10.244.0.5 . tcp . 8080",
		}},
		{"sticky", []string{
			"chain ip kube-proxy service-KBDI3LGB-ns/sticky/tcp/http: 4 rules",
			"  ip saddr @affinity-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080 goto endpoint-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080",
			"  ip saddr @affinity-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080 goto endpoint-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080",
			"  numgen random mod 2 0 goto endpoint-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080",
			"  goto endpoint-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080",
			"chain ip kube-proxy endpoint-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080: 2 rules, to 10.244.0.5:8080",
			"  update @affinity-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080 { ip saddr }",
			"  meta l4proto tcp dnat to 10.244.0.5:8080",
			"chain ip kube-proxy endpoint-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080: 2 rules, to 10.244.1.5:8080",
			"  update @affinity-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080 { ip saddr }",
			"  meta l4proto tcp dnat to 10.244.1.5:8080",
			"set ip kube-proxy affinity-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080: clients sent to 10.244.0.5:8080, for 3h",
			"set ip kube-proxy affinity-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080: clients sent to 10.244.1.5:8080, for 3h",
			"set element cluster-ips 10.96.0.12",
			"map element service-ips 10.96.0.12 . tcp . 80: goto service-KBDI3LGB-ns/sticky/tcp/http",
			"set element hairpin-connections 10.244.0.5 . 10.244.0.5 . tcp . 8080",
		}},
	}
	for _, tc := range cases {
		objects, check := h.syncer.Describe(h.view(), httpPort(tc.svc))
		requireLines(t, tc.svc, objectLines(objects), tc.want)
		if check == nil {
			t.Errorf("%s: no check", tc.svc)
		}
	}
	if objects, check := h.syncer.Describe(h.view(), httpPort("none")); objects != nil || check != nil {
		t.Errorf("an unknown service port has objects: %v", objects)
	}
}

// verify checks the port against the table: nothing differs after a sync;
// each change made behind the syncer's back is named in words.
func TestVerifyNamesWhatTheTableLacks(t *testing.T) {
	nodePort := "external-4EINRXLW-ns/np/tcp/http"
	sticky := "service-KBDI3LGB-ns/sticky/tcp/http"
	endpoint := "endpoint-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080"
	cases := []struct {
		name   string
		svc    string
		change func(*knftables.Transaction)
		want   []string
	}{
		{"nothing", "np", nil, nil},
		{"a deleted rule", "np", func(tx *knftables.Transaction) {
			tx.Flush(&knftables.Chain{Name: nodePort})
			tx.Add(&knftables.Rule{Chain: nodePort, Rule: "goto local-4EINRXLW-ns/np/tcp/http"})
		}, []string{
			`chain ip kube-proxy ` + nodePort + ` lacks: ip saddr 10.244.0.0/16 goto service-4EINRXLW-ns/np/tcp/http comment "short-circuit pod traffic"`,
			`chain ip kube-proxy ` + nodePort + ` lacks: fib saddr type local meta mark set meta mark | 0x00004000 comment "masquerade local traffic"`,
			`chain ip kube-proxy ` + nodePort + ` lacks: fib saddr type local goto service-4EINRXLW-ns/np/tcp/http comment "short-circuit local traffic"`,
		}},
		{"an added rule", "sticky", func(tx *knftables.Transaction) {
			tx.Add(&knftables.Rule{Chain: endpoint, Rule: "drop"})
		}, []string{"chain ip kube-proxy " + endpoint + " has an unwanted rule: drop"}},
		{"a deleted chain", "sticky", func(tx *knftables.Transaction) {
			// Nothing may refer to a chain deleted: the service chain does.
			tx.Flush(&knftables.Chain{Name: sticky})
			tx.Delete(&knftables.Chain{Name: endpoint})
		}, []string{
			"chain ip kube-proxy " + sticky + " lacks: ip saddr @affinity-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080 goto " + endpoint,
			"chain ip kube-proxy " + sticky + " lacks: ip saddr @affinity-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080 goto endpoint-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080",
			"chain ip kube-proxy " + sticky + " lacks: numgen random mod 2 0 goto " + endpoint,
			"chain ip kube-proxy " + sticky + " lacks: goto endpoint-HNERGFFK-ns/sticky/tcp/http__10.244.1.5/8080",
			"chain ip kube-proxy " + endpoint + " is missing",
		}},
		{"a deleted map element", "np", func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Map: mapServiceNodePorts, Key: []string{"tcp", "30080"}})
		}, []string{"map service-nodeports: element tcp . 30080 : goto " + nodePort + " is missing"}},
		{"a changed map element", "np", func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Map: mapServiceIPs, Key: []string{"10.96.0.11", "tcp", "80"}})
			tx.Add(&knftables.Element{Map: mapServiceIPs, Key: []string{"10.96.0.11", "tcp", "80"}, Value: []string{"drop"}})
		}, []string{"map service-ips: element 10.96.0.11 . tcp . 80 maps to drop instead of goto service-4EINRXLW-ns/np/tcp/http"}},
		{"a deleted set element", "web", func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Set: setClusterIPs, Key: []string{"10.96.0.10"}})
		}, []string{"set cluster-ips: element 10.96.0.10 is missing"}},
		{"a stray element leading to its chain", "web", func(tx *knftables.Transaction) {
			tx.Add(&knftables.Element{Map: mapServiceIPs, Key: []string{"10.96.0.99", "tcp", "80"}, Value: []string{"goto service-Y6QD5CCT-ns/web/tcp/http"}})
		}, []string{"map service-ips: element 10.96.0.99 . tcp . 80 : goto service-Y6QD5CCT-ns/web/tcp/http is unexpected"}},
		{"a stray element in a map the port does not use", "web", func(tx *knftables.Transaction) {
			tx.Add(&knftables.Element{Map: mapNoEndpointServices, Key: []string{"10.96.0.10", "tcp", "80"}, Value: []string{"goto reject-chain"},
				Comment: knftables.PtrTo("ns/web:http")})
		}, []string{"map no-endpoint-services: element 10.96.0.10 . tcp . 80 : goto reject-chain is unexpected"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
			h.apply(describeObjects()...)
			h.full()
			if tc.change != nil {
				tx := h.nft.NewTransaction()
				tc.change(tx)
				if err := h.nft.Run(context.Background(), tx); err != nil {
					t.Fatal(err)
				}
			}
			_, check := h.syncer.Describe(h.view(), httpPort(tc.svc))
			got, err := check()
			if err != nil {
				t.Fatal(err)
			}
			requireLines(t, "differences", got, tc.want)
		})
	}
}

// verify lists a port with one chain object by object, and a port with
// several chains by one listing of the table: nft's listing of any chain
// costs nearly what the table's does.
func TestVerifyListsObjectsOrTheTableOnce(t *testing.T) {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(describeObjects()...)
	h.full()
	var listed []string
	h.syncer.cfg.Kernel = listRecorder{Kernel: h.syncer.cfg.Kernel, listed: &listed}
	for svc, want := range map[string][]string{
		"web": {"chain service-Y6QD5CCT-ns/web/tcp/http", "set cluster-ips", "map firewall-ips", "set hairpin-connections",
			"map no-endpoint-nodeports", "map no-endpoint-services", "map service-ips", "map service-nodeports"},
		"sticky": {"table"},
	} {
		listed = nil
		_, check := h.syncer.Describe(h.view(), httpPort(svc))
		if got, err := check(); err != nil || len(got) > 0 {
			t.Fatalf("%s: %v %q", svc, err, got)
		}
		requireLines(t, svc+" listed", listed, want)
	}
}

// A set of another type, or a table without the port's objects at all.
func TestVerifyNamesMissingAndChangedSets(t *testing.T) {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(describeObjects()...)
	h.full()
	affinity := "affinity-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080"
	tx := h.nft.NewTransaction()
	tx.Flush(&knftables.Chain{Name: "service-KBDI3LGB-ns/sticky/tcp/http"})
	tx.Flush(&knftables.Chain{Name: "endpoint-32PROFJR-ns/sticky/tcp/http__10.244.0.5/8080"})
	tx.Delete(&knftables.Set{Name: affinity})
	tx.Add(&knftables.Set{Name: affinity, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: ptr(60 * time.Second)})
	if err := h.nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	_, check := h.syncer.Describe(h.view(), httpPort("sticky"))
	got, err := check()
	if err != nil {
		t.Fatal(err)
	}
	want := "set ip kube-proxy " + affinity + " is type ipv4_addr, flags dynamic,timeout, timeout 1m, want type ipv4_addr, flags dynamic,timeout, timeout 3h"
	if !slices.Contains(got, want) {
		t.Errorf("differences:\n%s\nwant among them:\n%s", strings.Join(got, "\n"), want)
	}

	// With no table, every object is missing, and the check says so
	// rather than fail.
	h.nft.Fake = knftables.NewFake(knftables.IPv4Family, TableName)
	h.syncer = h.newSyncer(v1.IPv4Protocol, v4(nil)(t))
	_, check = h.syncer.Describe(h.view(), httpPort("web"))
	if got, err = check(); err != nil {
		t.Fatal(err)
	}
	requireLines(t, "differences without a table", got, []string{
		"chain ip kube-proxy service-Y6QD5CCT-ns/web/tcp/http is missing",
		"set ip kube-proxy cluster-ips is missing",
		"set ip kube-proxy hairpin-connections is missing",
		"map ip kube-proxy service-ips is missing",
	})
}

// On the real kernel, after a sync of every golden case, verify finds
// every service port as wanted (what nft lists back compares equal to what
// was written); after `nft delete rule` of one rule it names that rule.
// Each verify reads the port's objects over netlink and finds what it
// finds with nft.
func TestKernelVerifyNamesARuleDeletedByHand(t *testing.T) {
	if !inNetns(t) {
		return
	}
	verifyAll := func(t *testing.T, h *harness) {
		t.Helper()
		for name := range h.state.Services {
			if got := verifyBothWays(t, h, name); len(got) > 0 {
				t.Errorf("%s:\n%s", name, strings.Join(got, "\n"))
			}
		}
	}
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := kernelHarness(t, tc.ipFamily(), tc.params(t))
			tc.firstSync(h)
			verifyAll(t, h)
		})
	}

	h, _ := kernelHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(describeObjects()...)
	h.full()
	verifyAll(t, h)
	chain := "external-4EINRXLW-ns/np/tcp/http"
	out, err := exec.Command("nft", "-a", "list", "chain", "ip", TableName, chain).CombinedOutput()
	if err != nil {
		t.Fatalf("nft -a list chain: %v: %s", err, out)
	}
	// The second rule: "... comment "masquerade local traffic" # handle N".
	m := regexp.MustCompile(`masquerade local traffic" # handle (\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("no handle in:\n%s", out)
	}
	if out, err := exec.Command("nft", "delete", "rule", "ip", TableName, chain, "handle", m[1]).CombinedOutput(); err != nil {
		t.Fatalf("nft delete rule: %v: %s", err, out)
	}
	requireLines(t, "differences", verifyBothWays(t, h, httpPort("np")), []string{
		`chain ip kube-proxy ` + chain + ` lacks: fib saddr type local meta mark set meta mark | 0x00004000 comment "masquerade local traffic"`,
	})
}

// verifyBothWays verifies a service port over netlink, which must read
// its objects, and with nft (where a failed read falls back to), and
// requires the same differences of both.
func verifyBothWays(t *testing.T, h *harness, name state.ServicePortName) []string {
	t.Helper()
	real := h.syncer.cfg.Kernel.(*realKernel)
	readObjects := real.netlinkReadObjects
	defer func() { real.netlinkReadObjects = readObjects }()
	real.netlinkReadObjects = func(ctx context.Context, chains, sets []string) (*nftnl.Table, error) {
		nt, err := readObjects(ctx, chains, sets)
		if err != nil {
			t.Errorf("%s: reading over netlink: %v", name, err)
		}
		return nt, err
	}
	_, check := h.syncer.Describe(h.view(), name)
	overNetlink, err := check()
	if err != nil {
		t.Fatalf("%s: verify over netlink: %v", name, err)
	}
	real.netlinkReadObjects = func(context.Context, []string, []string) (*nftnl.Table, error) {
		return nil, errors.New("a shape the reader does not decode")
	}
	_, check = h.syncer.Describe(h.view(), name)
	withNFT, err := check()
	if err != nil {
		t.Fatalf("%s: verify with nft: %v", name, err)
	}
	if !slices.Equal(overNetlink, withNFT) {
		t.Errorf("%s: verify over netlink found\n%s\nwith nft\n%s", name, strings.Join(overNetlink, "\n"), strings.Join(withNFT, "\n"))
	}
	return overNetlink
}

// A chain the kernel holds in upstream's form (after a takeover, which
// keeps it) is no difference.
func TestVerifyTakesUpstreamsFormAsEqual(t *testing.T) {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(describeObjects()...)
	h.full()
	objects := h.syncer.objectsFor(h.view(), httpPort("web"))
	tx := h.nft.NewTransaction()
	for _, c := range objects.Chains {
		if c.Upstream == nil {
			t.Fatalf("chain %s has no upstream form", c.Name)
		}
		tx.Flush(&knftables.Chain{Name: c.Name})
		for _, r := range c.Upstream {
			tx.Add(&knftables.Rule{Chain: c.Name, Rule: writable(r)})
		}
	}
	if err := h.nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	_, check := h.syncer.Describe(h.view(), httpPort("web"))
	if got, err := check(); err != nil || len(got) > 0 {
		t.Errorf("verify over upstream's form: %q, %v", got, err)
	}
}
