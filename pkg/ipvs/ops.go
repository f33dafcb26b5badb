package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// plan is what one sync sends to the kernel, decided before anything is
// sent, in the order apply sends it: each service port's virtual servers,
// real servers and addresses; then the set entries; then the iptables
// chains, which match the sets; then what no service port wants any more.
type plan struct {
	steps []op
	// sets are the entry changes, deletions first, so that a full set
	// has room for the additions.
	sets []ipvskernel.SetChange
	// chains are every chain of the mode; with full, ChainSet compares
	// them with the kernel, else with what it last wrote.
	chains map[iptables.Table][]iptables.OwnChain
	full   bool
	// unbind go before deleteServers: an address stays bound only while
	// its virtual server is there (a bound address without one would take
	// the service's traffic to the node's own sockets).
	unbind        []netip.Addr
	deleteServers []ipvskernel.VirtualServerKey
	// next is the syncer's state once the plan is applied, for commit;
	// it is no part of what the plan sends.
	next syncResult
}

type opKind uint8

const (
	// opAddServer adds a virtual server with all its real servers.
	opAddServer opKind = iota
	opUpdateServer
	opAddReal
	// opRestoreReal puts a real server at weight 0 (draining, or left so
	// by an earlier run) back to weight 1.
	opRestoreReal
	// opDrainReal sets a removed TCP real server to weight 0, so that its
	// connections finish while new ones go elsewhere, and opWatchDrain
	// follows one already at weight 0; the drain check deletes them.
	opDrainReal
	opWatchDrain
	opDeleteReal
	// opBind binds an address to kube-ipvs0, after every virtual server;
	// apply drops it if every virtual server on the address was refused
	// (bound, it would take their traffic to the node's own sockets).
	opBind
)

// op is one step of a plan: server is the virtual server it is about
// (the wanted one), real the real server, or for opBind the address to
// bind (port 0). A first sync at 10,000 services holds some 20,000 of
// them while it applies them: they are kept small.
type op struct {
	kind   opKind
	server *Server
	real   netip.AddrPort
}

func (o op) String() string {
	key := ""
	if o.server != nil {
		key = o.server.VirtualServerKey.String()
	}
	switch o.kind {
	case opAddServer:
		reals := make([]string, len(o.server.Reals))
		for i, r := range o.server.Reals {
			reals[i] = r.String()
		}
		return fmt.Sprintf("add server %s -> [%s]", key, strings.Join(reals, " "))
	case opUpdateServer:
		return "update server " + key
	case opAddReal:
		return fmt.Sprintf("add real %s to %s", o.real, key)
	case opRestoreReal:
		return fmt.Sprintf("restore real %s of %s", o.real, key)
	case opDrainReal:
		return fmt.Sprintf("drain real %s of %s", o.real, key)
	case opWatchDrain:
		return fmt.Sprintf("watch draining real %s of %s", o.real, key)
	case opDeleteReal:
		return fmt.Sprintf("delete real %s of %s", o.real, key)
	case opBind:
		return "bind " + o.real.Addr().String()
	}
	return fmt.Sprintf("op %d", o.kind)
}

// lines renders the plan one operation per line, for tests and logs.
func (pl *plan) lines() []string {
	var out []string
	for _, o := range pl.steps {
		out = append(out, o.String())
	}
	for _, c := range pl.sets {
		sign := "+"
		if c.Delete {
			sign = "-"
		}
		out = append(out, fmt.Sprintf("ipset %s%s %s", sign, c.Set, c.Entry))
	}
	if pl.chains != nil {
		var names []string
		for _, t := range slices.Sorted(maps.Keys(pl.chains)) {
			for _, c := range pl.chains[t] {
				names = append(names, fmt.Sprintf("%s/%s:%d", t, c.Name, len(c.Rules)))
			}
		}
		out = append(out, "chains "+strings.Join(names, " "))
	}
	for _, a := range pl.unbind {
		out = append(out, "unbind "+a.String())
	}
	for _, key := range pl.deleteServers {
		out = append(out, "delete server "+key.String())
	}
	return out
}

// apply sends a plan to the kernel, step by step: a step that fails is
// reported and the others still run, but for the real servers of a
// virtual server that could not be added, and the binding of an address
// none of whose added virtual servers could be. It keeps the draining
// real servers' deadlines. The caller holds mu.
func (p *Syncer) apply(pl *plan) error {
	a := &applying{p: p, k: p.cfg.Kernel, next: &pl.next.applied}
	for _, o := range pl.steps {
		a.step(o)
	}
	if len(pl.sets) > 0 {
		if err := a.k.ChangeSets(pl.sets); err != nil {
			a.fail(err, "changing ipset entries")
		}
	}
	if err := p.chains.Sync(pl.chains, Jumps(), pl.full); err != nil {
		a.fail(restoreError{err}, "writing the iptables chains")
	}
	for _, addr := range pl.unbind {
		if err := a.k.Unbind(addr); err != nil {
			a.fail(err, "unbinding %s from %s", addr, ipvskernel.DummyLink)
		}
	}
	for _, key := range pl.deleteServers {
		a.deleteServer(key)
	}
	return errors.Join(a.errs...)
}

