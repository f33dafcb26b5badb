// Command podserver is the test "pod": on each given port it answers TCP
// connections and UDP datagrams with one line, "<name> <client address>",
// so a test can tell which endpoint served it and what source it saw.
// With -client it is instead a one-shot client that prints the reply.
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
	flag.Parse()
	if *client != "" {
		reply, err := request(*client, *timeout)
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

// request sends one TCP or UDP request and returns the reply line.
func request(target string, timeout time.Duration) (string, error) {
	proto, addr, ok := strings.Cut(target, "://")
	if !ok {
		return "", fmt.Errorf("want proto://host:port, got %q", target)
	}
	conn, err := net.DialTimeout(proto, addr, timeout)
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
