package main

import (
	"strings"
	"testing"
)

// TestPerServiceSubtractsTheFloor checks the per-service memory table: a
// shape's figure less the zero-service floor's, divided by its services.
func TestPerServiceSubtractsTheFloor(t *testing.T) {
	shape := func(n int, oursHeap, theirsHeap float64) shapeTable {
		return shapeTable{n: n, e: 5, all: map[string]map[string]results{"nftables": {
			ours:     {"steadyHeap": {value: oursHeap}},
			upstream: {"steadyHeap": {value: theirsHeap}},
		}}}
	}
	var b strings.Builder
	writePerService(&b, []string{"nftables"}, []shapeTable{shape(0, 10, 20), shape(1000, 15, 40)})
	want := "| 1000 x 5 | nftables | steady live heap, go_memstats_heap_inuse_bytes after idling | 5.00 | 20.00 | 0.25 |"
	if !strings.Contains(b.String(), want) {
		t.Fatalf("got\n%s\nwant a line\n%s", b.String(), want)
	}
	b.Reset()
	writePerService(&b, []string{"nftables"}, []shapeTable{shape(1000, 15, 40)})
	if b.Len() != 0 {
		t.Fatalf("without a floor, got\n%s", b.String())
	}
}
