package ipvs

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
)

// Watch deletes draining real servers once their connections have ended
// or their time is up, and every CheckInterval (or ten times the last
// check's CPU time without its listings, if longer: at most 10% of a CPU)
// asks for a full sync when another program changed what the mode keeps
// in the kernel. CPU time, not wall time: a check that waited for a busy
// CPU cost no more, and pacing by wall time put a repair off by seconds
// on a loaded node. (The iptables listing run after another program
// changed the ruleset is a child process, not counted: it runs once per
// such change.) The listings whose cost grows with the services (every
// real server, every bound address) are read again only once a hundred
// times their CPU time has passed, so that they cost at most 1% of a CPU;
// the rest of the check (each set's number of entries, the nat table's
// generation) costs the same at any size.
func (p *Syncer) Watch(ctx context.Context, resync func()) {
	drains := time.NewTicker(p.cfg.DrainCheckInterval)
	defer drains.Stop()
	checks := time.NewTimer(p.cfg.CheckInterval)
	defer checks.Stop()
	var listingsDue time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-drains.C:
			p.finishDrains()
		case <-checks.C:
			start := time.Now()
			listings := !start.Before(listingsDue)
			runtime.LockOSThread()
			startCPU := threadCPU()
			drift, listingsCPU := p.checkDrift(listings)
			checkCPU := threadCPU() - startCPU
			runtime.UnlockOSThread()
			took := time.Since(start)
			if drift != "" {
				klog.InfoS("Another program changed the IPVS mode's kernel state; resyncing", "ipFamily", p.cfg.Family, "found", drift, "checkTook", took)
				resync()
			}
			if listings {
				listingsDue = start.Add(max(p.cfg.CheckInterval, listingsCPUShare*listingsCPU))
				klog.V(4).InfoS("Checked the IPVS mode's kernel state with its listings", "ipFamily", p.cfg.Family, "took", took, "cpu", checkCPU, "listingsCPU", listingsCPU, "nextListings", listingsDue.Sub(start))
			}
			checks.Reset(max(p.cfg.CheckInterval, 10*(checkCPU-listingsCPU)))
		}
	}
}

// listingsCPUShare is how many times the drift check's listings' CPU time
// passes before they are read again: they cost at most 1% of a CPU.
const listingsCPUShare = 100

// errFullSync ends a drift check's listing when a full sync began
// meanwhile: what it read is dropped, as that sync puts everything back.
var errFullSync = errors.New("a full sync began during the check")

// checkDrift reads the kernel and compares it with the snapshot the syncs
// published, never taking the syncer's lock: a sync never waits for a
// check, and a check never for a sync. What a sync changed while the
// check read is left out of the comparison (the snapshot tells which
// virtual servers, by the sync that last changed each); a full sync
// meanwhile voids the whole check. It remembers what it found for the
// full sync that repairs it, and tells the listings' CPU time (in the
// kernel too, where most of it goes). The caller keeps it on one thread.
func (p *Syncer) checkDrift(listings bool) (string, time.Duration) {
	start := p.kernelState.published()
	if start == nil {
		return "", 0 // no full sync has succeeded: nothing to compare with
	}
	var listingsCPU time.Duration
	var serversDrift string
	var errs []string
	// A family that owns no virtual server (the IPv6 one on a node whose
	// services are all IPv4) has none to miss: the listing holds every
	// family's, and is not read.
	listServers := listings && start.servers.len() > 0
	// The quick reads (all but the virtual servers' listing) hold only if
	// no sync published between before and after.
	var before *appliedSnapshot
	var bound []netip.Addr
	var quickErrs []string
	if listings {
		began := threadCPU()
		if listServers {
			var err error
			serversDrift, err = p.serversDrift(start)
			if errors.Is(err, errFullSync) {
				return "", threadCPU() - began
			}
			if err != nil {
				errs = append(errs, "virtual servers unreadable: "+err.Error())
			}
		}
		before = p.kernelState.published()
		var err error
		if bound, err = p.cfg.Kernel.BoundAddresses(); err != nil {
			quickErrs = append(quickErrs, "addresses unreadable: "+err.Error())
		}
		listingsCPU = threadCPU() - began
	} else {
		before = p.kernelState.published()
	}
	sizes, err := p.cfg.Kernel.SetSizes(p.setNames())
	if err != nil {
		quickErrs = append(quickErrs, "ipsets unreadable: "+err.Error())
	}
	jumpFound := p.jumpPresent()
	after := p.kernelState.published()
	if after == nil || after.fullSyncs != start.fullSyncs {
		return "", listingsCPU
	}
	quick := before == after && after.settled
	if quick {
		errs = append(errs, quickErrs...)
	}
	drift := ""
	switch {
	case len(errs) > 0:
		drift = strings.Join(errs, "; ")
	case serversDrift != "":
		drift = serversDrift
	case quick:
		drift = quickDrift(after, bound, listings, sizes, p.cfg.Params.Sets(), jumpFound)
	}
	if drift != "" {
		p.kernelState.found(drift)
	}
	return drift, listingsCPU
}

