// Package readahead keeps a read of the kernel made ahead of a sync (a
// restart's, while the informers list) with the kernel's version around
// it: the iptables tables' generations, the ipsets' entry counts. The sync
// takes the read only if the version has not moved since, and reads again
// otherwise. Every mode that reads early uses it.
package readahead

import "time"

// Version reads what tells that another program wrote, and compares two
// such reads: Same is false when either read failed.
type Version[V any] struct {
	Read func() V
	Same func(a, b V) bool
}

// Read is what was read ahead, with the version it holds for.
type Read[T, V any] struct {
	value   T
	version V
	at      time.Time
}

// Make reads with read between two reads of the version; nil when read
// fails or the version moved meanwhile.
func Make[T, V any](v Version[V], read func() (T, error)) *Read[T, V] {
	at := time.Now()
	before := v.Read()
	value, err := read()
	after := v.Read()
	if err != nil || !v.Same(before, after) {
		return nil
	}
	return &Read[T, V]{value: value, version: after, at: at}
}

// Take returns what was read if the kernel is still at its version (now,
// as v reads it) and, when maxAge is not 0, the read is at most that old.
// A nil Read has nothing to take.
func (r *Read[T, V]) Take(v Version[V], now V, maxAge time.Duration) (T, bool) {
	if r == nil || (maxAge > 0 && time.Since(r.at) > maxAge) || !v.Same(r.version, now) {
		var none T
		return none, false
	}
	return r.value, true
}
