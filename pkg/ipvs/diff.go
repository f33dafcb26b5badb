package ipvs

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// diff decides one sync, service port by service port, from what was
// applied, what is wanted and what the kernel was read to hold, into a
// plan (ops.go). It sends nothing and changes nothing of the syncer's: it
// edits copies of the counts of who wants each shared object and of what
// each service port applied, which the plan carries for commit. Its plan
// keeps traffic flowing: the virtual servers with their real servers
// before the addresses, new real servers before the removed ones go, a
// service's set entries before its address in KUBE-IPVS-IPS, set entries
// before the chains that match them, and what is no longer wanted last.
type diff struct {
	params *Params
	// limits are the hash sets' maxelem, exclude the CIDRs of other
	// programs' virtual servers, and draining the real servers the drain
	// check follows; the diff only reads them.
	limits   map[string]int
	exclude  []netip.Prefix
	draining map[drainKey]time.Time
	// applied and counts are the next applied objects and their counts,
	// edited from the syncer's (a full sync starts them from none).
	applied mapEdit[state.ServicePortName, ServiceObjects]
	counts  countsEdit
	// kernel is what a full sync read: what of it no service port wants
	// goes. Nil in a partial sync, which trusts what it applied.
	kernel *kernelObjects
	// listed are the real servers of the virtual servers that stay, as
	// the kernel lists them (with their weights and connections).
	listed map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer
	plan   plan
	// adds and deletes are the set entries to add and delete; an entry
	// one service port gives up and another takes up in the same sync
	// is in the kernel and stays: its deletion is cancelled (deleting
	// says which deletions still hold).
	adds     []SetEntry
	deletes  []SetEntry
	deleting map[SetEntry]bool
	// queued are the entries to add that this sync found, in order, for
	// admit; only those it cannot add then wait in the counts (at a
	// first sync, some 30,000 entries at 10,000 services).
	queued []SetEntry
	// unbind are the addresses to unbind at the end (false: taken up
	// again by another service port).
	unbind map[netip.Addr]bool
	// binds are the addresses to bind once every virtual server of the
	// sync is there: an address is bound for several service ports, and
	// bound before one of them has its virtual server, it would take
	// that port's new connections to the node's own sockets.
	binds []netip.Addr
	// servers and bound are the next snapshot's, edited from the last's
	// (a full sync starts them afresh); gen is its number, last the
	// snapshot of the sync before.
	servers *shardedEdit[ipvskernel.VirtualServerKey, appliedServer]
	bound   *shardedEdit[netip.Addr, int]
	gen     uint64
	last    *appliedSnapshot
}

func (p *Syncer) newDiff(kernel *kernelObjects, listed map[ipvskernel.VirtualServerKey][]ipvskernel.RealServer) *diff {
	last := p.last
	if last == nil {
		last = emptySnapshot()
	}
	d := &diff{params: &p.cfg.Params, limits: p.limits, exclude: p.cfg.ExcludeCIDRs, draining: p.draining,
		kernel: kernel, listed: listed, deleting: map[SetEntry]bool{}, unbind: map[netip.Addr]bool{},
		gen: last.gen + 1, last: last}
	if kernel != nil {
		// Everything is written against what the kernel holds, from none.
		last = emptySnapshot()
		d.applied, d.counts = fresh(map[state.ServicePortName]ServiceObjects{}), freshCounts()
	} else {
		d.applied, d.counts = overlay(p.applied), p.objects.edit()
	}
	d.servers, d.bound = last.servers.edit(), last.bound.edit()
	return d
}

func (d *diff) step(o op) { d.plan.steps = append(d.plan.steps, o) }

