package vm_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
	"github.com/rapidproxy/rapidproxy/test/vm"
)

// recordEnv enables TestRecordUpstreamIPVSLayout, a recording tool rather
// than a check.
const recordEnv = "RAPIDPROXY_RECORD_UPSTREAM_IPVS"

// layoutFile is where the recording goes, committed for the IPVS mode's authors.
const layoutFile = "testdata/upstream-ipvs-layout.txt"

// TestRecordUpstreamIPVSLayout runs upstream kube-proxy in IPVS mode in
// the VM, as node-1 of the local cluster, against a representative set of
// services, and writes what it programmed to layoutFile.
func TestRecordUpstreamIPVSLayout(t *testing.T) {
	if os.Getenv(recordEnv) == "" {
		t.Skip("a recording tool: set " + recordEnv + "=1 to rewrite " + layoutFile)
	}
	cluster := startCluster(t)

	layout := programLayout(t, cluster, cluster.UpstreamKubeProxy())
	header := "# What upstream kube-proxy programs in IPVS mode (mode: ipvs, otherwise its defaults),\n" +
		"# recorded by TestRecordUpstreamIPVSLayout in test/vm (" + recordEnv + "=1) in the test VM:\n" +
		"# Debian's kernel under qemu, iptables on the nft backend (Debian's default), modules loaded\n" +
		"# before kube-proxy started: " + strings.Join(vm.IPVSModules, " ") + ".\n" +
		"# Node " + framework.NodeName + ": its Node object's IPs " + framework.NodeIPv4 + " and " + framework.NodeIPv6 +
		" are on the guest's eth0,\n# with the uplink's " + vm.GuestIP + "/30; clusterCIDR " + framework.ClusterCIDRs +
		"; service CIDRs " + framework.ServiceCIDRs + ".\n" +
		"# Services (namespace default), created before kube-proxy started:\n" + serviceSummary
	if err := os.MkdirAll(filepath.Dir(layoutFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(layoutFile, append([]byte(header), layout...), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", layoutFile)
}

// programLayout runs a kube-proxy binary in IPVS mode in the VM as node-1
// of the cluster, once createServices has run, and returns what it
// programmed, section by section.
func programLayout(t *testing.T, cluster *framework.Cluster, binary string) []byte {
	t.Helper()
	config := filepath.Join(cluster.Dir, "kube-proxy-vm.yaml")
	if err := os.WriteFile(config, []byte(cluster.KubeProxyConfig("mode: ipvs\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	res := vm.Run(t, vm.Config{
		Modules: vm.IPVSModules,
		Network: true,
		Files:   vm.NodeFiles(cluster, binary, config),
		Timeout: 8 * time.Minute,
		Script: vm.NodeAddresses + `
kube-proxy --config=` + config + ` --v=2 >/out/kube-proxy.log 2>&1 &
` + vm.WaitForSync + `
# A few more seconds for anything a first sync leaves to the next.
sleep 5

section() { echo; echo "### $*"; "$@"; }
{
	section uname -r
	section kube-proxy --version
	section ipvsadm -Ln
	section ipvsadm -S -n
	section ipset save
	section iptables-save
	section ip6tables-save
	section ip addr show kube-ipvs0
	section ip -6 route show table local dev kube-ipvs0
	echo
	echo "### sysctls"
	for f in /proc/sys/net/ipv4/vs/* /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv6/conf/all/forwarding \
		/proc/sys/net/ipv4/conf/all/route_localnet /proc/sys/net/ipv4/conf/all/arp_ignore \
		/proc/sys/net/ipv4/conf/all/arp_announce /proc/sys/net/bridge/bridge-nf-call-iptables \
		/proc/sys/net/netfilter/nf_conntrack_max /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established \
		/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait /proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal; do
		[ -e "$f" ] && echo "${f#/proc/sys/} = $(cat "$f")"
	done
	echo
	echo "### modules loaded"
	lsmod | awk 'NR > 1 {print $1}' | sort
} >/out/layout.txt
`,
	})
	layout, err := os.ReadFile(filepath.Join(res.OutDir, "layout.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return layout
}

// startCluster starts the local cluster, for the test's whole run, with
// the services of createServices.
func startCluster(t *testing.T) *framework.Cluster {
	t.Helper()
	testutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	t.Cleanup(cancel)
	cluster, err := framework.Start(ctx)
	if err != nil {
		t.Fatalf("starting the local cluster: %v", err)
	}
	t.Cleanup(cluster.Stop)
	createServices(ctx, t, cluster)
	return cluster
}

// serviceSummary describes what createServices makes, for the header.
const serviceSummary = `#   affinity:  ClusterIP 10.96.100.10, tcp 80->8080 and udp 53->5353, sessionAffinity ClientIP
#              (10800 s), endpoints 10.244.0.11 (node-1) and 10.244.1.11 (node-2)
#   local-np:  NodePort 10.96.100.20, tcp 80->8080 nodePort 30080, externalTrafficPolicy Local,
#              endpoints 10.244.0.21 (node-1) and 10.244.1.21 (node-2)
#   lb:        LoadBalancer 10.96.100.30, tcp 80->8080 nodePort 30090, externalIPs 10.255.2.30,
#              status ingress 10.255.3.30, loadBalancerSourceRanges 10.255.1.0/24,
#              externalTrafficPolicy Cluster, endpoints 10.244.0.31 (node-1) and 10.244.1.31 (node-2)
#   empty:     ClusterIP 10.96.100.40, tcp 80->8080, no endpoints
`

// createServices creates the services serviceSummary lists, with their
// EndpointSlices written by hand (the services have no selector).
func createServices(ctx context.Context, t *testing.T, c *framework.Cluster) {
	t.Helper()
	tcp := v1.ServicePort{Name: "tcp", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}
	udp := v1.ServicePort{Name: "udp", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)}
	withNodePort := func(p v1.ServicePort, n int32) v1.ServicePort { p.NodePort = n; return p }
	services := []struct {
		svc       v1.ServiceSpec
		name      string
		endpoints []string // node-1's, then node-2's
	}{
		{name: "affinity", endpoints: []string{"10.244.0.11", "10.244.1.11"}, svc: v1.ServiceSpec{
			ClusterIP: "10.96.100.10", Ports: []v1.ServicePort{tcp, udp},
			SessionAffinity: v1.ServiceAffinityClientIP}},
		{name: "local-np", endpoints: []string{"10.244.0.21", "10.244.1.21"}, svc: v1.ServiceSpec{
			Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.100.20", Ports: []v1.ServicePort{withNodePort(tcp, 30080)},
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal}},
		{name: "lb", endpoints: []string{"10.244.0.31", "10.244.1.31"}, svc: v1.ServiceSpec{
			Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.100.30", Ports: []v1.ServicePort{withNodePort(tcp, 30090)},
			ExternalIPs: []string{"10.255.2.30"}, LoadBalancerSourceRanges: []string{"10.255.1.0/24"}}},
		{name: "empty", svc: v1.ServiceSpec{ClusterIP: "10.96.100.40", Ports: []v1.ServicePort{tcp}}},
	}
	for _, s := range services {
		created, err := c.Client.CoreV1().Services(framework.DefaultNamespace).Create(ctx, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: framework.DefaultNamespace}, Spec: s.svc},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating service %s: %v", s.name, err)
		}
		if s.svc.Type == v1.ServiceTypeLoadBalancer {
			created.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.255.3.30"}}
			if _, err := c.Client.CoreV1().Services(framework.DefaultNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("service %s status: %v", s.name, err)
			}
		}
		if len(s.endpoints) == 0 {
			continue
		}
		var endpoints []discoveryv1.Endpoint
		for i, node := range []string{framework.NodeName, framework.RemoteNodeName} {
			endpoints = append(endpoints, framework.ReadyEndpoint(s.endpoints[i], node))
		}
		slice := framework.ServiceEndpointSlice(created, endpoints...)
		if _, err := c.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating the endpoint slice of %s: %v", s.name, err)
		}
	}
}
