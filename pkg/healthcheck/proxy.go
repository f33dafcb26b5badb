// Package healthcheck serves kube-proxy's health: the proxy's own /healthz
// and /livez, and the per-service health-check node ports that external
// load balancers probe for services with externalTrafficPolicy Local.
package healthcheck

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// ToBeDeletedTaint marks a node the cluster autoscaler is removing; load
// balancers should stop sending to it, so /healthz fails.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// FamilyHealth is one IP family's proxier state.
type FamilyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Health is the JSON body of /healthz and /livez.
type Health struct {
	LastUpdated  time.Time                    `json:"lastUpdated"`
	CurrentTime  time.Time                    `json:"currentTime"`
	NodeEligible *bool                        `json:"nodeEligible,omitempty"`
	Healthy      bool                         `json:"healthy"`
	Status       map[v1.IPFamily]FamilyHealth `json:"status,omitempty"`
}

// ProxyHealth tracks whether the proxiers keep up: a family is unhealthy
// when a change was queued and not applied within the timeout (upstream
// uses twice the sync period).
type ProxyHealth struct {
	timeout time.Duration
	now     func() time.Time

	mu            sync.Mutex
	lastUpdated   map[v1.IPFamily]time.Time
	oldestPending map[v1.IPFamily]time.Time
	node          *v1.Node
	// held, until closed, keeps /healthz unhealthy (HoldUntil).
	held <-chan struct{}
}

// NewProxyHealth returns a tracker with the given timeout.
func NewProxyHealth(timeout time.Duration) *ProxyHealth {
	return &ProxyHealth{timeout: timeout, now: time.Now, lastUpdated: map[v1.IPFamily]time.Time{}, oldestPending: map[v1.IPFamily]time.Time{}}
}

// QueuedUpdate records that a family has a change waiting to be applied.
func (h *ProxyHealth) QueuedUpdate(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.oldestPending[family]; !ok {
		h.oldestPending[family] = h.now()
	}
	metrics.SyncProxyRulesLastQueued.WithLabelValues(string(family)).SetToCurrentTime()
}

// Updated records that a family applied every queued change.
func (h *ProxyHealth) Updated(family v1.IPFamily) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oldestPending, family)
	h.lastUpdated[family] = h.now()
}

// SetNode records the node's current object, for /healthz.
func (h *ProxyHealth) SetNode(node *v1.Node) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.node = node
}

// Health reports the proxiers' health.
func (h *ProxyHealth) Health() Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	health := Health{Healthy: true, CurrentTime: now, Status: map[v1.IPFamily]FamilyHealth{}}
	for family, updated := range h.lastUpdated {
		if updated.After(health.LastUpdated) {
			health.LastUpdated = updated
		}
		fh := FamilyHealth{LastUpdated: updated, Healthy: true}
		if pending, ok := h.oldestPending[family]; ok && now.Sub(pending) >= h.timeout {
			fh.Healthy, health.Healthy = false, false
		}
		health.Status[family] = fh
	}
	return health
}

// HoldUntil has /healthz answer 503 until done is closed. A node
// switching proxy modes holds it until the new mode's first sync: before
// that the rules in place are the old mode's, and a load balancer that
// picks nodes by /healthz should wait. /livez is not held: a liveness
// probe failing then would restart the switch.
func (h *ProxyHealth) HoldUntil(done <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = done
}

// holding tells whether HoldUntil's channel is still open.
func (h *ProxyHealth) holding() bool {
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	if held == nil {
		return false
	}
	select {
	case <-held:
		return false
	default:
		return true
	}
}

// nodeEligible is false while the node is being deleted or drained by the
// autoscaler, or before its object is known.
func (h *ProxyHealth) nodeEligible() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.node == nil || h.node.DeletionTimestamp != nil {
		return false
	}
	for _, taint := range h.node.Spec.Taints {
		if taint.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// Handler serves /healthz (proxier and node state) and /livez (proxier
// state only); every other path is 404.
func (h *ProxyHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		health := h.Health()
		eligible := h.nodeEligible()
		health.NodeEligible = &eligible
		h.write(w, health, health.Healthy && eligible && !h.holding(), metrics.ProxyHealthzTotal)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		health := h.Health()
		h.write(w, health, health.Healthy, metrics.ProxyLivezTotal)
	})
	return mux
}

// write answers 200 or 503 with the health as JSON, counting the code.
func (h *ProxyHealth) write(w http.ResponseWriter, health Health, healthy bool, counter *prometheus.CounterVec) {
	code := http.StatusOK
	if healthy {
		// A healthy proxy is as fresh as now, as upstream reports it.
		health.LastUpdated = health.CurrentTime
	} else {
		code = http.StatusServiceUnavailable
	}
	counter.WithLabelValues(strconv.Itoa(code)).Inc()
	writeJSON(w, code, health)
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	out, _ := json.Marshal(body)
	_, _ = w.Write(out)
}
