package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/rapidproxy/rapidproxy/deploy"
	"github.com/rapidproxy/rapidproxy/pkg/explain"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// The paths probed on each server, ours against upstream's: what each
// serves, near misses, and what neither should.
var (
	metricsPaths = []string{"/", "/metrics", "/metrics/slis", "/healthz", "/healthz/ping", "/livez", "/readyz",
		"/configz", "/proxyMode", "/flagz", "/statusz", "/debug/pprof/", "/debug/pprof/cmdline",
		"/debug/pprof/heap", "/debug/pprof", "/debug/flags", "/debug/flags/v", "/debug/services", "/nope"}
	healthzPaths = []string{"/", "/healthz", "/livez", "/readyz", "/metrics", "/configz", "/proxyMode",
		"/debug/pprof/", "/debug/services", "/nope"}
)

// ourOwnPaths are served by our metrics server only, on purpose: what the
// node does with each service (docs/architecture.md, pkg/explain).
var ourOwnPaths = []string{"/debug/services"}

// Run with the defaults, our kube-proxy and upstream's serve metrics on
// 127.0.0.1:10249 only, and both servers answer the same paths with the
// same status codes, with profiling off and on; /configz shows the same
// configuration, whose kubeconfig is a path, never its credentials; /flagz
// and /statusz answer each Accept header in the same form (zPageForms).
func TestServerPathsAnswerAsUpstreams(t *testing.T) {
	stopProxy() // the next test that needs the shared one starts it again
	answers := map[string]map[string]int{}
	configz := map[string]string{}
	zForms := map[string]map[string]string{}
	for _, profiling := range []bool{false, true} {
		for _, ours := range []bool{true, false} {
			name := map[bool]string{true: "ours", false: "upstream"}[ours]
			run := fmt.Sprintf("%s, enableProfiling %v", name, profiling)
			binary := cluster.KubeProxy()
			if !ours {
				binary = cluster.UpstreamKubeProxy()
			}
			started++
			config := fmt.Sprintf("mode: iptables\nenableProfiling: %v\nconntrack:\n  maxPerCore: 0\n", profiling)
			proxy, err := cluster.StartKubeProxy(fmt.Sprintf("%s-paths-%d", name, started), binary, cluster.KubeProxyConfig(config))
			if err != nil {
				t.Fatal(err)
			}
			if err := proxy.WaitHealthy(context.Background(), time.Minute); err != nil {
				proxy.Stop()
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, run+": metrics on 127.0.0.1:10249", func() error {
				_, err := nodeGet("http://127.0.0.1:10249/healthz")
				return err
			})
			if _, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + framework.NodeIPv4 + ":10249/healthz"); err == nil {
				t.Errorf("%s: metrics answer on the node's IP by default, want 127.0.0.1 only", run)
			}
			answers[run] = map[string]int{}
			for _, path := range metricsPaths {
				code, err := nodeGet("http://127.0.0.1:10249" + path)
				if err != nil {
					t.Fatalf("%s: %s: %v", run, path, err)
				}
				answers[run]["metrics "+path] = code
			}
			for _, path := range healthzPaths {
				resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + framework.NodeIPv4 + ":10256" + path)
				if err != nil {
					t.Fatalf("%s: healthz %s: %v", run, path, err)
				}
				resp.Body.Close()
				answers[run]["healthz "+path] = resp.StatusCode
			}
			if !profiling {
				out, err := cluster.Node.Exec("curl", "-sS", "--max-time", "2", "http://127.0.0.1:10249/configz")
				if err != nil {
					t.Fatalf("%s: /configz: %v", run, err)
				}
				configz[name] = out
				zForms[name] = zPageForms(t, run)
			}
			proxy.Stop()
		}
		ours, upstream := answers[fmt.Sprintf("ours, enableProfiling %v", profiling)], answers[fmt.Sprintf("upstream, enableProfiling %v", profiling)]
		var table strings.Builder
		for _, key := range slices.Sorted(func(yield func(string) bool) {
			for k := range ours {
				if !yield(k) {
					return
				}
			}
		}) {
			fmt.Fprintf(&table, "  %-28s ours %d, upstream %d\n", key, ours[key], upstream[key])
			_, path, _ := strings.Cut(key, " ")
			if strings.HasPrefix(key, "metrics ") && slices.Contains(ourOwnPaths, path) {
				if upstream[key] != http.StatusNotFound || ours[key] == http.StatusNotFound {
					t.Errorf("enableProfiling %v: %s: ours %d, upstream %d; want ours served, upstream 404", profiling, key, ours[key], upstream[key])
				}
				continue
			}
			if ours[key] != upstream[key] {
				t.Errorf("enableProfiling %v: %s: ours %d, upstream %d", profiling, key, ours[key], upstream[key])
			}
		}
		t.Logf("enableProfiling %v:\n%s", profiling, table.String())
	}

	for _, key := range slices.Sorted(maps.Keys(zForms["upstream"])) {
		if ours, upstream := zForms["ours"][key], zForms["upstream"][key]; ours != upstream {
			t.Errorf("%s:\nours:     %s\nupstream: %s", key, strings.ReplaceAll(ours, "\n", "\n          "), strings.ReplaceAll(upstream, "\n", "\n          "))
		} else {
			answer, _, _ := strings.Cut(ours, "\n")
			t.Logf("%s: %s, as upstream's", key, answer)
		}
	}

	var ours, upstream any
	if err := json.Unmarshal([]byte(configz["ours"]), &ours); err != nil {
		t.Fatalf("our /configz: %v\n%s", err, configz["ours"])
	}
	if err := json.Unmarshal([]byte(configz["upstream"]), &upstream); err != nil {
		t.Fatalf("upstream's /configz: %v\n%s", err, configz["upstream"])
	}
	for _, diff := range jsonDiff("", ours, upstream) {
		t.Errorf("/configz differs from upstream's: %s", diff)
	}
	if !strings.Contains(configz["ours"], `"kubeconfig":"`+cluster.KubeProxyKubeconfig+`"`) {
		t.Errorf("our /configz does not show the kubeconfig's path %s:\n%s", cluster.KubeProxyKubeconfig, configz["ours"])
	}
	secrets, err := os.ReadFile(cluster.KubeProxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(secrets), "\n") {
		if _, value, ok := strings.Cut(line, ": "); ok && len(value) > 20 && value != cluster.KubeProxyKubeconfig && strings.Contains(configz["ours"], value) {
			t.Errorf("our /configz shows the kubeconfig's %q", line)
		}
	}
}

