package ipvs

import (
	"net/netip"

	"k8s.io/klog/v2"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
)

// finishDrains deletes the draining real servers that are done: their
// connections have ended or their time (MaxDrain) is up. One that is gone
// or back at a weight is no longer followed.
func (p *Syncer) finishDrains() {
	p.mu.Lock()
	defer p.mu.Unlock()
	byServer := map[ipvskernel.VirtualServerKey][]drainKey{}
	for d := range p.draining {
		byServer[d.server] = append(byServer[d.server], d)
	}
	for key, drains := range byServer {
		list, err := p.cfg.Kernel.RealServers(key)
		if err != nil {
			klog.ErrorS(err, "Listing real servers to finish their draining", "virtualServer", key)
			continue
		}
		have := map[netip.AddrPort]ipvskernel.RealServer{}
		for _, rs := range list {
			have[rs.AddrPort()] = rs
		}
		for _, d := range drains {
			rs, ok := have[d.real]
			switch {
			case !ok || rs.Weight != 0:
				delete(p.draining, d)
			case rs.ActiveConns+rs.InactiveConns == 0 || p.now().After(p.draining[d]):
				if err := p.cfg.Kernel.DeleteRealServer(key, d.real); err != nil {
					klog.ErrorS(err, "Deleting a drained real server", "virtualServer", key, "realServer", d.real)
					continue
				}
				delete(p.draining, d)
			}
		}
	}
}
