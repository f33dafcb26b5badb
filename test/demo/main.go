// Command demo brings up the local cluster, runs our kube-proxy on its node,
// creates a few Services over three pods and shows which pod answers each
// request. It then keeps everything running until Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

const loadBalancerIP = "10.255.3.10"

func main() {
	mode := flag.String("mode", "iptables", "kube-proxy mode")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, mode string) error {
	start := time.Now()
	say("Starting the local cluster (etcd, kube-apiserver, kube-controller-manager, a node namespace)...")
	cluster, err := framework.Start(ctx)
	if err != nil {
		return err
	}
	defer func() {
		say("Tearing down the cluster...")
		cluster.Stop()
	}()
	say("Cluster up in %s. Logs and kubeconfigs: %s", time.Since(start).Round(time.Millisecond), cluster.Dir)

	for _, name := range []string{"web-1", "web-2", "web-3"} {
		if _, err := cluster.AddPod(ctx, name, framework.PodOptions{Labels: map[string]string{"app": "web"}}); err != nil {
			return err
		}
	}
	client, err := cluster.AddPod(ctx, "client", framework.PodOptions{})
	if err != nil {
		return err
	}
	services, err := createServices(ctx, cluster)
	if err != nil {
		return err
	}

	say("Starting our kube-proxy (%s mode) in the node namespace: %s", mode, cluster.KubeProxy())
	kp, err := cluster.StartKubeProxy("kube-proxy", cluster.KubeProxy(), cluster.KubeProxyConfig("mode: "+mode+"\n"))
	if err != nil {
		return err
	}
	if err := kp.WaitHealthy(ctx, 60*time.Second); err != nil {
		say("kube-proxy is NOT healthy: %v", err)
	} else {
		say("kube-proxy is healthy.")
	}
	time.Sleep(2 * time.Second) // let the first sync after the last change land

	nodePort := fmt.Sprint(services["web-nodeport"].Spec.Ports[0].NodePort)
	requests := []struct {
		from     string
		ns       *framework.Netns
		what     string
		proto    string
		hostPort string
	}{
		{"client pod", client.Netns, "ClusterIP web", "tcp", net.JoinHostPort(services["web"].Spec.ClusterIP, "80")},
		{"client pod", client.Netns, "ClusterIP web", "tcp", net.JoinHostPort(services["web"].Spec.ClusterIP, "80")},
		{"client pod", client.Netns, "ClusterIP web", "tcp", net.JoinHostPort(services["web"].Spec.ClusterIP, "80")},
		{"client pod", client.Netns, "ClusterIP web (UDP)", "udp", net.JoinHostPort(services["web"].Spec.ClusterIP, "80")},
		{"client pod", client.Netns, "ClientIP affinity", "tcp", net.JoinHostPort(services["web-sticky"].Spec.ClusterIP, "80")},
		{"client pod", client.Netns, "ClientIP affinity", "tcp", net.JoinHostPort(services["web-sticky"].Spec.ClusterIP, "80")},
		{"client pod", client.Netns, "ClientIP affinity", "tcp", net.JoinHostPort(services["web-sticky"].Spec.ClusterIP, "80")},
		{"external", cluster.External, "NodePort", "tcp", net.JoinHostPort(framework.NodeIPv4, nodePort)},
		{"external", cluster.External, "NodePort", "tcp", net.JoinHostPort(framework.NodeIPv4, nodePort)},
		{"external", cluster.External, "LoadBalancer", "tcp", net.JoinHostPort(loadBalancerIP, "80")},
		{"external", cluster.External, "LoadBalancer", "tcp", net.JoinHostPort(loadBalancerIP, "80")},
	}
	fmt.Println()
	table := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(table, "FROM\tSERVICE\tPROTO\tADDRESS\tANSWERED BY\tSOURCE SEEN")
	failed := 0
	for _, r := range requests {
		reply, err := r.ns.Request(r.proto, r.hostPort, 2*time.Second)
		answer, source := reply.Pod, reply.Source
		if err != nil {
			answer, source = "FAILED", "-"
			failed++
		}
		fmt.Fprintf(table, "%s\t%s\t%s\t%s\t%s\t%s\n", r.from, r.what, r.proto, r.hostPort, answer, source)
	}
	table.Flush()
	fmt.Printf("\n%d of %d requests answered.\n", len(requests)-failed, len(requests))
	say("Running until Ctrl-C. In another terminal, `make demo-shell` opens a shell in the client pod (try: %s -client tcp://%s).",
		"_output/bin/podserver", net.JoinHostPort(services["web"].Spec.ClusterIP, "80"))
	select {
	case <-ctx.Done():
	case <-kp.Exited():
		say("kube-proxy exited: %v\n%s", kp.Err(), kp.LogTail(10))
		<-ctx.Done()
	}
	return nil
}

func createServices(ctx context.Context, cluster *framework.Cluster) (map[string]*v1.Service, error) {
	port := []v1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP},
		{Name: "udp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolUDP}}
	specs := map[string]v1.ServiceSpec{
		"web":          {Ports: port},
		"web-nodeport": {Type: v1.ServiceTypeNodePort, Ports: port[:1]},
		"web-lb":       {Type: v1.ServiceTypeLoadBalancer, Ports: port[:1]},
		"web-sticky":   {Ports: port[:1], SessionAffinity: v1.ServiceAffinityClientIP},
	}
	created := map[string]*v1.Service{}
	services := cluster.Client.CoreV1().Services(framework.DefaultNamespace)
	for name, spec := range specs {
		spec.Selector = map[string]string{"app": "web"}
		svc, err := services.Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating service %s: %w", name, err)
		}
		if spec.Type == v1.ServiceTypeLoadBalancer {
			// No cloud provider here: the demo plays the load balancer controller.
			svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: loadBalancerIP}}
			if svc, err = services.UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
				return nil, fmt.Errorf("setting the load balancer IP: %w", err)
			}
		}
		created[name] = svc
	}
	return created, nil
}

func say(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}
