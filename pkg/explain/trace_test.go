package explain

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

func TestTraceHandler(t *testing.T) {
	h := &Handler{IsLocal: func(a netip.Addr) bool { return a == netip.MustParseAddr("10.255.0.2") }, now: tick()}
	const pod = TracePath + "?source=10.244.0.9&destination=10.96.0.10&port=80&protocol=TCP&from=pod"
	if code, _, _ := get(t, http.HandlerFunc(h.ServeTrace), "GET", pod); code != http.StatusServiceUnavailable {
		t.Errorf("before the proxier exists: %d, want 503", code)
	}
	h.SetSource(proxy.DualStack{webService(t, &fakeIPTables{})})
	cases := []struct {
		url      string
		code     int
		contains string
	}{
		// The zone hints leave the endpoints of zone-a, local or not.
		{pod + "&format=text", 200, "Outcome: DNAT to one of 2 endpoints: 10.244.0.5:8080 50.0%, 10.244.1.6:8080\n"},
		{pod, 200, `"verdict": "dnat"`},
		// eTP Local from outside: only the local ready endpoint.
		{TracePath + "?source=192.0.2.1&destination=10.255.0.2&port=30080&from=external&format=text", 200, "by its node port (local path)"},
		// The fake kernel holds no chain.
		{pod + "&verify=1&format=text", 200, "Verify: "},
		{TracePath + "?source=10.244.0.9&destination=10.96.0.10&port=80&protocol=ICMP&from=pod", 400, `protocol \"ICMP\" is not TCP, UDP or SCTP`},
		{TracePath + "?source=10.244.0.9&destination=10.96.0.10&port=80&from=pod&format=text&protocol=tcp&source=x", 200, "Outcome"},
		{TracePath + "?source=10.244.0.9&destination=10.96.0.10&port=80&protocol=tcp&format=text", 400, "from is missing"},
		{TracePath + "?source=fd00::9&destination=fd00::10&port=80&protocol=tcp&from=pod&format=text", 422, "programs no service of the packet's IP family (IPv6)"},
		{pod + "&format=yaml", 400, "format is json"},
	}
	for _, tc := range cases {
		code, _, body := get(t, http.HandlerFunc(h.ServeTrace), "GET", tc.url)
		if code != tc.code || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s: %d, want %d containing %q:\n%s", tc.url, code, tc.code, tc.contains, body)
		}
	}
	_, _, body := get(t, http.HandlerFunc(h.ServeTrace), "GET", pod)
	var r trace.Result
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.Service != "default/web:http" || r.Entry != trace.EntryClusterIP || len(r.Steps) == 0 {
		t.Errorf("JSON: %v %+v", err, r)
	}
}
