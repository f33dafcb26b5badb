package healthcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func get(t *testing.T, h http.Handler, path string) (int, Health) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	var body Health
	if rec.Code != http.StatusNotFound {
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: bad JSON %q: %v", path, rec.Body.String(), err)
		}
	}
	return rec.Code, body
}

func TestProxyHealth(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := NewProxyHealth(60 * time.Second)
	h.now = func() time.Time { return now }
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	h.SetNode(node)
	handler := h.Handler()

	h.QueuedUpdate(v1.IPv4Protocol)
	h.Updated(v1.IPv4Protocol)
	if code, body := get(t, handler, "/healthz"); code != 200 || !body.Healthy || body.NodeEligible == nil || !*body.NodeEligible {
		t.Errorf("after a sync: %d %+v", code, body)
	}
	// A change pending for less than the timeout is fine...
	h.QueuedUpdate(v1.IPv4Protocol)
	now = now.Add(59 * time.Second)
	if code, _ := get(t, handler, "/livez"); code != 200 {
		t.Errorf("pending 59s: livez %d", code)
	}
	// ...but not longer.
	now = now.Add(time.Second)
	code, body := get(t, handler, "/healthz")
	if code != 503 || body.Healthy || body.Status[v1.IPv4Protocol].Healthy {
		t.Errorf("pending 60s: healthz %d %+v", code, body)
	}
	if code, _ := get(t, handler, "/livez"); code != 503 {
		t.Errorf("pending 60s: livez %d", code)
	}
	h.Updated(v1.IPv4Protocol)

	// Node being deleted or drained: /healthz fails, /livez does not.
	deleting := node.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	for name, n := range map[string]*v1.Node{"deleting": deleting, "tainted": tainted, "unknown": nil} {
		h.SetNode(n)
		if code, body := get(t, handler, "/healthz"); code != 503 || *body.NodeEligible {
			t.Errorf("%s node: healthz %d %+v", name, code, body)
		}
		if code, _ := get(t, handler, "/livez"); code != 200 {
			t.Errorf("%s node: livez %d", name, code)
		}
	}
	if code, _ := get(t, handler, "/other"); code != 404 {
		t.Errorf("unknown path: %d", code)
	}
}

// A node switching modes answers /healthz 503 until the new mode's first
// sync; /livez is not held.
func TestProxyHealthHeldUntilDone(t *testing.T) {
	h := NewProxyHealth(60 * time.Second)
	h.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})
	handler := h.Handler()
	done := make(chan struct{})
	h.HoldUntil(done)
	if code, _ := get(t, handler, "/healthz"); code != 503 {
		t.Errorf("held: healthz %d", code)
	}
	if code, _ := get(t, handler, "/livez"); code != 200 {
		t.Errorf("held: livez %d", code)
	}
	close(done)
	if code, _ := get(t, handler, "/healthz"); code != 200 {
		t.Errorf("released: healthz %d", code)
	}
}

func freePort(t *testing.T) int32 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

func TestServiceHealthNodePorts(t *testing.T) {
	proxy := NewProxyHealth(time.Minute)
	s := NewServiceHealth([]string{"127.0.0.1"}, proxy)
	defer s.Close()
	name := types.NamespacedName{Namespace: "ns", Name: "lb"}
	port := freePort(t)
	if err := s.SyncServices(map[types.NamespacedName]int32{name: port}); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	check := func(wantCode int, wantBody string, wantWeight string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wantCode || string(body) != wantBody || resp.Header.Get("X-Load-Balancing-Endpoint-Weight") != wantWeight {
			t.Errorf("got %d %s weight %q, want %d %s weight %q", resp.StatusCode, body, resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), wantCode, wantBody, wantWeight)
		}
	}
	check(503, `{"service":{"namespace":"ns","name":"lb"},"localEndpoints":0,"serviceProxyHealthy":true}`, "0")
	s.SyncEndpoints(map[types.NamespacedName]int{name: 2})
	check(200, `{"service":{"namespace":"ns","name":"lb"},"localEndpoints":2,"serviceProxyHealthy":true}`, "2")
	// Closing the service frees the port.
	if err := s.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Errorf("port still held: %v", err)
	} else {
		ln.Close()
	}
}
