package trace

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
)

// IPTablesRuleset is iptables chains for a walk: the iptables mode's, and
// the IPVS mode's around its sets. Chains are named "table CHAIN".
type IPTablesRuleset struct {
	Packet Packet
	// MatchSet tells whether the packet matches an ipset with the
	// direction flags ("dst,dst"); nil matches none.
	MatchSet func(set, flags string) bool
	chains   map[string][]string
}

// NewIPTablesRuleset is a ruleset for pkt with the built-in chains, empty.
func NewIPTablesRuleset(pkt Packet) *IPTablesRuleset {
	rs := &IPTablesRuleset{Packet: pkt, chains: map[string][]string{}}
	for _, hook := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
		rs.chains[string(iptableskernel.TableNAT)+" "+hook] = []string{}
		rs.chains[string(iptableskernel.TableFilter)+" "+hook] = []string{}
	}
	return rs
}

// Add appends rules to a chain, creating it.
func (rs *IPTablesRuleset) Add(table iptableskernel.Table, chain iptableskernel.Chain, rules ...iptableskernel.Rule) {
	key := string(table) + " " + string(chain)
	if rs.chains[key] == nil {
		rs.chains[key] = []string{}
	}
	for _, r := range rules {
		rs.chains[key] = append(rs.chains[key], string(r))
	}
}

// Hooks walks the nat hook (PREROUTING, or OUTPUT for the node's own
// packets), then, for what no DNAT took, the filter hook: INPUT for a
// local destination, FORWARD, or OUTPUT.
func (rs *IPTablesRuleset) Hooks(localDestination bool) ([]Branch, error) {
	natHook, filterHook := "PREROUTING", "FORWARD"
	switch {
	case rs.Packet.From == FromNode:
		natHook, filterHook = "OUTPUT", "OUTPUT"
	case localDestination:
		filterHook = "INPUT"
	}
	nat, err := Walk(rs, "", string(iptableskernel.TableNAT)+" "+natHook)
	if err != nil {
		return nil, err
	}
	var out []Branch
	for _, b := range nat {
		// An ACCEPT in nat ends the hook, not the packet's way.
		if b.Verdict != PassedOn && b.Verdict != Accept {
			out = append(out, b)
			continue
		}
		filter, err := Walk(rs, "", string(iptableskernel.TableFilter)+" "+filterHook)
		if err != nil {
			return nil, err
		}
		out = append(out, Extend(b, filter)...)
	}
	return out, nil
}

// Rules is a chain's rules.
func (rs *IPTablesRuleset) Rules(chain string) ([]string, bool) {
	rules, ok := rs.chains[chain]
	return rules, ok
}

// Eval tells whether a rule matches the first packet of a new connection
// and what it does. It knows the matches and targets the modes write;
// any other is an error rather than a guess.
func (rs *IPTablesRuleset) Eval(chain, rule string) (bool, Effect, error) {
	table, _, _ := strings.Cut(chain, " ")
	ev := &ruleEval{rs: rs, table: table, args: iptableskernel.Args(iptableskernel.Rule(rule)), matched: true}
	for ; ev.next < len(ev.args); ev.next++ {
		if err := ev.option(ev.args[ev.next]); err != nil {
			return false, ev.effect, err
		}
	}
	return ev.matched, ev.effect, nil
}

// ruleEval is one rule's evaluation: its arguments, the one it is at,
// and what it found so far. A "!" negates the next test only.
type ruleEval struct {
	rs              *IPTablesRuleset
	table           string
	args            []string
	next            int
	matched, negate bool
	effect          Effect
}

// test records the outcome of a match, negated if a "!" came before it.
func (ev *ruleEval) test(ok bool) {
	if ok == ev.negate {
		ev.matched = false
	}
	ev.negate = false
}

// value takes the value of the option at next.
func (ev *ruleEval) value() (string, error) {
	if ev.next+1 >= len(ev.args) {
		return "", fmt.Errorf("%s without a value", ev.args[ev.next])
	}
	ev.next++
	return ev.args[ev.next], nil
}

// option evaluates the option a, at next, with its values.
func (ev *ruleEval) option(a string) error {
	if a == "!" {
		ev.negate = true
		return nil
	}
	if flag, ok := flagOptions[a]; ok {
		flag(ev)
		return nil
	}
	if a == "--match-set" {
		return ev.matchSet()
	}
	if !strings.HasPrefix(a, "-") {
		return fmt.Errorf("the trace does not know the match or option %q", a)
	}
	v, err := ev.value()
	if err != nil {
		return err
	}
	eval, ok := valueOptions[a]
	if !ok {
		return fmt.Errorf("the trace does not know the match or option %q", a)
	}
	return eval(ev, a, v)
}

// flagOptions evaluate the options without a value.
var flagOptions = map[string]func(*ruleEval){
	"--reap": noEffect, "--set": noEffect, "--random-fully": noEffect,
	// The node's pods are routed, not bridged.
	"--physdev-is-in": func(ev *ruleEval) { ev.test(false) },
	// A client seen before goes back to its endpoint; a new one does not
	// match (session affinity, see the outcome).
	"--rcheck": func(ev *ruleEval) { ev.matched = false },
}

func noEffect(*ruleEval) {}

