// The nftables mode's one seam to the kernel: every read and write of its
// table goes through a Kernel, the real one or a Fake.

package nftables

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nfgen"
	"github.com/rapidproxy/rapidproxy/internal/nftnl"
)

// Kernel is the family's kube-proxy table in the kernel, as the syncs,
// the watch and a verify use it.
//
//   - ReadTable reads the whole table, for a full sync: an empty table
//     (exists false) when there is none.
//   - ReadObjects reads just the named chains, and sets and maps, leaving
//     out those not there, in one go; an error when it cannot (always,
//     wrapping errNotOverNetlink, when the table is read with nft only),
//     and the caller lists them one by one instead.
//   - List reads what `nft list` prints of the table (kind "table", name
//     "") or of one chain, set or map in it: an empty table when there
//     is no such object.
//   - Run runs one transaction of ours, all or nothing. sets are the
//     table's sets and maps as it leaves them (the sync's plan of the
//     table): their types encode the elements.
//   - Generation is the ruleset generation, which every transaction
//     (ours or another program's) moves by one, less our own transactions
//     where the kernel can tell them apart.
//   - ListRules lists one chain's rules, for the watch: an error
//     knftables.IsNotFound takes when there is no such chain.
//
// NewKernel is the real one; NewFake is one on knftables' Fake, for tests.
type Kernel interface {
	ReadTable(ctx context.Context) (*table, error)
	ReadObjects(ctx context.Context, chains, sets []string) (*table, error)
	List(ctx context.Context, kind, name string) (*table, error)
	Run(ctx context.Context, tx txPlan, sets tableSets) error
	Generation() (uint64, error)
	ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error)
}

// errNotOverNetlink is ReadObjects' error when the table is read with nft
// only: no failure, nothing to log.
var errNotOverNetlink = errors.New("the table is read with nft only")

// realKernel is the kernel: over netlink where it can, which costs time
// linear in what is read or written, else through the nft program.
type realKernel struct {
	family v1.IPFamily
	// nft runs the transactions netlink does not take; a Streamer (as
	// kube-proxy's is) takes each as it is made, never whole.
	nft knftables.Interface
	// list runs `nft list` (lister): tests list a Fake instead.
	list func(ctx context.Context, kind, name string) (io.ReadCloser, error)
	// netlinkRead, netlinkReadObjects and netlinkSend read and write the
	// table over netlink (nftnl); all nil with nftOnly.
	netlinkRead        func(ctx context.Context) (*nftnl.Table, error)
	netlinkReadObjects func(ctx context.Context, chains, sets []string) (*nftnl.Table, error)
	netlinkSend        func(w *nftnl.Writer) error
	// generation reads the ruleset generation; writeTx wraps each of our
	// transactions so that it does not count them (nfgen). A nil writeTx
	// runs them as they are, for a test's own generation.
	generation func() (uint64, error)
	writeTx    func(write func() error) error
	// loggedRead and loggedEncode keep the fallbacks to nft from being
	// logged more than once: a table read, and a transaction written.
	loggedRead, loggedEncode bool
}

// NewKernel is the family's table in the kernel, written through nft
// (its knftables interface). With nftOnly (upstream's NFTablesNetlink
// gate off) every transaction and read goes through the nft program, as
// upstream's do; the ruleset generation is still read over netlink (one
// small query), as nft itself does.
func NewKernel(family v1.IPFamily, nft knftables.Interface, nftOnly bool) Kernel {
	k := &realKernel{family: family, nft: nft, list: lister(Family(family)),
		generation: nfgen.ForeignGeneration, writeTx: nfgen.Write}
	if !nftOnly {
		fam := string(Family(family))
		k.netlinkRead = func(ctx context.Context) (*nftnl.Table, error) { return nftnl.Read(ctx, fam, TableName) }
		k.netlinkReadObjects = func(ctx context.Context, chains, sets []string) (*nftnl.Table, error) {
			return nftnl.ReadObjects(ctx, fam, TableName, chains, sets)
		}
		k.netlinkSend = (*nftnl.Writer).Send
	}
	return k
}

// ReadTable reads over netlink, which costs time linear in the table's
// size, or with `nft list table` when that fails (a rule of a shape the
// reader does not decode, say), whose rule dump is quadratic in the
// kernel.
func (k *realKernel) ReadTable(ctx context.Context) (*table, error) {
	if k.netlinkRead != nil {
		nt, err := k.netlinkRead(ctx)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return newTable(), nil
		case err == nil:
			return fromNetlink(nt), nil
		case !k.loggedRead:
			klog.V(2).InfoS("Cannot read the nftables table over netlink; listing it with nft instead", "ipFamily", k.family, "err", err)
			k.loggedRead = true
		}
	}
	return k.List(ctx, "table", "")
}

func (k *realKernel) ReadObjects(ctx context.Context, chains, sets []string) (*table, error) {
	if k.netlinkReadObjects == nil {
		return nil, errNotOverNetlink
	}
	nt, err := k.netlinkReadObjects(ctx, chains, sets)
	if err != nil {
		return nil, err
	}
	return fromNetlink(nt), nil
}

func (k *realKernel) List(ctx context.Context, kind, name string) (*table, error) {
	return readTable(ctx, k.list, kind, name)
}

// Run runs the transaction through writeTx: see send.
func (k *realKernel) Run(ctx context.Context, tx txPlan, sets tableSets) error {
	if k.writeTx == nil {
		return k.send(ctx, tx, sets)
	}
	return k.writeTx(func() error { return k.send(ctx, tx, sets) })
}

// maxNetlinkOps bounds the transactions sent over netlink: a batch is
// held whole until it is sent (28 MB for 50k rules), where nft's input is
// streamed, so larger ones (a first sync's, beyond a few thousand
// services) go to nft. Over netlink alone, a first sync at 100k services
// took 12 s instead of 42 (see docs/performance.md).
const maxNetlinkOps = 10000

// send runs one transaction: over netlink when it may and the writer
// encodes every operation (else logged once, at -v=2); else written to
// nft as it is made when nft takes it so (a Streamer), or made whole and
// run.
func (k *realKernel) send(ctx context.Context, tx txPlan, sets tableSets) error {
	if k.netlinkSend != nil && tx.len() <= maxNetlinkOps {
		w, err := netlinkTx(Family(k.family), tx, sets)
		if err == nil {
			return k.netlinkSend(w)
		}
		if !k.loggedEncode {
			klog.V(2).InfoS("Cannot write the nftables transaction over netlink; writing it with nft instead", "ipFamily", k.family, "err", err)
			k.loggedEncode = true
		}
	}
	if st, ok := k.nft.(streamRunner); ok {
		return st.runStream(ctx, func(w *bufio.Writer) error { return tx.write(w, k.nft) })
	}
	return k.nft.Run(ctx, tx.transaction(k.nft))
}

func (k *realKernel) Generation() (uint64, error) { return k.generation() }

func (k *realKernel) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	return k.nft.ListRules(ctx, chain)
}
