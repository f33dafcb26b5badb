package testutil

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// DoInNetns runs f on a thread moved into the named namespace, for calls
// that act in the namespace of the thread making them (netlink sockets).
// f must not start goroutines that expect to be in the namespace.
func DoInNetns(t testing.TB, netns string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + netns)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("entering %s: %v", netns, err)
	}
	defer func() {
		// A thread that cannot go back stays locked: the runtime then
		// ends it with this goroutine instead of reusing it.
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	f()
}
