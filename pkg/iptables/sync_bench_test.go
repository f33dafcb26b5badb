package iptables

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"golang.org/x/sys/unix"

	iptablesrunner "github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// BenchmarkFullSyncIntoAnEmptyKernel times one full sync of N ClusterIP
// services with 5 endpoints each into a fresh network namespace, through
// the real iptables tools: the first sync of make bench without the API
// server, for trying out changes to what the sync writes. As root:
//
//	go test -run '^$' -bench 'FullSyncIntoAnEmptyKernel/nft/N=10000' -benchtime 3x ./pkg/iptables
func BenchmarkFullSyncIntoAnEmptyKernel(b *testing.B) {
	testutil.RequireCommands(b, "iptables-legacy-restore", "iptables-nft-restore")
	for _, backend := range []iptablesrunner.Backend{iptablesrunner.NFT, iptablesrunner.Legacy} {
		for _, n := range []int{1000, 10000, 30000} {
			b.Run(fmt.Sprintf("%s/N=%d", backend, n), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					netns := testutil.NewNetns(b)
					leave := enterNetns(b, netns)
					p := newTestProxier(b, iptablesrunner.New(false, backend))
					if backend == iptablesrunner.NFT {
						p.cfg.ChainRefsPerRestore = ChainRefsPerRestoreNFT
					}
					feedClusterIPs(p, n, 5)
					b.StartTimer()
					err := p.sync()
					b.StopTimer()
					leave()
					if err != nil {
						b.Fatal(err)
					}
					if out, err := exec.Command("ip", "netns", "delete", netns).CombinedOutput(); err != nil {
						b.Fatalf("deleting %s: %v: %s", netns, err, out)
					}
					b.StartTimer()
				}
			})
		}
	}
}

// enterNetns moves the calling goroutine's thread into a namespace, so
// that the programs it starts run there, until the returned func.
func enterNetns(b *testing.B, name string) (leave func()) {
	b.Helper()
	runtime.LockOSThread()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		b.Fatal(err)
	}
	target, err := os.Open("/run/netns/" + name)
	if err != nil {
		b.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		b.Fatal(err)
	}
	return func() {
		defer home.Close()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			b.Fatal(err) // the thread stays locked, so it ends with the goroutine
		}
		runtime.UnlockOSThread()
	}
}

// feedClusterIPs gives the proxier n ClusterIP services with the given
// number of ready endpoints each, as make bench creates them.
func feedClusterIPs(p *Proxier, n, endpoints int) {
	ready := true
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		p.OnService(&v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.ServiceSpec{ClusterIP: fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&0xff, i&0xff),
				Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}},
		}, false)
		slice := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-x", Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("p"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
		}
		for e := range endpoints {
			j := i*endpoints + e
			slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+j>>16, j>>8&0xff, j&0xff)},
				Conditions: discovery.EndpointConditions{Ready: &ready}})
		}
		p.OnEndpointSlice(slice, false)
	}
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
}
