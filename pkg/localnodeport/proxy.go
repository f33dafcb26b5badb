// Package localnodeport serves TCP NodePorts on the loopback address in
// userspace, for the nftables mode, where the kernel cannot DNAT traffic
// sent to 127.0.0.1 or ::1 (route_localnet is IPv4 only and unsafe). It
// behaves as upstream kube-proxy's localhost NodePort proxy (feature gate
// KubeProxyNFTablesLocalhostNodePorts): one listener per TCP NodePort on
// 127.0.0.1 (or [::1]), each accepted connection relayed to one endpoint
// picked at random, or to the pinned one with ClientIP session affinity.
package localnodeport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// DialTimeout bounds connecting to an endpoint, as upstream's.
const DialTimeout = 5 * time.Second

// Spec is one NodePort to serve on the loopback address.
type Spec struct {
	// Name is the service port, for logs.
	Name     string
	Protocol v1.Protocol
	NodePort int32
	// Endpoints are the "ip:port" endpoints connections are relayed to;
	// a NodePort without any has no listener.
	Endpoints []string
	// AffinityTimeout is the ClientIP session affinity's timeout; 0
	// without affinity. All localhost clients share one source address,
	// so affinity pins every connection to one endpoint while used.
	AffinityTimeout time.Duration
}

func (s *Spec) key() string { return string(s.Protocol) + "/" + strconv.Itoa(int(s.NodePort)) }

// Specs are the NodePorts of a state to serve on the loopback address: one
// per TCP service port with a NodePort, relayed to the endpoints upstream
// uses for it, the local ones with externalTrafficPolicy Local, the
// cluster's otherwise.
func Specs(v state.View) []Spec {
	var specs []Spec
	for name, svc := range v.Services {
		if svc.NodePort == 0 || svc.Protocol != v1.ProtocolTCP {
			continue
		}
		sel := state.Select(svc, v.Endpoints[name], v.Node)
		eps := sel.Cluster
		if svc.ExternalPolicyLocal {
			eps = sel.Local
		}
		s := Spec{Name: name.String(), Protocol: svc.Protocol, NodePort: svc.NodePort,
			AffinityTimeout: time.Duration(svc.AffinityTimeoutSeconds) * time.Second}
		for _, ep := range eps {
			s.Endpoints = append(s.Endpoints, ep.String())
		}
		specs = append(specs, s)
	}
	return specs
}

// Proxy holds the listeners of one IP family.
type Proxy struct {
	ctx      context.Context
	listenIP string
	family   string
	now      func() time.Time

	mu     sync.Mutex
	active map[string]*listener
}

// New makes the proxy of a family; listeners live until Shutdown or ctx
// ends.
func New(ctx context.Context, family v1.IPFamily) *Proxy {
	ip := "127.0.0.1"
	if family == v1.IPv6Protocol {
		ip = "::1"
	}
	return &Proxy{ctx: ctx, listenIP: ip, family: string(family), now: time.Now, active: map[string]*listener{}}
}

