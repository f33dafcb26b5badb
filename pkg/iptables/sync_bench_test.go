package iptables

import (
	"fmt"
	"os/exec"
	"testing"

	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
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
	for _, backend := range []iptableskernel.Backend{iptableskernel.NFT, iptableskernel.Legacy} {
		for _, n := range []int{1000, 10000, 30000} {
			b.Run(fmt.Sprintf("%s/N=%d", backend, n), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					netns := testutil.NewNetns(b)
					// The iptables tools the sync starts run in the namespace.
					testutil.DoInNetns(b, netns, func() {
						p := newTestProxier(b, iptableskernel.New(false, backend))
						if backend == iptableskernel.NFT {
							p.cfg.ChainRefsPerRestore = ChainRefsPerRestoreNFT
						}
						feedClusterIPs(p, n, 5)
						b.StartTimer()
						err := p.sync()
						b.StopTimer()
						if err != nil {
							b.Fatal(err)
						}
					})
					if out, err := exec.Command("ip", "netns", "delete", netns).CombinedOutput(); err != nil {
						b.Fatalf("deleting %s: %v: %s", netns, err, out)
					}
					b.StartTimer()
				}
			})
		}
	}
}
