package explain

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
)

// Only clients on the node itself are answered, unless AllClients: a
// loopback address of either family, or the address the client connected
// to; another host gets 403 saying how to ask.
func TestOnlyThisNodeByDefault(t *testing.T) {
	ask := func(h *Handler, path, remote, local string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = remote
		if local != "" {
			addr, err := net.ResolveTCPAddr("tcp", local)
			if err != nil {
				t.Fatal(err)
			}
			req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, addr))
		}
		rec := httptest.NewRecorder()
		if strings.HasPrefix(path, TracePath) {
			h.ServeTrace(rec, req)
		} else {
			h.ServeHTTP(rec, req)
		}
		return rec.Code, rec.Body.String()
	}
	h := &Handler{now: tick()}
	h.SetSource(proxy.DualStack{webService(t, &fakeIPTables{})})
	const trace = TracePath + "?source=10.244.0.9&destination=10.96.0.10&port=80&from=pod"
	for _, tc := range []struct {
		path, remote, local string
		code                int
	}{
		{Path, "127.0.0.1:40000", "127.0.0.1:10249", 200},
		{Path, "127.0.0.2:40000", "127.0.0.1:10249", 200},
		{Path, "[::1]:40000", "[::1]:10249", 200},
		{Path, "[::ffff:127.0.0.1]:40000", "[::ffff:127.0.0.1]:10249", 200},
		{Path, "10.0.0.5:40000", "10.0.0.5:10249", 200}, // the node asking its own address
		{trace, "127.0.0.1:40000", "", 200},
		{Path, "10.0.0.9:40000", "10.0.0.5:10249", 403},
		{Path + "/default/web?verify=1", "10.0.0.9:40000", "10.0.0.5:10249", 403},
		{trace + "&verify=1", "10.244.0.9:40000", "10.0.0.5:10249", 403},
		{Path, "[fd00::9]:40000", "[fd00::5]:10249", 403},
		{Path, "10.0.0.9:40000", "", 403},
		{Path, "0.0.0.0:40000", "0.0.0.0:10249", 403},
		{Path, "garbage", "", 403},
	} {
		code, body := ask(h, tc.path, tc.remote, tc.local)
		if code != tc.code {
			t.Errorf("%s from %s to %s: %d, want %d:\n%s", tc.path, tc.remote, tc.local, code, tc.code, body)
		}
		if code == 403 && !strings.Contains(body, "answers clients on this node only") || !strings.Contains(body, AccessEnv+"=all") && code == 403 {
			t.Errorf("%s from %s: the refusal does not say how to ask:\n%s", tc.path, tc.remote, body)
		}
	}
	h.AllClients = true
	if code, body := ask(h, Path, "10.0.0.9:40000", "10.0.0.5:10249"); code != 200 {
		t.Errorf("with AllClients, from another host: %d\n%s", code, body)
	}
}

func TestParseAccess(t *testing.T) {
	for value, want := range map[string]bool{"": false, "loopback": false, "all": true} {
		if got, err := ParseAccess(value); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", value, got, err, want)
		}
	}
	for _, value := range []string{"ALL", "yes", "0.0.0.0"} {
		if _, err := ParseAccess(value); err == nil || !strings.Contains(err.Error(), "want loopback (the default") {
			t.Errorf("%q: %v, want an error naming the values", value, err)
		}
	}
}

// verify=1 reads the kernel for one request at a time, at most once per
// VerifyInterval, for /debug/services and /debug/trace together; others
// get 429 with Retry-After; requests without verify are not limited.
func TestVerifyIsRateLimited(t *testing.T) {
	now := time.Now()
	h := &Handler{now: func() time.Time { return now }}
	h.SetSource(proxy.DualStack{webService(t, &fakeIPTables{})})
	const verifyService = Path + "/default/web?verify=1&format=text"
	const verifyTrace = TracePath + "?source=10.244.0.9&destination=10.96.0.10&port=80&from=pod&verify=1"
	ask := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = "127.0.0.1:40000"
		rec := httptest.NewRecorder()
		if strings.HasPrefix(path, TracePath) {
			h.ServeTrace(rec, req)
		} else {
			h.ServeHTTP(rec, req)
		}
		return rec
	}
	if rec := ask(verifyService); rec.Code != 200 {
		t.Fatalf("first verification: %d %s", rec.Code, rec.Body)
	}
	for _, path := range []string{verifyService, verifyTrace, verifyTrace + "&format=text"} {
		rec := ask(path)
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" || !strings.Contains(rec.Body.String(), "at most one") {
			t.Errorf("%s within %s: %d, Retry-After %q:\n%s", path, VerifyInterval, rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
	}
	for _, path := range []string{Path + "/default/web", TracePath + "?source=10.244.0.9&destination=10.96.0.10&port=80&from=pod"} {
		if rec := ask(path); rec.Code != 200 {
			t.Errorf("%s without verify: %d", path, rec.Code)
		}
	}
	now = now.Add(VerifyInterval)
	if rec := ask(verifyTrace); rec.Code != 200 {
		t.Errorf("a verification %s later: %d %s", VerifyInterval, rec.Code, rec.Body)
	}
	// One running: refused whatever the time.
	done, _ := h.verify.start(now.Add(time.Hour))
	if rec := ask(verifyService); rec.Code != http.StatusTooManyRequests {
		t.Errorf("while another verification runs: %d", rec.Code)
	}
	done()
	now = now.Add(2 * time.Hour)
	if rec := ask(verifyService); rec.Code != 200 {
		t.Errorf("after it ended: %d", rec.Code)
	}
}
