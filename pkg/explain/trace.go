package explain

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// TracePath is where a packet's trace is served:
// /debug/trace?source=A&destination=B&port=N&protocol=TCP&from=pod|node|external,
// with verify=1 to check the traced objects against the kernel and
// format=text for text.
const TracePath = "/debug/trace"

// ServeTrace answers TracePath.
func (h *Handler) ServeTrace(w http.ResponseWriter, r *http.Request) {
	if !h.allowed(w, r) {
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "only GET", http.StatusMethodNotAllowed)
		return
	}
	q := r.URL.Query()
	text := false
	switch q.Get("format") {
	case "", "json":
	case "text":
		text = true
	default:
		http.Error(w, "format is json (the default) or text", http.StatusBadRequest)
		return
	}
	fail := func(status int, msg string) {
		if text {
			writeText(w, status, func(b *strings.Builder) { b.WriteString(wrap(msg, "", "")) })
			return
		}
		writeJSON(w, status, map[string]string{"error": msg})
	}
	pkt, err := trace.ParsePacket(q.Get("source"), q.Get("destination"), q.Get("port"), q.Get("protocol"), q.Get("from"))
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	isLocal := h.IsLocal
	if isLocal == nil {
		isLocal = isLocalAddress
	}
	pkt.LocalDestination = isLocal(pkt.Destination)
	h.mu.Lock()
	source := h.source
	h.mu.Unlock()
	tracer, ok := source.(proxy.PacketTracer)
	if source == nil || !ok {
		fail(http.StatusServiceUnavailable, "kube-proxy is starting")
		return
	}
	verify := q.Get("verify") == "1" || q.Get("verify") == "true"
	if verify {
		done := h.startVerify(w, fail)
		if done == nil {
			return
		}
		defer done()
	}
	result, err := tracer.Trace(pkt, verify)
	if errors.Is(err, proxy.ErrNoTracer) || errors.Is(err, proxy.ErrCannotVerify) {
		fail(http.StatusNotImplemented, err.Error())
		return
	} else if err != nil {
		fail(http.StatusUnprocessableEntity, err.Error())
		return
	}
	if text {
		writeText(w, http.StatusOK, func(b *strings.Builder) { trace.WriteText(b, result) })
		return
	}
	writeJSON(w, http.StatusOK, result)
}

// isLocalAddress tells whether an address is one of this host's, as the
// kernel's routing would: loopback, or on any interface.
func isLocalAddress(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, addr := range addrs {
		if n, ok := addr.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}