// valueOptions evaluate the options with one value, by keyword.
var valueOptions = map[string]func(ev *ruleEval, option, v string) error{
	"-m": ignoreValue, "--comment": ignoreValue, "--mode": ignoreValue, "--name": ignoreValue,
	"--nfacct-name": ignoreValue, "--seconds": ignoreValue,
	"--or-mark":  (*ruleEval).orMark,
	"--xor-mark": (*ruleEval).xorMark,
	"-p":         (*ruleEval).protocol,
	"-d":         (*ruleEval).address, "-s": (*ruleEval).address,
	"--dport": (*ruleEval).port, "--vport": (*ruleEval).port,
	"--vaddr":    (*ruleEval).virtualAddress,
	"--vproto":   (*ruleEval).virtualProtocol,
	"--dst-type": (*ruleEval).addressType, "--src-type": (*ruleEval).addressType,
	"-i":               (*ruleEval).inInterface,
	"--ctstate":        (*ruleEval).connectionState,
	"--mark":           (*ruleEval).mark,
	"--probability":    (*ruleEval).probability,
	"--to-destination": (*ruleEval).toDestination,
	"-j":               (*ruleEval).target,
}

func ignoreValue(*ruleEval, string, string) error { return nil }

func (ev *ruleEval) orMark(string, string) error {
	ev.effect.Masquerade = true
	return nil
}

func (ev *ruleEval) xorMark(string, string) error {
	return fmt.Errorf("the trace follows no rule that clears the mark")
}

// matchSet tests the packet against an ipset with direction flags.
func (ev *ruleEval) matchSet() error {
	if ev.next+2 >= len(ev.args) {
		return fmt.Errorf("--match-set without a set and flags")
	}
	set, flags := ev.args[ev.next+1], ev.args[ev.next+2]
	ev.test(ev.rs.MatchSet != nil && ev.rs.MatchSet(set, flags))
	ev.next += 2
	return nil
}

func (ev *ruleEval) protocol(_, v string) error {
	ev.test(strings.EqualFold(v, string(ev.rs.Packet.Protocol)))
	return nil
}

// address tests the destination (-d) or source (-s) address.
func (ev *ruleEval) address(option, v string) error {
	prefix, err := parsePrefix(v)
	if err != nil {
		return err
	}
	addr := ev.rs.Packet.Destination
	if option == "-s" {
		addr = ev.rs.Packet.Source
	}
	ev.test(prefix.Contains(addr))
	return nil
}

func (ev *ruleEval) port(_, v string) error {
	ev.test(v == strconv.Itoa(int(ev.rs.Packet.Port)))
	return nil
}

func (ev *ruleEval) virtualAddress(_, v string) error {
	ev.test(v == ev.rs.Packet.Destination.String())
	return nil
}

func (ev *ruleEval) virtualProtocol(_, v string) error {
	ev.test(v == map[string]string{"TCP": "6", "UDP": "17", "SCTP": "132"}[string(ev.rs.Packet.Protocol)])
	return nil
}

// addressType tests whether the destination (--dst-type) or the source
// (--src-type, the node's own packets) is local.
func (ev *ruleEval) addressType(option, v string) error {
	local := ev.rs.Packet.LocalDestination
	if option == "--src-type" {
		local = ev.rs.Packet.From == FromNode
	}
	ev.test(v == "LOCAL" && local)
	return nil
}

// inInterface: only the local-traffic detector matches interfaces, the
// interfaces of this node's pods.
func (ev *ruleEval) inInterface(string, string) error {
	ev.test(ev.rs.Packet.From == FromPod)
	return nil
}

// connectionState: the first packet of a new connection not DNATed (a
// DNATed one ends the trace in the nat table).
func (ev *ruleEval) connectionState(_, v string) error {
	ev.test(v == "NEW" || strings.HasPrefix(v, "NEW,"))
	return nil
}

// mark: only the masquerade mark is matched on, in chains that packets
// reach marked only once DNATed.
func (ev *ruleEval) mark(string, string) error {
	ev.test(false)
	return nil
}

func (ev *ruleEval) probability(_, v string) error {
	share, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return fmt.Errorf("probability %q", v)
	}
	ev.effect.Share = share
	return nil
}

func (ev *ruleEval) toDestination(_, v string) error {
	to, err := netip.ParseAddrPort(v)
	if err != nil {
		return fmt.Errorf("DNAT to %q", v)
	}
	ev.effect.To = to
	return nil
}

// targetVerdicts are the verdicts of the targets that end the walk in
// this chain; any other target but MARK is a jump to a chain.
var targetVerdicts = map[string]Verdict{"ACCEPT": Accept, "DROP": Drop, "REJECT": Reject, "RETURN": Return, "DNAT": DNAT}

func (ev *ruleEval) target(_, v string) error {
	switch verdict, ok := targetVerdicts[v]; {
	case ok:
		ev.effect.Verdict = verdict
	case v == "MARK":
	case v == "MASQUERADE":
		ev.effect.Verdict, ev.effect.Masquerade = Accept, true
	default:
		ev.effect.Verdict, ev.effect.Chain = Jump, ev.table+" "+v
	}
	return nil
}

// parsePrefix reads an address or prefix as a rule writes it.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("address %q", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("address %q", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
