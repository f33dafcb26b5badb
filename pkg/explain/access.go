package explain

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// AccessEnv is the environment variable that says who may ask Path and
// TracePath: "loopback" (the default, also when unset) answers clients on
// the node itself only, "all" every client of the metrics address.
// The configuration file is upstream's type, so this is not a field of it.
const AccessEnv = "KUBE_PROXY_DEBUG_ENDPOINTS"

// Access values of AccessEnv.
const (
	AccessLoopback = "loopback"
	AccessAll      = "all"
)

// ParseAccess reads AccessEnv's value: whether every client may ask.
func ParseAccess(value string) (all bool, err error) {
	switch value {
	case "", AccessLoopback:
		return false, nil
	case AccessAll:
		return true, nil
	}
	return false, fmt.Errorf("%s=%q: want %s (the default: clients on this node only) or %s (every client of metricsBindAddress)",
		AccessEnv, value, AccessLoopback, AccessAll)
}

// fromThisNode tells whether a request comes from the node itself: from a
// loopback address, or from the very address it connected to (a process on
// the node asking the node's own IP, which the kernel routes through the
// loopback interface; a packet from elsewhere claiming a local source
// address is dropped as martian).
func fromThisNode(r *http.Request) bool {
	remote, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	client := remote.Addr().Unmap()
	if client.IsLoopback() {
		return true
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	server, err := netip.ParseAddrPort(local.String())
	return err == nil && server.Addr().Unmap() == client && !client.IsUnspecified()
}

// allowed answers 403 to a client the endpoints do not serve, and tells
// whether to go on.
func (h *Handler) allowed(w http.ResponseWriter, r *http.Request) bool {
	if h.AllClients || fromThisNode(r) {
		return true
	}
	http.Error(w, fmt.Sprintf("%s answers clients on this node only: run kube-proxy-explain on the node, or in its kube-proxy pod "+
		"(kubectl exec), which asks 127.0.0.1. To serve every client of the metrics address, start kube-proxy with %s=%s.",
		r.URL.Path, AccessEnv, AccessAll), http.StatusForbidden)
	return false
}

// VerifyInterval is the least time between the starts of two
// verifications: each reads the service's objects from the kernel (a few
// iptables chains take a second or two each on a large legacy node).
const VerifyInterval = time.Second

// verifyLimit lets one verification run at a time, at most one per
// VerifyInterval.
type verifyLimit struct {
	mu      sync.Mutex
	running bool
	last    time.Time
}

// start begins a verification and returns the function that ends it, or
// how long to wait before asking again.
func (l *verifyLimit) start(now time.Time) (done func(), wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running {
		return nil, VerifyInterval
	}
	if next := l.last.Add(VerifyInterval); !l.last.IsZero() && now.Before(next) {
		return nil, next.Sub(now)
	}
	l.running, l.last = true, now
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.running = false
	}, 0
}

// startVerify begins a verification, or answers 429 with Retry-After and
// returns nil.
func (h *Handler) startVerify(w http.ResponseWriter, fail func(int, string)) func() {
	now := time.Now
	if h.now != nil {
		now = h.now
	}
	done, wait := h.verify.start(now())
	if done != nil {
		return done
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	fail(http.StatusTooManyRequests, fmt.Sprintf("another verification is running or just ran: this kube-proxy reads the kernel for at most one "+
		"verify=1 request at a time, one per %s; ask again in %s, or without verify=1", VerifyInterval, wait.Round(time.Millisecond)))
	return nil
}
