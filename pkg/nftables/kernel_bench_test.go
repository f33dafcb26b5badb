package nftables

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// timedNFT is the real nft, streamed to as the syncer's is, and the
// netlink writer, timing their transactions and counting what they hold
// (an operation a line; over netlink, a message a line: the elements of
// one set written together are one). Bytes are nft's input only.
type timedNFT struct {
	*Streamer
	took       time.Duration
	txs, ops   int
	bytes, max int
	netlink    int
}

// send is the syncer's Config.Send.
func (n *timedNFT) send(w *nftnl.Writer) error {
	ops := strings.Count(w.String(), "\n") + 1
	began := time.Now()
	err := w.Send()
	n.took += time.Since(began)
	n.txs, n.ops, n.netlink = n.txs+1, n.ops+ops, n.netlink+1
	return err
}

func newTimedNFT(tb testing.TB) *timedNFT {
	st := realStreamer(tb, knftables.IPv4Family)
	n := &timedNFT{Streamer: st}
	start := st.start
	st.start = func(ctx context.Context) (io.WriteCloser, func() error, error) {
		began := time.Now()
		in, wait, err := start(ctx)
		counted := &countingWriter{WriteCloser: in}
		return counted, func() error {
			err := wait()
			n.took += time.Since(began)
			n.txs, n.ops = n.txs+1, n.ops+counted.lines
			n.bytes, n.max = n.bytes+counted.bytes, max(n.max, counted.bytes)
			return err
		}, err
	}
	return n
}

type countingWriter struct {
	io.WriteCloser
	bytes, lines int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.bytes += len(p)
	w.lines += bytes.Count(p, []byte("\n"))
	return w.WriteCloser.Write(p)
}

func (n *timedNFT) reset() { *n = timedNFT{Streamer: n.Streamer} }

// nthAddr is the nth address after base.
func nthAddr(base string, n int) string {
	a := netip.MustParseAddr(base).As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// scaleHarness holds n ClusterIP services with 5 endpoints each, the
// first of them on this node.
func scaleHarness(n int) *harness {
	h := newHarness(&testing.T{}, v1.IPv4Protocol, v4(nil)(&testing.T{}))
	objs := make([]any, 0, 2*n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		eps := []discovery.Endpoint{ep(nthAddr("10.244.0.0", 5*i))}
		for j := 1; j < 5; j++ {
			eps = append(eps, ep(nthAddr("10.244.0.0", 5*i+j), "node=node-2"))
		}
		objs = append(objs, service("ns", name, nthAddr("10.96.0.1", i), http80, nil), endpointSlice("ns", name, ep8080, eps...))
	}
	h.apply(objs...)
	return h
}

// BenchmarkKernelSync measures, on the real kernel in a fresh network
// namespace, a first full sync of N ClusterIP services x 5 endpoints
// (the syncer's plan and its transactions: over netlink up to
// maxNetlinkOps operations, else nft -f), a restart over it (reading the
// table over netlink, writing nothing), one endpoint change (over
// netlink; change-send-ms is the batch's send, nearly all of it the
// kernel's), and an explanation's verify of one service port. It reports
// seconds and the transactions' size. As root:
//
//	go test -run '^$' -bench 'KernelSync/N=10000' -benchtime 1x ./pkg/nftables
func BenchmarkKernelSync(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireCommands(b, "nft", "ip")
	for _, n := range []int{1000, 10000, 30000, 100000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			b.StopTimer()
			h := scaleHarness(n)
			for range b.N {
				netns := testutil.NewNetns(b)
				testutil.DoInNetns(b, netns, func() { kernelSyncOnce(b, h) })
				if out, err := exec.Command("ip", "netns", "delete", netns).CombinedOutput(); err != nil {
					b.Fatalf("deleting %s: %v: %s", netns, err, out)
				}
			}
		})
	}
}

func kernelSyncOnce(b *testing.B, h *harness) {
	nft := newTimedNFT(b)
	newSyncer := func() *Syncer {
		s, err := New(Config{Family: v1.IPv4Protocol, Kernel: sendingKernel(v1.IPv4Protocol, nft, nft.send), Params: h.syncer.cfg.Params})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	s := newSyncer()
	start := time.Now()
	if err := s.FullSync(h.view()); err != nil {
		b.Fatal(err)
	}
	first := time.Since(start)
	b.ReportMetric(first.Seconds(), "first-s")
	b.ReportMetric(nft.took.Seconds(), "first-nft-s")
	b.ReportMetric(float64(nft.txs), "first-txs")
	b.ReportMetric(float64(nft.netlink), "first-netlink-txs")
	b.ReportMetric(float64(nft.ops), "first-ops")
	b.ReportMetric(float64(nft.bytes)/1e6, "first-MB")
	b.ReportMetric(float64(nft.max)/1e6, "first-max-tx-MB")

	nft.reset()
	s = newSyncer()
	start = time.Now()
	if err := s.FullSync(h.view()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(time.Since(start).Seconds(), "restart-s")
	b.ReportMetric(float64(nft.ops), "restart-ops")

	nft.reset()
	h.apply(endpointSlice("ns", "svc-7", ep8080, ep("10.244.0.35"), ep(nthAddr("10.250.0.0", int(time.Now().UnixNano()%1000)), "node=node-2")))
	start = time.Now()
	if err := s.PartialSync(h.view(), h.changed); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1e3, "change-ms")
	b.ReportMetric(float64(nft.took.Microseconds())/1e3, "change-send-ms")
	b.ReportMetric(float64(nft.ops), "change-ops")
	b.ReportMetric(float64(nft.netlink), "change-netlink-txs")

	// An explanation's verify of that service port reads its chain and the
	// whole service-ips map and cluster-ips set over netlink.
	_, check := s.Describe(h.view(), httpPort("svc-7"))
	start = time.Now()
	if differences, err := check(); err != nil || len(differences) > 0 {
		b.Fatalf("verify: %v %q", err, differences)
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1e3, "verify-ms")
}
