package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Describe names the service port's virtual servers with their real
// servers, its addresses on kube-ipvs0, its set entries and its
// out-filter rules, as ServiceObjects decides them now, and returns a
// check of just those against the kernel.
func (p *Syncer) Describe(v state.View, name state.ServicePortName) ([]proxy.KernelObject, func() ([]string, error)) {
	p.mu.Lock()
	want := p.objectsFor(v, name)
	p.mu.Unlock()
	var objects []proxy.KernelObject
	for _, s := range want.Servers {
		reals := addrPortTexts(s.Reals)
		objects = append(objects, proxy.KernelObject{
			Kind: "virtual server", Name: s.VirtualServerKey.String(), Summary: serverSummary(s.VirtualServer, reals), Content: reals,
		})
	}
	for _, a := range want.Bound {
		objects = append(objects, proxy.KernelObject{Kind: "address", Name: a.String(), Summary: "on " + ipvskernel.DummyLink})
	}
	for _, e := range want.Entries {
		objects = append(objects, proxy.KernelObject{Kind: "set entry", Name: e.Set + " " + e.Entry})
	}
	for _, r := range want.OutFilter {
		objects = append(objects, proxy.KernelObject{Kind: "rule", Name: "filter " + string(chainIPVSOutFilter), Summary: string(r)})
	}
	return objects, func() ([]string, error) { return p.verify(want) }
}

// serverSummary is a virtual server's scheduler, persistence and real
// servers, for a table.
func serverSummary(vs ipvskernel.VirtualServer, reals []string) string {
	s := vs.Scheduler
	if vs.Flags&ipvskernel.FlagPersistent != 0 {
		s += fmt.Sprintf(", persistent %d s", vs.Timeout)
	}
	if len(reals) == 0 {
		return s + ", no real servers"
	}
	return s + ": " + strings.Join(reals, " ")
}

// verify lists how the kernel differs from one service port's objects. A
// real server the port no longer wants is a difference only at a weight
// above 0: at 0 it is draining.
func (p *Syncer) verify(want ServiceObjects) ([]string, error) {
	k := p.cfg.Kernel
	var differences []string
	servers, err := k.VirtualServers()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	for _, s := range want.Servers {
		i := slices.IndexFunc(servers, func(vs ipvskernel.VirtualServer) bool { return vs.VirtualServerKey == s.VirtualServerKey })
		if i < 0 {
			differences = append(differences, fmt.Sprintf("virtual server %s is missing", s.VirtualServerKey))
			continue
		}
		if have := servers[i]; have != s.VirtualServer {
			differences = append(differences, fmt.Sprintf("virtual server %s is %s, want %s", s.VirtualServerKey, serverSettings(have), serverSettings(s.VirtualServer)))
		}
		reals, err := k.RealServers(s.VirtualServerKey)
		if err != nil {
			return differences, fmt.Errorf("listing the real servers of %s: %w", s.VirtualServerKey, err)
		}
		differences = append(differences, realDifferences(s, reals)...)
	}
	bound, err := k.BoundAddresses()
	if err != nil {
		return differences, fmt.Errorf("listing the addresses of %s: %w", ipvskernel.DummyLink, err)
	}
	for _, a := range want.Bound {
		if !slices.Contains(bound, a) {
			differences = append(differences, fmt.Sprintf("%s is not bound to %s", a, ipvskernel.DummyLink))
		}
	}
	var sets []string
	for _, e := range want.Entries {
		if !slices.Contains(sets, e.Set) {
			sets = append(sets, e.Set)
		}
	}
	entries, err := k.SetEntries(sets)
	if err != nil {
		return differences, fmt.Errorf("listing the ipsets: %w", err)
	}
	for _, e := range want.Entries {
		if !slices.Contains(entries[e.Set], e.Entry) {
			differences = append(differences, fmt.Sprintf("set %s lacks %s", e.Set, e.Entry))
		}
	}
	if len(want.OutFilter) > 0 {
		rules, err := p.cfg.IPTables.ListRules(string(iptables.TableFilter), string(chainIPVSOutFilter))
		if err != nil {
			return differences, err
		}
		for _, r := range want.OutFilter {
			// Written as iptables-save prints it: the text compares.
			if !slices.Contains(rules, string(r)) {
				differences = append(differences, fmt.Sprintf("filter %s lacks: %s", chainIPVSOutFilter, r))
			}
		}
	}
	return differences, nil
}

func realDifferences(s Server, reals []ipvskernel.RealServer) []string {
	var out []string
	for _, want := range s.Reals {
		i := slices.IndexFunc(reals, func(rs ipvskernel.RealServer) bool { return rs.AddrPort() == want })
		switch {
		case i < 0:
			out = append(out, fmt.Sprintf("virtual server %s lacks real server %s", s.VirtualServerKey, want))
		case reals[i].Weight != 1:
			out = append(out, fmt.Sprintf("real server %s of %s has weight %d, want 1", want, s.VirtualServerKey, reals[i].Weight))
		}
	}
	for _, rs := range reals {
		if rs.Weight > 0 && !slices.Contains(s.Reals, rs.AddrPort()) {
			out = append(out, fmt.Sprintf("virtual server %s has real server %s, not wanted", s.VirtualServerKey, rs.AddrPort()))
		}
	}
	return out
}

func serverSettings(vs ipvskernel.VirtualServer) string {
	return fmt.Sprintf("scheduler %s, flags %#x, timeout %d", vs.Scheduler, vs.Flags, vs.Timeout)
}

func addrPortTexts(addrs []netip.AddrPort) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}
