package vm_test

import (
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// TestIPVSModeMatchesUpstream runs our kube-proxy in IPVS mode in the VM
// against the services upstream's was recorded with (layoutFile), and
// compares what the kernel holds: virtual and real servers, ipsets and
// their entries, iptables chains and rules of both families, the dummy
// link's addresses and the sysctls. A node can then move between the two
// without anything to rewrite.
func TestIPVSModeMatchesUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	want, err := os.ReadFile(layoutFile)
	if err != nil {
		t.Fatal(err)
	}
	cluster := startCluster(t)
	got := programLayout(t, cluster, cluster.KubeProxy())
	for _, section := range comparedSections {
		w, g := normalize(section, string(want)), normalize(section, string(got))
		if w == "" {
			t.Errorf("%s: nothing to compare in %s", section, layoutFile)
		}
		if w != g {
			t.Errorf("%s differs from upstream's:\n%s", section, testutil.LineDiff(w, g))
		}
	}
}

// comparedSections are the layout's sections that must be equal;
// ipvsadm -Ln says what -S -n does, and the loaded modules may differ.
var comparedSections = []string{"ipvsadm -S -n", "ipset save", "iptables-save", "ip6tables-save", "ip addr show kube-ipvs0", "sysctls"}

// section is the body of one "### name" section of a layout.
func section(layout, name string) []string {
	_, rest, ok := strings.Cut(layout, "### "+name+"\n")
	if !ok {
		return nil
	}
	body, _, _ := strings.Cut(rest, "\n### ")
	return strings.Split(strings.TrimSpace(body), "\n")
}

var (
	initval   = regexp.MustCompile(` initval 0x[0-9a-f]+`)
	ifaceAddr = regexp.MustCompile(`^\s+inet6? (\S+)`)
	// setSysctls are the sysctls the IPVS mode sets (the others are the
	// kernel's, or the test's).
	setSysctls = regexp.MustCompile(`^net/ipv4/(vs/(conntrack|expire_nodest_conn|expire_quiescent_template|conn_reuse_mode)|ip_forward|conf/all/arp_(ignore|announce)) = `)
)

// normalize puts a section in a form where only what the kernel does
// with it counts: ipset's random initval and the order of sets, entries
// and virtual servers, which is the kernel's hash order, are left out;
// iptables chains are compared rule by rule in their order.
func normalize(name, layout string) string {
	lines := section(layout, name)
	var out []string
	switch name {
	case "ipvsadm -S -n", "ipset save":
		for _, l := range lines {
			out = append(out, initval.ReplaceAllString(l, ""))
		}
		slices.Sort(out)
	case "iptables-save", "ip6tables-save":
		var table string
		rules := map[string][]string{}
		for _, l := range lines {
			switch {
			case strings.HasPrefix(l, "*"):
				table = l
			case strings.HasPrefix(l, ":"):
				out = append(out, table+" "+l)
			case strings.HasPrefix(l, "-A "):
				chain := strings.Fields(l)[1]
				rules[table+" "+chain] = append(rules[table+" "+chain], l)
			}
		}
		slices.Sort(out)
		for _, c := range slices.Sorted(maps.Keys(rules)) {
			out = append(out, fmt.Sprintf("%s: %s", c, strings.Join(rules[c], " | ")))
		}
	case "ip addr show kube-ipvs0":
		for _, l := range lines {
			if m := ifaceAddr.FindStringSubmatch(l); m != nil {
				out = append(out, m[1])
			}
		}
		slices.Sort(out)
	case "sysctls":
		for _, l := range lines {
			if setSysctls.MatchString(l) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}
