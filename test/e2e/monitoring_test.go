package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/deploy/monitoring"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Every series the rules and the dashboard of deploy/monitoring read is on
// /metrics of our kube-proxy in each mode, and none of those
// monitoring.NotServedIn says the mode does not serve. Some series appear
// only once something fed them, so the test first does what a node does
// early on: a service with a TCP and a UDP port gains an endpoint after the
// first sync (the EndpointSlice controller's trigger time, for network
// programming latency; the UDP port's first endpoint, whose flows are
// cleared, for the conntrack series), then a second one (a partial sync),
// and /livez is asked (/healthz was, when the proxy started).
func TestMonitoringSeriesAreServed(t *testing.T) {
	inEachMode(t, func(t *testing.T, mode string) {
		want, err := monitoring.ServedIn(mode)
		if err != nil {
			t.Fatal(err)
		}
		app := "mon-" + mode[:3]
		addPod(t, app+"-a", framework.PodOptions{Labels: map[string]string{"app": app}})
		svc := createService(t, service(app, app, v1.ProtocolTCP, v1.ProtocolUDP))
		eventually(t, convergence, "the service answering", func() error {
			_, err := answeredBy(cluster.Node, "udp", svc.Spec.ClusterIP, 80, app+"-a")
			return err
		})
		// The first endpoint may come with a full sync (one that ends a
		// mode switch, say): a second one, once the first answers, is a
		// partial sync's.
		addPod(t, app+"-b", framework.PodOptions{Labels: map[string]string{"app": app}})
		eventually(t, convergence, "the second endpoint answering", func() error {
			_, err := answeredBy(cluster.Node, "tcp", svc.Spec.ClusterIP, 80, app+"-b")
			return err
		})
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + framework.NodeIPv4 + ":10256/livez")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()

		var served map[string]bool
		eventually(t, convergence, "every series of deploy/monitoring served", func() error {
			served = seriesServed(metrics(t))
			var missing []string
			for _, name := range want {
				if !served[name] {
					missing = append(missing, name)
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("not on /metrics in the %s mode: %s", mode, strings.Join(missing, ", "))
			}
			return nil
		})
		for name, why := range monitoring.NotServedIn[mode] {
			if served[name] {
				t.Errorf("%s is served in the %s mode, but listed as not (%s)", name, mode, why)
			}
		}
		t.Logf("%s mode: the %d series of deploy/monitoring served, the %d of other modes not", mode, len(want), len(monitoring.NotServedIn[mode]))
	})
}

// seriesServed are the series names of a /metrics text: a histogram's by
// their _bucket, _sum and _count names, as Prometheus stores them.
func seriesServed(text string) map[string]bool {
	served := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if end := strings.IndexAny(line, "{ "); end > 0 {
			served[line[:end]] = true
		}
	}
	return served
}
