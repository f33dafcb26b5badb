package testutil

import "runtime"

// HeapInUse is the heap in use after a collection: what the benchmarks
// of kept memory compare.
func HeapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
