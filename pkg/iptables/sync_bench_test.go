package iptables

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

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
