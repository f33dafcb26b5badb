package nftables

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

// inNetns re-runs the calling test inside a fresh network namespace, and
// tells whether this is that inner run.
func inNetns(t *testing.T) bool {
	testutil.RequireRoot(t)
	testutil.RequireCommands(t, "nft", "ip")
	return testutil.RerunInNetns(t, [][2]string{{"fresh namespace", ""}})
}

// kernelNFT is the real nft, streamed to as the syncer's is, and the
// netlink writer, keeping each transaction either ran (nft's text, or
// the writer's operations, a line each) and counting chain listings and
// transactions over netlink.
type kernelNFT struct {
	*Streamer
	txs         []string
	lists       atomic.Int32
	overNetlink int
}

// send sends the syncer's transactions over netlink (see sendingKernel).
func (k *kernelNFT) send(w *nftnl.Writer) error {
	k.txs = append(k.txs, w.String())
	k.overNetlink++
	return w.Send()
}

func (k *kernelNFT) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	k.lists.Add(1)
	return k.Streamer.ListRules(ctx, chain)
}

func (k *kernelNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	k.txs = append(k.txs, tx.String())
	return k.Streamer.Run(ctx, tx)
}

// realStreamer is the real nft on the family's kube-proxy table, streamed
// to as kube-proxy's is.
func realStreamer(t testing.TB, family knftables.Family) *Streamer {
	t.Helper()
	real, err := knftables.New(family, TableName)
	if err != nil {
		t.Fatal(err)
	}
	st, err := NewStreamer(real)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// kernelHarness is a harness whose syncer writes the real table.
func kernelHarness(t *testing.T, family v1.IPFamily, params Params) (*harness, *kernelNFT) {
	t.Helper()
	st := realStreamer(t, Family(family))
	if err := Cleanup(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	k := &kernelNFT{Streamer: st}
	start := st.start
	st.start = func(ctx context.Context) (io.WriteCloser, func() error, error) {
		in, wait, err := start(ctx)
		var text strings.Builder
		return teeCloser{in, &text}, func() error {
			k.txs = append(k.txs, text.String())
			return wait()
		}, err
	}
	h := newHarness(t, family, params)
	h.syncer = h.kernelSyncer(family, params, k)
	return h, k
}

// teeCloser is an input that a copy of is kept.
type teeCloser struct {
	io.WriteCloser
	copy io.Writer
}

func (t teeCloser) Write(p []byte) (int, error) {
	_, _ = t.copy.Write(p)
	return t.WriteCloser.Write(p)
}

func (h *harness) kernelSyncer(family v1.IPFamily, params Params, k *kernelNFT) *Syncer {
	s, err := New(Config{Family: family, Kernel: sendingKernel(family, k, k.send), Params: params})
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// listed is the kernel's table, read back with our reader and dumped as
// the golden files are.
func listed(t *testing.T, family v1.IPFamily) string {
	t.Helper()
	kf := Family(family)
	tb, err := readTable(t.Context(), lister(kf), "table", "")
	if err != nil {
		t.Fatal(err)
	}
	return dump(replay(t, tb, kf))
}

// Every golden table, written by the real nft and listed back, is the
// golden file (so each rule is in nft's own listing form), and a restart
// over it writes nothing.
func TestKernelGoldenTables(t *testing.T) {
	if !inNetns(t) {
		return
	}
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			family := tc.ipFamily()
			h, k := kernelHarness(t, family, tc.params(t))
			tc.firstSync(h)
			want, err := os.ReadFile(filepath.Join("testdata", tc.name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			if got := listed(t, family); got != string(want) {
				t.Errorf("nft lists (+) what differs from the golden file (-):\n%s", testutil.LineDiff(string(want), got))
			}
			h.syncer = h.kernelSyncer(family, tc.params(t), k)
			n := len(k.txs)
			h.full()
			if len(k.txs) != n {
				t.Errorf("a restart wrote:\n%s", k.txs[len(k.txs)-1])
			}
		})
	}
}

// On the real kernel: a partial sync of one endpoint change, a removal
// whose chains are deleted a second later, and a takeover from the table
// upstream v1.36.3 wrote, loaded as it was listed.
func TestKernelSyncs(t *testing.T) {
	if !inNetns(t) {
		return
	}
	h, k, params := kernelSample(t)

	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.11"), ep("10.244.1.12", "node=node-2"), ep("10.244.1.15")))
	n, overNetlink := len(k.txs), k.overNetlink
	h.partial()
	// Two chains flushed, their five rules, the hairpin element.
	if len(k.txs) != n+1 || len(operations(k.txs[n])) != 8 || k.overNetlink != overNetlink+1 {
		t.Errorf("one endpoint change wrote (over netlink: %d):\n%s", k.overNetlink-overNetlink, strings.Join(k.txs[n:], "\n"))
	}
	compareWithFresh(t, h, params)

	h.tracker.OnService(types.NamespacedName{Namespace: "hx-conf", Name: "fid-a"}, nil)
	h.changed = h.tracker.Apply(h.state).ServicePorts
	h.partial()
	time.Sleep(staleChainDelay + 100*time.Millisecond)
	h.changed = nil
	h.partial()
	if last := k.txs[len(k.txs)-1]; strings.Count(last, "deleting chain") != 8 {
		t.Errorf("the removed service's chains were not deleted:\n%s", last)
	}
	compareWithFresh(t, h, params)

	// Upstream's table, as upstream left it (affinity entries too).
	sample, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(t.Context(), k.Interface); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(sampleTable(t, string(sample), "table ip kube-proxy {"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("loading upstream's table: %v: %s", err, out)
	}
	up := newHarness(t, v1.IPv4Protocol, params)
	up.syncer = up.kernelSyncer(v1.IPv4Protocol, params, k)
	up.apply(sampleObjects()...)
	n = len(k.txs)
	up.full()
	if len(k.txs) != n {
		t.Errorf("taking over upstream's table wrote:\n%s", k.txs[len(k.txs)-1])
	}
	// The affinity entry upstream's table held is still there.
	out, err := exec.Command("nft", "list", "set", "ip", TableName, "affinity-J3ASCV4X-hx-conf/fid-a/tcp/http__10.244.1.11/8080").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.244.1.100") {
		t.Errorf("affinity entry lost: %v: %s", err, out)
	}
}

// kernelSample is a kernel harness after a full sync of the sample
// services.
func kernelSample(t *testing.T) (*harness, *kernelNFT, Params) {
	t.Helper()
	params := v4(nil)(t)
	h, k := kernelHarness(t, v1.IPv4Protocol, params)
	h.apply(sampleObjects()...)
	h.full()
	return h, k, params
}

// compareWithFresh compares the kernel's table with what one full sync of
// the same state writes into an empty Fake.
func compareWithFresh(t *testing.T, h *harness, params Params) {
	t.Helper()
	fresh := newHarness(t, v1.IPv4Protocol, params)
	fresh.state, fresh.node = h.state, h.node
	fresh.full()
	if want, got := dump(fresh.nft.Fake), listed(t, v1.IPv4Protocol); want != got {
		t.Errorf("the kernel's table (+) differs from a fresh sync (-):\n%s", testutil.LineDiff(want, got))
	}
}

// On the real kernel the watch lists nothing while idle or after our own
// syncs; after another program's change it lists once and asks for a full
// sync, which writes nothing when the change was not to our table, and
// restores it when it was: the table flushed or deleted, a chain of ours
// flushed, a rule added to one. How soon it noticed is logged, not
// asserted.
func TestKernelWatch(t *testing.T) {
	if !inNetns(t) {
		return
	}
	h, k := kernelHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(sampleObjects()...)
	h.full()
	resyncs := make(chan struct{}, 100)
	prober := &countingProber{Prober: h.syncer}
	go proxy.WatchKernel(t.Context(), prober, func() time.Duration { return 0 }, func() { resyncs <- struct{}{} })
	// quiet waits for probes to run (the watch asks for a resync after a
	// probe, before the next: three probes make two whole looks) and
	// requires that none asked for a resync.
	quiet := func(what string, wantLists int32) {
		t.Helper()
		k.lists.Store(0)
		prober.await(t, 3)
		select {
		case <-resyncs:
			t.Errorf("%s: a resync was asked for", what)
		default:
		}
		if n := k.lists.Load(); n != wantLists {
			t.Errorf("%s: %d listings, want %d", what, n, wantLists)
		}
	}
	nft := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// noticed waits for the watch to ask for a full sync, runs it, and
	// checks whether it wrote, and counted a repair.
	repairs := func() float64 {
		var m dto.Metric
		if err := metrics.NFTablesRepairsTotal.WithLabelValues(string(v1.IPv4Protocol)).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	noticed := func(what string, wantWrite bool) {
		t.Helper()
		start := time.Now()
		select {
		case <-resyncs:
			t.Logf("%s noticed after %v (a probe a second)", what, time.Since(start).Round(time.Millisecond))
		case <-time.After(time.Minute):
			t.Fatalf("%s: not noticed in a minute: the watch is not running", what)
		}
		n, counted := len(k.txs), repairs()
		h.full()
		if wrote := len(k.txs) > n; wrote != wantWrite {
			t.Errorf("%s: the full sync wrote: %v, want %v", what, wrote, wantWrite)
		}
		if got := repairs() - counted; got != map[bool]float64{true: 1}[wantWrite] {
			t.Errorf("%s: %v repairs counted", what, got)
		}
		for len(resyncs) > 0 {
			<-resyncs
		}
	}

	quiet("idle", 0)
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.15")))
	h.partial()
	quiet("after our own partial sync", 0)
	k.lists.Store(0)
	nft("add", "table", "ip", "someone-else")
	noticed("another table added", false)
	if n := k.lists.Load(); n != 1 {
		t.Errorf("after another table was added: %d listings, want 1", n)
	}
	quiet("after that", 0)

	const ours = "service-DMA2WJPR-hx-conf/fid-a/tcp/http"
	for _, damage := range [][]string{
		{"flush", "table", "ip", TableName},
		{"delete", "table", "ip", TableName},
		{"flush", "chain", "ip", TableName, ours},
		{"insert", "rule", "ip", TableName, ours, "drop"},
	} {
		nft(damage...)
		noticed("nft "+strings.Join(damage, " "), true)
		quiet("after the repair", 0)
	}
	compareWithFresh(t, h, v4(nil)(t))
}

// countingProber counts the probes the watch made, so that a test waits
// for them instead of for a time.
type countingProber struct {
	proxy.Prober
	probes atomic.Int32
}

func (p *countingProber) Probe(ctx context.Context) (string, bool) {
	gone, changed := p.Prober.Probe(ctx)
	p.probes.Add(1)
	return gone, changed
}

// await waits for n more probes to end.
func (p *countingProber) await(t *testing.T, n int32) {
	t.Helper()
	want := p.probes.Load() + n
	deadline := time.Now().Add(time.Minute)
	for p.probes.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d probes in a minute, want %d: the watch is not running", p.probes.Load(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With NFTOnly (upstream's NFTablesNetlink gate off) the same syncs go
// through the nft program alone and leave the same table.
func TestKernelSyncsThroughNFTOnly(t *testing.T) {
	if !inNetns(t) {
		return
	}
	params := v4(nil)(t)
	h, k := kernelHarness(t, v1.IPv4Protocol, params)
	s, err := New(Config{Family: v1.IPv4Protocol, Kernel: NewKernel(v1.IPv4Protocol, k, true), Params: params})
	if err != nil {
		t.Fatal(err)
	}
	if real := s.cfg.Kernel.(*realKernel); real.netlinkSend != nil || real.netlinkRead != nil || real.netlinkReadObjects != nil {
		t.Fatal("NFTOnly: a netlink reader or writer is set")
	}
	h.syncer = s
	h.apply(sampleObjects()...)
	h.full()
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.11"), ep("10.244.1.12", "node=node-2"), ep("10.244.1.15")))
	h.partial()
	if k.overNetlink != 0 || len(k.txs) == 0 {
		t.Errorf("%d transactions over netlink, %d in all; want none over netlink", k.overNetlink, len(k.txs))
	}
	compareWithFresh(t, h, params)
}

// A service whose "namespace/name:port" is longer than the 128 bytes nft
// takes as a comment (63 + 1 + 63 + 1 + 15) is written with its comment
// cut there, as upstream's: not one failed transaction.
func TestKernelLongNamesFitTheCommentLimit(t *testing.T) {
	if !inNetns(t) {
		return
	}
	params := v4(nil)(t)
	h, _ := kernelHarness(t, v1.IPv4Protocol, params)
	ns, name, portName := strings.Repeat("n", 63), strings.Repeat("s", 63), strings.Repeat("p", 15)
	h.apply(service(ns, name, "10.96.10.40", []port{{portName, v1.ProtocolTCP, 80, 31999}}, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
	}))
	h.full()
	out, err := exec.Command("nft", "list", "map", "ip", TableName, mapNoEndpointServices).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	full := ns + "/" + name + ":" + portName
	if want := `comment "` + full[:knftables.CommentLengthMax] + `"`; !strings.Contains(string(out), want) {
		t.Errorf("no element with the comment cut to %d bytes in:\n%s", knftables.CommentLengthMax, out)
	}
	compareWithFresh(t, h, params)
}
