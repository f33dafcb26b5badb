package iptables

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/badinput"
	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
)

var families = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

// fuzzParams are node settings under which every kind of rule is
// written (the nfacct counting rules only when nfacct is there), those of
// the golden tests too.
func fuzzParams(t testing.TB, family v1.IPFamily, nfacct bool) Params {
	t.Helper()
	cidr, nodeIP := "10.244.0.0/16", "10.255.0.2"
	if family == v1.IPv6Protocol {
		cidr, nodeIP = "fd00:244::/56", "fd00:255::2"
	}
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{cidr}}, family)
	if err != nil {
		t.Fatal(err)
	}
	return Params{IPv6: family == v1.IPv6Protocol, MasqueradeBit: 14, LocalhostNodePorts: true,
		LocalDetector: detector, NodeIP: netip.MustParseAddr(nodeIP), NFAcct: nfacct}
}

// objectsProxier is a proxier on kernel that has been given the objects
// and told its caches are complete.
func objectsProxier(t testing.TB, family v1.IPFamily, kernel iptableskernel.Kernel, nfacct bool, objs ...badinput.Objects) testProxier {
	t.Helper()
	p := newProxier(Config{Family: family, Kernel: kernel, Params: fuzzParams(t, family, nfacct), SyncPeriod: time.Minute}, nodeName)
	for _, o := range objs {
		deliver(p, o)
	}
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	return p
}

func deliver(p testProxier, o badinput.Objects) {
	for _, s := range o.Services {
		p.OnService(s, false)
	}
	for _, s := range o.EndpointSlices {
		p.OnEndpointSlice(s, false)
	}
}

// firstSync is the restore input of a first full sync (on an empty
// kernel) of these objects.
func firstSync(t testing.TB, family v1.IPFamily, nfacct bool, objs ...badinput.Objects) string {
	t.Helper()
	kernel := &recordingKernel{}
	if err := objectsProxier(t, family, kernel, nfacct, objs...).sync(); err != nil {
		t.Fatal(err)
	}
	return kernel.written.String()
}

func uncommented(rules []string) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = withoutComment(iptableskernel.Rule(r))
	}
	return out
}

// restoreChains reads a first sync's input: each chain's rules, by
// "table chain".
func restoreChains(input string) map[string][]string {
	chains := map[string][]string{}
	table := ""
	for _, line := range strings.Split(input, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			chains[table+" "+name] = chains[table+" "+name][:0]
		case strings.HasPrefix(line, "-A "), strings.HasPrefix(line, "-I "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			if line[1] == 'I' {
				_, rule, _ = strings.Cut(rule, " ") // the position
			}
			chains[table+" "+chain] = append(chains[table+" "+chain], rule)
		}
	}
	return chains
}

// malformedLines lists what in a restore input iptables-restore would
// refuse, or what reads back differently.
func malformedLines(family v1.IPFamily, input string) []string {
	var bad []string
	for n, line := range strings.Split(strings.TrimSuffix(input, "\n"), "\n") {
		what := fmt.Sprintf("line %d %q", n+1, line)
		switch {
		case line == "COMMIT" || line == "# restore" || line == "*nat" || line == "*filter" || line == "*mangle":
		case strings.HasPrefix(line, ":") && strings.HasSuffix(line, " - [0:0]"):
			if chain := strings.TrimSuffix(line[1:], " - [0:0]"); len(chain) > 28 || strings.ContainsAny(chain, " \"'") {
				bad = append(bad, what+": chain name")
			}
		case strings.HasPrefix(line, "-X "):
		case strings.HasPrefix(line, "-A "), strings.HasPrefix(line, "-I "), strings.HasPrefix(line, "-D "):
			_, rule, _ := strings.Cut(line[3:], " ")
			if line[1] == 'I' {
				_, rule, _ = strings.Cut(rule, " ")
			}
			for _, problem := range ruleProblems(family, iptableskernel.Rule(rule)) {
				bad = append(bad, what+": "+problem)
			}
		default:
			bad = append(bad, what+": not a restore line")
		}
	}
	return bad
}

// ruleProblems lists what is wrong with one rule: its canonical form is
// not a fixed point, an address of the other family, a port out of range,
// a comment over the 255 bytes xt_comment keeps, a probability or
// affinity timeout iptables refuses.
func ruleProblems(family v1.IPFamily, r iptableskernel.Rule) []string {
	var bad []string
	if c := iptableskernel.CanonicalRule(r); iptableskernel.CanonicalRule(iptableskernel.Rule(c)) != c {
		bad = append(bad, "canonical form changes again: "+c)
	}
	args := iptableskernel.Args(r)
	ofFamily := func(a netip.Addr) bool { return a.Is4() == (family == v1.IPv4Protocol) }
	for i := 0; i+1 < len(args); i++ {
		v := args[i+1]
		switch args[i] {
		case "-s", "-d":
			a, err := netip.ParseAddr(v)
			if p, perr := netip.ParsePrefix(v); perr == nil {
				a, err = p.Addr(), nil
			}
			if err != nil || !ofFamily(a) {
				bad = append(bad, "address "+v)
			}
		case "--to-destination":
			if ap, err := netip.ParseAddrPort(v); err != nil || !ofFamily(ap.Addr()) || ap.Port() == 0 {
				bad = append(bad, "destination "+v)
			}
		case "--dport":
			if p, err := strconv.Atoi(v); err != nil || p < 1 || p > 65535 {
				bad = append(bad, "port "+v)
			}
		case "--comment":
			if len(v) > 255 {
				bad = append(bad, fmt.Sprintf("comment of %d bytes", len(v)))
			}
		case "--probability":
			if p, err := strconv.ParseFloat(v, 64); err != nil || p < 0 || p > 1 || math.IsNaN(p) {
				bad = append(bad, "probability "+v)
			}
		case "--seconds":
			if s, err := strconv.Atoi(v); err != nil || s < 1 {
				bad = append(bad, "affinity timeout "+v)
			}
		}
	}
	return bad
}

