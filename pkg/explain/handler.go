// Package explain serves what this node does with each service, for a
// person asking why a service works from one node and not from another:
// /debug/services lists the service ports the node programs, and
// /debug/services/NAMESPACE/NAME explains one service: each endpoint
// with whether and why each path uses it, the kernel objects that
// implement it, and with ?verify=1 how the kernel differs from them.
// JSON by default, a table with ?format=text.
package explain

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

// Path is where the handler is served; it answers below it too.
const Path = "/debug/services"

// Handler serves Path from a proxier, once it has one.
type Handler struct {
	// IsLocal tells whether an address is this node's, for a trace (a
	// NodePort answers there); nil reads the host's interfaces.
	IsLocal func(netip.Addr) bool
	// AllClients serves every client; by default only clients on the node
	// itself are answered (AccessEnv), others get 403.
	AllClients bool

	mu     sync.Mutex
	source proxy.Explainer
	// verify limits the requests that read the kernel (verify=1).
	verify verifyLimit
	now    func() time.Time // time.Now if nil
}

// SetSource gives the handler its proxier: the metrics server starts
// before the proxier exists.
func (h *Handler) SetSource(s proxy.Explainer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.source = s
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.allowed(w, r) {
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "only GET", http.StatusMethodNotAllowed)
		return
	}
	text := false
	switch r.URL.Query().Get("format") {
	case "", "json":
	case "text":
		text = true
	default:
		http.Error(w, "format is json (the default) or text", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	source := h.source
	h.mu.Unlock()
	if source == nil {
		http.Error(w, "kube-proxy is starting", http.StatusServiceUnavailable)
		return
	}

	rest := strings.Trim(strings.TrimPrefix(r.URL.Path, Path), "/")
	if rest == "" {
		ports := source.ServicePorts()
		if text {
			writeText(w, http.StatusOK, func(b *strings.Builder) { WriteServicePorts(b, ports) })
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"servicePorts": ports})
		return
	}
	namespace, name, ok := strings.Cut(rest, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		http.Error(w, "want "+Path+"/NAMESPACE/NAME", http.StatusNotFound)
		return
	}
	verify := r.URL.Query().Get("verify")
	verify1 := verify == "1" || verify == "true"
	if verify1 {
		done := h.startVerify(w, func(status int, msg string) {
			if text {
				writeText(w, status, func(b *strings.Builder) { b.WriteString(wrap(msg, "", "")) })
				return
			}
			writeJSON(w, status, map[string]string{"error": msg})
		})
		if done == nil {
			return
		}
		defer done()
	}
	e := source.Explain(types.NamespacedName{Namespace: namespace, Name: name}, verify1)
	if len(e.ServicePorts) == 0 {
		msg := fmt.Sprintf("%s/%s: this node programs no port of it. Either it does not exist, or kube-proxy leaves it out: "+
			"a headless or ExternalName service, one labelled service.kubernetes.io/service-proxy-name, "+
			"or one without a cluster IP of an IP family this node serves.", namespace, name)
		if text {
			writeText(w, http.StatusNotFound, func(b *strings.Builder) { b.WriteString(wrap(msg, "", "")) })
			return
		}
		writeJSON(w, http.StatusNotFound, map[string]string{"error": msg})
		return
	}
	if text {
		writeText(w, http.StatusOK, func(b *strings.Builder) { WriteExplanation(b, e) })
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeText(w http.ResponseWriter, status int, write func(*strings.Builder)) {
	var b strings.Builder
	write(&b)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}
