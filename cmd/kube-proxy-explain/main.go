// Command kube-proxy-explain prints what the kube-proxy on this node does
// with a service: each endpoint with whether and why it is used, and the
// kernel objects that implement it. It asks kube-proxy's metrics server,
// whose /debug/services answers clients on the node itself only, so it is
// meant to run on the node, e.g. by kubectl exec into the node's
// kube-proxy pod:
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
//
//	kube-proxy-explain help [preflight|trace]
//
// prints the help of the command or a subcommand, as --help does.
package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rapidproxy/rapidproxy/pkg/metricsaddr"
	"github.com/rapidproxy/rapidproxy/pkg/preflight"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// timeout bounds one answer: a verification lists a few iptables chains,
// which on a large legacy node take a second or two each.
const timeout = 2 * time.Minute

// usage is the command's help, without its flags.
const usage = `Usage: kube-proxy-explain [NAMESPACE/NAME] [--verify] [--address HOST:PORT|URL]
       kube-proxy-explain preflight --to MODE [--output text|json] [--allow CHECK]... [--address HOST:PORT|URL]
       kube-proxy-explain trace --source IP --destination IP --port N [--protocol P] --from pod|node|external [--verify] [-o json]
       kube-proxy-explain help [preflight|trace]

Explains what this node's kube-proxy does with a service: for each port, every endpoint and whether
the node uses it for cluster-wide and for node-local traffic, and if not why, with the kernel objects
that implement it. Without a service, lists every service port the node programs.

  preflight  lists what would break on this node if kube-proxy moved to another mode
  trace      follows a packet through this node's rules to where it ends
  help       prints this help, or a subcommand's (as --help does)

It asks the metrics server of the node's kube-proxy (rapidproxy), which answers these questions
only to clients on the node itself: run it on the node, or in the node's kube-proxy pod.

Examples:
  kube-proxy-explain default/my-svc
  kube-proxy-explain default/my-svc --verify
  kubectl exec -n kube-system <kube-proxy pod on the node> -- kube-proxy-explain default/my-svc --verify
  kube-proxy-explain --address http://127.0.0.1:10249

Flags:
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "preflight":
			return preflight.Main(args[1:], stdout, stderr)
		case "trace":
			return runTrace(args[1:], stdout, stderr)
		case "help":
			return runHelp(args[1:], stdout, stderr)
		}
	}
	flags := explainFlags()
	address := flags.String("address", metricsaddr.Default, "kube-proxy's metrics server: its metricsBindAddress (HOST:PORT) or a URL (http://HOST:PORT)")
	verify := flags.Bool("verify", false, "also read the kernel for the service and report what differs from what kube-proxy wants")
	help := flags.BoolP("help", "h", false, "print this help")
	if err := flags.Parse(args); err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain: %v\n(kube-proxy-explain --help for its usage)\n", err)
		return 2
	}
	if *help {
		printHelp(stdout, usage, flags)
		return 0
	}
	base, err := metricsaddr.Parse(*address)
	if err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain: %v\n", err)
		return 2
	}
	path := "/debug/services"
	switch flags.NArg() {
	case 0:
	case 1:
		namespace, name, ok := strings.Cut(flags.Arg(0), "/")
		if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
			fmt.Fprintf(stderr, "kube-proxy-explain: %q is not NAMESPACE/NAME, nor a subcommand (preflight, trace, help)\n", flags.Arg(0))
			return 2
		}
		path += "/" + url.PathEscape(namespace) + "/" + url.PathEscape(name)
	default:
		fmt.Fprintf(stderr, "kube-proxy-explain: one service at a time, not %q\n(kube-proxy-explain --help for its usage)\n", flags.Args())
		return 2
	}
	query := url.Values{"format": {"text"}}
	if *verify {
		query.Set("verify", "1")
	}
	return ask(stdout, stderr, base, path, query)
}

// explainFlags is the flag set of the command without a subcommand.
func explainFlags() *pflag.FlagSet {
	flags := pflag.NewFlagSet("kube-proxy-explain", pflag.ContinueOnError)
	flags.SetOutput(io.Discard) // errors are printed by the caller, help on request
	flags.Usage = func() {}
	return flags
}

// printHelp writes a command's help: its text, then its flags.
func printHelp(w io.Writer, text string, flags *pflag.FlagSet) {
	fmt.Fprint(w, text)
	fmt.Fprint(w, flags.FlagUsages())
}

// runHelp prints the help of the command or of one subcommand to stdout.
func runHelp(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		return run([]string{"--help"}, stdout, stderr)
	case len(args) > 1:
		fmt.Fprintf(stderr, "kube-proxy-explain help: one subcommand at a time, not %q\n", args)
		return 2
	}
	switch args[0] {
	case "preflight", "trace":
		return run([]string{args[0], "--help"}, stdout, stderr)
	case "help":
		return run([]string{"--help"}, stdout, stderr)
	}
	fmt.Fprintf(stderr, "kube-proxy-explain help: no subcommand %q: want preflight or trace (kube-proxy-explain help for the command itself)\n", args[0])
	return 2
}

// maxRetryAfter bounds how long ask waits when kube-proxy says it is
// busy verifying: it allows one kernel read at a time, a second apart.
const maxRetryAfter = 10 * time.Second

// ask gets path with query from kube-proxy's metrics server at base, and
// copies the answer to stdout, or to stderr with exit code 1 if it is an
// error. A 429 (another verification running) is retried after the time
// the server names, until timeout.
func ask(stdout, stderr io.Writer, base *url.URL, path string, query url.Values) int {
	client := &http.Client{Timeout: timeout}
	deadline := time.Now().Add(timeout)
	target := metricsaddr.URL(base, path, query)
	for {
		resp, err := client.Get(target)
		if err != nil {
			fmt.Fprintf(stderr, "kube-proxy-explain: %v\n(is kube-proxy running here, with its metrics server on %s? see --address)\n", err, base.Host)
			return 1
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			wait := time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
				wait = min(time.Duration(s)*time.Second, maxRetryAfter)
			}
			if time.Now().Add(wait).Before(deadline) {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				time.Sleep(wait)
				continue
			}
		}
		defer resp.Body.Close()
		return answer(stdout, stderr, client, base, path, resp)
	}
}

// answer copies an answer to stdout, or an error to stderr (exit code 1);
// a 404 from a server that does not know path at all is explained.
func answer(stdout, stderr io.Writer, client *http.Client, base *url.URL, path string, resp *http.Response) int {
	if resp.StatusCode == http.StatusOK {
		if _, err := io.Copy(stdout, resp.Body); err != nil {
			fmt.Fprintf(stderr, "kube-proxy-explain: reading the answer: %v\n", err)
			return 1
		}
		return 0
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain: reading the answer: %v\n", err)
		return 1
	}
	if resp.StatusCode == http.StatusNotFound && strings.TrimSpace(string(body)) == "404 page not found" {
		fmt.Fprint(stderr, notServed(client, base, path))
		return 1
	}
	if len(body) == 0 {
		body = []byte(resp.Status + "\n")
	}
	_, _ = stderr.Write(body)
	return 1
}

// notServed explains a server without path: Go's bare 404 page, which
// upstream's kube-proxy and rapidproxy before explanations give for any
// path they do not serve. /proxyMode tells whether it is a kube-proxy.
func notServed(client *http.Client, base *url.URL, path string) string {
	mode, err := get(client, metricsaddr.URL(base, "/proxyMode", nil))
	if err != nil {
		return fmt.Sprintf("kube-proxy-explain: %s answers %s with 404 page not found, and /proxyMode with %v: "+
			"this does not look like kube-proxy's metrics server. Check --address: kube-proxy's metricsBindAddress "+
			"(127.0.0.1:10249 by default), on the node or in its kube-proxy pod.\n", base.Host, path, err)
	}
	return fmt.Sprintf("kube-proxy-explain: the kube-proxy at %s (mode %s, from /proxyMode) does not serve %s: "+
		"it is probably upstream's kube-proxy, or an older rapidproxy without explanations "+
		"(e.g. a node not yet updated). Run rapidproxy's kube-proxy image on this node to ask it; "+
		"kube-proxy-explain preflight works with either.\n", base.Host, strings.TrimSpace(mode), path)
}

// get fetches a short answer, or fails with its status.
func get(client *http.Client, target string) (string, error) {
	resp, err := client.Get(target)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status)
	}
	return string(body), nil
}
