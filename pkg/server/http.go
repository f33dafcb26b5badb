// The health and metrics servers: what the metrics server serves besides
// the metrics (explain, flagz and statusz, pprof, the log level).

package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"

	"k8s.io/component-base/logs"
	"k8s.io/component-base/metrics/prometheus/slis"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/rapidproxy/rapidproxy/pkg/explain"
	"github.com/rapidproxy/rapidproxy/pkg/healthcheck"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
	"github.com/rapidproxy/rapidproxy/pkg/zpages"
)

// servers are the HTTP servers kube-proxy runs.
type servers []*http.Server

func (s servers) close() {
	for _, srv := range s {
		_ = srv.Close()
	}
}

// startServers opens the healthz and metrics servers where configured. A
// port in use is fatal with bindAddressHardFail, else only logged.
func startServers(ctx context.Context, cfg *kpconfig.KubeProxyConfiguration, health *healthcheck.ProxyHealth, services *explain.Handler, z *zpages.Pages) (servers, error) {
	var out servers
	listen := func(name, addr string, handler http.Handler) error {
		if addr == "" {
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("%s server on %s: %w", name, addr, err)
			if cfg.BindAddressHardFail {
				return err
			}
			klog.ErrorS(err, "Could not start server; continuing without it")
			return nil
		}
		srv := &http.Server{Handler: handler}
		out = append(out, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "Server stopped", "server", name)
			}
		}()
		return nil
	}
	if err := listen("healthz", cfg.HealthzBindAddress, health.Handler()); err != nil {
		out.close()
		return nil, err
	}
	if err := listen("metrics", cfg.MetricsBindAddress, metricsMux(cfg, services, z)); err != nil {
		out.close()
		return nil, err
	}
	go func() {
		<-ctx.Done()
		out.close()
	}()
	return out, nil
}

// metricsMux serves upstream's paths: /metrics, /metrics/slis, /healthz
// (and /healthz/ping, its one check), /configz, /proxyMode, /flagz,
// /statusz and, with
// profiling on, /debug/pprof and /debug/flags (PUT /debug/flags/v sets the
// log verbosity); and /debug/services (what the node does with each
// service) and /debug/trace (where a packet goes): only here, on the
// metrics address, and answering clients on the node itself only, whatever
// metricsBindAddress is, unless explain.AccessEnv opens them. Every other
// path is 404.
func metricsMux(cfg *kpconfig.KubeProxyConfiguration, services *explain.Handler, z *zpages.Pages) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(explain.Path, services)
	mux.Handle(explain.Path+"/", services)
	mux.HandleFunc(explain.TracePath, services.ServeTrace)
	mux.Handle("/metrics", metrics.Handler())
	slis.SLIMetricsWithReset{}.Install(mux)
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/healthz/ping", ok)
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(cfg.Mode))
	})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"kubeproxy.config.k8s.io": cfg})
	})
	mux.HandleFunc("/flagz", z.Flagz)
	mux.HandleFunc("/statusz", z.Statusz)
	if cfg.EnableProfiling {
		// Upstream's set: no cmdline, which would show the command line.
		mux.Handle("/debug/pprof", http.RedirectHandler("/debug/pprof/", http.StatusFound))
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/flags", debugFlags)
		mux.HandleFunc("/debug/flags/", debugFlags)
		mux.HandleFunc("/debug/flags/v", setVerbosity)
	}
	return mux
}

// debugFlags lists the flags /debug/flags/ can set, as upstream's page.
func debugFlags(w http.ResponseWriter, _ *http.Request) {
	_, _ = w.Write([]byte("<html>\n<head>\n<title>/debug/flags/</title>\n</head>\n<body>\n/debug/flags/<br>\n<br>\nflags:<br>\n<table>\n" +
		"<tr>v<br>\n</table>\n<br>\nfull flags configurable<br>\n</body>\n</html>\n"))
}

// setVerbosity sets the log verbosity to a PUT's body, as upstream's
// /debug/flags/v; other methods are refused as upstream refuses them.
func setVerbosity(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodPut {
		w.WriteHeader(http.StatusNotAcceptable)
		_, _ = w.Write([]byte("unsupported http method"))
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("error reading request body: " + err.Error()))
		return
	}
	response, err := logs.GlogSetter(string(body))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(err.Error()))
		return
	}
	_, _ = w.Write([]byte(response))
}
