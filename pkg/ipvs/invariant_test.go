package ipvs_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

// The mode's changes to the kernel, one at a time, as the kernel applies
// them: each is followed by the check of watchedKernel's node.
func (k watchedKernel) after(what string, err error) error {
	if err == nil && k.n.changed != nil {
		k.n.changed(what)
	}
	return err
}

func (k watchedKernel) changeSetsOneByOne(changes []ipvskernel.SetChange) error {
	for _, c := range changes {
		sign := "+"
		if c.Delete {
			sign = "-"
		}
		if err := k.after("ipset "+sign+c.Set+" "+c.Entry, k.Fake.ChangeSets([]ipvskernel.SetChange{c})); err != nil {
			k.n.restoreErrors = append(k.n.restoreErrors, err)
			return err
		}
	}
	return nil
}

func (k watchedKernel) AddVirtualServer(vs ipvskernel.VirtualServer) error {
	return k.after("add server "+vs.VirtualServerKey.String(), k.Fake.AddVirtualServer(vs))
}

func (k watchedKernel) UpdateVirtualServer(vs ipvskernel.VirtualServer) error {
	return k.after("update server "+vs.VirtualServerKey.String(), k.Fake.UpdateVirtualServer(vs))
}

func (k watchedKernel) DeleteVirtualServer(key ipvskernel.VirtualServerKey) error {
	return k.after("delete server "+key.String(), k.Fake.DeleteVirtualServer(key))
}

func (k watchedKernel) AddRealServer(key ipvskernel.VirtualServerKey, rs ipvskernel.RealServer) error {
	return k.after(fmt.Sprintf("add real %s to %s", rs.AddrPort(), key), k.Fake.AddRealServer(key, rs))
}

func (k watchedKernel) UpdateRealServer(key ipvskernel.VirtualServerKey, rs ipvskernel.RealServer) error {
	return k.after(fmt.Sprintf("weight %d for real %s of %s", rs.Weight, rs.AddrPort(), key), k.Fake.UpdateRealServer(key, rs))
}

func (k watchedKernel) DeleteRealServer(key ipvskernel.VirtualServerKey, rs netip.AddrPort) error {
	return k.after(fmt.Sprintf("delete real %s of %s", rs, key), k.Fake.DeleteRealServer(key, rs))
}

func (k watchedKernel) Bind(a netip.Addr) error { return k.after("bind "+a.String(), k.Fake.Bind(a)) }

func (k watchedKernel) Unbind(a netip.Addr) error {
	return k.after("unbind "+a.String(), k.Fake.Unbind(a))
}

// kernelView is what of the fake kernel decides whether a new connection
// to a service address is served: its virtual servers, the addresses on
// kube-ipvs0, and the set entries.
type kernelView struct {
	servers map[ipvskernel.VirtualServerKey]bool
	bound   map[netip.Addr]bool
	entries map[string]map[string]bool
}

// The sets whose entries let a service port's traffic past
// KUBE-IPVS-FILTER, and the set of the addresses it rejects otherwise.
var (
	passSets = []string{"KUBE-LOAD-BALANCER", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL"}
	ipvsIPs  = "KUBE-IPVS-IPS"
)

func viewOf(t *testing.T, k *ipvskernel.Fake) kernelView {
	t.Helper()
	v := kernelView{servers: map[ipvskernel.VirtualServerKey]bool{}, bound: map[netip.Addr]bool{}, entries: map[string]map[string]bool{}}
	servers, err1 := k.VirtualServers()
	bound, err2 := k.BoundAddresses()
	entries, err3 := k.SetEntries(append(slices.Clone(passSets), ipvsIPs))
	if err := cmpErr(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		v.servers[s.VirtualServerKey] = true
	}
	for _, a := range bound {
		v.bound[a] = true
	}
	for set, es := range entries {
		v.entries[set] = map[string]bool{}
		for _, e := range es {
			v.entries[set][e] = true
		}
	}
	return v
}

func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// passes tells whether a new connection to key gets past KUBE-IPVS-FILTER.
func (v kernelView) passes(key ipvskernel.VirtualServerKey) bool {
	if !v.entries[ipvsIPs][key.Addr.String()] {
		return true
	}
	entry := fmt.Sprintf("%s,%s:%d", key.Addr, strings.ToLower(string(key.Protocol)), key.Port)
	for _, set := range passSets {
		if v.entries[set][entry] {
			return true
		}
	}
	return false
}

// serving are the virtual servers that must serve new connections all
// through a sync from before to after: those there on both sides, and the
// new ones on an address the sync binds (until it binds it, nothing
// answers there either way).
func serving(before, after kernelView) []ipvskernel.VirtualServerKey {
	var out []ipvskernel.VirtualServerKey
	for key := range after.servers {
		if before.servers[key] || (after.bound[key.Addr] && !before.bound[key.Addr]) {
			out = append(out, key)
		}
	}
	slices.SortFunc(out, ipvskernel.VirtualServerKey.Compare)
	return out
}

// broken says what about v refuses or misroutes a new connection to key,
// if anything: an address bound without its virtual server (the node's
// own sockets answer), or rejected by KUBE-IPVS-FILTER.
func (v kernelView) broken(key ipvskernel.VirtualServerKey, before kernelView) string {
	switch {
	case before.servers[key] && !v.servers[key]:
		return "its virtual server is gone (deleted to be added again)"
	case v.bound[key.Addr] && !v.servers[key]:
		return "its address is bound without its virtual server"
	case v.bound[key.Addr] && !v.passes(key):
		return "KUBE-IPVS-FILTER rejects it: its address is in " + ipvsIPs + " without its entry"
	}
	return ""
}

// syncKeepingServed syncs, and fails the test if any change the sync made
// left a service port that serves before and after it (or one it binds
// the address of) unable to take a new connection.
func syncKeepingServed(t *testing.T, n *node, core *proxy.Core, step string) {
	t.Helper()
	before := viewOf(t, n.kernel)
	var views []kernelView
	var changes []string
	n.changed = func(what string) {
		views = append(views, viewOf(t, n.kernel))
		changes = append(changes, what)
	}
	defer func() { n.changed = nil }()
	sync(t, core)
	after := viewOf(t, n.kernel)
	for _, key := range serving(before, after) {
		for i, v := range views {
			if why := v.broken(key, before); why != "" {
				t.Errorf("%s: after %q, a new connection to %s fails: %s\nthe sync's changes:\n  %s",
					step, changes[i], key, why, strings.Join(changes, "\n  "))
				break
			}
		}
	}
}

// endpoint is an endpoint of the invariant tests: ip, on node-1 if local,
// ready or not (serving either way).
type endpoint struct {
	ip           string
	local, ready bool
}

func setEndpoints(c *proxy.Core, name string, eps ...endpoint) {
	slice := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("p"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, ep := range eps {
		nodeName := "node-2"
		if ep.local {
			nodeName = "node-1"
		}
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{ep.ip}, NodeName: ptr.To(nodeName),
			Conditions: discovery.EndpointConditions{Ready: ptr.To(ep.ready), Serving: ptr.To(true)}})
	}
	c.OnEndpointSlice(slice, false)
}

