package readahead

import (
	"errors"
	"testing"
	"time"
)

func TestTakenOnlyWhileTheVersionHolds(t *testing.T) {
	version := 1
	v := Version[int]{Read: func() int { return version }, Same: func(a, b int) bool { return a == b && a != 0 }}
	r := Make(v, func() (string, error) { return "tables", nil })
	if got, ok := r.Take(v, 1, 0); !ok || got != "tables" {
		t.Errorf("Take at the same version: %q, %v; want the read", got, ok)
	}
	if _, ok := r.Take(v, 2, 0); ok {
		t.Error("taken after another program wrote")
	}
	if _, ok := r.Take(v, 1, time.Nanosecond); ok {
		t.Error("taken when older than maxAge")
	}
	// The version moved while it read: nothing kept.
	moving := Make(v, func() (string, error) { version = 3; return "tables", nil })
	if _, ok := moving.Take(v, 3, 0); ok {
		t.Error("taken though the version moved during the read")
	}
	// A failed version read (0 here) never matches.
	version = 0
	if _, ok := Make(v, func() (string, error) { return "tables", nil }).Take(v, 0, 0); ok {
		t.Error("taken with the version unreadable")
	}
	if Make(v, func() (string, error) { return "", errors.New("no") }) != nil {
		t.Error("a failed read was kept")
	}
}
