package linehash

import (
	"hash/fnv"
	"testing"
)

// Line is FNV-1a over the line and a newline, as hash/fnv computes it.
func TestLineIsFNV1a(t *testing.T) {
	for _, lines := range [][]string{nil, {""}, {"-A KUBE-SERVICES -j DROP"}, {"a", "b c"}} {
		want := fnv.New64a()
		h := Start
		for _, l := range lines {
			want.Write([]byte(l + "\n"))
			h = Line(h, l)
		}
		if h != want.Sum64() {
			t.Errorf("%q: %x, want %x", lines, h, want.Sum64())
		}
		if b := Line(Start, []byte("x")); b != Line(Start, "x") {
			t.Error("a []byte hashes apart from its string")
		}
	}
}
