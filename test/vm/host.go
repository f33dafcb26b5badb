package vm

import (
	"context"
	"net"
	"syscall"
	"testing"
)

// ListenOnHost listens on a TCP port of HostIP, for a guest with
// Config.Network to reach over the tap. Run creates the tap and its
// address later: IP_FREEBIND binds to the address before it exists. The
// listener is closed when the test ends.
func ListenOnHost(t testing.TB) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_IP, syscall.IP_FREEBIND, 1)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	l, err := lc.Listen(context.Background(), "tcp4", HostIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
