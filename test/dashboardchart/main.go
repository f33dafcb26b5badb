// Command dashboardchart renders docs/img/dashboard.png: the dashboard's
// main panels (deploy/monitoring) over a real run. Our kube-proxy runs in
// the local cluster (test/framework) under endpoint and service churn;
// Debian's prometheus, on loopback with its own configuration and data in
// a temporary directory, scrapes it on the node's address; the panels' own
// expressions are queried through Prometheus' HTTP API and plotted with
// gonum/plot. Needs root (`make dashboard-chart`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Prometheus scrapes every scrapeInterval; the panels' $__rate_interval is
// four of them, as Grafana sets it.
const (
	scrapeInterval    = 5 * time.Second
	rateInterval      = "20s"
	rateIntervalWords = "20 s"
)

type options struct {
	mode, out            string
	changes, maxServices int
	interval, idle       time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "iptables", "proxy mode: iptables or nftables")
	flag.StringVar(&o.out, "out", "docs/img/dashboard.png", "the PNG to write")
	flag.IntVar(&o.changes, "changes", 150, "endpoint changes, one every -interval; a service is created or deleted every third")
	flag.IntVar(&o.maxServices, "services", 12, "the most services at a time")
	flag.DurationVar(&o.interval, "interval", time.Second, "time between endpoint changes")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "quiet time before and after the churn")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "dashboardchart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	flush, ok := map[string][]string{
		"iptables": {"iptables-nft", "-t", "nat", "-F"},
		"nftables": {"nft", "flush", "table", "ip", "kube-proxy"},
	}[o.mode]
	if !ok {
		return fmt.Errorf("mode %q: iptables or nftables (the IPVS mode runs only in a VM)", o.mode)
	}
	if _, err := exec.LookPath("prometheus"); err != nil {
		return errors.New("no prometheus: `make deps` installs Debian's")
	}
	cluster, err := framework.Start(ctx)
	if err != nil {
		return err
	}
	// Stops kube-proxy, Prometheus and the pods too.
	defer cluster.Stop()
	metricsAddr := net.JoinHostPort(framework.NodeIPv4, "10249")
	kp, err := cluster.StartKubeProxy("kube-proxy-chart", cluster.KubeProxy(),
		cluster.KubeProxyConfig("mode: "+o.mode+"\nmetricsBindAddress: "+metricsAddr+"\nconntrack:\n  maxPerCore: 0\n"))
	if err != nil {
		return err
	}
	if err := kp.WaitHealthy(ctx, time.Minute); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "dashboardchart-prometheus-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	prom, promURL, err := startPrometheus(ctx, cluster, dir, metricsAddr)
	if err != nil {
		return err
	}
	defer prom.Stop()

	start := time.Now()
	since := func() float64 { return time.Since(start).Seconds() }
	log("Prometheus on %s scrapes %s every %s; quiet for %s", promURL, metricsAddr, scrapeInterval, o.idle)
	sleep(ctx, o.idle)
	churn, err := cluster.NewChurn(ctx, framework.ChurnOptions{
		Labels: map[string]string{"app": "chart"}, NamePrefix: "chart-",
		Pods: 3, MaxPods: 8, Changes: o.changes, Interval: o.interval, Grace: 2 * time.Second, Seed: 1,
	})
	defer churn.Stop()
	if err != nil {
		return err
	}
	churnStart := since()
	log("%d endpoint changes, one every %s, over up to %d services created and deleted", o.changes, o.interval, o.maxServices)
	services := make(chan error, 1)
	churnCtx, endChurn := context.WithCancel(ctx)
	go func() { services <- churnServices(churnCtx, cluster, 3*o.interval, o.maxServices) }()
	// Halfway, another program flushes the rules: kube-proxy restores them.
	flushAt := churnStart + float64(o.changes)*o.interval.Seconds()/2
	flushed := time.AfterFunc(time.Until(start.Add(time.Duration(flushAt*float64(time.Second)))), func() {
		if out, err := cluster.Node.Command(flush...).CombinedOutput(); err != nil {
			log("%v: %v %s", flush, err, out)
		}
	})
	_, err = churn.Run(ctx)
	flushed.Stop()
	endChurn()
	if err := errors.Join(err, <-services); err != nil && ctx.Err() == nil {
		return err
	}
	churnEnd := since()
	log("Churn done; quiet for %s", o.idle)
	sleep(ctx, o.idle)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case <-kp.Exited():
		return fmt.Errorf("kube-proxy exited during the run: %v\n%s", kp.Err(), kp.LogTail(20))
	default:
	}
	end := time.Now()
	panels, err := queryPanels(ctx, promURL, start, end)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("rapidproxy in %s mode, Prometheus scraping every %s: endpoint and service churn from %.0fs to %.0fs, %s at %.0fs",
		o.mode, scrapeInterval, churnStart, churnEnd, flush[0]+" flushing the rules", flushAt)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if err := render(o.out, title, end.Sub(start).Seconds(), panels); err != nil {
		return err
	}
	log("Wrote %s", o.out)
	return nil
}

// churnServices creates a service over the churned pods every interval,
// deleting the oldest once there are max, until ctx ends.
func churnServices(ctx context.Context, cluster *framework.Cluster, interval time.Duration, max int) error {
	api := cluster.Client.CoreV1().Services(framework.DefaultNamespace)
	var live []string
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
		if len(live) == max {
			if err := api.Delete(ctx, live[0], metav1.DeleteOptions{}); err != nil && ctx.Err() == nil {
				return err
			}
			live = live[1:]
		}
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "chart-svc-" + strconv.Itoa(i)}, Spec: v1.ServiceSpec{
			Selector: map[string]string{"app": "chart"},
			Ports: []v1.ServicePort{
				{Name: "tcp", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "udp", Protocol: v1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
		if _, err := api.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		live = append(live, svc.Name)
	}
}

// startPrometheus runs Debian's prometheus listening on a free loopback
// port, with its configuration and data in dir, scraping target as the
// job kube-proxy, and waits until it is ready.
func startPrometheus(ctx context.Context, cluster *framework.Cluster, dir, target string) (*framework.Process, string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := l.Addr().String()
	l.Close()
	config := fmt.Sprintf("global:\n  scrape_interval: %s\n  evaluation_interval: %s\nscrape_configs:\n  - job_name: kube-proxy\n    static_configs:\n      - targets: ['%s']\n",
		scrapeInterval, scrapeInterval, target)
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		return nil, "", err
	}
	p, err := cluster.StartProcess("prometheus", exec.Command("prometheus", "--config.file="+configFile,
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr))
	if err != nil {
		return nil, "", err
	}
	url := "http://" + addr
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if resp, err := http.Get(url + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, url, nil
			}
		}
	}
	p.Stop()
	return nil, "", fmt.Errorf("prometheus not ready within a minute:\n%s", p.LogTail(20))
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func log(format string, args ...any) {
	fmt.Printf("%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
