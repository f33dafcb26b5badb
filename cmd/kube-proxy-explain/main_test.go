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
		{[]string{"a/b", "c/d", "--address", address}, 2, "", "", "one service at a time"},
		{[]string{"--nope"}, 2, "", "", "unknown flag: --nope"},
		{[]string{"default/my-svc", "--address", "http://" + address}, 0, "/debug/services/default/my-svc?format=text", "the table\n", ""},
		{[]string{"default/my-svc", "--address", "http://" + address + "/"}, 0, "/debug/services/default/my-svc?format=text", "the table\n", ""},
		{[]string{"default/my-svc", "--address", "127.0.0.1"}, 2, "", "", `--address "127.0.0.1" has no port`},
		{[]string{"default/my-svc", "--address", "http://" + address + "/metrics"}, 2, "", "", "without a path"},
		{[]string{"preflight", "--to", "nftables", "--address", "ftp://" + address}, 2, "", "", `the scheme is "ftp"`},
		{[]string{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "80", "--from", "pod", "--address", "http://" + address}, 0,
			"/debug/trace?destination=10.96.0.10&format=text&from=pod&port=80&protocol=TCP&source=10.244.0.9", "the table\n", ""},
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

// --help, -h and help print to stdout, each with an example; help with a
// subcommand prints that subcommand's.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"Usage: kube-proxy-explain [NAMESPACE/NAME]", "Examples:", "kube-proxy-explain default/my-svc --verify", "--address"}},
		{[]string{"-h"}, []string{"Usage: kube-proxy-explain [NAMESPACE/NAME]", "Examples:"}},
		{[]string{"help"}, []string{"Usage: kube-proxy-explain [NAMESPACE/NAME]", "Examples:"}},
		{[]string{"default/my-svc", "--help"}, []string{"Usage: kube-proxy-explain [NAMESPACE/NAME]"}},
		{[]string{"trace", "--help"}, []string{"Usage: kube-proxy-explain trace", "Examples:", "kube-proxy-explain trace --source", "--destination"}},
		{[]string{"help", "trace"}, []string{"Usage: kube-proxy-explain trace", "Examples:"}},
		{[]string{"preflight", "-h"}, []string{"Usage: kube-proxy-explain preflight", "Examples:", "kube-proxy-explain preflight --to nftables", "--allow"}},
		{[]string{"help", "preflight"}, []string{"Usage: kube-proxy-explain preflight", "Examples:"}},
	} {
		var stdout, stderr strings.Builder
		code := run(tc.args, &stdout, &stderr)
		if code != 0 || stderr.Len() > 0 {
			t.Errorf("%q: exit %d, stderr %q; want 0 and nothing", tc.args, code, stderr.String())
		}
		for _, want := range tc.want {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("%q: stdout lacks %q:\n%s", tc.args, want, stdout.String())
			}
		}
	}
	var stdout, stderr strings.Builder
	if code := run([]string{"help", "nope"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `no subcommand "nope"`) {
		t.Errorf("help nope: exit %d, stderr %q", code, stderr.String())
	}
}

// A server without /debug/services or /debug/trace, as upstream's
// kube-proxy, gets an explanation rather than Go's 404 page; a server
// that is not kube-proxy at all is told apart by /proxyMode.
func TestNotServed(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/proxyMode" {
			_, _ = w.Write([]byte("iptables"))
			return
		}
		http.NotFound(w, r)
	}))
	defer upstream.Close()
	other := httptest.NewServer(http.NotFoundHandler())
	defer other.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"default/my-svc", "--address", upstream.URL}, "(mode iptables, from /proxyMode) does not serve /debug/services/default/my-svc: it is probably upstream's kube-proxy, or an older rapidproxy"},
		{[]string{"--address", upstream.URL}, "does not serve /debug/services: it is probably upstream's"},
		{[]string{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "80", "--from", "pod", "--address", upstream.URL}, "does not serve /debug/trace: it is probably upstream's"},
		{[]string{"default/my-svc", "--address", other.URL}, "this does not look like kube-proxy's metrics server"},
	} {
		var stdout, stderr strings.Builder
		code := run(tc.args, &stdout, &stderr)
		if code != 1 || stdout.Len() > 0 || !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "404 page not found\n") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 1 and %q", tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
}

// A 429 (another verification running) is asked again after Retry-After.
func TestRetriesWhenBusy(t *testing.T) {
	asked := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked++
		if asked == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusTooManyRequests)
			return
		}
		_, _ = w.Write([]byte("verified\n"))
	}))
	defer srv.Close()
	var stdout, stderr strings.Builder
	if code := run([]string{"default/my-svc", "--verify", "--address", srv.URL}, &stdout, &stderr); code != 0 || asked != 2 || stdout.String() != "verified\n" {
		t.Errorf("exit %d after %d requests, stdout %q, stderr %q", code, asked, stdout.String(), stderr.String())
	}
}
