// Package metricsaddr reads the address of kube-proxy's metrics server as
// kube-proxy-explain takes it (--address): host:port, as in
// metricsBindAddress, or a URL with the scheme http or https.
package metricsaddr

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Default is kube-proxy's default metricsBindAddress.
const Default = "127.0.0.1:10249"

// Parse returns the base URL of the metrics server at address: a
// host:port ("127.0.0.1:10249", "[::1]:10249") is served over http; a URL
// ("http://127.0.0.1:10249", "https://node-1:9443/") keeps its scheme.
// Either needs a port; a URL may end in "/" but has no other path, query
// or user.
func Parse(address string) (*url.URL, error) {
	address = strings.TrimSpace(address)
	want := "want HOST:PORT (e.g. 127.0.0.1:10249, [::1]:10249) or a URL (e.g. http://127.0.0.1:10249)"
	if address == "" {
		return nil, fmt.Errorf("--address is empty: %s", want)
	}
	u := &url.URL{Scheme: "http", Host: address}
	if strings.Contains(address, "://") {
		var err error
		if u, err = url.Parse(address); err != nil {
			return nil, fmt.Errorf("--address %q is not a URL: %v", address, err)
		}
		switch {
		case u.Scheme != "http" && u.Scheme != "https":
			return nil, fmt.Errorf("--address %q: the scheme is %q; want http or https", address, u.Scheme)
		case u.User != nil:
			return nil, fmt.Errorf("--address %q: a user or password is not supported", address)
		case u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "":
			return nil, fmt.Errorf("--address %q: give the server's address without a path or query (e.g. %s://%s)", address, u.Scheme, u.Host)
		case u.Host == "":
			return nil, fmt.Errorf("--address %q has no host: %s", address, want)
		}
		u.Path, u.RawPath = "", ""
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		if strings.Count(u.Host, ":") > 1 && !strings.HasPrefix(u.Host, "[") {
			return nil, fmt.Errorf("--address %q: put an IPv6 address in brackets, e.g. [::1]:10249", address)
		}
		return nil, fmt.Errorf("--address %q has no port (kube-proxy's metrics port is 10249 unless metricsBindAddress says otherwise): %s", address, want)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("--address %q: port %q is not a number from 1 to 65535", address, port)
	}
	if strings.ContainsAny(host, "/ ") {
		return nil, fmt.Errorf("--address %q: %s", address, want)
	}
	return u, nil
}

// URL is base with path and query.
func URL(base *url.URL, path string, query url.Values) string {
	u := *base
	u.Path = path
	u.RawQuery = query.Encode()
	return u.String()
}
