package preflight

import (
	"slices"
	"strings"
	"testing"
)

func TestForeignReferences(t *testing.T) {
	for _, tc := range []struct {
		name, table, line string
		found             bool
	}{
		{"a CNI chain jumps into KUBE-SERVICES", "nat", "-A CNI-FOO -j KUBE-SERVICES", true},
		{"a CNI chain goes to a service chain", "nat", "-A CNI-FOO -d 10.96.0.10/32 -g KUBE-SVC-XPGD46QRK7WJZT7O", true},
		{"a built-in chain jumps in, not as kube-proxy does", "nat", "-A PREROUTING -i cni0 -j KUBE-SERVICES", true},
		{"kube-proxy's jump, in another table", "filter", "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES", true},
		{"a firewall marks for kube-proxy's masquerade", "nat", "-A FW-NAT -s 10.0.0.0/8 -j KUBE-MARK-MASQ", true},
		{"a CNI chain matches the IPVS mode's set", "filter", "-A CNI-FORWARD -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT", true},
		{"negated, the IPv6 set", "filter", "-A FORWARD -m set ! --match-set KUBE-6-LOAD-BALANCER dst,dst -j DROP", true},
		{"kube-proxy's own jump", "nat", "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES", false},
		{"kube-proxy's own jump, masquerade", "nat", "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING", false},
		{"the IPVS mode's own jump", "filter", "-A OUTPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER", false},
		{"the localnet guard's jump", "filter", "-A INPUT -j KUBE-FIREWALL", false},
		{"a rule inside kube-proxy's chain", "nat", "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ", false},
		{"another program's KUBE- chain", "mangle", "-A FOO -j KUBE-KUBELET-CANARY", false},
		{"another program's set", "filter", "-A FORWARD -m set --match-set KUBE-MY-OWN dst -j ACCEPT", false},
		{"no jump", "filter", "-A CNI-FORWARD -d 10.244.0.0/24 -j ACCEPT", false},
	} {
		saved := "*" + tc.table + "\n:FOO - [0:0]\n" + tc.line + "\nCOMMIT\n"
		got := foreignReferences(saved)
		want := []string(nil)
		if tc.found {
			want = []string{tc.table + ": " + tc.line}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q", tc.name, got, want)
		}
	}
}

// Every jump either mode makes from a built-in chain is kube-proxy's own,
// as written and in the form iptables-save prints.
func TestOwnJumps(t *testing.T) {
	if len(ownJumps) < 20 {
		t.Fatalf("%d own jumps", len(ownJumps))
	}
	var saved strings.Builder
	for _, j := range ownJumps {
		saved.WriteString("*" + string(j.Table) + "\n-A " + string(j.From) + " " + string(j.Rule) + "\nCOMMIT\n")
	}
	if got := foreignReferences(saved.String()); len(got) > 0 {
		t.Errorf("own jumps found foreign: %q", got)
	}
	if got := foreignReferences(cleanSaved); len(got) > 0 {
		t.Errorf("a clean node's rules found foreign: %q", got)
	}
}

func TestSavedLines(t *testing.T) {
	for line, keep := range map[string]bool{
		"*nat":                               true,
		":KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]": true,
		"-A KUBE-SVC-XPGD46QRK7WJZT7O -j KUBE-SEP-SXIVWICOYRO3J4NJ":     false,
		"-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-XPGD46QRK7WJZT7O": false,
		"-A CNI-FOO -j KUBE-SERVICES":                                   true,
		"-A PREROUTING -j KUBE-SERVICES":                                true,
		"COMMIT":                                                        true,
	} {
		if got := keepSavedLine(line); got != keep {
			t.Errorf("keepSavedLine(%q) = %v", line, got)
		}
	}
	if !holdsKubeProxyChains(cleanSaved) {
		t.Error("holdsKubeProxyChains(cleanSaved) = false")
	}
	if holdsKubeProxyChains("*filter\n:INPUT ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n-A INPUT -j KUBE-SERVICES\nCOMMIT\n") {
		t.Error("holdsKubeProxyChains of a kubelet chain and a jump = true")
	}
}
