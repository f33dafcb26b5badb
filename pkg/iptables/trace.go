package iptables

import (
	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
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
	rs := trace.NewIPTablesRuleset(pkt)
	static := p.StaticRules()
	for table, chains := range static.Chains {
		for _, c := range chains {
			rs.Add(table, c.Name, c.Rules...)
		}
	}
	for table, chains := range static.Shared {
		for _, c := range chains {
			rs.Add(table, c.Name)
		}
	}
	for _, j := range static.Jumps {
		rs.Add(j.Table, j.From, j.Rule)
	}
	if svc != nil {
		rules := p.ServiceRules(svc, sel)
		for _, c := range rules.Chains {
			rs.Add(iptableskernel.TableNAT, c.Name, c.Rules...)
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