// replace turns one service port's objects from old into updated.
func (d *diff) replace(name state.ServicePortName, old, updated ServiceObjects) {
	wanted := map[ipvskernel.VirtualServerKey]bool{}
	for i := range updated.Servers {
		s := &updated.Servers[i]
		if have, taken := d.servers.get(s.VirtualServerKey); taken && have.owner != name {
			klog.InfoS("Virtual server already belongs to another service port; skipping it", "servicePort", name, "virtualServer", s.VirtualServerKey, "owner", have.owner)
			continue
		}
		wanted[s.VirtualServerKey] = true
		d.server(s, findServer(old.Servers, s.VirtualServerKey))
		d.own(name, s)
	}
	for _, s := range old.Servers {
		if have, ok := d.servers.get(s.VirtualServerKey); ok && !wanted[s.VirtualServerKey] && have.owner == name {
			d.servers.delete(s.VirtualServerKey)
			d.plan.deleteServers = append(d.plan.deleteServers, s.VirtualServerKey)
		}
	}
	for _, a := range updated.Bound {
		n, _ := d.bound.get(a)
		if d.bound.set(a, n+1); n == 0 {
			d.bind(a)
		}
	}
	for _, a := range old.Bound {
		if n, _ := d.bound.get(a); n > 1 {
			d.bound.set(a, n-1)
			continue
		}
		d.bound.delete(a)
		d.unbind[a] = true
		d.entry(SetEntry{Set: d.params.setName(setIPVSAddresses), Entry: a.String()}, true)
	}
	o := &d.counts
	for _, e := range updated.Entries {
		if addCount(&o.entries, e, 1) == 1 {
			d.entry(e, false)
		}
	}
	for _, e := range old.Entries {
		if addCount(&o.entries, e, -1) == 0 {
			d.entry(e, true)
		}
	}
	for _, r := range updated.OutFilter {
		addCount(&o.outFilter, r, 1)
	}
	for _, r := range old.OutFilter {
		addCount(&o.outFilter, r, -1)
	}
	if len(updated.Servers) == 0 && len(updated.Entries) == 0 {
		d.applied.delete(name)
	} else {
		d.applied.set(name, updated)
	}
}

// own records name as s's owner. The server's generation moves only when
// its real servers change: the drift check compares only what no sync
// changed since it began to list the kernel.
func (d *diff) own(name state.ServicePortName, s *Server) {
	gen := d.gen
	if prev, ok := d.last.servers.get(s.VirtualServerKey); ok && slices.Equal(prev.reals, s.Reals) {
		gen = prev.gen
	}
	d.servers.set(s.VirtualServerKey, appliedServer{owner: name, reals: s.Reals, gen: gen})
}

func findServer(servers []Server, key ipvskernel.VirtualServerKey) *Server {
	for i := range servers {
		if servers[i].VirtualServerKey == key {
			return &servers[i]
		}
	}
	return nil
}

// server makes the kernel hold one virtual server with its real servers;
// old is what was applied (nil if none, or in a full sync).
func (d *diff) server(s *Server, old *Server) {
	var exists, same bool
	if d.kernel != nil {
		have, ok := d.kernel.servers[s.VirtualServerKey]
		exists, same = ok, have == s.VirtualServer
	} else if old != nil {
		exists, same = true, old.VirtualServer == s.VirtualServer
	}
	switch {
	case !exists:
		d.step(op{kind: opAddServer, server: s})
		return
	case !same:
		d.step(op{kind: opUpdateServer, server: s})
	}
	d.reals(s)
}

// reals brings an existing virtual server's real servers in line with
// what the kernel listed: draining ones are at weight 0, and their
// connection counts say whether a removed one can go at once. The wanted
// ones come first, so that a virtual server never goes without.
func (d *diff) reals(s *Server) {
	current := d.listed[s.VirtualServerKey]
	unwanted := make(map[netip.AddrPort]ipvskernel.RealServer, len(current))
	for _, rs := range current {
		unwanted[rs.AddrPort()] = rs
	}
	for _, rs := range s.Reals {
		have, ok := unwanted[rs]
		delete(unwanted, rs)
		switch {
		case !ok:
			d.step(op{kind: opAddReal, server: s, real: rs})
		case have.Weight != 1:
			// Draining, or left at weight 0 by a previous run: wanted again.
			d.step(op{kind: opRestoreReal, server: s, real: rs})
		}
	}
	for _, rs := range slices.SortedFunc(maps.Values(unwanted), func(a, b ipvskernel.RealServer) int { return a.AddrPort().Compare(b.AddrPort()) }) {
		d.removeReal(s, rs)
	}
}

// removeReal deletes a real server at once (UDP, SCTP: expire_nodest_conn
// ends their flows, and a TCP one without connections), or drains a TCP
// one: at weight 0 its connections finish while new ones go elsewhere.
func (d *diff) removeReal(s *Server, rs ipvskernel.RealServer) {
	if _, draining := d.draining[drainKey{s.VirtualServerKey, rs.AddrPort()}]; draining {
		return
	}
	switch {
	case s.Protocol != v1.ProtocolTCP || rs.ActiveConns+rs.InactiveConns == 0:
		d.step(op{kind: opDeleteReal, server: s, real: rs.AddrPort()})
	case rs.Weight != 0:
		d.step(op{kind: opDrainReal, server: s, real: rs.AddrPort()})
	default:
		d.step(op{kind: opWatchDrain, server: s, real: rs.AddrPort()})
	}
}

