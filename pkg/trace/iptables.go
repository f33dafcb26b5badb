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
	pkt := rs.Packet
	args := iptableskernel.Args(iptableskernel.Rule(rule))
	var e Effect
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
				local = pkt.From == FromNode
			}
			test(v == "LOCAL" && local)
		case "-i":
			// Only the local-traffic detector matches interfaces: the
			// interfaces of this node's pods.
			test(pkt.From == FromPod)
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
				e.Verdict = Accept
			case "DROP":
				e.Verdict = Drop
			case "REJECT":
				e.Verdict = Reject
			case "RETURN":
				e.Verdict = Return
			case "DNAT":
				e.Verdict = DNAT
			case "MARK":
			case "MASQUERADE":
				e.Verdict, e.Masquerade = Accept, true
			default:
				e.Verdict, e.Chain = Jump, table+" "+v
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
