package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// PacketTracer is a proxier that traces packets through what it programs
// (Core and DualStack are ones).
type PacketTracer interface {
	Trace(pkt trace.Packet, verify bool) (trace.Result, error)
}

// ErrNoTracer is a mode that cannot trace.
var ErrNoTracer = errors.New("this mode cannot trace packets")

// ErrOtherFamily is a packet of an IP family the core does not program.
var ErrOtherFamily = errors.New("this node's kube-proxy programs no service of the packet's IP family")

// ErrCannotVerify is a mode that traces but cannot check a trace's
// objects against the kernel.
var ErrCannotVerify = errors.New("cannot verify a trace against the kernel")

// Trace follows a packet through this core's mode.
func (c *Core) Trace(pkt trace.Packet, verify bool) (trace.Result, error) {
	r, check, err := c.trace(pkt)
	if err != nil || !verify {
		return r, err
	}
	if r.Service != "" && check == nil {
		return r, fmt.Errorf("the %s mode %w: trace without --verify", c.cfg.ModeName, ErrCannotVerify)
	}
	v := &trace.Verification{Differences: []string{}}
	switch {
	case r.Service == "":
		// Nothing of a service to read: the fixed objects are checked by
		// the mode's own watch.
	default:
		differences, err := check()
		if differences != nil {
			v.Differences = differences
		}
		if err != nil {
			v.Error = err.Error()
		}
	}
	r.Verify = v
	return r, nil
}

func (c *Core) trace(pkt trace.Packet) (trace.Result, func() ([]string, error), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := trace.Result{Packet: pkt, Node: c.node.Name, Mode: c.cfg.ModeName, Family: c.cfg.Family}
	if pkt.Family() != c.cfg.Family {
		return r, nil, fmt.Errorf("%w (%s)", ErrOtherFamily, pkt.Family())
	}
	tracer, ok := c.mode.(Tracer)
	if !ok {
		return r, nil, ErrNoTracer
	}
	view := state.View{State: c.state, Node: c.node}
	match, found := trace.Find(view.Services, pkt)
	var name *state.ServicePortName
	if found {
		name = &match.Name
		r.Service, r.Entry = match.Name.String(), match.Entry
	}
	branches, check, err := tracer.Trace(view, name, pkt)
	if err != nil {
		return r, nil, fmt.Errorf("%s mode: %w", c.cfg.ModeName, err)
	}
	r.SetBranches(branches)
	if found {
		svc, ex, _ := view.Explain(match.Name)
		local := usesLocalPath(svc, match.Entry, pkt)
		r.Path = "cluster"
		if local {
			r.Path = "local"
		}
		r.Outcome.Reason = reason(svc, ex, match.Entry, local, pkt, r.Outcome.Verdict, c.cfg.ModeName)
		if svc.AffinityTimeoutSeconds > 0 {
			r.Outcome.Affinity = fmt.Sprintf("ClientIP, %d s: a client that connected within that time goes back to the same endpoint; the chances are a new client's",
				svc.AffinityTimeoutSeconds)
		}
	} else {
		r.Outcome.Reason = noServiceReason(view.Services, pkt, r.Outcome.Verdict)
	}
	return r, check, nil
}

// usesLocalPath tells whether the traffic policies send the packet to
// this node's endpoints only: internal traffic under an internal Local
// policy; external traffic from outside under an external Local policy
// (the node's own and its pods' go to the cluster's endpoints).
func usesLocalPath(svc *state.ServicePort, entry trace.Entry, pkt trace.Packet) bool {
	if entry == trace.EntryClusterIP {
		return svc.InternalPolicyLocal
	}
	return svc.ExternalPolicyLocal && pkt.From == trace.FromExternal
}

// reason says why the packet ends as it does, in explain's words.
func reason(svc *state.ServicePort, ex state.Explanation, entry trace.Entry, local bool, pkt trace.Packet, verdict trace.Verdict, mode string) string {
	note := clusterNote(ex)
	if local {
		note = localNote(ex)
	}
	policy := ""
	switch {
	case local && entry == trace.EntryClusterIP:
		policy = "internalTrafficPolicy Local: "
	case local:
		policy = "externalTrafficPolicy Local: "
	}
	switch verdict {
	case trace.DNAT:
		return note
	case trace.Reject:
		if !ex.HasAny {
			return "no endpoints: " + note
		}
		return policy + note
	case trace.Drop:
		if entry == trace.EntryLoadBalancer && len(svc.LoadBalancerSourceRanges) > 0 && !svc.SourceRangesAllow(pkt.Source) {
			return fmt.Sprintf("source range not allowed: %s is in none of loadBalancerSourceRanges %s",
				pkt.Source, strings.Join(texts(svc.LoadBalancerSourceRanges), ", "))
		}
		if entry == trace.EntryNodePort && pkt.Destination.IsLoopback() {
			return "localhost NodePort: a NodePort on a localhost address answers only the node's own traffic"
		}
		return policy + note
	case trace.PassedOn:
		if entry == trace.EntryNodePort && pkt.Destination.IsLoopback() {
			return "localhost NodePort: the " + mode + " mode serves no NodePort on localhost addresses (localhostNodePorts)"
		}
		return "no rule of this service matched the packet"
	}
	return ""
}

// noServiceReason says what becomes of a packet addressed to no service.
func noServiceReason(services state.ServiceMap, pkt trace.Packet, verdict trace.Verdict) string {
	at := fmt.Sprintf("%s/%s", netip.AddrPortFrom(pkt.Destination, pkt.Port), pkt.Protocol)
	switch {
	case verdict == trace.Reject && trace.IsClusterIP(services, pkt.Destination):
		return "a cluster IP, but no service has " + at + ": rejected (invalid port of a ClusterIP)"
	case verdict == trace.Drop:
		return "ServiceCIDR guard: " + pkt.Destination.String() + " is in a ServiceCIDR but no service has it (unallocated ClusterIP)"
	}
	return "no service this node programs is at " + at + "; kube-proxy leaves the packet alone"
}

// Trace follows the packet in the core of its IP family.
func (d DualStack) Trace(pkt trace.Packet, verify bool) (trace.Result, error) {
	for _, p := range d {
		t, ok := p.(PacketTracer)
		if !ok {
			continue
		}
		if r, err := t.Trace(pkt, verify); !errors.Is(err, ErrOtherFamily) {
			return r, err
		}
	}
	return trace.Result{Packet: pkt}, fmt.Errorf("%w (%s)", ErrOtherFamily, pkt.Family())
}
