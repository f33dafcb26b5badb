// The contract between the proxy core and a proxy mode, on one page: the
// one interface every mode implements, and the optional capabilities the
// core finds by type assertion. A mode states each capability it has at
// compile time (var _ proxy.Prober = (*Syncer)(nil)), so that a renamed
// method is a build error, not a capability silently switched off.

package proxy

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Mode is what one proxy mode (iptables, IPVS, nftables) supplies to the
// core: making the kernel hold what the state asks for. The core owns
// everything else: change tracking, the state, the sync schedule, health,
// conntrack and the generic metrics.
type Mode interface {
	// FullSync makes the kernel hold what the whole state asks for,
	// whatever it holds now (ours, upstream's, or nothing).
	FullSync(v state.View) error
	// PartialSync does the same for the service ports that changed, after
	// a successful sync. ErrFullSyncNeeded asks for a full sync instead;
	// any other error is a failure, followed by a full sync.
	PartialSync(v state.View, changed map[state.ServicePortName]bool) error
}

// ErrFullSyncNeeded is returned by a partial sync whose changes touch
// every service's rules.
var ErrFullSyncNeeded = errors.New("the changes need a full sync")

// Syncing: what a mode may need around its syncs.

// Preparer is a mode with work to do before its first sync while the
// informers are still listing: the iptables mode reads the kernel's rules
// then, so that the read's garbage is gone before the sync's peak, and the
// IPVS mode reads everything its first full sync compares, so that a
// restart's sync does not wait for the reads. The core calls Prepare once,
// before it waits for the informers, and never during a sync.
type Preparer interface {
	Prepare()
}

// Deferrer is a mode that leaves work to a later sync (the nftables mode
// deletes the chains it flushed a second later): after each successful
// sync the core asks when that work is due and syncs then, even if
// nothing changes.
type Deferrer interface {
	// NextSync is when the deferred work is due; zero when none is.
	NextSync() time.Time
}

// ServiceCIDRUser is a mode that acts on the cluster's service CIDRs (the
// ServiceCIDR objects' ranges): the nftables mode drops traffic to their
// addresses that no service has. The core calls it between syncs, never
// during one.
type ServiceCIDRUser interface {
	SetServiceCIDRs(cidrs []netip.Prefix)
}

// FailureCounter is a mode with a metric of failed syncs of its own, as
// each of upstream's modes has one (iptables-restore failures, nftables
// transaction failures). The core reports every failed sync to it, partial
// or full, once the sync has returned; ErrFullSyncNeeded is no failure.
// The mode decides from the error what its metric counts.
type FailureCounter interface {
	CountFailure(full bool, err error)
}

// Watching the kernel: how another program's changes are found. A mode
// has one of the two, or neither.

// Prober is a mode whose kernel objects another program may change (a
// firewall reload, `nft flush ruleset`, an admin's rule) and which the core
// watches for it (WatchKernel): it asks Probe once a ProbeInterval, and
// has a full sync, which compares everything with what the state asks
// for, repair what another program did. A mode whose look at the kernel
// is cheap is a Prober.
type Prober interface {
	ProbeInterval() time.Duration
	// Probe is one cheap look at the kernel: gone names what of ours
	// another program removed ("" when all is there, or when nothing was
	// written yet; the mode logs what it found), changed says another
	// program changed what the mode writes to since the last look.
	Probe(ctx context.Context) (gone string, changed bool)
	// RepairNext marks the next full sync as a repair: what it rewrites,
	// another program changed, and the mode logs and counts it so.
	RepairNext()
}

// Watcher is a mode that watches the kernel for other programs undoing its
// work at a pace of its own (the IPVS mode's drift check, whose listings
// cost in proportion to the services); it calls resync to have everything
// written again.
type Watcher interface {
	Watch(ctx context.Context, resync func())
}

// Explaining: what the explain and trace endpoints ask of a mode. Both
// are called under the core's lock, so no sync runs meanwhile; the checks
// they return run without it, since reading the kernel can take a while.

// Describer is a mode that can name the kernel objects of a service port
// and check them.
type Describer interface {
	// Describe lists what the kernel should hold for the service port, as
	// the mode would write it now, and returns a check that reads the
	// kernel for just those objects and lists how it differs.
	Describe(v state.View, name state.ServicePortName) ([]KernelObject, func() ([]string, error))
}

// KernelObject is one thing in the kernel that implements a service port.
type KernelObject struct {
	// Kind is what it is: "chain", "rule", "virtual server", "address",
	// "set entry".
	Kind string `json:"kind"`
	// Name identifies it, e.g. "nat KUBE-SVC-...", "10.96.0.10:80/TCP".
	Name string `json:"name"`
	// Summary is a short description for a table, e.g. "3 rules".
	Summary string `json:"summary,omitempty"`
	// Content is what it holds: a chain's rules, a virtual server's real
	// servers.
	Content []string `json:"content,omitempty"`
}

// String is the object on one line: "kind name", then ": summary" if it
// has one.
func (o KernelObject) String() string {
	if o.Summary == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Name + ": " + o.Summary
}

// Tracer is a mode that can follow a packet through what it writes.
type Tracer interface {
	// Trace walks the packet through the mode's objects: the fixed ones
	// and those of the service port it is addressed to (name nil when
	// none), as a sync would write them now. It returns every way the
	// packet can end, and a check that reads just the service port's
	// objects from the kernel and lists how they differ (nil when the
	// mode cannot check them).
	Trace(v state.View, name *state.ServicePortName, pkt trace.Packet) ([]trace.Branch, func() ([]string, error), error)
}
