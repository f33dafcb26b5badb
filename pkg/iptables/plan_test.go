package iptables

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// earlyFailingKernel fails its restores (an unsplit full sync is one,
// streamed) after reading a little, as iptables-restore does at a bad line.
type earlyFailingKernel struct{ recordingKernel }

func (k *earlyFailingKernel) Restore(input io.Reader) error {
	io.ReadFull(input, make([]byte, 16))
	return errors.New("iptables-restore: line 2 failed")
}

// A streamed restore that fails early ends the sync with its error, and
// the writer does not wait for a reader that is gone.
func TestStreamedRestoreThatFailsEarlyEndsTheSync(t *testing.T) {
	kernel := &earlyFailingKernel{}
	p := newTestProxier(t, kernel)
	feed(p, 500) // far more text than a pipe holds
	done := make(chan error, 1)
	go func() { done <- p.sync() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "line 2 failed") {
			t.Errorf("sync returned %v, want the restore's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sync is stuck writing to a restore that ended")
	}
	if !p.needFullSync {
		t.Error("after a failed full sync, the next sync is not a full one")
	}
}