// FuzzServiceRules puts arbitrary Services and EndpointSlices (JSON, see
// internal/badinput) next to good ones through a first full sync of each
// family: every line written is one iptables-restore takes, every rule
// is well-formed, and the good services keep their rules. Seeds:
// testdata/fuzz/FuzzServiceRules, one per kind of bad input.
func FuzzServiceRules(f *testing.F) {
	good := map[v1.IPFamily]string{}
	for _, family := range families {
		good[family] = firstSync(f, family, true, badinput.Good())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, ok := badinput.Decode(data)
		if !ok {
			return
		}
		for _, family := range families {
			input := firstSync(t, family, true, badinput.Good(), objs)
			if bad := malformedLines(family, input); len(bad) > 0 {
				t.Errorf("%s: malformed restore input:\n%s", family, strings.Join(bad, "\n"))
			}
			if objs.UsesGoodNames() {
				continue
			}
			if missing := missingGoodRules(good[family], input); len(missing) > 0 {
				t.Errorf("%s: good services lost rules next to bad objects:\n%s", family, strings.Join(missing, "\n"))
			}
		}
	})
}

// missingGoodRules lists the good services' rules that input lacks: their
// own chains must be identical, and the shared chains hold their rules.
// Comments do not count: many endpoints (a large cluster) leave some out.
func missingGoodRules(good, input string) []string {
	have := restoreChains(input)
	var missing []string
	for key, rules := range restoreChains(good) {
		table, chain, _ := strings.Cut(key, " ")
		if iptableskernel.IsServiceChain(iptableskernel.Chain(chain)) {
			if !slices.Equal(uncommented(have[key]), uncommented(rules)) {
				missing = append(missing, fmt.Sprintf("%s %s differs", table, chain))
			}
			continue
		}
		kept := uncommented(have[key])
		for _, r := range uncommented(rules) {
			if !slices.Contains(kept, r) {
				missing = append(missing, fmt.Sprintf("%s %s: %s", table, chain, r))
			}
		}
	}
	return missing
}

// FuzzIPTablesSave feeds arbitrary iptables-save output to the parser of
// a full sync: it never fails but on an overlong line, the canonical form
// of every rule is its own canonical form, and so the text with every
// rule in canonical form reads as the same chains. Seeds:
// testdata/fuzz/FuzzIPTablesSave (what iptables-save printed for every
// kind of rule, and odd input).
func FuzzIPTablesSave(f *testing.F) {
	// The built-in chains' rules are kept as text, the others' as
	// fingerprints, as a full sync keeps them.
	keep := func(_ iptableskernel.Table, c iptableskernel.Chain) iptableskernel.RuleKeeping {
		if iptableskernel.BuiltinChains[c] {
			return iptableskernel.KeepRuleText
		}
		return iptableskernel.KeepRuleFingerprints
	}
	f.Fuzz(func(t *testing.T, save string) {
		tables, err := iptableskernel.ReadTables(strings.NewReader(save), keep)
		if err != nil {
			if !errors.Is(err, bufio.ErrTooLong) {
				t.Fatalf("reading: %v", err)
			}
			return
		}
		var canonical strings.Builder
		declared := map[iptableskernel.Table][]iptableskernel.Chain{}
		var table iptableskernel.Table
		for _, line := range strings.Split(save, "\n") {
			if chain, rule, ok := strings.Cut(strings.TrimPrefix(line, "-A "), " "); ok && strings.HasPrefix(line, "-A ") {
				c := iptableskernel.CanonicalRule(iptableskernel.Rule(rule))
				if again := iptableskernel.CanonicalRule(iptableskernel.Rule(c)); again != c {
					t.Fatalf("canonical form of %q changes again:\n %s\n %s", rule, c, again)
				}
				line = "-A " + chain + " " + c
			}
			if name, ok := strings.CutPrefix(line, "*"); ok {
				table = iptableskernel.Table(name)
			} else if name, _, ok := strings.Cut(strings.TrimPrefix(line, ":"), " "); ok && strings.HasPrefix(line, ":") {
				// Chains declared before any table are not read.
				if _, read := tables[table]; read {
					declared[table] = append(declared[table], iptableskernel.Chain(name))
				}
			}
			canonical.WriteString(line + "\n")
		}
		again, err := iptableskernel.ReadTables(strings.NewReader(canonical.String()), keep)
		if err != nil {
			t.Fatalf("reading the canonical text: %v", err)
		}
		for table, chains := range declared {
			for _, chain := range chains {
				fp, ok := tables[table].Fingerprint(chain)
				if fpAgain, okAgain := again[table].Fingerprint(chain); fp != fpAgain || ok != okAgain {
					t.Errorf("%s %s reads differently with its rules in canonical form", table, chain)
				}
				if !slices.Equal(again[table].RuleFingerprints(chain), tables[table].RuleFingerprints(chain)) {
					t.Errorf("%s %s: its rules' fingerprints differ with the rules in canonical form", table, chain)
				}
			}
		}
	})
}
