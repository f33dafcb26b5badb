package ipvs

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Trace follows a packet through what the mode keeps for the service
// port it is addressed to (ServiceObjects, as a sync decides it now):
// the set entries its chains match on, which decide the masquerade mark
// and the source-range filter, and the virtual server whose real servers
// IPVS picks from. The chains match sets, not services (see Chains), so
// each step names the set entry that decides and the rule of the chain
// that matches it. The check reads the service port's virtual servers,
// addresses and set entries, as an explanation's verify does.
func (p *Syncer) Trace(v state.View, name *state.ServicePortName, pkt trace.Packet) ([]trace.Branch, func() ([]string, error), error) {
	if name == nil {
		// No virtual server holds the address and port: IPVS leaves the
		// packet alone.
		return []trace.Branch{{Probability: 1, Verdict: trace.PassedOn}}, nil, nil
	}
	svc, _, _ := v.Select(*name)
	p.mu.Lock()
	want := p.objectsFor(v, *name)
	params := p.cfg.Params
	p.mu.Unlock()
	_, check := p.Describe(v, *name)
	return params.trace(svc, want, pkt), check, nil
}

func (p *Params) trace(svc *state.ServicePort, want ServiceObjects, pkt trace.Packet) []trace.Branch {
	proto := strings.ToLower(string(pkt.Protocol))
	dstPort := pkt.Destination.String() + "," + proto + ":" + strconv.Itoa(int(pkt.Port))
	entry := func(set, e string) (trace.Step, bool) {
		name := p.setName(set)
		for _, se := range want.Entries {
			if se.Set == name && se.Entry == e {
				return trace.Step{Where: "ipset " + name, What: e}, true
			}
		}
		return trace.Step{}, false
	}
	var steps []trace.Step
	masquerade := false
	step := func(where, what, note string) {
		steps = append(steps, trace.Step{Where: where, What: what, Note: note})
	}

	// The source-range filter (filter KUBE-PROXY-FIREWALL, before IPVS
	// sees the packet at input).
	if s, ok := entry(setLoadBalancerFW, dstPort); ok {
		steps = append(steps, s)
		allowed := false
		for _, r := range svc.LoadBalancerSourceRanges {
			if s, ok := entry(setLoadBalancerSourceNet, dstPort+","+r.String()); ok && r.Contains(pkt.Source) {
				steps = append(steps, s)
				allowed = true
				break
			}
		}
		if s, ok := entry(setLoadBalancerSourceIP, dstPort+","+pkt.Source.String()); ok && !allowed {
			steps = append(steps, s)
			allowed = true
		}
		step("filter "+string(chainProxyFirewall), "-m set --match-set "+p.setName(setLoadBalancerFW)+" dst,dst -j "+string(chainSourceRangeFirewall), "")
		if !allowed {
			step("filter "+string(chainSourceRangeFirewall), "-j DROP", "the source is in no entry of "+p.setName(setLoadBalancerSourceNet))
			return []trace.Branch{{Probability: 1, Steps: steps, Verdict: trace.Drop}}
		}
	}

	// The masquerade mark (nat KUBE-SERVICES and the chains it leads to).
	switch {
	case pkt.Destination == svc.ClusterIP:
		s, _ := entry(setClusterIP, dstPort)
		steps = append(steps, s)
		local := p.LocalDetector.Implemented() && localSource(p, pkt)
		if p.MasqueradeAll || (p.LocalDetector.Implemented() && !local) {
			masquerade = true
			step("nat "+string(chainServices), "-m set --match-set "+p.setName(setClusterIP)+" dst,dst -j "+string(chainMarkMasq), "not from a pod of this node")
		}
	case slices.Contains(svc.ExternalIPs, pkt.Destination):
		if s, ok := entry(setExternalIP, dstPort); ok {
			steps = append(steps, s)
			masquerade = true
			step("nat "+string(chainServices), "-m set --match-set "+p.setName(setExternalIP)+" dst,dst -j "+string(chainMarkMasq), "")
		} else if s, ok := entry(setExternalIPLocal, dstPort); ok {
			steps = append(steps, s)
		}
	case slices.Contains(svc.LoadBalancerIPs, pkt.Destination):
		s, _ := entry(setLoadBalancer, dstPort)
		steps = append(steps, s)
		if s, ok := entry(setLoadBalancerLocal, dstPort); ok {
			steps = append(steps, s)
			step("nat "+string(chainLoadBalancer), "-m set --match-set "+p.setName(setLoadBalancerLocal)+" dst,dst -j RETURN", "externalTrafficPolicy Local: the source is kept")
		} else {
			masquerade = true
			step("nat "+string(chainLoadBalancer), "-j "+string(chainMarkMasq), "")
		}
	default: // a NodePort
		set, local := setNodePortTCP, setNodePortLocalTCP
		key := strconv.Itoa(int(pkt.Port))
		switch proto {
		case "udp":
			set, local = setNodePortUDP, setNodePortLocalUDP
		case "sctp":
			set, local, key = setNodePortSCTP, setNodePortLocalSCTP, dstPort
		}
		if s, ok := entry(local, key); ok {
			steps = append(steps, s)
			step("nat "+string(chainNodePort), "-m set --match-set "+p.setName(local)+" dst -j RETURN", "externalTrafficPolicy Local: the source is kept")
		} else if s, ok := entry(set, key); ok {
			steps = append(steps, s)
			masquerade = true
			step("nat "+string(chainNodePort), "-m set --match-set "+p.setName(set)+" dst -j "+string(chainMarkMasq), "")
		}
	}

	var server *Server
	for i := range want.Servers {
		if k := want.Servers[i].VirtualServerKey; k.Addr == pkt.Destination && int(k.Port) == int(pkt.Port) && k.Protocol == pkt.Protocol {
			server = &want.Servers[i]
		}
	}
	if server == nil {
		// A NodePort on an address NodePorts do not answer on.
		return []trace.Branch{{Probability: 1, Steps: steps, Verdict: trace.PassedOn, Masquerade: masquerade}}
	}
	vs := "ipvs " + server.VirtualServerKey.String()
	what := server.Scheduler
	if server.Flags&FlagPersistent != 0 {
		what += ", persistent " + strconv.Itoa(int(server.Timeout)) + " s"
	}
	if len(server.Reals) == 0 {
		steps = append(steps, trace.Step{Where: vs, What: what + ", no real servers",
			Note: "IPVS finds no destination and leaves the packet to the node, which refuses the connection"})
		verdict := trace.Reject
		if svc.ExternalPolicyLocal && pkt.From == trace.FromExternal && svc.ClusterIP != pkt.Destination {
			verdict = trace.Drop
		}
		return []trace.Branch{{Probability: 1, Steps: steps, Verdict: verdict, Masquerade: masquerade}}
	}
	steps = append(steps, trace.Step{Where: vs, What: what, Note: "each real server at weight 1"})
	var out []trace.Branch
	for _, real := range server.Reals {
		b := trace.Branch{Probability: 1 / float64(len(server.Reals)), Verdict: trace.DNAT, Endpoint: real.String(), Masquerade: masquerade,
			Steps: append(slices.Clone(steps), trace.Step{Where: vs, What: "-> " + real.String() + " Masq 1"})}
		if s, ok := entry(setLoopBack, real.Addr().String()+","+proto+":"+strconv.Itoa(int(real.Port()))+","+pkt.Source.String()); ok {
			b.Masquerade = true
			b.Steps = append(b.Steps, s, trace.Step{Where: "nat " + string(chainPostrouting),
				What: "-m set --match-set " + p.setName(setLoopBack) + " dst,dst,src -j MASQUERADE", Note: "the source is the endpoint"})
		}
		out = append(out, b)
	}
	return out
}

// localSource tells whether the local-traffic detector takes the packet
// for a pod's: by its source address for the CIDR detectors, by where it
// comes from for the interface ones.
func localSource(p *Params, pkt trace.Packet) bool {
	args := p.LocalDetector.IfLocal()
	if len(args) == 2 && args[0] == "-s" {
		prefix, err := netip.ParsePrefix(args[1])
		return err == nil && prefix.Contains(pkt.Source)
	}
	return pkt.From == trace.FromPod
}
