package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ServiceHealth runs one HTTP server per service health-check node port,
// answering 200 while the service has endpoints on this node and the proxy
// is healthy, else 503, so external load balancers skip this node.
type ServiceHealth struct {
	// addresses to listen on; empty means all.
	addresses []string
	proxy     *ProxyHealth

	mu       sync.Mutex
	services map[types.NamespacedName]*serviceServer
}

type serviceServer struct {
	port           int32
	localEndpoints int
	servers        []*http.Server
}

// NewServiceHealth returns servers bound to the given addresses (all when empty).
func NewServiceHealth(addresses []string, proxy *ProxyHealth) *ServiceHealth {
	return &ServiceHealth{addresses: addresses, proxy: proxy, services: map[types.NamespacedName]*serviceServer{}}
}

// SyncServices opens a server for each service's port and closes the
// servers of services no longer listed (or whose port changed).
func (s *ServiceHealth) SyncServices(ports map[types.NamespacedName]int32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, svc := range s.services {
		if ports[name] != svc.port {
			svc.close()
			delete(s.services, name)
		}
	}
	var errs []error
	for name, port := range ports {
		if _, ok := s.services[name]; ok {
			continue
		}
		svc, err := s.open(name, port)
		if err != nil {
			// Another service may get its port later; keep going.
			errs = append(errs, err)
			continue
		}
		s.services[name] = svc
	}
	return errors.Join(errs...)
}

// SyncEndpoints sets how many local endpoints each service has.
func (s *ServiceHealth) SyncEndpoints(local map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, svc := range s.services {
		svc.localEndpoints = local[name]
	}
}

// Close stops every server.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, svc := range s.services {
		svc.close()
		delete(s.services, name)
	}
}

func (s *ServiceHealth) open(name types.NamespacedName, port int32) (*serviceServer, error) {
	svc := &serviceServer{port: port}
	addresses := s.addresses
	if len(addresses) == 0 {
		addresses = []string{""}
	}
	for _, addr := range addresses {
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(int(port))))
		if err != nil {
			svc.close()
			return nil, fmt.Errorf("health check node port %d of service %s: %w", port, name, err)
		}
		srv := &http.Server{Handler: s.handler(name)}
		svc.servers = append(svc.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "Health check server stopped", "service", name, "port", port)
			}
		}()
	}
	return svc, nil
}

func (svc *serviceServer) close() {
	for _, srv := range svc.servers {
		_ = srv.Shutdown(context.Background())
	}
}

type serviceHealthBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *ServiceHealth) handler(name types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		svc := s.services[name]
		count := 0
		if svc != nil {
			count = svc.localEndpoints
		}
		s.mu.Unlock()
		healthy := s.proxy.Health().Healthy
		var body serviceHealthBody
		body.Service.Namespace, body.Service.Name = name.Namespace, name.Name
		body.LocalEndpoints, body.ServiceProxyHealthy = count, healthy
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		code := http.StatusOK
		if count == 0 || !healthy {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, body)
	})
}
