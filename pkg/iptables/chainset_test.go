package iptables

import (
	"io"
	"strings"
	"testing"
)

// savedKernel holds fixed iptables-save output and records restores;
// generation is every table's, saves counts the reads.
type savedKernel struct {
	recordingKernel
	save       string
	generation uint64
	saves      int
}

func (k *savedKernel) Save(read func(io.Reader) error) error {
	k.saves++
	return read(strings.NewReader(k.save))
}

func (k *savedKernel) Generation(string) (uint64, error) { return k.generation, nil }

// ListRules lists a chain's rules as the saved output holds them.
func (k *savedKernel) ListRules(table, chain string) ([]string, error) {
	var rules []string
	inTable := false
	for _, line := range strings.Split(k.save, "\n") {
		if name, ok := strings.CutPrefix(line, "*"); ok {
			inTable = name == table
		} else if rule, ok := strings.CutPrefix(line, "-A "+chain+" "); ok && inTable {
			rules = append(rules, rule)
		}
	}
	return rules, nil
}

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
		k := &savedKernel{save: kernel}
		chains := map[Table][]OwnChain{TableFilter: {{Name: "KUBE-IPVS-OUT-FILTER", Rules: tc.rules, Unordered: tc.unordered}}}
		if err := NewChainSet(k).Sync(chains, nil, true); err != nil {
			t.Fatal(err)
		}
		if rewritten := strings.Contains(k.written.String(), "-A KUBE-IPVS-OUT-FILTER"); rewritten != tc.rewritten {
			t.Errorf("%s: rewritten %t, want %t:\n%s", tc.name, rewritten, tc.rewritten, k.written.String())
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
	k := &savedKernel{save: "*filter\n:KUBE-IPVS-OUT-FILTER - [0:0]\n" +
		"-A KUBE-IPVS-OUT-FILTER " + string(drop("10.255.3.40")) + "\n" +
		"-A KUBE-IPVS-OUT-FILTER " + string(drop("10.255.3.30")) + "\n" +
		"COMMIT\n"}
	chains := map[Table][]OwnChain{TableFilter: {{Name: "KUBE-IPVS-OUT-FILTER", Rules: []Rule{drop("10.255.3.30"), drop("10.255.3.40")}, Unordered: true}}}
	for _, moved := range []bool{false, true} {
		k.saves = 0
		k.written.Reset()
		s := NewChainSet(k)
		s.Prepare(chains)
		if moved {
			k.generation++
		}
		if err := s.Sync(chains, nil, true); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 1, true: 2}[moved]; k.saves != want {
			t.Errorf("generation moved %t: %d reads of the tables, want %d", moved, k.saves, want)
		}
		if k.written.Len() != 0 {
			t.Errorf("generation moved %t: the sync wrote\n%s", moved, k.written.String())
		}
	}
}
