package metricsaddr

import (
	"net/url"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for address, want := range map[string]string{
		"127.0.0.1:10249":         "http://127.0.0.1:10249/debug/services?format=text",
		" 127.0.0.1:10249 ":       "http://127.0.0.1:10249/debug/services?format=text",
		"[::1]:10249":             "http://[::1]:10249/debug/services?format=text",
		"localhost:10249":         "http://localhost:10249/debug/services?format=text",
		"0.0.0.0:10249":           "http://0.0.0.0:10249/debug/services?format=text",
		"http://127.0.0.1:10249":  "http://127.0.0.1:10249/debug/services?format=text",
		"http://127.0.0.1:10249/": "http://127.0.0.1:10249/debug/services?format=text",
		"https://node-1:9443":     "https://node-1:9443/debug/services?format=text",
		"http://[fd00::1]:10249/": "http://[fd00::1]:10249/debug/services?format=text",
		"HTTP://127.0.0.1:10249":  "http://127.0.0.1:10249/debug/services?format=text",
	} {
		u, err := Parse(address)
		if err != nil {
			t.Errorf("%q: %v", address, err)
			continue
		}
		if got := URL(u, "/debug/services", url.Values{"format": {"text"}}); got != want {
			t.Errorf("%q: %s, want %s", address, got, want)
		}
	}
	for address, want := range map[string]string{
		"":                               "--address is empty",
		"127.0.0.1":                      "has no port",
		"http://127.0.0.1":               "has no port",
		"::1":                            "put an IPv6 address in brackets",
		"::1:10249":                      "put an IPv6 address in brackets",
		"127.0.0.1:http":                 `port "http" is not a number`,
		"127.0.0.1:0":                    `port "0" is not a number from 1 to 65535`,
		"127.0.0.1:99999":                "is not a number from 1 to 65535",
		"ftp://127.0.0.1:10249":          `the scheme is "ftp"; want http or https`,
		"http://127.0.0.1:10249/metrics": "without a path or query (e.g. http://127.0.0.1:10249)",
		"http://127.0.0.1:10249?x=1":     "without a path or query",
		"http://user:pw@127.0.0.1:10249": "a user or password is not supported",
		"http://":                        "has no host",
		"http//127.0.0.1:10249":          "want HOST:PORT",
		"http://%zz":                     "is not a URL",
	} {
		if _, err := Parse(address); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", address, err, want)
		}
	}
}
