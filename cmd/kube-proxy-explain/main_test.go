package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.String())
		if r.URL.Path == "/debug/services/default/missing" {
			http.Error(w, "default/missing: this node programs no port of it", http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte("the table\n"))
	}))
	defer srv.Close()
	address := strings.TrimPrefix(srv.URL, "http://")

	cases := []struct {
		args           []string
		code           int
		url            string
		stdout, stderr string
	}{
		{[]string{"default/my-svc", "--address", address}, 0, "/debug/services/default/my-svc?format=text", "the table\n", ""},
		{[]string{"--address", address, "kube-system/dns", "--verify"}, 0, "/debug/services/kube-system/dns?format=text&verify=1", "the table\n", ""},
		{[]string{"--address", address}, 0, "/debug/services?format=text", "the table\n", ""},
		{[]string{"default/missing", "--address", address}, 1, "/debug/services/default/missing?format=text", "", "this node programs no port of it"},
		{[]string{"my-svc", "--address", address}, 2, "", "", `"my-svc" is not NAMESPACE/NAME`},
		{[]string{"a/b", "c/d", "--address", address}, 2, "", "", "Usage:"},
		{[]string{"--help"}, 0, "", "", "Usage:"},
		{[]string{"--nope"}, 2, "", "", "unknown flag: --nope"},
		{[]string{"a/b", "--address", "127.0.0.1:1"}, 1, "", "", "is kube-proxy running here"},
		{[]string{"preflight", "--to", "userspace", "--address", address}, 2, "", "", `kube-proxy-explain preflight: --to "userspace"`},
		{[]string{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "80", "--from", "pod", "--address", address}, 0,
			"/debug/trace?destination=10.96.0.10&format=text&from=pod&port=80&protocol=TCP&source=10.244.0.9", "the table\n", ""},
		{[]string{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "53", "--protocol", "udp", "--from", "node", "--verify", "-o", "json", "--address", address}, 0,
			"/debug/trace?destination=10.96.0.10&format=json&from=node&port=53&protocol=udp&source=10.244.0.9&verify=1", "the table\n", ""},
		{[]string{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "80", "--address", address}, 2, "", "", "from is missing"},
		{[]string{"trace", "--source", "pod-a", "--destination", "10.96.0.10", "--port", "80", "--from", "pod"}, 2, "", "", `source "pod-a" is not an IP address`},
		{[]string{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "80", "--protocol", "icmp", "--from", "pod"}, 2, "", "", `protocol "icmp" is not TCP, UDP or SCTP`},
		{[]string{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "80", "--from", "pod", "-o", "yaml"}, 2, "", "", `--output "yaml" is not text or json`},
	}
	for _, tc := range cases {
		asked = nil
		var stdout, stderr strings.Builder
		code := run(tc.args, &stdout, &stderr)
		url := ""
		if len(asked) > 0 {
			url = asked[0]
		}
		if code != tc.code || url != tc.url || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%v: exit %d, asked %q, stdout %q, stderr %q; want %d, %q, %q, %q", tc.args, code, url, stdout.String(), stderr.String(), tc.code, tc.url, tc.stdout, tc.stderr)
		}
	}
}
