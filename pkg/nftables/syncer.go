package nftables

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"sync"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Config are the nftables mode's inputs for one IP family.
type Config struct {
	Family v1.IPFamily
	// NFT runs transactions on the family's kube-proxy table.
	NFT knftables.Interface
	// List returns the table as `nft list table <family> kube-proxy`
	// prints it; nil runs nft.
	List   func(ctx context.Context) (io.ReadCloser, error)
	Params Params
}

// Syncer is the nftables mode for one IP family: the proxy core hands it
// the state, and it writes what differs from what the kernel holds, in one
// transaction per sync.
type Syncer struct {
	cfg Config
	mu  sync.Mutex
}

// New returns the nftables mode; proxy.NewCore runs it.
func New(cfg Config) (*Syncer, error) {
	if cfg.NFT == nil {
		return nil, errors.New("nftables: no knftables interface")
	}
	cfg.Params.IPv6 = cfg.Family == v1.IPv6Protocol
	return &Syncer{cfg: cfg}, nil
}

// SetServiceCIDRs changes the ServiceCIDRs whose unallocated addresses are
// dropped; the next sync rewrites cluster-ips-check.
func (s *Syncer) SetServiceCIDRs(cidrs []netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Params.ServiceCIDRs = cidrs
}

// FullSync makes the table hold what the whole state asks for.
func (s *Syncer) FullSync(v state.View) error {
	return errors.New("nftables: not implemented yet")
}

// PartialSync rewrites what the changed service ports own.
func (s *Syncer) PartialSync(v state.View, changed map[state.ServicePortName]bool) error {
	return errors.New("nftables: not implemented yet")
}

// Cleanup deletes the kube-proxy table of nft's family, if any.
func Cleanup(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	// Adding first makes the delete succeed when there is no table.
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	return nft.Run(ctx, tx)
}
