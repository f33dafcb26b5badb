package iptables

import (
	"fmt"
	"strings"
	"testing"
)

// A section keeps its lines in order across chunks that grow to
// chunkSize.
func TestSectionChunks(t *testing.T) {
	var s section
	var want strings.Builder
	for i := range 5000 {
		line := fmt.Sprintf("-A KUBE-SVC-%d -j KUBE-SEP-%d", i, i)
		s.add("-A KUBE-SVC-", fmt.Sprint(i), " -j KUBE-SEP-", fmt.Sprint(i))
		want.WriteString(line + "\n")
	}
	var got strings.Builder
	for _, c := range s.chunks {
		got.Write(c)
		if cap(c) > chunkSize {
			t.Errorf("a chunk of %d bytes, want at most %d", cap(c), chunkSize)
		}
	}
	if got.String() != want.String() || s.lines != 5000 {
		t.Errorf("the section holds %d lines, %d bytes; want 5000 lines, %d bytes", s.lines, got.Len(), want.Len())
	}
}
