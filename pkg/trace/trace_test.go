package trace

import (
	"strings"
	"testing"
)

// Each bad field gets an error naming it and what it should be.
func TestParsePacketNamesWhatIsWrong(t *testing.T) {
	cases := []struct {
		src, dst, port, protocol, from, want string
	}{
		{"", "10.96.0.10", "80", "tcp", "pod", "source address is missing"},
		{"10.0.0.300", "10.96.0.10", "80", "tcp", "pod", `source "10.0.0.300" is not an IP address`},
		{"10.0.0.1", "my-svc", "80", "tcp", "pod", `destination "my-svc" is not an IP address`},
		{"10.0.0.1", "fd00::1", "80", "tcp", "pod", "of different IP families"},
		{"10.0.0.1", "10.96.0.10", "http", "tcp", "pod", `port "http" is not a port number (1-65535)`},
		{"10.0.0.1", "10.96.0.10", "70000", "tcp", "pod", `port "70000" is not a port number`},
		{"10.0.0.1", "10.96.0.10", "0", "tcp", "pod", `port "0" is not a port number`},
		{"10.0.0.1", "10.96.0.10", "80", "icmp", "pod", `protocol "icmp" is not TCP, UDP or SCTP`},
		{"10.0.0.1", "10.96.0.10", "80", "tcp", "", "from is missing"},
		{"10.0.0.1", "10.96.0.10", "80", "tcp", "elsewhere", `from "elsewhere" is not pod`},
	}
	for _, tc := range cases {
		_, err := ParsePacket(tc.src, tc.dst, tc.port, tc.protocol, tc.from)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePacket(%q, %q, %q, %q, %q): %v, want an error saying %q", tc.src, tc.dst, tc.port, tc.protocol, tc.from, err, tc.want)
		}
	}
	p, err := ParsePacket(" ::ffff:10.0.0.1", "10.96.0.10", "53", "udp", "Node")
	if err != nil || p.Source.String() != "10.0.0.1" || p.Protocol != "UDP" || p.From != FromNode || p.Port != 53 {
		t.Errorf("ParsePacket: %+v, %v", p, err)
	}
}

// rules is a ruleset of chains whose rules are their effects by name.
type rules struct {
	chains  map[string][]string
	effects map[string]Effect
}

func (r rules) Rules(chain string) ([]string, bool) { c, ok := r.chains[chain]; return c, ok }

func (r rules) Eval(_, rule string) (bool, Effect, error) {
	e, ok := r.effects[rule]
	return ok, e, nil
}

// The walker splits at random picks, follows jumps and returns, and
// leaves out the jump into a chain that matched nothing.
func TestWalk(t *testing.T) {
	r := rules{
		chains: map[string][]string{
			"start":  {"to-empty", "mark", "to-spread", "never"},
			"empty":  {},
			"spread": {"third", "half", "rest"},
			"ep-a":   {"dnat-a"},
			"ep-b":   {"dnat-b"},
			"ep-c":   {"drop"},
		},
		effects: map[string]Effect{
			"to-empty":  {Verdict: Jump, Chain: "empty"},
			"mark":      {Masquerade: true},
			"to-spread": {Verdict: Jump, Chain: "spread"},
			"third":     {Verdict: Goto, Chain: "ep-a", Share: 1.0 / 3},
			"half":      {Verdict: Goto, Chain: "ep-b", Share: 0.5},
			"rest":      {Verdict: Goto, Chain: "ep-c"},
			"dnat-a":    {Verdict: DNAT},
			"dnat-b":    {Verdict: DNAT},
			"drop":      {Verdict: Drop},
		},
	}
	branches, err := Walk(r, "t ", "start")
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	res.SetBranches(branches)
	if len(branches) != 3 || res.Outcome.Verdict != Mixed || !res.Outcome.Masquerade {
		t.Fatalf("branches %+v, outcome %+v", branches, res.Outcome)
	}
	if len(res.Steps) != 2 || res.Steps[0].What != "mark" || res.Steps[1].What != "to-spread" {
		t.Errorf("common steps %+v: want the mark and the jump to spread, not the jump into the empty chain", res.Steps)
	}
	for i, want := range []float64{1.0 / 3, 1.0 / 3, 1.0 / 3} {
		if d := branches[i].Probability - want; d > 1e-9 || d < -1e-9 {
			t.Errorf("branch %d has probability %v, want %v", i, branches[i].Probability, want)
		}
	}
	if _, err := Walk(r, "", "nowhere"); err == nil || !strings.Contains(err.Error(), "chain nowhere does not exist") {
		t.Errorf("a missing chain: %v", err)
	}
}