// quickDrift tells what of the reads that cost the same at any size is
// not as the snapshot says: our addresses on kube-ipvs0 (when listed),
// the number of entries in each set, the jump into KUBE-SERVICES. Another
// program's change that keeps a set's size (an entry deleted and another
// added) is not seen; the next full sync (a restart, a failure) undoes it.
func quickDrift(s *appliedSnapshot, bound []netip.Addr, listedAddresses bool, sizes map[string]int, sets []ipvskernel.SetSpec, jumpFound bool) string {
	if listedAddresses {
		ours := 0
		for _, a := range bound {
			if _, ok := s.bound.get(a); ok {
				ours++
			}
		}
		if ours != s.bound.len() {
			return fmt.Sprintf("%d of %d addresses on %s", ours, s.bound.len(), ipvskernel.DummyLink)
		}
	}
	for _, set := range sets {
		have, ok := sizes[set.Name]
		if !ok {
			return "ipset " + set.Name
		}
		if have != s.setSizes[set.Name] {
			return fmt.Sprintf("ipset %s with %d of %d entries", set.Name, have, s.setSizes[set.Name])
		}
	}
	if !jumpFound {
		return "the jump from nat PREROUTING to " + string(chainServices)
	}
	return ""
}

// serversDrift tells which of our virtual servers, or of their wanted
// real servers, the kernel lacks, comparing only those no sync changed
// since the check began (start). It compares each virtual server as the
// kernel lists it against the newest snapshot, so the listing is never
// held whole (at 10k services x 5 endpoints it held 8.7 MB for seconds),
// only a hash of each key it found. A real server found missing counts
// only if the snapshot at the end says its virtual server did not change
// during the listing (the comparison may have met a sync halfway).
// Another program's change of a real server's weight is not seen.
func (p *Syncer) serversDrift(start *appliedSnapshot) (string, error) {
	since := start.stableSince()
	seed := maphash.MakeSeed()
	seen := map[uint64]bool{}
	var missingReal string
	var missingIn ipvskernel.VirtualServerKey
	err := p.cfg.Kernel.EachVirtualServer(func(key ipvskernel.VirtualServerKey, have []ipvskernel.RealServer) error {
		now := p.kernelState.published()
		if now == nil || now.fullSyncs != start.fullSyncs {
			return errFullSync
		}
		applied, ours := now.servers.get(key)
		if !ours || applied.gen > since {
			return nil
		}
		seen[maphash.Comparable(seed, key)] = true
		if missingReal != "" {
			return nil
		}
		for _, rs := range applied.reals {
			if !slices.ContainsFunc(have, func(h ipvskernel.RealServer) bool { return h.AddrPort() == rs }) {
				missingReal, missingIn = fmt.Sprintf("real server %s of %s", rs, key), key
				break
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	end := p.kernelState.published()
	if end == nil || end.fullSyncs != start.fullSyncs {
		return "", errFullSync
	}
	wanted, found := 0, 0
	for key, applied := range end.servers.all() {
		if applied.gen > since {
			continue
		}
		wanted++
		if seen[maphash.Comparable(seed, key)] {
			found++
		}
	}
	if found < wanted {
		return fmt.Sprintf("%d of %d virtual servers", found, wanted), nil
	}
	if missingReal != "" {
		if applied, ok := end.servers.get(missingIn); ok && applied.gen <= since {
			return missingReal, nil
		}
	}
	return "", nil
}

// jumpPresent tells whether the jump from nat PREROUTING into
// KUBE-SERVICES is there (an iptables flush removes it). The chain is
// listed, which starts a process, only when another program may have
// changed the table since the jump was last seen: its generation
// (iptables.Kernel.Generation, read without a process) moved. Only the
// drift check calls it.
func (p *Syncer) jumpPresent() bool {
	jump := Jumps()[1]
	generation, genErr := p.cfg.IPTables.Generation(string(jump.Table))
	if p.jump.stillThere(generation, genErr) {
		return true
	}
	rules, err := p.cfg.IPTables.ListRules(string(jump.Table), string(jump.From))
	found := err == nil && slices.ContainsFunc(rules, func(r string) bool { return strings.HasSuffix(r, "-j "+string(chainServices)) })
	p.jump.listed(found, generation, genErr)
	return found
}

// threadCPU is the CPU time the calling thread has used, in the kernel
// too (where most of a listing's time goes).
func threadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
