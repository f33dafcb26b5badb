// Command probe is the VM tests' TCP end: a server that answers every
// connection with one line naming itself and the client address it saw,
// and again each line the client sends, or a client that prints the line
// it gets (with -chat, also the answer to each line of its input). Static,
// it runs in the guest.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	listen := flag.String("listen", "", "serve on this address")
	name := flag.String("name", "probe", "the name the server answers with")
	connect := flag.String("connect", "", "connect to this address and print the answer")
	wait := flag.Duration("wait", 10*time.Second, "how long the client retries a refused connection")
	chat := flag.Bool("chat", false, "client: then send each line of stdin and print the answer, until stdin ends")
	flag.Parse()
	var err error
	switch {
	case *listen != "":
		err = serve(*listen, *name)
	case *connect != "":
		err = dial(*connect, *wait, *chat)
	default:
		err = fmt.Errorf("need -listen or -connect")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func serve(addr, name string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			answer := fmt.Sprintf("%s saw %s\n", name, c.RemoteAddr())
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
			// A held connection (-chat) shows which server still has it.
			for sc := bufio.NewScanner(c); sc.Scan(); {
				if _, err := io.WriteString(c, answer); err != nil {
					return
				}
			}
		}()
	}
}

// dial retries until the server listens: it may start in the background
// just before.
func dial(addr string, wait time.Duration, chat bool) error {
	deadline := time.Now().Add(wait)
	for {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			if time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return err
		}
		defer c.Close()
		r := bufio.NewReader(c)
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		fmt.Print(line)
		if chat {
			return chatOver(c.(*net.TCPConn), r)
		}
		return nil
	}
}

// chatOver sends each line of stdin and prints the answer; at the end of
// stdin it resets the connection rather than closing it, so that IPVS
// forgets it within seconds (its CLOSE state) instead of keeping it for
// the two minutes of TIME_WAIT, during which a draining real server still
// counts it.
func chatOver(c *net.TCPConn, r *bufio.Reader) error {
	for in := bufio.NewScanner(os.Stdin); in.Scan(); {
		// The host's answer may wait for the API server to start.
		if err := c.SetDeadline(time.Now().Add(3 * time.Minute)); err != nil {
			return err
		}
		if _, err := fmt.Fprintln(c, in.Text()); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("no answer to %q: %w", in.Text(), err)
		}
		fmt.Print(line)
	}
	return c.SetLinger(0)
}