// Sync makes the listeners those of specs: new ones bound, gone ones
// closed (their connections with them), the others given their new
// endpoints. A NodePort that cannot be bound is logged and counted, and
// tried again at the next Sync.
func (p *Proxy) Sync(specs []Spec) {
	wanted := make(map[string]*Spec, len(specs))
	for i := range specs {
		if len(specs[i].Endpoints) > 0 {
			wanted[specs[i].key()] = &specs[i]
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, l := range p.active {
		if _, ok := wanted[key]; !ok {
			klog.V(2).InfoS("Removing localhost NodePort proxy", "protocol", l.protocol, "port", l.port)
			l.shutdown()
			delete(p.active, key)
		}
	}
	for key, s := range wanted {
		if l, ok := p.active[key]; ok {
			l.update(s)
			continue
		}
		if s.Protocol != v1.ProtocolTCP {
			klog.ErrorS(nil, "Unexpected non-TCP localhost NodePort proxy", "service", s.Name, "protocol", s.Protocol, "port", s.NodePort)
			continue
		}
		l, err := p.listen(s)
		if err != nil {
			klog.ErrorS(err, "Failed to create localhost NodePort proxy", "service", s.Name, "protocol", s.Protocol, "port", s.NodePort)
			metrics.LocalhostNodePortListenerCreationFailuresTotal.WithLabelValues(p.family).Inc()
			continue
		}
		p.active[key] = l
		klog.V(4).InfoS("Created localhost NodePort proxy", "service", s.Name, "protocol", s.Protocol, "port", s.NodePort, "endpoints", len(s.Endpoints))
	}
	metrics.LocalhostNodePortListeners.WithLabelValues(p.family).Set(float64(len(p.active)))
}

// Serving tells whether a NodePort has a listener.
func (p *Proxy) Serving(protocol v1.Protocol, nodePort int32) bool {
	s := Spec{Protocol: protocol, NodePort: nodePort}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.active[s.key()]
	return ok
}

// Shutdown closes every listener and its connections.
func (p *Proxy) Shutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, l := range p.active {
		l.shutdown()
		delete(p.active, key)
	}
	metrics.LocalhostNodePortListeners.WithLabelValues(p.family).Set(0)
}

func (p *Proxy) listen(s *Spec) (*listener, error) {
	addr := net.JoinHostPort(p.listenIP, strconv.Itoa(int(s.NodePort)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(p.ctx)
	l := &listener{protocol: s.Protocol, port: s.NodePort, ln: ln, cancel: cancel, now: p.now,
		endpoints: s.Endpoints, affinity: s.AffinityTimeout}
	go l.accept(ctx)
	return l, nil
}

type listener struct {
	protocol v1.Protocol
	port     int32
	ln       net.Listener
	cancel   context.CancelFunc
	now      func() time.Time

	mu        sync.Mutex
	endpoints []string
	affinity  time.Duration
	// pinned is the endpoint affinity keeps, last used at pinnedAt.
	pinned   string
	pinnedAt time.Time
}

func (l *listener) accept(ctx context.Context) {
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			klog.V(4).InfoS("Accept error on localhost NodePort proxy", "err", err, "port", l.port)
			continue
		}
		go l.relay(ctx, conn)
	}
}

// relay copies both ways between a client and an endpoint, each side's
// end of stream passed on as a half close, until both are done or the
// listener is shut down.
func (l *listener) relay(ctx context.Context, client net.Conn) {
	defer client.Close() //nolint:errcheck
	ep := l.pick()
	backend, err := net.DialTimeout("tcp", ep, DialTimeout)
	if err != nil {
		klog.V(4).InfoS("Failed to connect to endpoint", "err", err, "port", l.port, "endpoint", ep)
		return
	}
	defer backend.Close() //nolint:errcheck
	connCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-connCtx.Done()
		_ = client.Close()
		_ = backend.Close()
	}()
	pipe := func(dst, src net.Conn) {
		if _, err := io.Copy(dst, src); err != nil && connCtx.Err() == nil {
			klog.V(4).InfoS("Error relaying localhost NodePort connection", "err", err, "port", l.port)
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { pipe(backend, client) })
	wg.Go(func() { pipe(client, backend) })
	wg.Wait()
}

// pick chooses a connection's endpoint: at random, or with affinity the
// pinned one while it is still an endpoint and was used within the
// timeout (each use renews it).
func (l *listener) pick() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.endpoints) == 0 {
		return ""
	}
	now := l.now()
	if l.affinity > 0 && l.pinned != "" && now.Sub(l.pinnedAt) <= l.affinity {
		for _, ep := range l.endpoints {
			if ep == l.pinned {
				l.pinnedAt = now
				return ep
			}
		}
	}
	ep := l.endpoints[rand.IntN(len(l.endpoints))]
	if l.affinity > 0 {
		l.pinned, l.pinnedAt = ep, now
	}
	return ep
}

func (l *listener) update(s *Spec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endpoints = s.Endpoints
	if l.affinity != s.AffinityTimeout {
		l.pinned, l.affinity = "", s.AffinityTimeout
	}
}

func (l *listener) shutdown() {
	l.cancel()
	_ = l.ln.Close()
}
