package iptables

import (
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/iptables/iptablestest"
)

// Upstream's IPVS mode writes KUBE-IPVS-OUT-FILTER's rules in its map's
// order: a full sync over them leaves an unordered chain that holds the
// same rules alone, and rewrites one whose rules differ, or whose order
// matters.
func TestChainSetKeepsAnUnorderedChainInAnotherOrder(t *testing.T) {
	drop := func(ip string) Rule {
		return Rule("-s " + ip + "/32 -m ipvs --vproto 6 --vaddr " + ip + " --vport 80 -j DROP")
	}
	kernel := "*filter\n:KUBE-IPVS-OUT-FILTER - [0:0]\n" +
		"-A KUBE-IPVS-OUT-FILTER " + string(drop("10.255.3.40")) + "\n" +
		"-A KUBE-IPVS-OUT-FILTER " + string(drop("10.255.3.30")) + "\n" +
		"COMMIT\n"
	for _, tc := range []struct {
		name      string
		rules     []Rule
		unordered bool
		rewritten bool
	}{
		{"the same rules in another order", []Rule{drop("10.255.3.30"), drop("10.255.3.40")}, true, false},
		{"the same rules in another order, order mattering", []Rule{drop("10.255.3.30"), drop("10.255.3.40")}, false, true},
		{"one rule more", []Rule{drop("10.255.3.30"), drop("10.255.3.40"), drop("10.255.3.50")}, true, true},
		{"another rule", []Rule{drop("10.255.3.30"), drop("10.255.3.50")}, true, true},
	} {
		k := &iptablestest.SavedKernel{Saved: kernel}
		chains := map[Table][]OwnChain{TableFilter: {{Name: "KUBE-IPVS-OUT-FILTER", Rules: tc.rules, Unordered: tc.unordered}}}
		if err := NewChainSet(k).Sync(chains, nil, true); err != nil {
			t.Fatal(err)
		}
		if rewritten := strings.Contains(k.Written.String(), "-A KUBE-IPVS-OUT-FILTER"); rewritten != tc.rewritten {
			t.Errorf("%s: rewritten %t, want %t:\n%s", tc.name, rewritten, tc.rewritten, k.Written.String())
		}
	}
}

// A full Sync after Prepare compares with what Prepare read, unordered
// chains included, while the tables' generations have not moved; after
// they moved it reads the tables again.
func TestChainSetTakesThePreparedReadWhileTheTablesAreUnchanged(t *testing.T) {
	drop := func(ip string) Rule {
		return Rule("-s " + ip + "/32 -m ipvs --vproto 6 --vaddr " + ip + " --vport 80 -j DROP")
	}
	k := &iptablestest.SavedKernel{Saved: "*filter\n:KUBE-IPVS-OUT-FILTER - [0:0]\n" +
		"-A KUBE-IPVS-OUT-FILTER " + string(drop("10.255.3.40")) + "\n" +
		"-A KUBE-IPVS-OUT-FILTER " + string(drop("10.255.3.30")) + "\n" +
		"COMMIT\n"}
	chains := map[Table][]OwnChain{TableFilter: {{Name: "KUBE-IPVS-OUT-FILTER", Rules: []Rule{drop("10.255.3.30"), drop("10.255.3.40")}, Unordered: true}}}
	for _, moved := range []bool{false, true} {
		k.Saves = 0
		k.Written.Reset()
		s := NewChainSet(k)
		s.Prepare(chains)
		if moved {
			k.TableGeneration++
		}
		if err := s.Sync(chains, nil, true); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 1, true: 2}[moved]; k.Saves != want {
			t.Errorf("generation moved %t: %d reads of the tables, want %d", moved, k.Saves, want)
		}
		if k.Written.Len() != 0 {
			t.Errorf("generation moved %t: the sync wrote\n%s", moved, k.Written.String())
		}
	}
}
