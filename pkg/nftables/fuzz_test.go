package nftables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/badinput"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// fuzzParams are node settings under which every kind of object is made.
func fuzzParams(t *testing.T, family v1.IPFamily) Params {
	cidr, nodeIP := "10.244.0.0/16", "10.255.0.2"
	if family == v1.IPv6Protocol {
		cidr, nodeIP = "fd00:244::/56", "fd00:255::2"
	}
	return Params{IPv6: family == v1.IPv6Protocol, MasqueradeBit: 14, LocalDetector: detector(t, "ClusterCIDR", family, cidr),
		NodeIP: netip.MustParseAddr(nodeIP)}
}

// planned is every service port's objects for the state of these objects.
func planned(t *testing.T, family v1.IPFamily, objs ...badinput.Objects) map[state.ServicePortName]ServiceObjects {
	tr := state.NewTracker(family, nodeName)
	st := state.NewState()
	for _, o := range objs {
		o.AddTo(tr)
	}
	tr.Apply(st)
	params := fuzzParams(t, family)
	view := state.View{State: st, Node: state.Node{Name: nodeName}}
	out := map[state.ServicePortName]ServiceObjects{}
	for name := range st.Services {
		svc, sel, _ := view.Select(name)
		out[name] = params.ServiceObjects(svc, sel)
	}
	return out
}

// objectProblems lists what nft would refuse in one service port's
// objects, failing the whole transaction: an over-long name or comment,
// an address of the other family, a port out of range.
func objectProblems(family v1.IPFamily, o ServiceObjects) []string {
	var bad []string
	name := func(n string) {
		if len(n) > knftables.NameLengthMax || strings.ContainsAny(n, " \"\n") {
			bad = append(bad, "name "+n)
		}
	}
	// word checks a token that is an address, a port or address . port.
	word := func(w string) {
		w = strings.Trim(w, "{},")
		if a, err := netip.ParseAddr(w); err == nil && a.Is4() != (family == v1.IPv4Protocol) {
			bad = append(bad, "address "+w)
		}
		if ap, err := netip.ParseAddrPort(w); err == nil && (ap.Addr().Is4() != (family == v1.IPv4Protocol) || ap.Port() == 0) {
			bad = append(bad, "destination "+w)
		}
	}
	for _, c := range o.Chains {
		name(c.Name)
		for _, r := range c.Rules {
			if strings.ContainsAny(r, "\n\x00") {
				bad = append(bad, fmt.Sprintf("rule %q", r))
			}
			for _, w := range strings.Fields(r) {
				word(w)
			}
		}
	}
	for _, s := range o.Sets {
		name(s.Name)
	}
	for _, e := range o.Elements {
		if e.Comment != nil && len(*e.Comment) > knftables.CommentLengthMax {
			bad = append(bad, fmt.Sprintf("element comment of %d bytes", len(*e.Comment)))
		}
		for i, k := range e.Key {
			switch {
			case k == "tcp" || k == "udp" || k == "sctp":
			case strings.Contains(k, ".") || strings.Contains(k, ":"):
				word(k)
				if _, err := netip.ParseAddr(k); err != nil {
					bad = append(bad, "key "+k)
				}
			default:
				if p, err := strconv.Atoi(k); err != nil || p < 1 || p > 65535 || i == 0 {
					bad = append(bad, "key "+k)
				}
			}
		}
	}
	return bad
}

// FuzzServiceObjects puts arbitrary Services and EndpointSlices (JSON,
// see internal/badinput) next to good ones through the nftables plan of
// each family: nothing nft would refuse, and the good services' objects
// are as without them. Seeds: testdata/fuzz/FuzzServiceObjects.
func FuzzServiceObjects(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) { badinput.CheckPlan(t, data, planned, objectProblems) })
}