// zPageAccepts are the Accept headers /flagz and /statusz are asked with
// (%s is the page's kind): each structured form upstream's z-pages serve,
// and what they refuse.
var zPageAccepts = []string{
	"application/json;v=v1beta1;g=config.k8s.io;as=%s",
	"application/json;v=v1alpha1;g=config.k8s.io;as=%s",
	"application/yaml;v=v1beta1;g=config.k8s.io;as=%s",
	"*/*;v=v1beta1;g=config.k8s.io;as=%s",
	"application/json",
	"application/yaml",
	"text/html",
	"application/cbor;v=v1beta1;g=config.k8s.io;as=%s",
	"text/plain;v=v1beta1;g=config.k8s.io;as=%s",
	"application/json;v=v1;g=config.k8s.io;as=%s",
}

// zPageForms asks the node's metrics server for /flagz and /statusz with
// each of zPageAccepts and sums up each answer: its status code, content
// type and warning, and the shape of its body: of a Status, all of it; of
// a Flagz or Statusz, its fields, with the values of those that say what
// it is, the flags' names, the paths and the emulated version (the other
// values are the process's own).
func zPageForms(t *testing.T, run string) map[string]string {
	t.Helper()
	forms := map[string]string{}
	for path, kind := range map[string]string{"/flagz": "Flagz", "/statusz": "Statusz"} {
		for _, accept := range zPageAccepts {
			if strings.Contains(accept, "%s") {
				accept = fmt.Sprintf(accept, kind)
			}
			out, err := cluster.Node.Exec("curl", "-sS", "--max-time", "2", "-H", "Accept: "+accept,
				"-w", "\n%{http_code} %{content_type} %header{warning}", "http://127.0.0.1:10249"+path)
			if err != nil {
				t.Fatalf("%s: %s with Accept %s: %v", run, path, accept, err)
			}
			body, answer := out[:strings.LastIndex(out, "\n")], out[strings.LastIndex(out, "\n")+1:]
			var fields map[string]any
			if err := yaml.Unmarshal([]byte(body), &fields); err != nil { // YAML or JSON
				t.Fatalf("%s: %s with Accept %s: %v\n%s", run, path, accept, err, body)
			}
			var shape []string
			for _, key := range slices.Sorted(maps.Keys(fields)) {
				switch value := fields[key]; {
				case fields["kind"] == "Status", key == "kind", key == "apiVersion", key == "metadata", key == "paths", key == "emulationVersion":
					shape = append(shape, fmt.Sprintf("%s=%v", key, value))
				case key == "flags":
					flags, _ := value.(map[string]any)
					shape = append(shape, fmt.Sprintf("flags=%v", slices.Sorted(maps.Keys(flags))))
				default:
					shape = append(shape, key)
				}
			}
			forms[path+" "+accept] = strings.TrimSpace(answer) + "\n" + strings.Join(shape, " ")
		}
	}
	return forms
}

