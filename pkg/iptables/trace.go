package iptables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Trace follows a packet through the rules a sync writes: the fixed ones
// (StaticRules) and those of the service port it is addressed to
// (ServiceRules with the endpoints selected for this node; svc nil when
// it is addressed to none). First the nat table's hook (PREROUTING, or
// OUTPUT for the node's own traffic), then, unless a DNAT took it, the
// filter table's (INPUT for a local destination, FORWARD, or OUTPUT).
// Other services' rules match other addresses or ports, so they are left
// out.
func (p *Params) Trace(svc *state.ServicePort, sel state.Selection, pkt trace.Packet) ([]trace.Branch, error) {
	rs := NewRuleTracer(pkt)
	static := p.StaticRules()
	for table, chains := range static.Chains {
		for _, c := range chains {
			rs.Add(table, c.Name, c.Rules...)
		}
	}
	for table, chains := range static.Shared {
		for _, c := range chains {
			rs.chains[string(table)+" "+string(c.Name)] = []string{}
		}
	}
	for _, j := range static.Jumps {
		rs.Add(j.Table, j.From, j.Rule)
	}
	if svc != nil {
		rules := p.ServiceRules(svc, sel)
		for _, c := range rules.Chains {
			rs.Add(TableNAT, c.Name, c.Rules...)
		}
		for _, r := range rules.Shared {
			rs.Add(r.Table, r.Chain, r.Rule)
		}
	}
	// The fixed tails (the NodePort jump ends KUBE-SERVICES) come after
	// the services' rules.
	for table, chains := range static.Shared {
		for _, c := range chains {
			rs.Add(table, c.Name, c.Rules...)
		}
	}
	return rs.Hooks(rs.Packet.LocalDestination)
}

// RuleTracer walks iptables chains for a trace: this mode's, and the
// IPVS mode's around its sets. Chains are named "table CHAIN".
type RuleTracer struct {
	Packet trace.Packet
	// MatchSet tells whether the packet matches an ipset with the
	// direction flags ("dst,dst"); nil matches none.
	MatchSet func(set, flags string) bool
	chains   map[string][]string
}

// NewRuleTracer is a tracer of pkt with the built-in chains, empty.
func NewRuleTracer(pkt trace.Packet) *RuleTracer {
	rs := &RuleTracer{Packet: pkt, chains: map[string][]string{}}
	for _, hook := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
		rs.chains[string(TableNAT)+" "+hook] = []string{}
		rs.chains[string(TableFilter)+" "+hook] = []string{}
	}
	return rs
}