// applying is one apply under way: its errors so far, and what the steps
// after a refused virtual server need to know.
type applying struct {
	p    *Syncer
	k    ipvskernel.Interface
	errs []error
	// notAdded are the virtual servers the kernel refused, whose other
	// steps are skipped.
	notAdded map[ipvskernel.VirtualServerKey]bool
	// refused are the addresses a virtual server was refused on; kept
	// only on a failure, as it is rare.
	refused map[netip.Addr]bool
	// next is every service port's objects once the plan is applied.
	next *mapEdit[state.ServicePortName, ServiceObjects]
}

func (a *applying) fail(err error, format string, args ...any) {
	a.errs = append(a.errs, fmt.Errorf(format+": %w", append(args, err)...))
}

// step sends one step, unless its virtual server was refused.
func (a *applying) step(o op) {
	var key ipvskernel.VirtualServerKey
	if o.server != nil {
		key = o.server.VirtualServerKey
	}
	if a.notAdded[key] {
		return
	}
	switch o.kind {
	case opAddServer:
		a.addServer(o.server)
	case opUpdateServer:
		if err := a.k.UpdateVirtualServer(o.server.VirtualServer); err != nil {
			a.fail(err, "updating virtual server %s", key)
		}
	case opAddReal, opRestoreReal:
		a.addReal(key, o.real, o.kind == opRestoreReal)
	case opDrainReal, opWatchDrain:
		a.drainReal(key, o.real, o.kind == opDrainReal)
	case opDeleteReal:
		if err := a.k.DeleteRealServer(key, o.real); err != nil {
			a.fail(err, "deleting real server %s of %s", o.real, key)
		}
	case opBind:
		// The binds come after every virtual server: an address all of
		// whose virtual servers were refused is left unbound, for the
		// failed sync's repair.
		if addr := o.real.Addr(); !a.refused[addr] || a.served(addr) {
			a.bind(addr)
		}
	}
}

// served tells whether a virtual server on addr is in the kernel once
// the plan is applied: one not refused, added by the plan or there
// already. Asked only of an address a virtual server was refused on.
func (a *applying) served(addr netip.Addr) bool {
	for _, objects := range a.next.all() {
		for _, s := range objects.Servers {
			if s.Addr == addr && !a.notAdded[s.VirtualServerKey] {
				return true
			}
		}
	}
	return false
}

// addServer adds a virtual server with its real servers; one refused is
// noted, with its address.
func (a *applying) addServer(s *Server) {
	key := s.VirtualServerKey
	if err := a.k.AddVirtualServer(s.VirtualServer); err != nil {
		a.fail(err, "adding virtual server %s", key)
		if a.notAdded == nil {
			a.notAdded, a.refused = map[ipvskernel.VirtualServerKey]bool{}, map[netip.Addr]bool{}
		}
		a.notAdded[key] = true
		a.refused[key.Addr] = true
		return
	}
	for _, rs := range s.Reals {
		delete(a.p.draining, drainKey{key, rs})
		if err := a.k.AddRealServer(key, ipvskernel.RealServer{Addr: rs.Addr(), Port: rs.Port(), Weight: 1}); err != nil {
			a.fail(err, "adding real server %s to %s", rs, key)
		}
	}
}

// addReal adds a real server, or restores one at weight 0 to weight 1; it
// drains no more.
func (a *applying) addReal(key ipvskernel.VirtualServerKey, rs netip.AddrPort, restore bool) {
	delete(a.p.draining, drainKey{key, rs})
	real := ipvskernel.RealServer{Addr: rs.Addr(), Port: rs.Port(), Weight: 1}
	var err error
	if restore {
		err = a.k.UpdateRealServer(key, real)
	} else {
		err = a.k.AddRealServer(key, real)
	}
	if err != nil {
		a.fail(err, "adding real server %s to %s", rs, key)
	}
}

// drainReal sets a real server to weight 0 (unless it is there already)
// and gives it until MaxDrain to finish its connections.
func (a *applying) drainReal(key ipvskernel.VirtualServerKey, rs netip.AddrPort, setWeight bool) {
	if setWeight {
		if err := a.k.UpdateRealServer(key, ipvskernel.RealServer{Addr: rs.Addr(), Port: rs.Port(), Weight: 0}); err != nil {
			a.fail(err, "draining real server %s of %s", rs, key)
			return
		}
	}
	a.p.draining[drainKey{key, rs}] = a.p.now().Add(a.p.cfg.MaxDrain)
}

func (a *applying) bind(addr netip.Addr) {
	if err := a.k.Bind(addr); err != nil {
		a.fail(err, "binding %s to %s", addr, ipvskernel.DummyLink)
	}
}

// deleteServer deletes a virtual server; its real servers drain no more.
func (a *applying) deleteServer(key ipvskernel.VirtualServerKey) {
	if err := a.k.DeleteVirtualServer(key); err != nil {
		a.fail(err, "deleting virtual server %s", key)
	}
	for d := range a.p.draining {
		if d.server == key {
			delete(a.p.draining, d)
		}
	}
}
