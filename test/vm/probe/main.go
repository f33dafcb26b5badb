// Command probe is the VM tests' TCP end: a server that answers every
// connection with one line naming itself and the client address it saw,
// or a client that prints the line it gets. Static, it runs in the guest.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	listen := flag.String("listen", "", "serve on this address")
	name := flag.String("name", "probe", "the name the server answers with")
	connect := flag.String("connect", "", "connect to this address and print the answer")
	wait := flag.Duration("wait", 10*time.Second, "how long the client retries a refused connection")
	flag.Parse()
	var err error
	switch {
	case *listen != "":
		err = serve(*listen, *name)
	case *connect != "":
		err = dial(*connect, *wait)
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
		fmt.Fprintf(c, "%s saw %s\n", name, c.RemoteAddr())
		c.Close()
	}
}

// dial retries until the server listens: it may start in the background
// just before.
func dial(addr string, wait time.Duration) error {
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
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			return err
		}
		fmt.Print(line)
		return nil
	}
}
