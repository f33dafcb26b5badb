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
	entries := map[string][]string{}
	for _, e := range want.Entries {
		entries[e.Set] = append(entries[e.Set], e.Entry)
	}
	for _, a := range want.Bound {
		entries[p.setName(setIPVSAddresses)] = append(entries[p.setName(setIPVSAddresses)], a.String())
	}
	// Sets only this port's entries could match the packet in: the
	// others' rules are the same whether written or not.
	chains := p.Chains(func(set string) bool { return len(entries[p.setName(set)]) > 0 }, want.OutFilter)
	tracer := func(pkt trace.Packet) *trace.IPTablesRuleset {
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
	// Service addresses are bound on kube-ipvs0: local to the node.
	local := pkt.LocalDestination || slices.Contains(want.Bound, pkt.Destination)
	branches, err := tracer(pkt).Hooks(local)
	if err != nil {
		return nil, err
	}
	var server *Server
	for i := range want.Servers {
		if k := want.Servers[i].VirtualServerKey; k.Addr == pkt.Destination && int(k.Port) == int(pkt.Port) && k.Protocol == pkt.Protocol {
			server = &want.Servers[i]
		}
	}
	var out []trace.Branch
	for _, b := range branches {
		if (b.Verdict != trace.PassedOn && b.Verdict != trace.Accept) || server == nil {
			out = append(out, b)
			continue
		}
		// IPVS takes the packet at local input (at output for the
		// node's own).
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
			out = append(out, b)
			continue
		}
		b.Steps = append(b.Steps, trace.Step{Where: vs, What: what, Note: "each real server at weight 1"})
		for _, real := range server.Reals {
			r := b
			r.Probability, r.Verdict, r.Endpoint = b.Probability/float64(len(server.Reals)), trace.DNAT, real.String()
			r.Steps = append(slices.Clone(b.Steps), trace.Step{Where: vs, What: "-> " + real.String() + " Masq 1"})
			dnated := pkt
			dnated.Destination, dnated.Port = real.Addr(), real.Port()
			post, err := trace.Walk(tracer(dnated), "", string(iptables.TableNAT)+" "+string(chainPostrouting))
			if err != nil {
				return nil, err
			}
			for _, pb := range post {
				if pb.Masquerade {
					r.Masquerade = true
					r.Steps = append(r.Steps, pb.Steps...)
				}
			}
			out = append(out, r)
		}
	}
	return out, nil
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
