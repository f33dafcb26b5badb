// Package e2e tests kube-proxy end to end: a real API server, a real
// EndpointSlice controller and real packets between network namespaces.
// The cluster starts once for the whole package.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// cluster is shared by every test of the package.
var cluster *framework.Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		if os.Getenv(testutil.StrictEnv) != "" {
			fmt.Fprintf(os.Stderr, "e2e: needs root, and %s is set\n", testutil.StrictEnv)
			os.Exit(1)
		}
		fmt.Println("e2e: skipped: needs root")
		os.Exit(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	start := time.Now()
	var err error
	cluster, err = framework.Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the local cluster:", err)
		os.Exit(1)
	}
	fmt.Printf("e2e: local cluster up in %s\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	stopProxy()
	if missing := unservedMetrics(); len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: metrics registered in pkg/metrics that our kube-proxy never served in this run: %s\n", strings.Join(missing, ", "))
		code = 1
	}
	cluster.Stop()
	os.Exit(code)
}
