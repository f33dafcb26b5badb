package nftables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// streamed is a Streamer on a Fake that runs no nft: it keeps the text of
// each transaction, and whether nft would have been killed before reading
// the end of it (so applying none of it).
type streamed struct {
	txs    []string
	killed []bool
}

func (st *streamed) streamer(family knftables.Family) *Streamer {
	return &Streamer{Interface: knftables.NewFake(family, TableName), start: func(ctx context.Context) (io.WriteCloser, func() error, error) {
		in := &input{}
		return in, func() error {
			st.txs = append(st.txs, in.String())
			st.killed = append(st.killed, ctx.Err() != nil && !in.closed)
			return nil
		}, nil
	}}
}

type input struct {
	bytes.Buffer
	closed bool
}

func (in *input) Close() error {
	in.closed = true
	return nil
}

// A streamed transaction is, part by part, the text knftables writes for
// it whole: for every golden table, and for a large sync written in
// several transactions of several parts each.
func TestStreamedTransactionsAreWhatKnftablesWrites(t *testing.T) {
	check := func(t *testing.T, h *harness, family v1.IPFamily, maxOps int) {
		t.Helper()
		h.syncer.maxTxOps = maxOps
		h.full()
		var st streamed
		k := listingKernel(family, st.streamer(Family(family)), listFake(knftables.NewFake(Family(family), TableName)))
		k.generation, k.writeTx = func() (uint64, error) { return 0, nil }, nil
		s, err := New(Config{Family: family, Kernel: k, Params: h.syncer.cfg.Params})
		if err != nil {
			t.Fatal(err)
		}
		s.maxTxOps = maxOps
		if err := s.FullSync(h.view()); err != nil {
			t.Fatal(err)
		}
		if len(st.txs) != len(h.nft.txs) {
			t.Fatalf("%d transactions streamed, %d run whole", len(st.txs), len(h.nft.txs))
		}
		for i := range st.txs {
			if st.txs[i] != h.nft.txs[i] {
				t.Errorf("transaction %d streamed (+) differs from knftables' (-):\n%s", i, testutil.LineDiff(h.nft.txs[i], st.txs[i]))
			}
		}
	}
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.ipFamily(), tc.params(t))
			h.apply(tc.objs...)
			check(t, h, tc.ipFamily(), maxTxOps)
		})
	}
	t.Run("split", func(t *testing.T) {
		// 2,700 operations: transactions of up to 2,000, with parts of
		// knftables' objects of 1,000 between lines of ours.
		h := scaleHarness(300)
		h.t = t
		h.syncer = h.newSyncer(v1.IPv4Protocol, h.syncer.cfg.Params)
		check(t, h, v1.IPv4Protocol, 2*partOps)
		if len(h.nft.txs) < 3 || len(operations(h.nft.txs[1])) <= partOps {
			t.Errorf("expected several transactions, one of more than a part: %d", len(h.nft.txs))
		}
	})
}

// An invalid object fails a streamed transaction before nft reads the end
// of its input, so nft applies none of it, however much it read before.
func TestAnInvalidObjectStopsTheStreamedTransaction(t *testing.T) {
	var st streamed
	s := st.streamer(knftables.IPv4Family)
	// Parts of knftables' objects (more than the writer buffers), a line
	// of ours, then an invalid object.
	valid := []knftables.Object{&knftables.Table{}}
	for i := range 3 * partOps {
		valid = append(valid, &knftables.Chain{Name: fmt.Sprintf("c%d", i)})
	}
	c0 := &Chain{Chain: knftables.Chain{Name: "c0"}, Rules: []string{"drop"}}
	plan := txPlan{{objectOps(addOp, valid), 0, len(valid)}, {ruleOps("ip", []ruleRef{{c0, 0}}), 0, 1},
		{objectOps(addOp, []knftables.Object{&knftables.Rule{Rule: "drop"}}), 0, 1}}
	err := s.runStream(t.Context(), func(w *bufio.Writer) error { return plan.write(w, s) })
	if err == nil || !strings.Contains(err.Error(), "chain") {
		t.Errorf("got %v, want the invalid rule's error", err)
	}
	if len(st.killed) != 1 || !st.killed[0] {
		t.Fatalf("nft was not killed before the end of its input: %v", st.killed)
	}
	if !strings.HasPrefix(st.txs[0], "add table ip kube-proxy\nadd chain ip kube-proxy c0\n") || strings.Contains(st.txs[0], "ERROR") {
		t.Errorf("nft read %d bytes, not a beginning of the valid operations", len(st.txs[0]))
	}
}

// A streamed transaction nft refuses at its end applies nothing of what
// came before, and its error is nft's.
func TestKernelRefusedStreamedTransactionAppliesNothing(t *testing.T) {
	if !inNetns(t) {
		return
	}
	s := realStreamer(t, knftables.IPv4Family)
	first := &Chain{Chain: knftables.Chain{Name: "first"}}
	var refs []ruleRef
	for i := range 3 * partOps {
		first.Rules = append(first.Rules, "counter")
		refs = append(refs, ruleRef{first, i})
	}
	plan := txPlan{{objectOps(addOp, []knftables.Object{&knftables.Table{}, &first.Chain}), 0, 2}, {ruleOps("ip", refs), 0, len(refs)},
		{objectOps(addOp, []knftables.Object{&knftables.Rule{Chain: "absent", Rule: "drop"}}), 0, 1}}
	err := s.runStream(t.Context(), func(w *bufio.Writer) error { return plan.write(w, s) })
	if err == nil || !strings.Contains(err.Error(), "No such file or directory") {
		t.Errorf("got %v, want nft's error for the absent chain", err)
	}
	tb, err := readTable(t.Context(), lister(knftables.IPv4Family), "table", "")
	if err != nil {
		t.Fatal(err)
	}
	if tb.exists {
		t.Errorf("the refused transaction left the table with %d chains", len(tb.chains))
	}
}
