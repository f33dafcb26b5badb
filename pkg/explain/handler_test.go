package explain

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

func get(t *testing.T, h http.Handler, method, url string) (int, string, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, url, nil)
	req.RemoteAddr = "127.0.0.1:40000"
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, rec.Header().Get("Content-Type"), string(body)
}

// tick is a clock that moves on by VerifyInterval on each reading, so
// that every verification is let through.
func tick() func() time.Time {
	now := time.Now()
	return func() time.Time {
		now = now.Add(VerifyInterval)
		return now
	}
}

func TestHandler(t *testing.T) {
	h := &Handler{now: tick()}
	if code, _, _ := get(t, h, "GET", Path); code != http.StatusServiceUnavailable {
		t.Errorf("before the proxier exists: %d, want 503", code)
	}
	h.SetSource(proxy.DualStack{webService(t, &fakeIPTables{})})

	cases := []struct {
		method, url string
		code        int
		contentType string
		contains    string
	}{
		{"GET", Path, 200, "application/json", `"name": "default/web:http"`},
		{"GET", Path + "?format=text", 200, "text/plain; charset=utf-8", "SERVICE PORT"},
		{"GET", Path + "/default/web?format=text", 200, "text/plain; charset=utf-8", "[5] not on this node, and the policy is Local"},
		{"GET", Path + "/default/web?format=text&verify=1", 200, "text/plain; charset=utf-8", "nat chain KUBE-SVC-CDGGSHYLG3RE2FKL is missing"},
		{"GET", Path + "/default/nothing", 404, "application/json", "this node programs no port of it"},
		{"GET", Path + "/default/nothing?format=text", 404, "text/plain; charset=utf-8", "this node programs no port of it"},
		{"GET", Path + "/default", 404, "text/plain; charset=utf-8", "want /debug/services/NAMESPACE/NAME"},
		{"GET", Path + "/default/web/x", 404, "text/plain; charset=utf-8", "want /debug/services/NAMESPACE/NAME"},
		{"GET", Path + "?format=yaml", 400, "text/plain; charset=utf-8", "format is json"},
		{"POST", Path, 405, "text/plain; charset=utf-8", "only GET"},
	}
	for _, tc := range cases {
		code, contentType, body := get(t, h, tc.method, tc.url)
		if code != tc.code || contentType != tc.contentType || !strings.Contains(body, tc.contains) {
			t.Errorf("%s %s: %d %s, want %d %s containing %q:\n%s", tc.method, tc.url, code, contentType, tc.code, tc.contentType, tc.contains, body)
		}
	}
}

// The JSON says the same as the text, field by field, and verification
// only when asked for.
func TestHandlerJSON(t *testing.T) {
	h := &Handler{now: tick()}
	h.SetSource(proxy.DualStack{webService(t, &fakeIPTables{})})
	decode := func(url string) proxy.Explanation {
		t.Helper()
		_, _, body := get(t, h, "GET", url)
		var e proxy.Explanation
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("%v:\n%s", err, body)
		}
		if len(e.ServicePorts) != 1 {
			t.Fatalf("service ports: %s", body)
		}
		return e
	}
	e := decode(Path + "/default/web")
	sp := e.ServicePorts[0]
	if e.Node != "node-1" || e.Zone != "zone-a" || sp.Family != "IPv4" || sp.ExternalTrafficPolicy != "Local" || sp.Cluster.Endpoints != 2 || sp.Local.Endpoints != 1 {
		t.Errorf("explanation: %+v", e)
	}
	var got []string
	for _, ep := range sp.Endpoints {
		got = append(got, ep.Address+" "+reason(ep.Cluster)+" "+reason(ep.Local))
	}
	want := []string{
		"10.244.0.5:8080 used used",
		"10.244.0.6:8080 TerminatingWhileOthersReady TerminatingWhileOthersReady",
		"10.244.0.7:8080 NotReady NotReady",
		"10.244.1.5:8080 HintedForOtherZone NotOnThisNode",
		"10.244.1.6:8080 used NotOnThisNode",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("endpoints:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if sp.Kernel == nil || sp.Kernel.Mode != "iptables" || len(sp.Kernel.Objects) == 0 || sp.Kernel.Verify != nil {
		t.Errorf("kernel without verify: %+v", sp.Kernel)
	}
	if v := decode(Path + "/default/web?verify=1").ServicePorts[0].Kernel.Verify; v == nil || len(v.Differences) == 0 {
		t.Errorf("verify over an empty kernel: %+v", v)
	}
}

func reason(u *state.Use) string {
	if u.Used {
		return "used"
	}
	return string(u.Reason)
}
