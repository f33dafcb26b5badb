// CPU profiles and logs of a run's kube-proxy, kept beside the results.

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// profileCPU writes a CPU profile of kp's next length, taken in the
// background; done tells when it is written.
func (b *bench) profileCPU(ctx context.Context, kp proxyProcess, column, what string, length time.Duration, done *sync.WaitGroup) {
	done.Add(1)
	go func() {
		defer done.Done()
		path := b.outputPath(ours, column, what+".pprof")
		query := fmt.Sprintf("profile?seconds=%d", int(length.Seconds()))
		if err := fetchProfile(ctx, kp, query, path); err != nil {
			b.logf("CPU profile: %v", err)
		} else {
			b.logf("CPU profile of %s (%s) written to %s", what, length, path)
		}
	}()
}

// keepLog copies the process's log into the profile directory, if one
// was given: its timestamps tell where a start's seconds went.
func (b *bench) keepLog(kp proxyProcess, proxy, column, name string) {
	if b.opts.profileDir == "" {
		return
	}
	if err := os.WriteFile(b.outputPath(proxy, column, name), []byte(kp.LogTail(1<<20)), 0o644); err != nil {
		b.logf("keeping the log: %v", err)
	}
}

// outputPath names a file of -profile-dir for one proxy, column and shape.
func (b *bench) outputPath(proxy, column, name string) string {
	return filepath.Join(b.opts.profileDir, fmt.Sprintf("%s-%s-N%d-E%d-%s", proxy, column, b.n, b.e, name))
}

// fetchProfile saves the process's pprof profile named by query, for
// example "heap" or "profile?seconds=20" (CPU, from now on).
func fetchProfile(ctx context.Context, kp proxyProcess, query, path string) error {
	for { // the metrics server comes up first thing
		if _, err := framework.FetchMetrics(kp.metricsURL() + "/metrics"); err == nil {
			break
		}
		if err := pause(ctx, kp, kp.pollInterval()); err != nil {
			return err
		}
	}
	url := kp.metricsURL() + "/debug/pprof/" + query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
