package localnodeport

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// backend is an endpoint on loopback: it answers each line with its name
// and the line, and says "bye" once the client half-closes.
type backend struct {
	name string
	ln   net.Listener
	mu   sync.Mutex
	hits int
}

func newBackend(t *testing.T, name, ip string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		testutil.Skip(t, fmt.Sprintf("no loopback listener on %s: %v", ip, err))
	}
	b := &backend{name: name, ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.hits++
			b.mu.Unlock()
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						io.WriteString(c, b.name+" bye\n")
						return
					}
					io.WriteString(c, b.name+" "+line)
				}
			}()
		}
	}()
	return b
}

func (b *backend) addr() string { return b.ln.Addr().String() }

func (b *backend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hits
}

// value is a gauge's or counter's value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

// freePort is a TCP port nothing listens on, on ip, at the time of asking.
func freePort(t *testing.T, ip string) int32 {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		testutil.Skip(t, fmt.Sprintf("no loopback listener on %s: %v", ip, err))
	}
	defer ln.Close()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

func newProxy(t *testing.T, family v1.IPFamily) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	p := New(ctx, family)
	t.Cleanup(func() { p.Shutdown(); cancel() })
	return p
}

// ask connects to the NodePort on ip, sends one line and half-closes,
// and returns all it reads back.
func ask(t *testing.T, ip string, port int32, line string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))), time.Second)
	if err != nil {
		t.Fatalf("dialing the localhost NodePort: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading back: %v", err)
	}
	return string(out)
}

func TestRelaysBothWaysWithHalfClose(t *testing.T) {
	for _, tc := range []struct {
		family v1.IPFamily
		ip     string
	}{{v1.IPv4Protocol, "127.0.0.1"}, {v1.IPv6Protocol, "::1"}} {
		t.Run(string(tc.family), func(t *testing.T) {
			b := newBackend(t, "a", tc.ip)
			p := newProxy(t, tc.family)
			port := freePort(t, tc.ip)
			p.Sync([]Spec{{Name: "ns/svc:http", Protocol: v1.ProtocolTCP, NodePort: port, Endpoints: []string{b.addr()}}})
			if !p.Serving(v1.ProtocolTCP, port) {
				t.Fatal("not serving the NodePort")
			}
			if got, want := ask(t, tc.ip, port, "hello"), "a hello\na bye\n"; got != want {
				t.Errorf("got %q, want %q", got, want)
			}
			if got := value(metrics.LocalhostNodePortListeners.WithLabelValues(string(tc.family))); got != 1 {
				t.Errorf("listeners gauge %v, want 1", got)
			}
		})
	}
}

func TestSpreadsOverEndpointsAndFollowsUpdates(t *testing.T) {
	a, b, c := newBackend(t, "a", "127.0.0.1"), newBackend(t, "b", "127.0.0.1"), newBackend(t, "c", "127.0.0.1")
	p := newProxy(t, v1.IPv4Protocol)
	port := freePort(t, "127.0.0.1")
	p.Sync([]Spec{{Protocol: v1.ProtocolTCP, NodePort: port, Endpoints: []string{a.addr(), b.addr()}}})
	for range 40 {
		ask(t, "127.0.0.1", port, "x")
	}
	if a.count() == 0 || b.count() == 0 || a.count()+b.count() != 40 {
		t.Errorf("connections a %d, b %d: want both used, 40 in all", a.count(), b.count())
	}
	p.Sync([]Spec{{Protocol: v1.ProtocolTCP, NodePort: port, Endpoints: []string{c.addr()}}})
	if got := ask(t, "127.0.0.1", port, "y"); got != "c y\nc bye\n" {
		t.Errorf("after the update got %q, want endpoint c's answer", got)
	}
}

func TestRemovedOrEndpointlessNodePortsAreClosed(t *testing.T) {
	b := newBackend(t, "a", "127.0.0.1")
	p := newProxy(t, v1.IPv4Protocol)
	port, empty := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.1")
	p.Sync([]Spec{
		{Protocol: v1.ProtocolTCP, NodePort: port, Endpoints: []string{b.addr()}},
		{Protocol: v1.ProtocolTCP, NodePort: empty},
		{Protocol: v1.ProtocolUDP, NodePort: empty, Endpoints: []string{b.addr()}},
	})
	if p.Serving(v1.ProtocolTCP, empty) || p.Serving(v1.ProtocolUDP, empty) {
		t.Error("a NodePort without endpoints, or not TCP, got a listener")
	}
	// A connection open when its NodePort goes is closed with it.
	open, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	io.WriteString(open, "hi\n")
	r := bufio.NewReader(open)
	if line, _ := r.ReadString('\n'); line != "a hi\n" {
		t.Fatalf("got %q before the removal", line)
	}
	p.Sync(nil)
	_ = open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Error("the open connection still reads after its NodePort went")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("the open connection was not closed when its NodePort went")
	}
	if _, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), time.Second); err == nil {
		t.Error("the removed NodePort still accepts connections")
	}
	if got := value(metrics.LocalhostNodePortListeners.WithLabelValues("IPv4")); got != 0 {
		t.Errorf("listeners gauge %v, want 0", got)
	}
}

