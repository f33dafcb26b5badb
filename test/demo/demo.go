package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

const loadBalancerIP = "10.255.3.10"

// Where requests are made from: a pod, or a client outside the cluster.
const (
	fromClient   = "client pod"
	fromExternal = "external"
)

// node is where our kube-proxy runs and the demo's requests are made
// from: the cluster's namespaces on this machine (hostNode), or a VM
// (guestNode).
type node interface {
	// addPods starts the three pods the services send to; it returns
	// their addresses for hand-written EndpointSlices, or nil where the
	// services select them (app=web).
	addPods(ctx context.Context) (endpoints []string, err error)
	// run starts kube-proxy, waits for its first sync, makes the requests
	// one after another and returns what each got (no answer: a zero
	// Reply).
	run(ctx context.Context, rs []request) ([]framework.Reply, error)
	// more prints what there is to see besides the table.
	more()
	// ended is closed if kube-proxy ends; why then says why.
	ended() <-chan struct{}
	why() string
	// stop ends what run started; the cluster's Stop ends the rest.
	stop()
}

// request is one row of the table.
type request struct {
	from  string // fromClient or fromExternal
	what  string
	proto string // tcp or udp
	addr  string // host:port
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

	var n node = &hostNode{cluster: cluster, mode: mode}
	if mode == "ipvs" {
		n = &guestNode{cluster: cluster}
	}
	defer n.stop()
	endpoints, err := n.addPods(ctx)
	if err != nil {
		return err
	}
	services, err := createServices(ctx, cluster, endpoints)
	if err != nil {
		return err
	}
	rs := requestsTo(services)
	replies, err := n.run(ctx, rs)
	if err != nil {
		return err
	}
	fmt.Println()
	printTable(os.Stdout, rs, replies)
	n.more()
	say("Running until Ctrl-C.")
	select {
	case <-ctx.Done():
	case <-n.ended():
		say("kube-proxy ended: %s", n.why())
		<-ctx.Done()
	}
	return nil
}

// createServices creates the demo's services: over the pods labelled
// app=web, or, given endpoints, without a selector and with an
// EndpointSlice of those addresses on the node.
func createServices(ctx context.Context, cluster *framework.Cluster, endpoints []string) (map[string]*v1.Service, error) {
	port := []v1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolTCP},
		{Name: "udp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: v1.ProtocolUDP}}
	specs := map[string]v1.ServiceSpec{
		"web":          {Ports: port},
		"web-nodeport": {Type: v1.ServiceTypeNodePort, Ports: port[:1]},
		"web-lb":       {Type: v1.ServiceTypeLoadBalancer, Ports: port[:1]},
		"web-sticky":   {Ports: port[:1], SessionAffinity: v1.ServiceAffinityClientIP},
	}
	var slice []discoveryv1.Endpoint
	for _, ip := range endpoints {
		slice = append(slice, framework.ReadyEndpoint(ip, framework.NodeName))
	}
	created := map[string]*v1.Service{}
	services := cluster.Client.CoreV1().Services(framework.DefaultNamespace)
	for name, spec := range specs {
		if endpoints == nil {
			spec.Selector = map[string]string{"app": "web"}
		}
		svc, err := services.Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating service %s: %w", name, err)
		}
		if endpoints != nil {
			_, err := cluster.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Create(ctx,
				framework.ServiceEndpointSlice(svc, slice...), metav1.CreateOptions{})
			if err != nil {
				return nil, fmt.Errorf("creating the endpoint slice of %s: %w", name, err)
			}
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

// requestsTo are the table's rows: a few requests to each service.
func requestsTo(services map[string]*v1.Service) []request {
	web := net.JoinHostPort(services["web"].Spec.ClusterIP, "80")
	sticky := net.JoinHostPort(services["web-sticky"].Spec.ClusterIP, "80")
	nodePort := net.JoinHostPort(framework.NodeIPv4, fmt.Sprint(services["web-nodeport"].Spec.Ports[0].NodePort))
	lb := net.JoinHostPort(loadBalancerIP, "80")
	var rs []request
	add := func(times int, r request) {
		for range times {
			rs = append(rs, r)
		}
	}
	add(3, request{fromClient, "ClusterIP web", "tcp", web})
	add(1, request{fromClient, "ClusterIP web (UDP)", "udp", web})
	add(3, request{fromClient, "ClientIP affinity", "tcp", sticky})
	add(2, request{fromExternal, "NodePort", "tcp", nodePort})
	add(2, request{fromExternal, "LoadBalancer", "tcp", lb})
	return rs
}

// printTable prints who answered each request, and how many were.
func printTable(w io.Writer, rs []request, replies []framework.Reply) {
	table := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(table, "FROM\tSERVICE\tPROTO\tADDRESS\tANSWERED BY\tSOURCE SEEN")
	answered := 0
	for i, r := range rs {
		answer, source := replies[i].Pod, replies[i].Source
		if answer == "" {
			answer, source = "FAILED", "-"
		} else {
			answered++
		}
		fmt.Fprintf(table, "%s\t%s\t%s\t%s\t%s\t%s\n", r.from, r.what, r.proto, r.addr, answer, source)
	}
	table.Flush()
	fmt.Fprintf(w, "\n%d of %d requests answered.\n", answered, len(rs))
}

func say(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}
