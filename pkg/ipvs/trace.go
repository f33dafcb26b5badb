package ipvs

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Trace follows a packet through what the mode keeps for the service
// port it is addressed to (ServiceObjects, as a sync decides it now):
// the mode's iptables chains (Chains, Jumps) matching the port's set
// entries, which decide the masquerade mark and the source-range filter;
// then the virtual server, whose real servers IPVS picks from; then, for
// each, the postrouting chain (a pod sent to itself is masqueraded). The
// check reads the service port's virtual servers, addresses and set
// entries, as an explanation's verify does.
func (p *Syncer) Trace(v state.View, name *state.ServicePortName, pkt trace.Packet) ([]trace.Branch, func() ([]string, error), error) {
	var want ServiceObjects
	var svc *state.ServicePort
	if name != nil {
		svc, _, _ = v.Select(*name)
	}
	p.mu.Lock()
	if name != nil {
		want = p.objectsFor(v, *name)
	}
	params := p.cfg.Params
	p.mu.Unlock()
	branches, err := params.trace(svc, want, pkt)
	if err != nil || name == nil {
		return branches, nil, err
	}
	_, check := p.Describe(v, *name)
	return branches, check, nil
}

func (p *Params) trace(svc *state.ServicePort, want ServiceObjects, pkt trace.Packet) ([]trace.Branch, error) {
	entries := p.traceEntries(want)
	// Sets only this port's entries could match the packet in: the
	// others' rules are the same whether written or not.
	chains := p.Chains(func(set string) bool { return len(entries[p.setName(set)]) > 0 }, want.OutFilter)
	tracer := func(pkt trace.Packet) *trace.IPTablesRuleset { return p.ruleset(chains, entries, pkt) }
	// Service addresses are bound on kube-ipvs0: local to the node.
	local := pkt.LocalDestination || slices.Contains(want.Bound, pkt.Destination)
	branches, err := tracer(pkt).Hooks(local)
	if err != nil {
		return nil, err
	}
	server := targetOf(want.Servers, pkt)
	var out []trace.Branch
	for _, b := range branches {
		if (b.Verdict != trace.PassedOn && b.Verdict != trace.Accept) || server == nil {
			out = append(out, b)
			continue
		}
		taken, err := throughIPVS(b, server, svc, pkt, tracer)
		if err != nil {
			return nil, err
		}
		out = append(out, taken...)
	}
	return out, nil
}

// traceEntries are the service port's set entries by set, its bound
// addresses in KUBE-IPVS-IPS.
func (p *Params) traceEntries(want ServiceObjects) map[string][]string {
	entries := map[string][]string{}
	for _, e := range want.Entries {
		entries[e.Set] = append(entries[e.Set], e.Entry)
	}
	for _, a := range want.Bound {
		entries[p.setName(setIPVSAddresses)] = append(entries[p.setName(setIPVSAddresses)], a.String())
	}
	return entries
}

// ruleset is the mode's chains and jumps for tracing pkt, its sets holding
// entries.
func (p *Params) ruleset(chains map[iptables.Table][]iptables.OwnChain, entries map[string][]string, pkt trace.Packet) *trace.IPTablesRuleset {
	rs := trace.NewIPTablesRuleset(pkt)
	for table, cs := range chains {
		for _, c := range cs {
			rs.Add(table, c.Name, c.Rules...)
		}
	}
	for _, j := range Jumps() {
		rs.Add(j.Table, j.From, j.Rule)
	}
	rs.MatchSet = func(set, flags string) bool { return p.matchSet(set, flags, entries[set], pkt) }
	return rs
}

// targetOf is the virtual server pkt is addressed to, nil if none.
func targetOf(servers []Server, pkt trace.Packet) *Server {
	var server *Server
	for i := range servers {
		if k := servers[i].VirtualServerKey; k.Addr == pkt.Destination && int(k.Port) == int(pkt.Port) && k.Protocol == pkt.Protocol {
			server = &servers[i]
		}
	}
	return server
}

