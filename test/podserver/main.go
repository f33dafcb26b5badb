// Command podserver is the test "pod": on each given port it answers TCP
// connections and UDP datagrams with one line, "<name> <client address>",
// so a test can tell which endpoint served it and what source it saw.
// With -client it is instead a client: one request that prints the reply,
// or with -load a stream of requests that prints how many were answered, or
// with -probe fresh TCP connections opened on a fixed beat, each reported on
// a line of its own.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	name := flag.String("name", "", "the name to answer with")
	ports := flag.String("ports", "8080", "comma-separated ports to serve on, TCP and UDP")
	client := flag.String("client", "", "instead of serving, send one request to proto://host:port (tcp or udp) and print the reply")
	timeout := flag.Duration("timeout", 2*time.Second, "client: how long to wait for a reply")
	sport := flag.Int("sport", 0, "client: the local port to send from (0: any); with -hold, the first connection's, the next ones' following it")
	load := flag.Duration("load", 0, "client: send a new request every -interval for this long or until SIGTERM, then print \"ok=N failed=M gap=D\" (D the longest time between two answered requests, or from the start to the first, or from the last to the end) and the first errors")
	interval := flag.Duration("interval", 50*time.Millisecond, "client: the time between requests of -load or connections of -probe")
	probe := flag.Duration("probe", 0, "client: open a new TCP connection every -interval for this long or until SIGTERM, without waiting for the previous ones, and print one line per connection (see probeConnection)")
	hold := flag.Int("hold", 0, "client: open this many TCP connections and keep them, each sending a line every -interval and reading it back, for -load or until SIGTERM, then print \"held=N broken=M\" and the first errors")
	flag.Parse()
	if *client != "" && *hold > 0 {
		holdConnections(*client, *hold, *sport, *load, *interval, *timeout)
		return
	}
	if *client != "" && *probe > 0 {
		probeConnections(*client, *probe, *interval, *timeout)
		return
	}
	if *client != "" && *load > 0 {
		generateLoad(*client, *load, *interval, *timeout)
		return
	}
	if *client != "" {
		reply, err := request(*client, *sport, *timeout)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(reply)
		return
	}
	if *name == "" {
		fmt.Fprintln(os.Stderr, "podserver: -name is required")
		os.Exit(2)
	}
	for _, port := range strings.Split(*ports, ",") {
		if err := serve(*name, port); err != nil {
			fmt.Fprintln(os.Stderr, "podserver:", err)
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	select {}
}

func serve(name, port string) error {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	pc, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		return err
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				continue
			}
			go func() {
				defer conn.Close()
				fmt.Fprintf(conn, "%s %s\n", name, conn.RemoteAddr())
				// Then an echo of each line, until the client closes: a
				// long-lived connection (-hold) checks that it still
				// works.
				lines := bufio.NewScanner(conn)
				for lines.Scan() {
					if _, err := fmt.Fprintf(conn, "%s\n", lines.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			_, addr, err := pc.ReadFrom(buf)
			if err != nil {
				continue
			}
			_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, addr)), addr)
		}
	}()
	return nil
}

// generateLoad sends requests one after the other, each on a new
// connection, for duration or until SIGTERM (a load that lasts as long as
// a fault does), and reports how many got no reply and the longest time
// without an answer.
func generateLoad(target string, duration, interval, timeout time.Duration) {
	var stopped atomic.Bool
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	go func() { <-stop; stopped.Store(true) }()
	ok, failed := 0, 0
	var errs []string
	start := time.Now()
	end, lastOK, gap := start.Add(duration), start, time.Duration(0)
	for ; time.Now().Before(end) && !stopped.Load(); time.Sleep(interval) {
		if _, err := request(target, 0, timeout); err != nil {
			failed++
			if len(errs) < 5 {
				errs = append(errs, time.Now().Format("15:04:05.000")+" "+err.Error())
			}
			continue
		}
		ok++
		now := time.Now()
		gap, lastOK = max(gap, now.Sub(lastOK)), now
	}
	gap = max(gap, time.Since(lastOK))
	fmt.Printf("ok=%d failed=%d gap=%s\n", ok, failed, gap.Round(time.Millisecond))
	for _, e := range errs {
		fmt.Println(e)
	}
}

