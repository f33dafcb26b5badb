package nftables

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
)

// sendingKernel is the real kernel on nft, sending its transactions over
// netlink through send (to count them, say).
func sendingKernel(family v1.IPFamily, nft knftables.Interface, send func(*nftnl.Writer) error) *realKernel {
	k := NewKernel(family, nft, false).(*realKernel)
	k.netlinkSend = send
	return k
}

// listingKernel is the real kernel on nft, with nothing over netlink but
// the generation, reading the table through list (a Fake's, say).
func listingKernel(family v1.IPFamily, nft knftables.Interface, list func(context.Context, string, string) (io.ReadCloser, error)) *realKernel {
	k := NewKernel(family, nft, true).(*realKernel)
	k.list = list
	return k
}

// listRecorder is a Kernel that keeps each listing asked of it, as "kind
// name".
type listRecorder struct {
	Kernel
	listed *[]string
}

func (r listRecorder) List(ctx context.Context, kind, name string) (*table, error) {
	*r.listed = append(*r.listed, strings.TrimSpace(kind+" "+name))
	return r.Kernel.List(ctx, kind, name)
}

// NewKernel reads and writes over netlink unless nftOnly, and reads the
// generation over netlink either way.
func TestNewKernelGoesOverNetlinkUnlessNFTOnly(t *testing.T) {
	for _, nftOnly := range []bool{false, true} {
		k := NewKernel(v1.IPv6Protocol, knftables.NewFake(knftables.IPv6Family, TableName), nftOnly).(*realKernel)
		overNetlink := []bool{k.netlinkRead != nil, k.netlinkReadObjects != nil, k.netlinkSend != nil}
		for i, set := range overNetlink {
			if set == nftOnly {
				t.Errorf("nftOnly %v: netlink function %d set: %v", nftOnly, i, set)
			}
		}
		if k.list == nil || k.generation == nil || k.writeTx == nil {
			t.Errorf("nftOnly %v: no nft listing, or no generation read over netlink", nftOnly)
		}
		if _, err := k.ReadObjects(t.Context(), nil, nil); nftOnly && !errors.Is(err, errNotOverNetlink) {
			t.Errorf("nftOnly: ReadObjects: %v, want errNotOverNetlink", err)
		}
	}
}

// The Fake runs a transaction on knftables' Fake, reads back what it
// holds, and counts the transactions as the generation; a failed one
// moves nothing.
func TestFakeRunsReadsAndCountsTransactions(t *testing.T) {
	f := NewFake(v1.IPv4Protocol)
	ctx := t.Context()
	if tb, err := f.ReadTable(ctx); err != nil || tb.exists {
		t.Fatalf("empty Fake: %+v, %v", tb, err)
	}
	c := &Chain{Chain: knftables.Chain{Name: "c"}, Rules: []string{"drop"}}
	set := Set{Name: "s", Type: "ipv4_addr"}
	elems := []*knftables.Element{{Set: "s", Key: []string{"10.0.0.1"}}}
	tx := txPlan{{objectOps(addOp, []knftables.Object{&knftables.Table{}, set.object(), &c.Chain}), 0, 3},
		{ruleOps("ip", []ruleRef{{c, 0}}), 0, 1}, {elementOps("ip", elems), 0, 1}}
	if err := f.Run(ctx, tx, nil); err != nil {
		t.Fatal(err)
	}
	tb, err := f.ReadTable(ctx)
	if err != nil || !tb.exists || tb.chains["c"] == nil || strings.Join(tb.chains["c"].Rules, ";") != "drop" {
		t.Fatalf("read back: %+v, %v", tb, err)
	}
	if _, ok := tb.sets["s"].elements["10.0.0.1"]; !ok {
		t.Errorf("set s holds %v", tb.sets["s"].elements)
	}
	if only, err := f.List(ctx, "chain", "c"); err != nil || len(only.chains) != 1 || len(only.sets) != 0 {
		t.Errorf("chain c alone: %+v, %v", only, err)
	}
	if none, err := f.List(ctx, "map", "absent"); err != nil || none.exists {
		t.Errorf("an absent map: %+v, %v", none, err)
	}
	bad := txPlan{{objectOps(addOp, []knftables.Object{&knftables.Rule{Chain: "absent", Rule: "drop"}}), 0, 1}}
	if err := f.Run(ctx, bad, nil); err == nil {
		t.Error("a rule in an absent chain ran")
	}
	if gen, err := f.Generation(); err != nil || gen != 1 {
		t.Errorf("generation %d (%v), want 1", gen, err)
	}
	if _, err := f.ReadObjects(ctx, []string{"c"}, nil); !errors.Is(err, errNotOverNetlink) {
		t.Errorf("ReadObjects: %v, want errNotOverNetlink", err)
	}
	if rules, err := f.ListRules(ctx, "c"); err != nil || len(rules) != 1 {
		t.Errorf("ListRules: %d rules, %v", len(rules), err)
	}
}
