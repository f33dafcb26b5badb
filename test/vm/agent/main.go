// Command agent is a networked VM's helper (test/vm's Agent is its
// client): the host drives it over HTTP through the VM's tap to start and
// stop one process at a time (the IPVS benchmark's kube-proxy, a real
// node's kube-proxy in the upstream e2e run) and to read the guest's
// /proc files and clock. Static, it runs in the guest.
//
//	POST /start?arg=A&arg=B&log=F  runs A B... with its output in F; the
//	                               response is its PID on the first line,
//	                               sent at once, then how it ended ("exit
//	                               status 1"), sent when it ends
//	POST /stop                     SIGTERM (SIGKILL after 10 s); answers
//	                               once the process has ended
//	GET  /read?path=P              the content of file P
//	GET  /clock                    the guest's time, Unix nanoseconds
//	POST /quit                     the agent exits (and so the VM's script)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// agent holds the process it started last.
type agent struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has ended
}

func main() {
	listen := flag.String("listen", "", "address to serve on")
	flag.Parse()
	a := &agent{}
	quit := make(chan struct{})
	quitOnce := sync.OnceFunc(func() { close(quit) })
	srv := &http.Server{Addr: *listen}
	http.HandleFunc("POST /start", a.start)
	http.HandleFunc("POST /stop", a.stop)
	http.HandleFunc("GET /read", func(w http.ResponseWriter, r *http.Request) {
		// os.ReadFile, not a file server: /proc files have no size.
		data, err := os.ReadFile(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		_, _ = w.Write(data)
	})
	http.HandleFunc("GET /clock", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, time.Now().UnixNano())
	})
	http.HandleFunc("POST /quit", func(w http.ResponseWriter, r *http.Request) { quitOnce() })
	go func() {
		if err := srv.ListenAndServe(); err != http.ErrServerClosed {
			log.Fatal(err)
		}
	}()
	<-quit
	a.stopProcess()
	// Shutdown lets the last answers (the quit's, the start's) go out.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

func (a *agent) start(w http.ResponseWriter, r *http.Request) {
	args := r.URL.Query()["arg"]
	if len(args) == 0 {
		http.Error(w, "no arg", http.StatusBadRequest)
		return
	}
	out, err := os.Create(r.URL.Query().Get("log"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer out.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	a.mu.Lock()
	if a.cmd != nil {
		a.mu.Unlock()
		http.Error(w, "a process runs already", http.StatusConflict)
		return
	}
	if err := cmd.Start(); err != nil {
		a.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	done := make(chan struct{})
	a.cmd, a.done = cmd, done
	a.mu.Unlock()
	fmt.Fprintln(w, cmd.Process.Pid)
	w.(http.Flusher).Flush()
	_ = cmd.Wait()
	a.mu.Lock()
	a.cmd = nil
	a.mu.Unlock()
	close(done)
	fmt.Fprintln(w, cmd.ProcessState)
}

func (a *agent) stop(w http.ResponseWriter, r *http.Request) { a.stopProcess() }

// stopProcess ends the running process, if any, as framework.Process.Stop
// does on the host.
func (a *agent) stopProcess() {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}