func TestBindFailureIsCountedAndRetried(t *testing.T) {
	b := newBackend(t, "a", "127.0.0.1")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := int32(busy.Addr().(*net.TCPAddr).Port)
	failures := metrics.LocalhostNodePortListenerCreationFailuresTotal.WithLabelValues("IPv4")
	before := value(failures)
	p := newProxy(t, v1.IPv4Protocol)
	specs := []Spec{{Protocol: v1.ProtocolTCP, NodePort: port, Endpoints: []string{b.addr()}}}
	p.Sync(specs)
	if p.Serving(v1.ProtocolTCP, port) {
		t.Fatal("serving a port another program holds")
	}
	if got := value(failures) - before; got != 1 {
		t.Errorf("creation failures went up by %v, want 1", got)
	}
	busy.Close()
	p.Sync(specs)
	if !p.Serving(v1.ProtocolTCP, port) {
		t.Fatal("the next sync did not bind the freed port")
	}
	if got := ask(t, "127.0.0.1", port, "z"); got != "a z\na bye\n" {
		t.Errorf("got %q", got)
	}
}

func TestAffinityPinsUntilIdle(t *testing.T) {
	a, b := newBackend(t, "a", "127.0.0.1"), newBackend(t, "b", "127.0.0.1")
	l := &listener{endpoints: []string{a.addr(), b.addr()}, affinity: 10 * time.Second}
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	first := l.pick()
	for range 20 {
		now = now.Add(9 * time.Second)
		if got := l.pick(); got != first {
			t.Fatalf("picked %s within the timeout, want the pinned %s", got, first)
		}
	}
	// Once idle past the timeout, picks are random again: both show up.
	seen := map[string]bool{}
	for range 64 {
		now = now.Add(11 * time.Second)
		seen[l.pick()] = true
	}
	if len(seen) != 2 {
		t.Errorf("after the timeout picked only %v", seen)
	}
	// A pinned endpoint that goes is replaced.
	l.update(&Spec{Endpoints: []string{b.addr()}, AffinityTimeout: 10 * time.Second})
	if got := l.pick(); got != b.addr() {
		t.Errorf("picked %s, want the only endpoint", got)
	}
}

func TestSpecsPickUpstreamsEndpoints(t *testing.T) {
	st := state.NewState()
	svc := func(name string, proto v1.Protocol, nodePort int32, local bool) state.ServicePortName {
		n := state.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "p", Protocol: proto}
		st.Services[n] = &state.ServicePort{Name: n, Protocol: proto, Port: 80, NodePort: nodePort,
			ClusterIP: netip.MustParseAddr("10.0.0.1"), ExternalPolicyLocal: local, AffinityTimeoutSeconds: 30}
		st.Endpoints[n] = []*state.Endpoint{
			{IP: netip.MustParseAddr("10.1.0.1"), Port: 8080, Ready: true, Serving: true, IsLocal: true},
			{IP: netip.MustParseAddr("10.1.0.2"), Port: 8080, Ready: true, Serving: true},
		}
		return n
	}
	svc("cluster", v1.ProtocolTCP, 30001, false)
	svc("local", v1.ProtocolTCP, 30002, true)
	svc("udp", v1.ProtocolUDP, 30003, false)
	svc("nonodeport", v1.ProtocolTCP, 0, false)
	got := map[int32]Spec{}
	for _, s := range Specs(state.View{State: st}) {
		got[s.NodePort] = s
	}
	if len(got) != 2 {
		t.Fatalf("specs for NodePorts %v, want 30001 and 30002 only", got)
	}
	if eps := got[30001].Endpoints; len(eps) != 2 {
		t.Errorf("cluster policy endpoints %v, want both", eps)
	}
	if eps := got[30002].Endpoints; len(eps) != 1 || eps[0] != "10.1.0.1:8080" {
		t.Errorf("local policy endpoints %v, want the local one", eps)
	}
	if got[30001].AffinityTimeout != 30*time.Second {
		t.Errorf("affinity timeout %v", got[30001].AffinityTimeout)
	}
}
