// Command kube-proxy is a drop-in replacement for Kubernetes' kube-proxy.
package main

import (
	"os"

	"github.com/rapidproxy/rapidproxy/pkg/app"
)

func main() {
	os.Exit(app.Run(os.Args[1:]))
}