// throughIPVS follows a branch that reaches server: IPVS takes the packet
// at local input (at output for the node's own) to one of its real
// servers, or with none leaves it to the node.
func throughIPVS(b trace.Branch, server *Server, svc *state.ServicePort, pkt trace.Packet, tracer func(trace.Packet) *trace.IPTablesRuleset) ([]trace.Branch, error) {
	vs := "ipvs " + server.VirtualServerKey.String()
	what := server.Scheduler
	if server.Flags&ipvskernel.FlagPersistent != 0 {
		what += ", persistent " + strconv.Itoa(int(server.Timeout)) + " s"
	}
	if len(server.Reals) == 0 {
		b.Steps = append(b.Steps, trace.Step{Where: vs, What: what + ", no real servers",
			Note: "IPVS finds no destination and leaves the packet to the node, which refuses the connection"})
		b.Verdict = trace.Reject
		if svc.ExternalPolicyLocal && pkt.From == trace.FromExternal && svc.ClusterIP != pkt.Destination {
			b.Verdict = trace.Drop
		}
		return []trace.Branch{b}, nil
	}
	b.Steps = append(b.Steps, trace.Step{Where: vs, What: what, Note: "each real server at weight 1"})
	out := make([]trace.Branch, 0, len(server.Reals))
	for _, real := range server.Reals {
		r, err := toReal(b, vs, real, len(server.Reals), pkt, tracer)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// toReal is branch b sent to real, one of n real servers of virtual
// server vs, then through postrouting (a pod sent to itself is
// masqueraded).
func toReal(b trace.Branch, vs string, real netip.AddrPort, n int, pkt trace.Packet, tracer func(trace.Packet) *trace.IPTablesRuleset) (trace.Branch, error) {
	r := b
	r.Probability, r.Verdict, r.Endpoint = b.Probability/float64(n), trace.DNAT, real.String()
	r.Steps = append(slices.Clone(b.Steps), trace.Step{Where: vs, What: "-> " + real.String() + " Masq 1"})
	dnated := pkt
	dnated.Destination, dnated.Port = real.Addr(), real.Port()
	post, err := trace.Walk(tracer(dnated), "", string(iptables.TableNAT)+" "+string(chainPostrouting))
	if err != nil {
		return trace.Branch{}, err
	}
	for _, pb := range post {
		if pb.Masquerade {
			r.Masquerade = true
			r.Steps = append(r.Steps, pb.Steps...)
		}
	}
	return r, nil
}

// matchSet tells whether the packet matches one of a set's entries, the
// flags saying which of its fields each part of an entry is.
func (p *Params) matchSet(set, flags string, entries []string, pkt trace.Packet) bool {
	typ := ipvskernel.SetType("")
	for _, s := range setTypes {
		if p.setName(s.name) == set {
			typ = s.typ
		}
	}
	dirs := strings.Split(flags, ",")
	addr := func(i int) string {
		if i < len(dirs) && dirs[i] == "src" {
			return pkt.Source.String()
		}
		return pkt.Destination.String()
	}
	port := strconv.Itoa(int(pkt.Port))
	ipPort := addr(0) + "," + strings.ToLower(string(pkt.Protocol)) + ":" + port
	var key string
	switch typ {
	case ipvskernel.HashIP:
		key = addr(0)
	case ipvskernel.BitmapPort:
		key = port
	case ipvskernel.HashIPPort:
		key = ipPort
	case ipvskernel.HashIPPortIP:
		key = ipPort + "," + addr(2)
	case ipvskernel.HashIPPortNet:
		src, _ := netip.ParseAddr(addr(2))
		for _, e := range entries {
			if rest, ok := strings.CutPrefix(e, ipPort+","); ok {
				if n, err := netip.ParsePrefix(rest); err == nil && n.Contains(src) {
					return true
				}
			}
		}
		return false
	}
	return slices.Contains(entries, key)
}