func localPolicy(s *v1.Service) {
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32001
}

func noStatus(s *v1.Service) { s.Status.LoadBalancer.Ingress = nil }

// Every sync of a LoadBalancer or NodePort service's life, from its
// creation through its type, policy, status and endpoint changes, and a
// restart over it, keeps each of its service ports that serves before
// and after the sync serving at every change it makes to the kernel.
func TestServicesServeAtEveryChangeOfASync(t *testing.T) {
	local, remote := endpoint{"10.244.0.5", true, true}, endpoint{"10.244.1.5", false, true}
	notReady := endpoint{"10.244.0.5", true, false}
	steps := []struct {
		name   string
		change func(c *proxy.Core)
	}{
		{"a LoadBalancer with eTP=Local, no status yet, the local endpoint not ready", func(c *proxy.Core) {
			service(c, "lb", "10.96.0.20", loadBalancer("10.255.3.1"), localPolicy, noStatus)
			setEndpoints(c, "lb", notReady, remote)
		}},
		{"its local endpoint ready", func(c *proxy.Core) { setEndpoints(c, "lb", local, remote) }},
		{"its status", func(c *proxy.Core) { service(c, "lb", "10.96.0.20", loadBalancer("10.255.3.1"), localPolicy) }},
		{"eTP=Cluster", func(c *proxy.Core) { service(c, "lb", "10.96.0.20", loadBalancer("10.255.3.1")) }},
		{"eTP=Local again", func(c *proxy.Core) { service(c, "lb", "10.96.0.20", loadBalancer("10.255.3.1"), localPolicy) }},
		{"a second port", func(c *proxy.Core) {
			service(c, "lb", "10.96.0.20", loadBalancer("10.255.3.1"), localPolicy, twoPorts)
		}},
		{"an externalIP", func(c *proxy.Core) {
			service(c, "lb", "10.96.0.20", loadBalancer("10.255.3.1"), localPolicy, twoPorts, externalIPs("10.255.2.1"))
		}},
		{"another LB IP", func(c *proxy.Core) {
			service(c, "lb", "10.96.0.20", loadBalancer("10.255.3.2"), localPolicy, twoPorts, externalIPs("10.255.2.1"))
		}},
		{"the local endpoint not ready", func(c *proxy.Core) { setEndpoints(c, "lb", notReady, remote) }},
		{"a NodePort with eTP=Cluster", func(c *proxy.Core) {
			service(c, "np", "10.96.0.21", nodePort(30081, false))
			setEndpoints(c, "np", local, remote)
		}},
		{"it becomes a LoadBalancer", func(c *proxy.Core) { service(c, "np", "10.96.0.21", loadBalancer("10.255.3.3")) }},
		{"with eTP=Local", func(c *proxy.Core) { service(c, "np", "10.96.0.21", loadBalancer("10.255.3.3"), localPolicy) }},
		{"a NodePort with eTP=Local again", func(c *proxy.Core) { service(c, "np", "10.96.0.21", nodePort(30999, true)) }},
	}
	n := newNode()
	core, _ := n.proxier(t)
	synced(core)
	sync(t, core)
	for _, s := range steps {
		s.change(core)
		syncKeepingServed(t, n, core, s.name)
	}
	restarted, _ := n.proxier(t)
	for _, s := range steps {
		s.change(restarted)
	}
	synced(restarted)
	syncKeepingServed(t, n, restarted, "a restart")
}
