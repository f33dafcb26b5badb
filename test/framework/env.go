package framework

import (
	"os"
	"strings"
)

// localNetworks are every range the framework's addresses come from (see
// the package documentation).
var localNetworks = []string{"10.96.0.0/16", "10.244.0.0/16", "10.255.0.0/16", "fd00::/8"}

// A host that reaches the internet through an HTTP(S) proxy (a CI machine,
// say) must not send the cluster's own traffic there: the API server's
// loopback client, client-go in the tests and in kube-proxy, and curl all
// read these variables. Setting them at init, before anything reads them
// (net/http caches them), covers this process and every child it starts.
func init() {
	for _, name := range []string{"NO_PROXY", "no_proxy"} {
		entries := localNetworks
		if current := os.Getenv(name); current != "" {
			entries = append([]string{current}, entries...)
		}
		os.Setenv(name, strings.Join(entries, ","))
	}
}