// Add appends rules to a chain, creating it.
func (rs *RuleTracer) Add(table Table, chain Chain, rules ...Rule) {
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
func (rs *RuleTracer) Hooks(localDestination bool) ([]trace.Branch, error) {
	natHook, filterHook := "PREROUTING", "FORWARD"
	switch {
	case rs.Packet.From == trace.FromNode:
		natHook, filterHook = "OUTPUT", "OUTPUT"
	case localDestination:
		filterHook = "INPUT"
	}
	nat, err := trace.Walk(rs, "", string(TableNAT)+" "+natHook)
	if err != nil {
		return nil, err
	}
	var out []trace.Branch
	for _, b := range nat {
		// An ACCEPT in nat ends the hook, not the packet's way.
		if b.Verdict != trace.PassedOn && b.Verdict != trace.Accept {
			out = append(out, b)
			continue
		}
		filter, err := trace.Walk(rs, "", string(TableFilter)+" "+filterHook)
		if err != nil {
			return nil, err
		}
		for _, f := range filter {
			f.Probability *= b.Probability
			f.Masquerade = f.Masquerade || b.Masquerade
			f.Steps = append(append([]trace.Step{}, b.Steps...), f.Steps...)
			out = append(out, f)
		}
	}
	return out, nil
}

// Rules is a chain's rules.
func (rs *RuleTracer) Rules(chain string) ([]string, bool) {
	rules, ok := rs.chains[chain]
	return rules, ok
}

// Eval tells whether a rule matches the first packet of a new connection
// and what it does. It knows the matches and targets this mode writes;
// any other is an error rather than a guess.
func (rs *RuleTracer) Eval(chain, rule string) (bool, trace.Effect, error) {
	table, _, _ := strings.Cut(chain, " ")
	pkt := rs.Packet
	args := splitArgs(Rule(rule))
	var e trace.Effect
	matched, negate := true, false
	value := func(i int) (string, error) {
		if i+1 >= len(args) {
			return "", fmt.Errorf("%s without a value", args[i])
		}
		return args[i+1], nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "!" {
			negate = true
			continue
		}
		test := func(ok bool) {
			if ok == negate {
				matched = false
			}
			negate = false
		}
		v, err := "", error(nil)
		switch a {
		case "-m", "--comment", "--mode", "--name", "--nfacct-name", "--seconds", "--or-mark", "--xor-mark":
			if v, err = value(i); err != nil {
				return false, e, err
			}
			i++
			switch a {
			case "--or-mark":
				e.Masquerade = true
			case "--xor-mark":
				return false, e, fmt.Errorf("the trace follows no rule that clears the mark")
			}
			continue
		case "--reap", "--set", "--random-fully":
			continue
		case "--match-set":
			if i+2 >= len(args) {
				return false, e, fmt.Errorf("--match-set without a set and flags")
			}
			test(rs.MatchSet != nil && rs.MatchSet(args[i+1], args[i+2]))
			i += 2
			continue
		case "--physdev-is-in":
			// The node's pods are routed, not bridged.
			test(false)
			continue
		case "--rcheck":
			// A client seen before goes back to its endpoint; a new one
			// does not match (session affinity, see the outcome).
			matched = false
			continue
		}
		if a == "-j" || strings.HasPrefix(a, "-") {
			if v, err = value(i); err != nil {
				return false, e, err
			}
			i++
		}
		switch a {
		case "-p":
			test(strings.EqualFold(v, string(pkt.Protocol)))
		case "-d", "-s":
			prefix, err := parsePrefix(v)
			if err != nil {
				return false, e, err
			}
			addr := pkt.Destination
			if a == "-s" {
				addr = pkt.Source
			}
			test(prefix.Contains(addr))
		case "--dport", "--vport":
			test(v == strconv.Itoa(int(pkt.Port)))
		case "--vaddr":
			test(v == pkt.Destination.String())
		case "--vproto":
			test(v == map[string]string{"TCP": "6", "UDP": "17", "SCTP": "132"}[string(pkt.Protocol)])
		case "--dst-type", "--src-type":
			local := pkt.LocalDestination
			if a == "--src-type" {
				local = pkt.From == trace.FromNode
			}
			test(v == "LOCAL" && local)
		case "-i":
			// Only the local-traffic detector matches interfaces: the
			// interfaces of this node's pods.
			test(pkt.From == trace.FromPod)
		case "--ctstate":
			// The first packet of a new connection not DNATed (a DNATed
			// one ends the trace in the nat table).
			test(v == "NEW" || strings.HasPrefix(v, "NEW,"))
		case "--mark":
			// Only the masquerade mark is matched on, in chains that
			// packets reach marked only once DNATed.
			test(false)
		case "--probability":
			share, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return false, e, fmt.Errorf("probability %q", v)
			}
			e.Share = share
		case "--to-destination":
			to, err := netip.ParseAddrPort(v)
			if err != nil {
				return false, e, fmt.Errorf("DNAT to %q", v)
			}
			e.To = to
		case "-j":
			switch v {
			case "ACCEPT":
				e.Verdict = trace.Accept
			case "DROP":
				e.Verdict = trace.Drop
			case "REJECT":
				e.Verdict = trace.Reject
			case "RETURN":
				e.Verdict = trace.Return
			case "DNAT":
				e.Verdict = trace.DNAT
			case "MARK":
			case "MASQUERADE":
				e.Verdict, e.Masquerade = trace.Accept, true
			default:
				e.Verdict, e.Chain = trace.Jump, table+" "+v
			}
		default:
			return false, e, fmt.Errorf("the trace does not know the match or option %q", a)
		}
	}
	return matched, e, nil
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

// Trace follows a packet through the rules this node writes now (see
// Params.Trace); the check reads the service port's rules, as an
// explanation's verify does.
func (p *Syncer) Trace(v state.View, name *state.ServicePortName, pkt trace.Packet) ([]trace.Branch, func() ([]string, error), error) {
	var svc *state.ServicePort
	var sel state.Selection
	if name != nil {
		svc, sel, _ = v.Select(*name)
	}
	branches, err := p.cfg.Params.Trace(svc, sel, pkt)
	if err != nil || svc == nil {
		return branches, nil, err
	}
	_, check := p.Describe(v, *name)
	return branches, check, nil
}
