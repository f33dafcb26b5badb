package ipvs

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/badinput"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// planned is every service port's objects for the state of these objects.
func planned(t *testing.T, family v1.IPFamily, objs ...badinput.Objects) map[state.ServicePortName]ServiceObjects {
	tr := state.NewTracker(family, "node-1")
	st := state.NewState()
	for _, o := range objs {
		o.AddTo(tr)
	}
	tr.Apply(st)
	ipv6 := family == v1.IPv6Protocol
	p := testParams(t, ipv6)
	a := Addresses{Node: addrs("10.255.0.2"), NodePort: addrs("10.255.0.2")}
	if ipv6 {
		a = Addresses{Node: addrs("fd00:255::2"), NodePort: addrs("fd00:255::2")}
	}
	view := state.View{State: st, Node: state.Node{Name: "node-1"}}
	out := map[state.ServicePortName]ServiceObjects{}
	for name := range st.Services {
		svc, sel, _ := view.Select(name)
		out[name] = p.ServiceObjects(svc, st.Endpoints[name], sel, a)
	}
	return out
}

// objectProblems lists what the kernel would refuse or take as something
// else in one service port's objects: addresses of the other family, port
// 0 (a port over 65535 would have wrapped to one), an unknown protocol.
func objectProblems(family v1.IPFamily, o ServiceObjects) []string {
	var bad []string
	ofFamily := func(a netip.Addr) bool { return a.IsValid() && a.Is4() == (family == v1.IPv4Protocol) }
	for _, s := range o.Servers {
		if !ofFamily(s.Addr) || s.Port == 0 || protocolNumbers[s.Protocol] == "" {
			bad = append(bad, "virtual server "+s.VirtualServerKey.String())
		}
		for _, r := range s.Reals {
			if !ofFamily(r.Addr()) || r.Port() == 0 {
				bad = append(bad, "real server "+r.String())
			}
		}
	}
	for _, a := range o.Bound {
		if !ofFamily(a) {
			bad = append(bad, "bound address "+a.String())
		}
	}
	for _, e := range o.Entries {
		// "ip,proto:port[,ip or net]", or a bare port or address.
		for _, part := range strings.Split(e.Entry, ",") {
			_, port, hasPort := strings.Cut(part, ":")
			if a, err := netip.ParseAddr(part); err == nil && !ofFamily(a) {
				bad = append(bad, fmt.Sprintf("%s entry %s", e.Set, e.Entry))
			}
			if p, err := netip.ParsePrefix(part); err == nil && !ofFamily(p.Addr()) {
				bad = append(bad, fmt.Sprintf("%s entry %s", e.Set, e.Entry))
			}
			if hasPort && !strings.Contains(part, ".") && (port == "0" || port == "") {
				bad = append(bad, fmt.Sprintf("%s entry %s", e.Set, e.Entry))
			}
		}
	}
	return bad
}

// FuzzServiceObjects puts arbitrary Services and EndpointSlices (JSON,
// see internal/badinput) next to good ones through the IPVS plan of each
// family: no virtual or real server, address or set entry the kernel
// would refuse, and the good services' objects are as without them.
// Seeds: testdata/fuzz/FuzzServiceObjects.
func FuzzServiceObjects(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) { badinput.CheckPlan(t, data, planned, objectProblems) })
}
