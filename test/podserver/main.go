// Command podserver is the test "pod": on each given port it answers TCP
// connections and UDP datagrams with one line, "<name> <client address>",
// so a test can tell which endpoint served it and what source it saw.
// With -client it is instead a client: one request that prints the reply,
// or with -load a stream of requests that prints how many were answered.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

func main() {
	name := flag.String("name", "", "the name to answer with")
	ports := flag.String("ports", "8080", "comma-separated ports to serve on, TCP and UDP")
	client := flag.String("client", "", "instead of serving, send one request to proto://host:port (tcp or udp) and print the reply")
	timeout := flag.Duration("timeout", 2*time.Second, "client: how long to wait for a reply")
	sport := flag.Int("sport", 0, "client: the local port to send from (0: any)")
	load := flag.Duration("load", 0, "client: send a new request every -interval for this long, then print \"ok=N failed=M gap=D\" (D the longest time between two answered requests, or from the start to the first, or from the last to the end) and the first errors")
	interval := flag.Duration("interval", 50*time.Millisecond, "client: the time between requests of -load")
	flag.Parse()
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
// connection, and reports how many got no reply and the longest time
// without an answer.
func generateLoad(target string, duration, interval, timeout time.Duration) {
	ok, failed := 0, 0
	var errs []string
	start := time.Now()
	end, lastOK, gap := start.Add(duration), start, time.Duration(0)
	for ; time.Now().Before(end); time.Sleep(interval) {
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
