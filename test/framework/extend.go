package framework

import (
	"net"
	"path/filepath"
)

// What packages that build on the cluster (test/node's real kubelets) need
// from it: certificates from its authority, and processes recorded like
// its own so that a killed run's are killed by the next one.

// APIServerURL is where the API server listens, reachable from the node namespace.
func (c *Cluster) APIServerURL() string {
	return "https://" + net.JoinHostPort(APIServerIP, apiServerPort)
}

// CACertPath is the cluster's certificate authority, which signed the API
// server's certificate and every client's.
func (c *Cluster) CACertPath() string { return c.pki.path("ca.crt") }

// IssueKubeconfig writes name.crt, name.key and name.kubeconfig in the
// cluster's directory: a client certificate for user in groups, and a
// kubeconfig that uses it. It returns the kubeconfig's path.
func (c *Cluster) IssueKubeconfig(name, user string, groups []string) (string, error) {
	if err := c.pki.issue(name, user, groups, nil, nil); err != nil {
		return "", err
	}
	return c.pki.kubeconfig(name, c.APIServerURL())
}

// NodeUplink is the host's end of the node namespace's link, where the
// API server listens; routes to the node's pods go through it. The link
// goes with the cluster, and every route through it.
const NodeUplink = namePrefix + "node0"

// LogPath is where StartProcess logs a process of that name.
func (c *Cluster) LogPath(name string) string { return filepath.Join(c.Dir, name+".log") }
