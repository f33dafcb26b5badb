package main

import (
	"fmt"
	"io"
	"net/url"

	"github.com/rapidproxy/rapidproxy/pkg/metricsaddr"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// traceUsage is the trace subcommand's help, without its flags.
const traceUsage = `Usage: kube-proxy-explain trace --source IP --destination IP --port N [--protocol TCP|UDP|SCTP]
           --from pod|node|external [--verify] [-o text|json] [--address HOST:PORT|URL]

Follows a connection's first packet through this node's kube-proxy rules: each chain, rule, map or
virtual server it meets, and where it ends (endpoints and their chances, masquerade, drop or reject,
and why). --verify also reads the traced service's objects from the kernel and reports what differs.

Examples:
  # a pod on this node to a ClusterIP
  kube-proxy-explain trace --source 10.244.0.15 --destination 10.96.204.98 --port 80 --from pod
  # another host to a load-balancer IP, checking the kernel's rules too
  kube-proxy-explain trace --source 10.255.1.2 --destination 10.255.3.23 --port 80 --from external --verify
  # a DNS query from the node itself, as JSON
  kube-proxy-explain trace --source 10.0.0.5 --destination 10.96.0.10 --port 53 --protocol UDP --from node -o json

Flags:
`

// runTrace asks the metrics server where a packet goes on this node.
func runTrace(args []string, stdout, stderr io.Writer) int {
	flags := explainFlags()
	address := flags.String("address", metricsaddr.Default, "kube-proxy's metrics server: its metricsBindAddress (HOST:PORT) or a URL (http://HOST:PORT)")
	source := flags.String("source", "", "the packet's source address")
	destination := flags.String("destination", "", "the packet's destination address (a cluster, external or load-balancer IP, or a node address for a NodePort)")
	port := flags.String("port", "", "the destination port")
	protocol := flags.String("protocol", "TCP", "TCP, UDP or SCTP")
	from := flags.String("from", "", "where the packet comes from: pod (a pod on this node), node (this node itself) or external (another node or host)")
	verify := flags.Bool("verify", false, "also read the traced service's objects from the kernel and report what differs")
	output := flags.StringP("output", "o", "text", "text or json")
	help := flags.BoolP("help", "h", false, "print this help")
	if err := flags.Parse(args); err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain trace: %v\n(kube-proxy-explain trace --help for its usage)\n", err)
		return 2
	}
	if *help {
		printHelp(stdout, traceUsage, flags)
		return 0
	}
	if flags.NArg() > 0 {
		fmt.Fprintf(stderr, "kube-proxy-explain trace: unexpected argument %q\n", flags.Arg(0))
		return 2
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "kube-proxy-explain trace: --output %q is not text or json\n", *output)
		return 2
	}
	// Checked here too, for an error that names the flag before asking.
	if _, err := trace.ParsePacket(*source, *destination, *port, *protocol, *from); err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain trace: %v\n", err)
		return 2
	}
	base, err := metricsaddr.Parse(*address)
	if err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain trace: %v\n", err)
		return 2
	}
	query := url.Values{"source": {*source}, "destination": {*destination}, "port": {*port}, "protocol": {*protocol}, "from": {*from}, "format": {*output}}
	if *verify {
		query.Set("verify", "1")
	}
	return ask(stdout, stderr, base, "/debug/trace", query)
}
