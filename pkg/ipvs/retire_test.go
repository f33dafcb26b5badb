package ipvs_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
)

// A node that left the IPVS mode keeps a virtual server, and the address
// on kube-ipvs0 it is reached at, while any of its real servers has
// connections; the rest goes in the first round, and everything once the
// connections end or the bound is reached (force). Virtual servers in
// excludeCIDRs are another program's and stay.
func TestRetireKeepsWhatStillHasConnections(t *testing.T) {
	n, _, _ := fedNode(t)
	web := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	webEndpoint := netip.MustParseAddrPort("10.244.1.5:8080")
	if err := n.kernel.SetConnections(web, webEndpoint, 1, 0); err != nil {
		t.Fatal(err)
	}
	lb := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.255.3.1"), Port: 80, Protocol: v1.ProtocolTCP}
	if err := n.kernel.SetConnections(lb, netip.MustParseAddrPort("10.244.1.8:8080"), 0, 2); err != nil {
		t.Fatal(err)
	}
	exclude := []netip.Prefix{netip.MustParsePrefix("10.96.0.11/32")} // dns

	r, err := ipvs.Retire(n.kernel, exclude, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Draining != 2 {
		t.Errorf("%d virtual servers draining, want 2 (web, lb)", r.Draining)
	}
	assertServers(t, n, []string{"10.96.0.10:80", "10.96.0.11:80", "10.255.3.1:80"})
	bound, err := n.kernel.BoundAddresses()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Trim(strings.Join(addrStrings(bound), " "), " "); got != "10.96.0.10 10.96.0.11 10.255.3.1" {
		t.Errorf("bound %q, want the draining and excluded servers' addresses only", got)
	}

	// web's connection ends: it goes; lb stays.
	if err := n.kernel.SetConnections(web, webEndpoint, 0, 0); err != nil {
		t.Fatal(err)
	}
	if r, err = ipvs.Retire(n.kernel, exclude, false); err != nil || r.Draining != 1 || r.Removed != 1 {
		t.Errorf("after web's connection ended: %d draining, %d removed, %v; want 1 and 1", r.Draining, r.Removed, err)
	}
	assertServers(t, n, []string{"10.96.0.11:80", "10.255.3.1:80"})

	// At the bound, whatever still has connections goes too.
	r, err = ipvs.Retire(n.kernel, exclude, true)
	if err != nil || r.Draining != 0 || len(r.Cut) != 1 || r.Cut[0] != lb {
		t.Errorf("forced: %d draining, cut %v, %v; want 0 draining and lb cut", r.Draining, r.Cut, err)
	}
	assertServers(t, n, []string{"10.96.0.11:80"})
	if bound, _ := n.kernel.BoundAddresses(); len(bound) != 1 {
		t.Errorf("bound after the last virtual server went: %v, want the excluded one's only", bound)
	}
}

func addrStrings(addrs []netip.Addr) []string {
	var out []string
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

// assertServers checks the virtual servers the kernel holds, by address
// and port.
func assertServers(t *testing.T, n *node, want []string) {
	t.Helper()
	vss, err := n.kernel.VirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, vs := range vss {
		got = append(got, netip.AddrPortFrom(vs.Addr, vs.Port).String())
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("virtual servers %v, want %v", got, want)
	}
}

// A real server whose connections have all ended (TCP in TIME_WAIT) goes
// in the first round, with its virtual server when no other real server
// of it has an open connection: expiring later, its entries would delete
// the conntrack entries of new connections from reused client ports.
func TestRetireRemovesWhatOnlyHasEndedConnections(t *testing.T) {
	n, _, _ := fedNode(t)
	web := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	held, ended := netip.MustParseAddrPort("10.244.1.5:8080"), netip.MustParseAddrPort("10.244.1.6:8080")
	if err := n.kernel.AddRealServer(web, ipvskernel.RealServer{Addr: ended.Addr(), Port: ended.Port(), Weight: 1}); err != nil {
		t.Fatal(err)
	}
	lb := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.255.3.1"), Port: 80, Protocol: v1.ProtocolTCP}
	lbEndpoint := netip.MustParseAddrPort("10.244.1.8:8080")
	for _, c := range []struct {
		key              ipvskernel.VirtualServerKey
		real             netip.AddrPort
		active, inactive int
		ended            int
	}{
		{web, held, 1, 3, 2}, // one established, one half-closed, two in TIME_WAIT
		{web, ended, 0, 4, 4},
		{lb, lbEndpoint, 0, 2, 2},
	} {
		if err := n.kernel.SetConnections(c.key, c.real, c.active, c.inactive); err != nil {
			t.Fatal(err)
		}
		if err := n.kernel.SetEndedConnections(c.key, c.real, c.ended); err != nil {
			t.Fatal(err)
		}
	}

	r, err := ipvs.Retire(n.kernel, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Draining != 1 || r.EndedReals != 1 {
		t.Errorf("%d virtual servers draining, %d real servers removed; want 1 (web) and 1 (its ended one)", r.Draining, r.EndedReals)
	}
	assertServers(t, n, []string{"10.96.0.10:80"})
	reals, err := n.kernel.RealServers(web)
	if err != nil {
		t.Fatal(err)
	}
	has := func(a netip.AddrPort) bool {
		return slices.ContainsFunc(reals, func(rs ipvskernel.RealServer) bool { return rs.AddrPort() == a })
	}
	if !has(held) || has(ended) {
		t.Errorf("web's real servers %v, want %s, which holds open connections, and not %s", reals, held, ended)
	}

	// Once the held one's connections end too, web goes.
	if err := n.kernel.SetEndedConnections(web, held, 3); err != nil {
		t.Fatal(err)
	}
	if err := n.kernel.SetConnections(web, held, 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := n.kernel.SetEndedConnections(web, held, 4); err != nil {
		t.Fatal(err)
	}
	if r, err = ipvs.Retire(n.kernel, nil, false); err != nil || r.Draining != 0 {
		t.Errorf("after the held connections ended: %d draining, %v; want none", r.Draining, err)
	}
	assertServers(t, n, nil)
}

// Without the connection table, every connection counts as open: what
// has any stays, and the round says why.
func TestRetireWithoutTheConnectionTableKeepsWhatHasConnections(t *testing.T) {
	n, _, _ := fedNode(t)
	web := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	endpoint := netip.MustParseAddrPort("10.244.1.5:8080")
	if err := n.kernel.SetConnections(web, endpoint, 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := n.kernel.SetEndedConnections(web, endpoint, 2); err != nil {
		t.Fatal(err)
	}
	n.kernel.FailNext("OpenConnections", errors.New("no table"))
	r, err := ipvs.Retire(n.kernel, nil, false)
	if err == nil || !strings.Contains(err.Error(), "connection table") {
		t.Errorf("error %v, want one naming the connection table", err)
	}
	if r.Draining != 1 || r.EndedReals != 0 {
		t.Errorf("%d draining, %d real servers removed; want web kept whole", r.Draining, r.EndedReals)
	}
	assertServers(t, n, []string{"10.96.0.10:80"})
}
