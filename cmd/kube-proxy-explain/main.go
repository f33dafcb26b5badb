// Command kube-proxy-explain prints what the kube-proxy on this node does
// with a service: each endpoint with whether and why it is used, and the
// kernel objects that implement it. It asks kube-proxy's metrics server,
// which serves /debug/services on loopback, so it is meant to run on the
// node, e.g. by kubectl exec into the node's kube-proxy pod:
//
//	kube-proxy-explain default/my-svc [--verify] [--address 127.0.0.1:10249]
//
// Without a service it lists every service port the node programs.
//
//	kube-proxy-explain preflight --to MODE [--output json]
//
// lists what would break on this node if its kube-proxy moved to MODE.
//
//	kube-proxy-explain trace --source IP --destination IP --port N --from pod|node|external
//
// follows a packet through the node's rules (see pkg/trace).
package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rapidproxy/rapidproxy/pkg/preflight"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// timeout bounds one answer: a verification lists a few iptables chains,
// which on a large legacy node take a second or two each.
const timeout = 2 * time.Minute

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "preflight" {
		return preflight.Main(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "trace" {
		return runTrace(args[1:], stdout, stderr)
	}
	flags := pflag.NewFlagSet("kube-proxy-explain", pflag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kube-proxy-explain [NAMESPACE/NAME] [--verify] [--address HOST:PORT]")
		fmt.Fprintln(stderr, "       kube-proxy-explain preflight --to MODE [--output text|json] [--address HOST:PORT]")
		fmt.Fprintln(stderr, "       kube-proxy-explain trace --source IP --destination IP --port N [--protocol P] --from pod|node|external [--verify] [-o json]")
		fmt.Fprintln(stderr, "Explains what this node's kube-proxy does with a service; lists every service port without one.")
		fmt.Fprintln(stderr, "preflight lists what would break on this node if kube-proxy moved to another mode (--help for more).")
		fmt.Fprintln(stderr, "trace follows a packet through this node's rules to where it ends (--help for more).")
		flags.PrintDefaults()
	}
	address := flags.String("address", "127.0.0.1:10249", "kube-proxy's metrics server (metricsBindAddress)")
	verify := flags.Bool("verify", false, "also read the kernel for the service and report what differs from what kube-proxy wants")
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return 0
	} else if err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain: %v\n", err)
		return 2
	}
	path := "/debug/services"
	switch flags.NArg() {
	case 0:
	case 1:
		namespace, name, ok := strings.Cut(flags.Arg(0), "/")
		if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
			fmt.Fprintf(stderr, "kube-proxy-explain: %q is not NAMESPACE/NAME\n", flags.Arg(0))
			return 2
		}
		path += "/" + url.PathEscape(namespace) + "/" + url.PathEscape(name)
	default:
		flags.Usage()
		return 2
	}
	query := url.Values{"format": {"text"}}
	if *verify {
		query.Set("verify", "1")
	}
	target := "http://" + *address + path + "?" + query.Encode()
	resp, err := (&http.Client{Timeout: timeout}).Get(target)
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
