package vm_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// lbChangesScript creates a LoadBalancer service with
// externalTrafficPolicy Local as a cloud and a rollout do: its local
// endpoint starting (not ready) beside a ready remote one, its LB IP in its
// status only later, then the local endpoint ready, the policy switched
// to Cluster and back. Clients outside the node open a new connection
// every 20 ms to its NodePort and, once it answers, to its LB IP, through
// every change: none may be refused or time out. A trace of the virtual
// servers, set entries and kube-ipvs0's addresses, a sample every few
// hundred ms under TCG, counts the samples that caught the LB IP unable to
// take a new connection.
const lbChangesScript = `
pod pod-r $R
serve pod-r
pod ext-in 10.255.1.2
start kube-proxy

LB=10.255.3.50 NP=10.255.0.2:30110
trace_lb() {
	while :; do
		echo "--- $(date +%T.%N)"
		ipvsadm -S -n
		ipset save
		ip -4 -o addr show kube-ipvs0
		sleep 0.05
	done >/out/lb-trace.txt 2>&1
}
trace_lb &
TRACE=$!
# trace_windows: how many of the trace's samples caught the LB IP bound
# without its virtual server, or rejected by KUBE-IPVS-FILTER (in
# KUBE-IPVS-IPS, not in KUBE-LOAD-BALANCER).
trace_windows() {
	awk -v ip=$LB '
		function flush() {
			if (!n) return
			if (bound && !vs) novs++
			if (bound && ips && !lbset) reject++
		}
		/^---/ { flush(); n++; vs = ips = lbset = bound = 0; next }
		$1 == "-A" && $3 == ip ":80" { vs = 1 }
		$1 == "add" && $2 == "KUBE-IPVS-IPS" && $3 == ip { ips = 1 }
		$1 == "add" && $2 == "KUBE-LOAD-BALANCER" && $3 == ip ",tcp:80" { lbset = 1 }
		index($0, " inet " ip "/32 ") { bound = 1 }
		END { flush(); printf "%d trace samples, %d with the LB IP bound without its virtual server, %d with it rejected by KUBE-IPVS-FILTER", n, novs, reject }
	' /out/lb-trace.txt
}
answers() { requests ext-in "$1" 1; [ "$GOT" != failed ]; }
# load NAME URL: a new connection every 20 ms, each with a 1 s timeout.
load() {
	ip netns exec ext-in podserver -client "$2" -load 1h -interval 20ms -timeout 1s >/tmp/load-$1 2>&1 &
	LOADS="$LOADS $!"
}
# loads_ok: ends the loads; none of their connections failed. DETAIL has
# what each saw: its counts, and its first errors (refused or timed out).
loads_ok() {
	kill -TERM $LOADS
	for pid in $LOADS; do wait $pid || :; done
	DETAIL= bad=
	for f in /tmp/load-*; do
		line=$(head -n 1 $f)
		refused=$(grep -c "connection refused" $f || :) timeouts=$(grep -c "timeout" $f || :)
		DETAIL="$DETAIL ${f#/tmp/load-}: $line (of the first errors: $refused refused, $timeouts timed out) $(tail -n +2 $f | head -n 3 | tr '\n' ' ');"
		case $line in *" failed=0 "*) ;; *) bad=1 ;; esac
	done
	[ -z "$bad" ]
}

host create lbl LoadBalancer Local 10.96.101.110 30110
host endpoints lbl $A! $R
eventually "eTP=Local, the local endpoint starting: the NodePort answers" 30 answers tcp://$NP
load nodeport tcp://$NP
host lbstatus lbl $LB
eventually "the LB IP, set in the status, answers" 30 answers tcp://$LB:80
load lb tcp://$LB:80
host endpoints lbl $A $R
eventually "the local endpoint ready: only it serves the LB IP" 30 serves pod-a ext-in tcp://$LB:80 4
check "... and the NodePort" serves pod-a ext-in tcp://$NP 4
host policy lbl Cluster
eventually "eTP=Cluster: both endpoints serve the LB IP" 30 serves "pod-a pod-r" ext-in tcp://$LB:80 6
host policy lbl Local
eventually "eTP=Local again: only the local endpoint" 30 serves pod-a ext-in tcp://$LB:80 4
sleep 2
kill $TRACE
echo "trace: $(trace_windows)"
loads_ok || {
	echo "the trace's last samples:"
	grep -e "^---" -e "$LB" /out/lb-trace.txt | tail -n 60
	fail "no new connection to the LB IP or the NodePort failed through the changes: $DETAIL"
}
echo "ok: no new connection to the LB IP or the NodePort failed through the changes ($DETAIL)"
host delete lbl
not_bound() { ! ip -4 addr show kube-ipvs0 | grep -q " $1/32 "; }
eventually "the deleted service's LB IP is unbound" 30 not_bound $LB
`

// changedServices are the services lbChangesScript creates.
var changedServices = []string{"lbl"}

// serviceChange makes one of lbChangesScript's API changes (see
// serveHostSteps).
func serviceChange(ctx context.Context, c *framework.Cluster, args []string) error {
	services := c.Client.CoreV1().Services(framework.DefaultNamespace)
	edit := func(change func(*v1.Service)) error {
		svc, err := services.Get(ctx, args[1], metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(svc)
		if len(args) == 3 && args[0] == "lbstatus" {
			_, err = services.UpdateStatus(ctx, svc, metav1.UpdateOptions{})
		} else {
			_, err = services.Update(ctx, svc, metav1.UpdateOptions{})
		}
		return err
	}
	switch {
	case len(args) == 6 && args[0] == "create":
		return createService(ctx, c, args[1:])
	case len(args) == 3 && args[0] == "lbstatus":
		return edit(func(s *v1.Service) { s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: args[2]}} })
	case len(args) == 3 && args[0] == "policy":
		return edit(func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicy(args[2]) })
	case len(args) == 2 && args[0] == "delete":
		return deleteService(ctx, c, args[1])
	}
	return fmt.Errorf("unknown command %q", strings.Join(args, " "))
}

// createService creates the service NAME TYPE POLICY CLUSTERIP NODEPORT
// and its empty EndpointSlice.
func createService(ctx context.Context, c *framework.Cluster, args []string) error {
	nodePort, err := strconv.Atoi(args[4])
	if err != nil {
		return err
	}
	svc, err := c.Client.CoreV1().Services(framework.DefaultNamespace).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: args[0], Namespace: framework.DefaultNamespace},
		Spec: v1.ServiceSpec{Type: v1.ServiceType(args[1]), ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicy(args[2]),
			ClusterIP: args[3], Ports: []v1.ServicePort{{Name: "tcp", Protocol: v1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(8080), NodePort: int32(nodePort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	_, err = c.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Create(ctx, framework.ServiceEndpointSlice(svc), metav1.CreateOptions{})
	return err
}

// deleteService deletes a service and its EndpointSlice; either gone
// already is no error.
func deleteService(ctx context.Context, c *framework.Cluster, name string) error {
	err := c.Client.CoreV1().Services(framework.DefaultNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = c.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Delete(ctx, name+"-manual", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// deleteChangedServices deletes what lbChangesScript may have left, had it
// failed before it deleted it.
func deleteChangedServices(t *testing.T, c *framework.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range changedServices {
		if err := deleteService(ctx, c, name); err != nil {
			t.Errorf("deleting service %s: %v", name, err)
		}
	}
}