func (d *diff) bind(a netip.Addr) {
	d.entry(SetEntry{Set: d.params.setName(setIPVSAddresses), Entry: a.String()}, false)
	if d.unbind[a] {
		// Another service port gave it up in this sync: it is bound.
		d.unbind[a] = false
		return
	}
	if d.kernel != nil && d.kernel.bound[a] {
		return
	}
	d.binds = append(d.binds, a)
}

// entry records a set change; a full sync skips what the kernel holds,
// and an entry given up and taken up again in one sync stays. An entry
// to add waits until finish, which knows how much room its set has.
func (d *diff) entry(e SetEntry, remove bool) {
	o := &d.counts
	waiting := o.isWaiting(e)
	switch {
	case remove && waiting:
		o.unwait(e) // never written
	case remove:
		d.deletes = append(d.deletes, e)
		d.deleting[e] = true
		o.resize(e.Set, -1)
	case d.deleting[e]:
		d.deleting[e] = false
		o.resize(e.Set, 1)
	case d.kernel != nil && d.kernel.entries[e.Set][e.Entry]:
		o.resize(e.Set, 1)
	default:
		// Never given up in the same sync: a sync replaces each service
		// port once, so an entry comes from no owner to one only once.
		d.queued = append(d.queued, e)
	}
}

// admit adds the waiting entries whose sets have room: all of them while
// a hash set stays within its maxelem, else the ones that came first (a
// full sync takes the service ports by name, after what the kernel holds
// already) up to it. The rest wait for a later sync whose deletions make
// room: ipset would refuse them, and with them every later line of the
// restore, other services' entries too.
func (d *diff) admit() {
	o := &d.counts
	fits := func(set string) bool {
		limit, ok := d.limits[set]
		size, _ := o.setSizes.get(set)
		return !ok || size < limit
	}
	add := func(e SetEntry) {
		o.resize(e.Set, 1)
		d.adds = append(d.adds, e)
	}
	// What waited before this sync first, oldest first; then this sync's
	// entries in the order it found them.
	if o.waiting.len() > 0 {
		seq := func(e SetEntry) uint64 { n, _ := o.waiting.get(e); return n }
		older := slices.SortedFunc(o.waiting.keys(), func(a, b SetEntry) int { return cmp.Compare(seq(a), seq(b)) })
		for _, e := range older {
			if fits(e.Set) {
				o.unwait(e)
				add(e)
			}
		}
	}
	for _, e := range d.queued {
		if fits(e.Set) {
			add(e)
		} else {
			o.wait(e)
		}
	}
	d.queued = nil
}

// finish decides the set changes, the chains and what goes (after a full
// sync: whatever else of ours the kernel held), and returns the plan with
// the syncer's next state for commit. The diff must not be used after.
func (d *diff) finish(full bool) *plan {
	pl := &d.plan
	pl.full = full
	for _, a := range d.binds {
		d.step(op{kind: opBind, real: netip.AddrPortFrom(a, 0)})
	}
	d.admit()
	pl.sets = d.setChanges()
	nonEmpty := func(set string) bool {
		n, _ := d.counts.setSizes.get(d.params.setName(set))
		return n > 0
	}
	pl.chains = d.params.Chains(nonEmpty, slices.Sorted(d.counts.outFilter.keys()))
	if d.kernel != nil {
		d.unwantedInKernel()
	}
	for _, a := range slices.SortedFunc(maps.Keys(d.unbind), netip.Addr.Compare) {
		if d.unbind[a] {
			pl.unbind = append(pl.unbind, a)
		}
	}
	// Entries left out are not the sync's failure: the service ports that
	// fit are written, and a failed sync would hold back what follows a
	// sync (health-check servers, conntrack cleanup, the healthz update)
	// and retry a full sync, reading the whole kernel, for as long as the
	// set is full. They wait, and a later sync that frees room adds them.
	pl.next = syncResult{applied: d.applied, counts: d.counts, left: d.leftOut(), snapshot: d.snapshot(full)}
	return pl
}

// setChanges are the sync's set entry changes: deletions before
// additions, so that a full set has room for what admit let in (an entry
// never is in both). After a full sync the kernel's entries no service
// port wants go too.
func (d *diff) setChanges() []ipvskernel.SetChange {
	sets := make([]ipvskernel.SetChange, 0, len(d.adds)+len(d.deletes))
	for _, e := range d.deletes {
		if d.deleting[e] {
			sets = append(sets, ipvskernel.SetChange{Set: e.Set, Entry: e.Entry, Delete: true})
		}
	}
	if d.kernel != nil {
		for _, set := range slices.Sorted(maps.Keys(d.kernel.entries)) {
			var unwanted []string
			for e := range d.kernel.entries[set] {
				if !d.wantsEntry(set, e) {
					unwanted = append(unwanted, e)
				}
			}
			slices.Sort(unwanted)
			for _, e := range unwanted {
				sets = append(sets, ipvskernel.SetChange{Set: set, Entry: e, Delete: true})
			}
		}
	}
	for _, e := range d.adds {
		sets = append(sets, ipvskernel.SetChange{Set: e.Set, Entry: e.Entry})
	}
	return d.filterSafeOrder(sets)
}

