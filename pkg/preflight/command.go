package preflight

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/rapidproxy/rapidproxy/pkg/metricsaddr"
)

// usageText is the subcommand's help, without its flags.
const usageText = `Usage: kube-proxy-explain preflight --to MODE [--output text|json] [--allow CHECK]... [--address HOST:PORT|URL]

Lists what would break on this node if its kube-proxy (rapidproxy or upstream's) moved from the mode
it runs in to MODE (iptables, ipvs or nftables): each blocker and warning, with its reason and what
to do. Exits 1 if there is a blocker, 0 otherwise. It asks kube-proxy's metrics server for its mode,
configuration and counters, and reads the node's kernel, rules and firewall.

Examples:
  kube-proxy-explain preflight --to nftables
  kubectl exec -n kube-system <kube-proxy pod on the node> -- kube-proxy-explain preflight --to nftables
  kube-proxy-explain preflight --to nftables --allow localhost-nodeports -o json

Flags:
`

// Main is `kube-proxy-explain preflight`: it prints what would break on
// this node if its kube-proxy moved to the mode --to, and returns the exit
// status: 1 with a blocker, 0 without, 2 for a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	return run(args, stdout, stderr, Gather)
}

func run(args []string, stdout, stderr io.Writer, gather func(context.Context, string) *Facts) int {
	flags := pflag.NewFlagSet("kube-proxy-explain preflight", pflag.ContinueOnError)
	flags.SetOutput(io.Discard) // errors are printed below, help on request
	flags.Usage = func() {}
	to := flags.String("to", "", "the mode to move to: "+strings.Join(Modes, ", "))
	output := flags.StringP("output", "o", "text", "text or json")
	allow := flags.StringSlice("allow", nil, "turn this check's blocker into a warning, once you know it does not apply (one of: "+strings.Join(CheckNames, ", ")+")")
	address := flags.String("address", DefaultAddress, "kube-proxy's metrics server: its metricsBindAddress (HOST:PORT) or a URL (http://HOST:PORT)")
	help := flags.BoolP("help", "h", false, "print this help")
	if err := flags.Parse(args); err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain preflight: %v\n(kube-proxy-explain preflight --help for its usage)\n", err)
		return 2
	}
	if *help {
		fmt.Fprint(stdout, usageText)
		fmt.Fprint(stdout, flags.FlagUsages())
		return 0
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "kube-proxy-explain preflight: "+format+"\n(kube-proxy-explain preflight --help for its usage)\n", a...)
		return 2
	}
	switch {
	case flags.NArg() > 0:
		return usage("unexpected arguments %q", flags.Args())
	case *to == "":
		return usage("--to is required")
	case !ValidMode(*to):
		return usage("--to %q: want one of %s", *to, strings.Join(Modes, ", "))
	case *output != "text" && *output != "json":
		return usage("--output %q: want text or json", *output)
	}
	if _, err := metricsaddr.Parse(*address); err != nil {
		return usage("%v", err)
	}
	for _, c := range *allow {
		if !slices.Contains(CheckNames, c) {
			return usage("--allow %q: want one of %s", c, strings.Join(CheckNames, ", "))
		}
	}
	report := Check(gather(context.Background(), *address), *to, *allow)
	write := WriteText
	if *output == "json" {
		write = WriteJSON
	}
	if err := write(stdout, report); err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain preflight: %v\n", err)
		return 1
	}
	if report.Blocked() {
		return 1
	}
	return 0
}
