package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Main is `kube-proxy-explain preflight`: it prints what would break on
// this node if its kube-proxy moved to the mode --to, and returns the exit
// status: 1 with a blocker, 0 without, 2 for a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	return run(args, stdout, stderr, Gather)
}

func run(args []string, stdout, stderr io.Writer, gather func(context.Context, string) *Facts) int {
	flags := pflag.NewFlagSet("kube-proxy-explain preflight", pflag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kube-proxy-explain preflight --to MODE [--output text|json] [--allow CHECK]... [--address HOST:PORT]")
		fmt.Fprintln(stderr, "Lists what would break on this node if its kube-proxy moved to MODE; exits 1 if anything would.")
		flags.PrintDefaults()
	}
	to := flags.String("to", "", "the mode to move to: "+strings.Join(Modes, ", "))
	output := flags.StringP("output", "o", "text", "text or json")
	allow := flags.StringSlice("allow", nil, "turn this check's blocker into a warning, once you know it does not apply (one of: "+strings.Join(CheckNames, ", ")+")")
	address := flags.String("address", DefaultAddress, "kube-proxy's metrics server (metricsBindAddress)")
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return 0
	} else if err != nil {
		fmt.Fprintf(stderr, "kube-proxy-explain preflight: %v\n", err)
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "kube-proxy-explain preflight: "+format+"\n", a...)
		flags.Usage()
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
