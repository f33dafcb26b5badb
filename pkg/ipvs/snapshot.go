package ipvs

import (
	"hash/maphash"
	"iter"
	"maps"
	"net/netip"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// appliedSnapshot is what the syncs applied, published for the drift
// check, which reads it without the syncer's lock. A published snapshot is
// never changed: the next sync's diff edits a copy of its maps (shardedMap
// copies only the shards it changes) and publishes that.
type appliedSnapshot struct {
	// gen numbers the syncs; settled is false while the sync that
	// published it is still changing the kernel.
	gen     uint64
	settled bool
	// fullSyncs counts the full syncs begun: one voids a check that
	// overlapped it.
	fullSyncs uint64
	// servers are our virtual servers, each with its owner and the real
	// servers it wants; bound counts the service ports wanting each
	// address on kube-ipvs0; setSizes are each set's entries. The diff
	// keeps its counts in them: they are the syncer's only copy.
	servers  *shardedMap[ipvskernel.VirtualServerKey, appliedServer]
	bound    *shardedMap[netip.Addr, int]
	setSizes map[string]int
}

// appliedServer is one virtual server's owner and wanted real servers,
// and the sync that last changed them: a check compares only what no
// sync changed since it began to list the kernel.
type appliedServer struct {
	owner state.ServicePortName
	reals []netip.AddrPort
	gen   uint64
}

func emptySnapshot() *appliedSnapshot {
	return &appliedSnapshot{servers: newShardedMap[ipvskernel.VirtualServerKey, appliedServer](), bound: newShardedMap[netip.Addr, int]()}
}

// stableSince is the last sync whose kernel changes were all made when s
// was read: what a check reads from the kernel afterwards holds at least
// the servers that sync or an earlier one last changed.
func (s *appliedSnapshot) stableSince() uint64 {
	if s.settled {
		return s.gen
	}
	return s.gen - 1
}

// snapshot is the snapshot after a sync's diff, before its kernel
// changes are made; it ends the diff's edits of the snapshot's maps.
func (d *diff) snapshot(full bool) *appliedSnapshot {
	next := &appliedSnapshot{gen: d.gen, fullSyncs: d.last.fullSyncs, setSizes: d.counts.setSizes.copied(),
		servers: d.servers.done(), bound: d.bound.done()}
	if full {
		next.fullSyncs++
	}
	return next
}

// shardedMap is a map published in immutable versions: a new version
// copies only the shards its changes fall in, so that a partial sync at
// 10,000 services copies a few hundred entries, not them all.
type shardedMap[K comparable, V any] struct {
	seed   maphash.Seed
	shards [shardCount]map[K]V
	n      int
}

const shardCount = 256

func newShardedMap[K comparable, V any]() *shardedMap[K, V] {
	return &shardedMap[K, V]{seed: maphash.MakeSeed()}
}

func (m *shardedMap[K, V]) shard(k K) int { return int(maphash.Comparable(m.seed, k) % shardCount) }

func (m *shardedMap[K, V]) get(k K) (V, bool) {
	v, ok := m.shards[m.shard(k)][k]
	return v, ok
}

func (m *shardedMap[K, V]) len() int { return m.n }

func (m *shardedMap[K, V]) all() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for _, s := range m.shards {
			for k, v := range s {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// edit starts the next version of m, which m itself never sees.
func (m *shardedMap[K, V]) edit() *shardedEdit[K, V] {
	next := *m
	return &shardedEdit[K, V]{m: &next}
}

type shardedEdit[K comparable, V any] struct {
	m      *shardedMap[K, V]
	copied [shardCount]bool
}

// writable is shard i, copied once per edit before its first change.
func (e *shardedEdit[K, V]) writable(i int) map[K]V {
	if !e.copied[i] {
		e.copied[i] = true
		if e.m.shards[i] == nil {
			e.m.shards[i] = map[K]V{}
		} else {
			e.m.shards[i] = maps.Clone(e.m.shards[i])
		}
	}
	return e.m.shards[i]
}

func (e *shardedEdit[K, V]) get(k K) (V, bool) { return e.m.get(k) }

func (e *shardedEdit[K, V]) set(k K, v V) {
	s := e.writable(e.m.shard(k))
	if _, had := s[k]; !had {
		e.m.n++
	}
	s[k] = v
}

func (e *shardedEdit[K, V]) delete(k K) {
	i := e.m.shard(k)
	if _, had := e.m.shards[i][k]; had {
		delete(e.writable(i), k)
		e.m.n--
	}
}

// done ends the edit; the edit must not be used after.
func (e *shardedEdit[K, V]) done() *shardedMap[K, V] { return e.m }
