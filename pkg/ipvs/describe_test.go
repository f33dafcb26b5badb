package ipvs_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

func objectLines(objects []proxy.KernelObject) []string {
	var out []string
	for _, o := range objects {
		out = append(out, o.String())
	}
	return out
}

// An explanation names a NodePort service's virtual servers (the cluster
// IP and each node address) with their real servers, its address on
// kube-ipvs0 and its set entries; the kernel the sync wrote holds them all.
func TestExplainNamesTheObjects(t *testing.T) {
	n := newNode()
	core, _ := n.proxier(t)
	feedServices(core)
	sync(t, core)
	e := core.Explain(types.NamespacedName{Namespace: "ns", Name: "local"}, true)
	k := e.ServicePorts[0].Kernel
	want := []string{
		"virtual server 10.96.0.12:80/TCP: rr: 10.244.0.7:8080 10.244.1.7:8080",
		"virtual server 10.255.0.2:30080/TCP: rr: 10.244.0.7:8080",
		"virtual server 10.255.1.1:30080/TCP: rr: 10.244.0.7:8080",
		"address 10.96.0.12: on kube-ipvs0",
		"set entry KUBE-LOOP-BACK 10.244.0.7,tcp:8080,10.244.0.7",
		"set entry KUBE-CLUSTER-IP 10.96.0.12,tcp:80",
		"set entry KUBE-NODE-PORT-TCP 30080",
		"set entry KUBE-NODE-PORT-LOCAL-TCP 30080",
	}
	if got := objectLines(k.Objects); !slices.Equal(got, want) {
		t.Errorf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if k.Mode != "ipvs" || k.Verify == nil || k.Verify.Error != "" || len(k.Verify.Differences) != 0 {
		t.Errorf("verify right after a sync: %+v", k.Verify)
	}
}

// Verification finds what another program changed in the kernel for the
// service, and nothing of what is as wanted; a real server at weight 0 is
// draining, not a difference.
func TestVerifyFindsWhatChanged(t *testing.T) {
	n := newNode()
	core, _ := n.proxier(t)
	feedServices(core)
	sync(t, core)
	web := ipvskernel.VirtualServerKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	for _, change := range []func() error{
		func() error { return n.kernel.DeleteRealServer(web, netip.MustParseAddrPort("10.244.1.5:8080")) },
		func() error {
			return n.kernel.AddRealServer(web, ipvskernel.RealServer{Addr: netip.MustParseAddr("10.244.9.9"), Port: 8080, Weight: 1})
		},
		func() error {
			return n.kernel.AddRealServer(web, ipvskernel.RealServer{Addr: netip.MustParseAddr("10.244.9.10"), Port: 8080, Weight: 0})
		},
		func() error {
			return n.kernel.UpdateRealServer(web, ipvskernel.RealServer{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080, Weight: 0})
		},
		func() error {
			return n.kernel.UpdateVirtualServer(ipvskernel.VirtualServer{VirtualServerKey: web, Scheduler: "wrr"})
		},
		func() error { return n.kernel.Unbind(netip.MustParseAddr("10.96.0.10")) },
		func() error {
			return n.kernel.ChangeSets([]ipvskernel.SetChange{{Set: "KUBE-CLUSTER-IP", Entry: "10.96.0.10,tcp:80", Delete: true}})
		},
	} {
		if err := change(); err != nil {
			t.Fatal(err)
		}
	}
	got := core.Explain(types.NamespacedName{Namespace: "ns", Name: "web"}, true).ServicePorts[0].Kernel.Verify
	want := []string{
		"virtual server 10.96.0.10:80/TCP is scheduler wrr, flags 0x0, timeout 0, want scheduler rr, flags 0x0, timeout 0",
		"real server 10.244.0.5:8080 of 10.96.0.10:80/TCP has weight 0, want 1",
		"virtual server 10.96.0.10:80/TCP lacks real server 10.244.1.5:8080",
		"virtual server 10.96.0.10:80/TCP has real server 10.244.9.9:8080, not wanted",
		"10.96.0.10 is not bound to kube-ipvs0",
		"set KUBE-CLUSTER-IP lacks 10.96.0.10,tcp:80",
	}
	if got == nil || got.Error != "" || !slices.Equal(got.Differences, want) {
		t.Errorf("verify: %+v\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

// A kernel that cannot be read is an error, not a list of differences.
func TestVerifyReportsAnUnreadableKernel(t *testing.T) {
	n := newNode()
	core, _ := n.proxier(t)
	feedServices(core)
	sync(t, core)
	n.kernel.FailNext("VirtualServers", errors.New("netlink said no"))
	got := core.Explain(types.NamespacedName{Namespace: "ns", Name: "web"}, true).ServicePorts[0].Kernel.Verify
	if got == nil || !strings.Contains(got.Error, "netlink said no") {
		t.Errorf("verify: %+v", got)
	}
}