// nodeGet fetches url from the node namespace (its loopback) and returns
// the status code.
func nodeGet(url string) (int, error) {
	out, err := cluster.Node.Exec("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", url)
	if err != nil {
		return 0, fmt.Errorf("%w: %s", err, out)
	}
	var code int
	_, err = fmt.Sscan(out, &code)
	return code, err
}

// jsonDiff lists where two decoded JSON values differ, by path.
func jsonDiff(path string, a, b any) []string {
	am, aMap := a.(map[string]any)
	bm, bMap := b.(map[string]any)
	if aMap && bMap {
		var out []string
		for k, v := range am {
			out = append(out, jsonDiff(path+"."+k, v, bm[k])...)
		}
		for k, v := range bm {
			if _, ok := am[k]; !ok {
				out = append(out, fmt.Sprintf("%s.%s: ours none, upstream %v", path, k, v))
			}
		}
		slices.Sort(out)
		return out
	}
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	if string(aj) != string(bj) {
		return []string{fmt.Sprintf("%s: ours %s, upstream %s", path, aj, bj)}
	}
	return nil
}

// The ClusterRole of deploy/ is exactly what our kube-proxy uses: bound to
// a ServiceAccount of the real API server (which authorizes with RBAC),
// its token is enough for our kube-proxy to sync, serve traffic and record
// its start event in both modes without a request refused; and without any
// one of its rules, our kube-proxy (in nftables mode, which uses them all)
// is refused that resource.
func TestDeployRBACIsExactlyWhatKubeProxyUses(t *testing.T) {
	ctx := context.Background()
	client, mapper, err := cluster.DynamicClient()
	if err != nil {
		t.Fatal(err)
	}
	var role *unstructured.Unstructured
	var account string
	for _, obj := range render(t, deploy.Base).Objects {
		switch obj.GetKind() {
		case "ClusterRole":
			role = obj
		case "ServiceAccount":
			account = obj.GetName()
		case "ClusterRoleBinding":
		default:
			continue
		}
		res := resourceFor(t, client, mapper, obj)
		if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		t.Cleanup(func() { _ = res.Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}) })
	}
	if role == nil || account == "" {
		t.Fatal("deploy/base has no ClusterRole or ServiceAccount")
	}
	kubeconfig := tokenKubeconfig(t, "kube-system", account)
	start := func(t *testing.T, mode string) *framework.KubeProxy {
		t.Helper()
		stopProxy() // the next test that needs the shared one starts it again
		started++
		config := strings.Replace(cluster.KubeProxyConfig(proxyConfig(mode)), cluster.KubeProxyKubeconfig, kubeconfig, 1)
		proxy, err := cluster.StartKubeProxy(fmt.Sprintf("kube-proxy-rbac-%s-%d", mode, started), cluster.KubeProxy(), config)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Stop)
		return proxy
	}

	for _, mode := range modes {
		t.Run("enough/"+mode, func(t *testing.T) {
			since := time.Now().Add(-time.Second)
			proxy := start(t, mode)
			if err := proxy.WaitHealthy(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			addPod(t, "rbac-a", framework.PodOptions{Labels: map[string]string{"app": "rbac"}})
			client := addPod(t, "rbac-client", framework.PodOptions{})
			svc := createService(t, service("rbac", "rbac", v1.ProtocolTCP))
			eventually(t, convergence, "the client pod to the service", func() error {
				_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "rbac-a")
				return err
			})
			eventually(t, 30*time.Second, "kube-proxy's start event", func() error {
				events, err := cluster.Client.EventsV1().Events(framework.DefaultNamespace).List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				for _, e := range events.Items {
					if e.Reason == "Starting" && e.ReportingController == "kube-proxy" && e.Regarding.Name == framework.NodeName && e.EventTime.After(since) {
						return nil
					}
				}
				return fmt.Errorf("none among %d events", len(events.Items))
			})
			if log, _ := os.ReadFile(proxy.LogPath); strings.Contains(string(log), "forbidden") {
				t.Errorf("our kube-proxy was refused something:\n%s", grepLines(string(log), "forbidden"))
			}
		})
	}

	t.Run("each rule needed", func(t *testing.T) {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		res := resourceFor(t, client, mapper, role)
		t.Cleanup(func() {
			_ = unstructured.SetNestedSlice(role.Object, rules, "rules")
			if current, err := res.Get(context.Background(), role.GetName(), metav1.GetOptions{}); err == nil {
				role.SetResourceVersion(current.GetResourceVersion())
				_, _ = res.Update(context.Background(), role, metav1.UpdateOptions{})
			}
		})
		for i, rule := range rules {
			resource := rule.(map[string]any)["resources"].([]any)[0].(string)
			t.Run(resource, func(t *testing.T) {
				current, err := res.Get(ctx, role.GetName(), metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				fewer := slices.Delete(slices.Clone(rules), i, i+1)
				if err := unstructured.SetNestedSlice(current.Object, fewer, "rules"); err != nil {
					t.Fatal(err)
				}
				if _, err := res.Update(ctx, current, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				proxy := start(t, nftablesMode)
				refused := fmt.Sprintf("cannot %%s resource %q", resource)
				eventually(t, 30*time.Second, "our kube-proxy refused "+resource, func() error {
					raw, _ := os.ReadFile(proxy.LogPath)
					log := strings.ReplaceAll(string(raw), `\"`, `"`) // klog quotes the error
					for _, verb := range []string{"list", "get", "create", "watch", "patch"} {
						if strings.Contains(log, fmt.Sprintf(refused, verb)) {
							return nil
						}
					}
					return fmt.Errorf("no %q in its log", refused)
				})
			})
		}
	})
}

// tokenKubeconfig writes a kubeconfig for the cluster's API server that
// authenticates with a token of the ServiceAccount (TokenRequest API).
func tokenKubeconfig(t *testing.T, namespace, account string) string {
	t.Helper()
	expiry := int64(3600)
	token, err := cluster.Client.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	config, err := clientcmd.LoadFromFile(cluster.KubeProxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	user := config.Contexts[config.CurrentContext].AuthInfo
	config.AuthInfos[user].ClientCertificate, config.AuthInfos[user].ClientKey = "", ""
	config.AuthInfos[user].Token = token.Status.Token
	path := filepath.Join(t.TempDir(), "token.kubeconfig")
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// grepLines are the lines of text that hold s.
func grepLines(text, s string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// Another host on the node's link cannot reach what listens on the node's
// 127.0.0.1 (CVE-2020-8558): a SYN from the external namespace to
// 127.0.0.1 on the node gets no answer. In iptables mode, which turns
// route_localnet on for NodePorts on localhost, the KUBE-FIREWALL rule
// drops it (its counter shows it), while the node itself reaches a
// NodePort on 127.0.0.1. A SYN to 127.0.0.1:<nodePort> gets the answer
// upstream's kube-proxy gives, which is the pod's SYN-ACK: its rules DNAT
// it in PREROUTING like any local address, and the guard, in INPUT, lets
// DNATed packets through; it reaches nothing the node's own IP does not
// already offer at that port. In nftables mode, as
// upstream's, route_localnet stays off and the kernel drops them. The same
// SYN to the node's own address is answered, which shows the probe works.
func TestLocalhostIsClosedToOtherHosts(t *testing.T) {
	// What listens on the node's loopback only, as the CVE's local services.
	local := netip.MustParseAddrPort("127.0.0.1:10999")
	stopListening, err := cluster.Node.ListenTCP(local)
	if err != nil {
		t.Fatal(err)
	}
	defer stopListening()
	addPod(t, "localnet-a", framework.PodOptions{Labels: map[string]string{"app": "localnet"}})
	svc := service("localnet", "localnet", v1.ProtocolTCP)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc = createService(t, svc)
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	from := netip.AddrPortFrom(netip.MustParseAddr(framework.ExternalIPv4), 0)
	syn := func(t *testing.T, dst netip.AddrPort) framework.SYNReply {
		t.Helper()
		from = netip.AddrPortFrom(from.Addr(), 40000+from.Port()%20000+1)
		reply, err := cluster.External.RawSYN("eth0", cluster.Node, "eth1", from, dst, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	// The node's primary IP: the nftables mode's NodePorts answer there only.
	toNode := netip.AddrPortFrom(netip.MustParseAddr(framework.NodeIPv4), nodePort)
	toLoopbackNodePort := netip.AddrPortFrom(local.Addr(), nodePort)

	t.Run(iptablesMode, func(t *testing.T) {
		useOurProxy(t, iptablesMode)
		if got, _ := cluster.Node.Exec("sysctl", "-n", "net.ipv4.conf.all.route_localnet"); strings.TrimSpace(got) != "1" {
			t.Fatalf("route_localnet is %q in iptables mode, want 1", got)
		}
		eventually(t, convergence, "the node to 127.0.0.1:nodePort", func() error {
			_, err := answeredBy(cluster.Node, "tcp", "127.0.0.1", int32(nodePort), "localnet-a")
			return err
		})
		eventually(t, convergence, "a SYN to the node's IP and node port", func() error {
			if reply := syn(t, toNode); reply != framework.SYNACK {
				return fmt.Errorf("%s", reply)
			}
			return nil
		})
		guard := func() string {
			out, err := cluster.Node.Exec("iptables-nft", "-w", "-t", "filter", "-L", "KUBE-FIREWALL", "-n", "-v", "-x")
			if err != nil {
				t.Fatalf("listing KUBE-FIREWALL: %v: %s", err, out)
			}
			line := grepLines(out, "block incoming localnet connections")
			if !strings.Contains(line, "DROP") {
				t.Fatalf("KUBE-FIREWALL has no localnet guard:\n%s", out)
			}
			return strings.Fields(line)[0] // packets
		}
		before := guard()
		if reply := syn(t, local); reply != framework.NoReply {
			t.Errorf("a SYN from the external namespace to %s on the node: %s, want no reply", local, reply)
		}
		if after := guard(); after == before {
			t.Errorf("the localnet guard dropped no packet (%s before and after)", before)
		}
		ours := syn(t, toLoopbackNodePort)
		switchProxy(t, false, iptablesMode)
		defer switchProxy(t, true, iptablesMode)
		if upstream := syn(t, toLoopbackNodePort); ours != upstream {
			t.Errorf("a SYN from the external namespace to %s: ours %s, upstream's %s", toLoopbackNodePort, ours, upstream)
		} else {
			t.Logf("a SYN from the external namespace to %s: %s, as upstream's", toLoopbackNodePort, ours)
		}
		if reply := syn(t, local); reply != framework.NoReply {
			t.Errorf("upstream's: a SYN from the external namespace to %s: %s, want no reply", local, reply)
		}
	})

	t.Run(nftablesMode, func(t *testing.T) {
		// A node that runs the nftables mode only: route_localnet off.
		if err := cluster.Node.Sysctl("net.ipv4.conf.all.route_localnet", "0"); err != nil {
			t.Fatal(err)
		}
		switchProxy(t, true, nftablesMode)
		eventually(t, convergence, "a SYN to the node's IP and node port", func() error {
			if reply := syn(t, toNode); reply != framework.SYNACK {
				return fmt.Errorf("%s", reply)
			}
			return nil
		})
		if got, _ := cluster.Node.Exec("sysctl", "-n", "net.ipv4.conf.all.route_localnet"); strings.TrimSpace(got) != "0" {
			t.Errorf("route_localnet is %q in nftables mode, want 0 (left alone)", got)
		}
		for _, dst := range []netip.AddrPort{local, toLoopbackNodePort} {
			if reply := syn(t, dst); reply != framework.NoReply {
				t.Errorf("a SYN from the external namespace to %s on the node: %s, want no reply", dst, reply)
			}
		}
	})
}

// /debug/services and /debug/trace (verify=1 included, which reads the
// kernel) answer only the node itself, though metricsBindAddress is
// 0.0.0.0:10249 as for Prometheus: from the external namespace, from a
// pod and from the host, each reaching the node's address, /metrics
// answers and they are refused with 403; from the node, to 127.0.0.1 and
// to its own address, they answer (and kube-proxy-explain with them).
// verify=1 reads the kernel at most once a second: a second request at
// once gets 429 with Retry-After. KUBE_PROXY_DEBUG_ENDPOINTS=all opens
// them to every client; another value stops the start, naming it.
func TestDebugEndpointsAnswerOnlyTheNode(t *testing.T) {
	useOurProxy(t, iptablesMode)
	client := addPod(t, "debug-client", framework.PodOptions{})
	svc := createService(t, service("debug-access", "debug-access", v1.ProtocolTCP))
	trace := "/debug/trace?source=" + client.IPv4 + "&destination=" + svc.Spec.ClusterIP + "&port=80&from=pod"
	const explained = "/debug/services/default/debug-access"
	paths := []string{"/debug/services", explained, explained + "?verify=1", trace, trace + "&verify=1", explained + "?format=text&verify=1"}
	eventually(t, convergence, "the service programmed", func() error {
		code, body, err := nodeAsk("http://127.0.0.1:10249" + explained)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("%d %v: %s", code, err, body)
		}
		return nil
	})
	remote := "http://" + framework.NodeIPv4 + ":10249"

	refused := func(t *testing.T, from string, ask func(url string) (int, string, error)) {
		t.Helper()
		if code, _, err := ask(remote + "/metrics"); err != nil || code != http.StatusOK {
			t.Errorf("%s: /metrics: %d %v, want 200", from, code, err)
		}
		for _, path := range paths {
			code, body, err := ask(remote + path)
			if err != nil || code != http.StatusForbidden || !strings.Contains(body, "answers clients on this node only") || !strings.Contains(body, "KUBE_PROXY_DEBUG_ENDPOINTS=all") {
				t.Errorf("%s: %s: %d %v %q, want 403 saying how to ask", from, path, code, err, body)
			}
		}
	}
	fromHost := func(url string) (int, string, error) {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	others := func(t *testing.T) {
		refused(t, "the external namespace", func(url string) (int, string, error) { return askFrom(cluster.External, url) })
		refused(t, "a pod", func(url string) (int, string, error) { return askFrom(client.Netns, url) })
		refused(t, "the host", fromHost)
	}
	others(t)

	// The node itself, to 127.0.0.1 and to its own address; a
	// verification a second after the last.
	for _, base := range []string{"http://127.0.0.1:10249", remote} {
		for _, path := range paths {
			time.Sleep(explain.VerifyInterval)
			if code, body, err := nodeAsk(base + path); err != nil || code != http.StatusOK {
				t.Errorf("the node: %s%s: %d %v %q, want 200", base, path, code, err, body)
			}
		}
	}
	if code, stdout, stderr := explainOnTheNode(t, "default/debug-access", "--verify"); code != 0 || !strings.Contains(stdout, "verify:") {
		t.Errorf("kube-proxy-explain default/debug-access --verify on the node: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// Two verifications at once: the second is told when to ask again.
	time.Sleep(explain.VerifyInterval)
	out, err := cluster.Node.Exec("sh", "-c", `for i in 1 2; do curl -sS -o /dev/null -D - --max-time 10 "$1"; done`, "sh", "http://127.0.0.1:10249"+explained+"?verify=1")
	statuses := grepLines(out, "HTTP/")
	if err != nil || !strings.Contains(statuses, " 200") || !strings.Contains(statuses, " 429") || !strings.Contains(out, "Retry-After: 1") {
		t.Errorf("two verifications at once: %v\n%s\nwant 200, then 429 with Retry-After: 1", err, out)
	}
	if code, _, err := nodeAsk("http://127.0.0.1:10249" + explained); err != nil || code != http.StatusOK {
		t.Errorf("an explanation without verify, right after: %d %v, want 200 (not limited)", code, err)
	}

	// Opened to every client.
	proxyMu.Lock()
	startProxyLocked(t, true, iptablesMode, []string{"env", explain.AccessEnv + "=all"}, proxyConfig(iptablesMode))
	proxyMu.Unlock()
	defer switchProxy(t, true, iptablesMode) // the default again for the next tests
	eventually(t, convergence, "the service programmed", func() error {
		code, body, err := askFrom(cluster.External, remote+explained)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("%d %v: %s", code, err, body)
		}
		return nil
	})
	for name, ask := range map[string]func(string) (int, string, error){
		"the external namespace": func(url string) (int, string, error) { return askFrom(cluster.External, url) },
		"a pod":                  func(url string) (int, string, error) { return askFrom(client.Netns, url) },
		"the host":               fromHost,
	} {
		for _, path := range paths {
			time.Sleep(explain.VerifyInterval)
			if code, body, err := ask(remote + path); err != nil || code != http.StatusOK {
				t.Errorf("with %s=all, %s: %s: %d %v %q, want 200", explain.AccessEnv, name, path, code, err, body)
			}
		}
	}

	// A value it does not know stops the start.
	started++
	bad, err := cluster.StartKubeProxyUnder(fmt.Sprintf("kube-proxy-bad-access-%d", started), []string{"env", explain.AccessEnv + "=everyone"},
		cluster.KubeProxy(), cluster.KubeProxyConfig(proxyConfig(iptablesMode)))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Stop()
	select {
	case <-bad.Exited():
		if log := bad.LogTail(5); !strings.Contains(log, explain.AccessEnv+`="everyone": want loopback (the default`) {
			t.Errorf("kube-proxy with %s=everyone exited (%v) without naming it:\n%s", explain.AccessEnv, bad.Err(), log)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("kube-proxy with %s=everyone still runs after 30s:\n%s", explain.AccessEnv, bad.LogTail(5))
	}
}