// request sends one TCP or UDP request, from sport when it is not 0, and
// returns the reply line.
func request(target string, sport int, timeout time.Duration) (string, error) {
	proto, addr, ok := strings.Cut(target, "://")
	if !ok {
		return "", fmt.Errorf("want proto://host:port, got %q", target)
	}
	dialer := net.Dialer{Timeout: timeout}
	if sport != 0 {
		if proto == "udp" {
			dialer.LocalAddr = &net.UDPAddr{Port: sport}
		} else {
			dialer.LocalAddr = &net.TCPAddr{Port: sport}
		}
	}
	conn, err := dialer.Dial(proto, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if proto == "udp" {
		if _, err := conn.Write([]byte("hello\n")); err != nil {
			return "", err
		}
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("%s: no reply: %w", target, err)
	}
	return strings.TrimSpace(line), nil
}

// probeConnections opens a TCP connection to target every interval for
// duration or until SIGTERM, each in its own goroutine so that a stalled
// one does not delay the beat, and prints a line per connection once all
// have ended.
func probeConnections(target string, duration, interval, timeout time.Duration) {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	addr := strings.TrimPrefix(target, "tcp://")
	var (
		mu    sync.Mutex
		lines []string
		wg    sync.WaitGroup
	)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.After(duration)
	for probing := true; probing; {
		select {
		case <-stop:
			probing = false
		case <-end:
			probing = false
		case <-tick.C:
			wg.Go(func() {
				line := probeConnection(addr, timeout)
				mu.Lock()
				lines = append(lines, line)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	for _, line := range lines {
		fmt.Println(line)
	}
}

// probeConnection opens one connection and reads the reply: it returns
// "<start, Unix ns> <connect time, µs> <outcome> <pod or error>", the
// outcome being ok, reset (refused or reset), timeout (no connection
// within timeout) or error (anything else, such as unreachable).
func probeConnection(addr string, timeout time.Duration) string {
	start := time.Now()
	outcome, detail := "ok", ""
	conn, err := net.DialTimeout("tcp", addr, timeout)
	connect := time.Since(start)
	if err == nil {
		defer conn.Close()
		_ = conn.SetDeadline(start.Add(timeout))
		var line string
		if line, err = bufio.NewReader(conn).ReadString('\n'); err == nil {
			detail, _, _ = strings.Cut(line, " ")
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		outcome = "reset"
	case isTimeout(err):
		outcome = "timeout"
	default:
		outcome = "error"
	}
	if err != nil {
		detail = strings.ReplaceAll(err.Error(), " ", "_")
	}
	return fmt.Sprintf("%d %d %s %s", start.UnixNano(), connect.Microseconds(), outcome, detail)
}

func isTimeout(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// holdConnections opens n TCP connections to target and keeps them for
// duration or until SIGTERM: every interval each sends a line and reads
// it back within timeout. A connection that fails once is broken and
// stays so. It prints "held=N broken=M" and the first errors.
func holdConnections(target string, n, sport int, duration, interval, timeout time.Duration) {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	addr := strings.TrimPrefix(target, "tcp://")
	var (
		mu     sync.Mutex
		broken int
		errs   []string
	)
	fail := func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		broken++
		if len(errs) < 5 {
			errs = append(errs, fmt.Sprintf("%s connection %d: %v", time.Now().Format("15:04:05.000"), i, err))
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		dialer := net.Dialer{Timeout: timeout}
		if sport != 0 {
			dialer.LocalAddr = &net.TCPAddr{Port: sport + i}
		}
		conn, err := dialer.Dial("tcp", addr)
		if err != nil {
			fail(i, err)
			continue
		}
		wg.Go(func() {
			defer conn.Close()
			r := bufio.NewReader(conn)
			_ = conn.SetDeadline(time.Now().Add(timeout))
			if _, err := r.ReadString('\n'); err != nil {
				fail(i, fmt.Errorf("greeting: %w", err))
				return
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				_ = conn.SetDeadline(time.Now().Add(timeout))
				want := fmt.Sprintf("line %d", seq)
				if _, err := fmt.Fprintf(conn, "%s\n", want); err != nil {
					fail(i, err)
					return
				}
				got, err := r.ReadString('\n')
				if err == nil && strings.TrimSpace(got) != want {
					err = fmt.Errorf("echoed %q, want %q", strings.TrimSpace(got), want)
				}
				if err != nil {
					fail(i, err)
					return
				}
			}
		})
	}
	select {
	case <-stop:
	case <-time.After(duration):
	}
	close(done)
	wg.Wait()
	fmt.Printf("held=%d broken=%d\n", n, broken)
	for _, e := range errs {
		fmt.Println(e)
	}
}
