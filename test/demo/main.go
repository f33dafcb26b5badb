// Command demo brings up the local cluster, runs our kube-proxy as its
// node, creates a few Services over three pods and shows which pod answers
// each request. It then keeps everything running until Ctrl-C.
//
// In iptables and nftables mode the node and its pods are network
// namespaces on this machine (host.go); in IPVS mode, which this machine's
// kernel may lack, they are in a VM booting Debian's kernel (guest.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	mode := flag.String("mode", "iptables", "kube-proxy mode: iptables, nftables or ipvs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
