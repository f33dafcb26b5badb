package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/spf13/pflag"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// runTrace asks the metrics server where a packet goes on this node.
func runTrace(args []string, stdout, stderr io.Writer) int {
	flags := pflag.NewFlagSet("kube-proxy-explain trace", pflag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kube-proxy-explain trace --source IP --destination IP --port N [--protocol TCP|UDP|SCTP] --from pod|node|external [--verify] [-o text|json] [--address HOST:PORT]")
		fmt.Fprintln(stderr, "Follows a connection's first packet through this node's kube-proxy rules: each chain, rule, map or virtual")
		fmt.Fprintln(stderr, "server it meets, and where it ends (endpoints and their chances, masquerade, drop or reject, and why).")
		flags.PrintDefaults()
	}
	address := flags.String("address", "127.0.0.1:10249", "kube-proxy's metrics server (metricsBindAddress)")
	source := flags.String("source", "", "the packet's source address")
	destination := flags.String("destination", "", "the packet's destination address (a cluster, external or load-balancer IP, or a node address for a NodePort)")
	port := flags.String("port", "", "the destination port")
	protocol := flags.String("protocol", "TCP", "TCP, UDP or SCTP")
	from := flags.String("from", "", "where the packet comes from: pod (a pod on this node), node (this node itself) or external (another node or host)")
	verify := flags.Bool("verify", false, "also read the traced service's objects from the kernel and report what differs")
	output := flags.StringP("output", "o", "text", "text or json")
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return 0
	} else if err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain trace: %v\n", err)
		return 2
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
	query := url.Values{"source": {*source}, "destination": {*destination}, "port": {*port}, "protocol": {*protocol}, "from": {*from}, "format": {*output}}
	if *verify {
		query.Set("verify", "1")
	}
	resp, err := (&http.Client{Timeout: timeout}).Get("http://" + *address + "/debug/trace?" + query.Encode())
	if err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain: %v\n(is kube-proxy running here, with its metrics server on %s? see --address)\n", err, *address)
		return 1
	}
	defer resp.Body.Close()
	out := stdout
	if resp.StatusCode != http.StatusOK {
		out = stderr
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain: reading the answer: %v\n", err)
		return 1
	}
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}
