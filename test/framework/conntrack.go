package framework

import (
	"fmt"
	"net"
	"strings"
)

// UnansweredConnection is a TCP connection the node forwarded and never
// saw answered: its conntrack entry is still in SYN_SENT.
type UnansweredConnection struct {
	Client   string // address:port
	Endpoint string // where the rules sent it, address:port
	// Entry is conntrack's line, which tells how long the entry has left
	// (2 minutes after the last SYN conntrack took into account).
	Entry string
}

// UnansweredConnections lists the node's conntrack entries in SYN_SENT of
// connections to hostPort: a connection that failed without a reset (a
// SYN forwarded and never answered, or answered only by ICMP) leaves one
// for 2 minutes, naming the endpoint it was sent to. A SYN the node
// could not route leaves none.
func (n *Netns) UnansweredConnections(hostPort string) ([]UnansweredConnection, error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return nil, err
	}
	out, err := n.Exec("conntrack", "-L", "-p", "tcp", "--orig-dst", host, "--dport", port, "--state", "SYN_SENT")
	if err != nil {
		return nil, err
	}
	var conns []UnansweredConnection
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "SYN_SENT") {
			continue // conntrack's summary line
		}
		// The original tuple's src and sport, then the reply tuple's.
		var src, sport []string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "src="); ok {
				src = append(src, v)
			} else if v, ok := strings.CutPrefix(f, "sport="); ok {
				sport = append(sport, v)
			}
		}
		if len(src) != 2 || len(sport) != 2 {
			return nil, fmt.Errorf("conntrack said %q", line)
		}
		conns = append(conns, UnansweredConnection{
			Client:   net.JoinHostPort(src[0], sport[0]),
			Endpoint: net.JoinHostPort(src[1], sport[1]),
			Entry:    strings.TrimSpace(line),
		})
	}
	return conns, nil
}

// Neighbour is the namespace's neighbour entry for address, with its
// timers (`ip -s neigh`), or "none".
func (n *Netns) Neighbour(address string) (string, error) {
	out, err := n.Exec("ip", "-s", "neigh", "show", "to", address)
	if out == "" && err == nil {
		out = "none"
	}
	return out, err
}
