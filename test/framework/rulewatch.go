package framework

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// WatchDNATs calls seen with the time at which a DNAT rule to a
// destination ("ip:port") appeared in the namespace's IPv4 nat table. With
// nft it follows `nft monitor` (each committed rule, as it is committed);
// with legacy, which has no notifications, it polls iptables-save, so a
// time is late by up to one save plus interval. stop ends the watch and
// tells whether events may have been lost.
func (n *Netns) WatchDNATs(b IPTablesBackend, interval time.Duration, seen func(dest string, at time.Time)) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if b == IPTablesNFT {
			err = n.monitorDNATs(ctx, seen)
		} else {
			err = n.pollDNATs(ctx, interval, seen)
		}
	}()
	return func() error {
		cancel()
		wg.Wait()
		return err
	}
}

func (n *Netns) monitorDNATs(ctx context.Context, seen func(string, time.Time)) error {
	restarts := 0
	for ctx.Err() == nil {
		cmd := n.Command("nft", "monitor", "rules")
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		go func() {
			<-ctx.Done()
			_ = cmd.Process.Kill()
		}()
		scanner := bufio.NewScanner(out)
		scanner.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for scanner.Scan() {
			line := scanner.Text()
			if !strings.HasPrefix(line, "add rule ip nat ") {
				continue
			}
			if _, dest, ok := strings.Cut(line, " dnat to "); ok {
				if f := strings.Fields(dest); len(f) > 0 {
					seen(f[0], time.Now())
				}
			}
		}
		_ = cmd.Wait()
		if ctx.Err() == nil {
			// nft monitor gives up when its socket buffer overflows.
			restarts++
		}
	}
	if restarts > 0 {
		return fmt.Errorf("nft monitor restarted %d times: events may be missing", restarts)
	}
	return nil
}

func (n *Netns) pollDNATs(ctx context.Context, interval time.Duration, seen func(string, time.Time)) error {
	present := map[string]bool{}
	for ctx.Err() == nil {
		out, err := n.Exec("iptables-legacy-save", "-t", "nat")
		if err != nil {
			return err
		}
		at := time.Now()
		now := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			_, dest, ok := strings.Cut(line, " --to-destination ")
			if f := strings.Fields(dest); ok && len(f) > 0 {
				now[f[0]] = true
				if !present[f[0]] {
					seen(f[0], at)
				}
			}
		}
		present = now
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
	return nil
}
