package main

import (
	"slices"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// A removal's window ends with the last failed connection that started
// after it and before the next removal; other changes do not end it.
func TestRemovalWindowsEndAtTheLastFailureBeforeTheNextRemoval(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, int64(ms)*int64(time.Millisecond)) }
	changes := []framework.EndpointChange{
		{At: at(0), Kind: framework.ChangeRemove, Pod: "a"},
		{At: at(250), Kind: framework.ChangeAdd, Pod: "c"},
		{At: at(500), Kind: framework.ChangeRemove, Pod: "b"},
		{At: at(750), Kind: framework.ChangeRemove, Pod: "c"},
	}
	conns := []framework.Connection{
		{Start: at(-5), Connect: 1010 * time.Millisecond, Outcome: framework.ProbeOK}, // before any removal
		{Start: at(100), Connect: 1010 * time.Millisecond, Outcome: framework.ProbeOK},
		{Start: at(300), Connect: time.Millisecond, Outcome: framework.ProbeReset},
		{Start: at(400), Connect: time.Millisecond, Outcome: framework.ProbeOK}, // answered at once
		{Start: at(520), Connect: 3 * time.Second, Outcome: framework.ProbeError},
	}
	want := []time.Duration{300 * time.Millisecond, 20 * time.Millisecond, 0}
	if got := removalWindows(conns, changes); !slices.Equal(got, want) {
		t.Errorf("windows %v, want %v", got, want)
	}
}