// filterSafeOrder moves the deletions from KUBE-IPVS-IPS before the other
// changes and the additions to it after them, keeping the order within
// each part. KUBE-IPVS-FILTER rejects new connections to the addresses in
// KUBE-IPVS-IPS that no service set lets through, and an ipset restore
// applies its lines one by one: an address must leave KUBE-IPVS-IPS before
// its service entries go, and join it only once they are in.
func (d *diff) filterSafeOrder(sets []ipvskernel.SetChange) []ipvskernel.SetChange {
	ipvsIPs := d.params.setName(setIPVSAddresses)
	rank := func(c ipvskernel.SetChange) int {
		switch {
		case c.Set != ipvsIPs:
			return 1
		case c.Delete:
			return 0
		}
		return 2
	}
	slices.SortStableFunc(sets, func(a, b ipvskernel.SetChange) int { return cmp.Compare(rank(a), rank(b)) })
	return sets
}

// unwantedInKernel has a full sync unbind the addresses and delete the
// virtual servers of ours the kernel held that no service port wants.
func (d *diff) unwantedInKernel() {
	// A bound address no service wants is one a previous run (ours or
	// upstream's) bound if KUBE-IPVS-IPS lists it; another program's
	// addresses on the link are left alone.
	previous := d.kernel.entries[d.params.setName(setIPVSAddresses)]
	for a := range d.kernel.bound {
		if _, wanted := d.bound.get(a); !wanted && previous[a.String()] {
			d.unbind[a] = true
		}
	}
	var unwanted []ipvskernel.VirtualServerKey
	for key := range d.kernel.servers {
		if _, wanted := d.servers.get(key); !wanted && !excluded(d.exclude, key.Addr) {
			unwanted = append(unwanted, key)
		}
	}
	slices.SortFunc(unwanted, ipvskernel.VirtualServerKey.Compare)
	d.plan.deleteServers = append(d.plan.deleteServers, unwanted...)
}

// wantsEntry tells whether a service port wants the entry of set that
// the kernel holds: its address bound (KUBE-IPVS-IPS) or its count above
// 0.
func (d *diff) wantsEntry(set, entry string) bool {
	if set == d.params.setName(setIPVSAddresses) {
		a, err := netip.ParseAddr(entry)
		if err != nil || a.String() != entry {
			return false
		}
		_, bound := d.bound.get(a)
		return bound
	}
	n, _ := d.counts.entries.get(SetEntry{Set: set, Entry: entry})
	return n > 0
}

// leftOut names, set by set, the entries waiting for room and the service
// ports that want them; nil when none wait. It reads every service
// port's objects, which it does only while some wait.
func (d *diff) leftOut() error {
	o := &d.counts
	if o.waiting.len() == 0 {
		return nil
	}
	ipvsIPs := d.params.setName(setIPVSAddresses)
	wanting := map[string]map[state.ServicePortName]bool{}
	want := func(e SetEntry, name state.ServicePortName) {
		if !o.isWaiting(e) {
			return
		}
		if wanting[e.Set] == nil {
			wanting[e.Set] = map[state.ServicePortName]bool{}
		}
		wanting[e.Set][name] = true
	}
	ipsWaiting, _ := o.waitingIn.get(ipvsIPs)
	for name, objects := range d.applied.all() {
		for _, e := range objects.Entries {
			want(e, name)
		}
		if ipsWaiting > 0 {
			for _, a := range objects.Bound {
				want(SetEntry{Set: ipvsIPs, Entry: a.String()}, name)
			}
		}
	}
	var errs []error
	for _, set := range slices.Sorted(o.waitingIn.keys()) {
		waiting, _ := o.waitingIn.get(set)
		names := slices.SortedFunc(maps.Keys(wanting[set]), state.ServicePortName.Compare)
		var some []string
		for _, n := range names[:min(len(names), 3)] {
			some = append(some, n.String())
		}
		if len(names) > 3 {
			some = append(some, "...")
		}
		errs = append(errs, fmt.Errorf("ipset %s is full (maxelem %d): %s of %s not added (%s)", set, d.limits[set],
			count(waiting, "entry", "entries"), count(len(names), "service port", "service ports"), strings.Join(some, ", ")))
	}
	return errors.Join(errs...)
}

func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
