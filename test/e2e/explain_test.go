package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/pkg/explain"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// explanation fetches our kube-proxy's explanation of a default-namespace
// service from the metrics server, asked on the node (it answers no other
// client), again after a 429 (a verification ran less than a second ago).
func explanation(name, query string) (proxy.Explanation, error) {
	var e proxy.Explanation
	url := "http://127.0.0.1:10249/debug/services/" + framework.DefaultNamespace + "/" + name + query
	for attempt := 0; ; attempt++ {
		code, body, err := nodeAsk(url)
		if err != nil {
			return e, err
		}
		if code == http.StatusTooManyRequests && attempt < 10 {
			time.Sleep(explain.VerifyInterval)
			continue
		}
		if code != http.StatusOK {
			return e, fmt.Errorf("%d: %s", code, body)
		}
		return e, json.Unmarshal([]byte(body), &e)
	}
}

// nodeAsk gets url with curl in the node namespace (extra are more of
// curl's arguments) and returns the status code and body.
func nodeAsk(url string, extra ...string) (int, string, error) {
	return askFrom(cluster.Node, url, extra...)
}

// askFrom is nodeAsk from another namespace.
func askFrom(ns *framework.Netns, url string, extra ...string) (int, string, error) {
	args := append([]string{"curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}"}, extra...)
	out, err := ns.Exec(append(args, url)...)
	if err != nil {
		return 0, "", fmt.Errorf("curl %s: %w: %s", url, err, out)
	}
	i := strings.LastIndex(out, "\n")
	var code int
	if _, err := fmt.Sscan(out[i+1:], &code); err != nil {
		return 0, "", fmt.Errorf("curl %s: %q: %w", url, out, err)
	}
	return code, out[:i], nil
}

// The node explains a service whose endpoints are a mix of ready,
// terminating, not ready, other-zone and remote ones: each gets its
// reason; a rule deleted by hand from one of the service's chains shows
// up under verify, in the JSON and through kube-proxy-explain on the node.
func TestExplainAServiceOnTheNode(t *testing.T) {
	inEachMode(t, explainAServiceOnTheNode)
}

func explainAServiceOnTheNode(t *testing.T, mode string) {
	ctx := context.Background()
	svc := framework.SelectorlessService("explain", 80, 8080)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	createService(t, svc)
	endpoint := func(ip, node, zone string, ready, serving, terminating bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptrTo(node), Zone: ptrTo(zone),
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(ready), Serving: ptrTo(serving), Terminating: ptrTo(terminating)},
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}}
	}
	slice := framework.ManualEndpointSlice("explain", 8080)
	slice.Endpoints = []discoveryv1.Endpoint{
		endpoint("10.244.0.200", framework.NodeName, framework.Zone, true, true, false),
		endpoint("10.244.0.201", framework.NodeName, framework.Zone, false, true, true),
		endpoint("10.244.0.202", framework.NodeName, framework.Zone, false, false, false),
		endpoint("10.244.1.200", framework.RemoteNodeName, "zone-b", true, true, false),
		endpoint("10.244.1.201", framework.RemoteNodeName, framework.Zone, true, true, false),
	}
	slices := cluster.Client.DiscoveryV1().EndpointSlices(framework.DefaultNamespace)
	if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slices.Delete(context.Background(), slice.Name, metav1.DeleteOptions{}) })

	want := strings.Join([]string{
		"10.244.0.200:8080 used used",
		"10.244.0.201:8080 TerminatingWhileOthersReady TerminatingWhileOthersReady",
		"10.244.0.202:8080 NotReady NotReady",
		"10.244.1.200:8080 HintedForOtherZone NotOnThisNode",
		"10.244.1.201:8080 used NotOnThisNode",
	}, "\n")
	var e proxy.Explanation
	eventually(t, convergence, "the explanation gives each endpoint's reasons, and the kernel agrees", func() error {
		var err error
		if e, err = explanation("explain", "?verify=1"); err != nil {
			return err
		}
		if len(e.ServicePorts) != 1 {
			return fmt.Errorf("%d service ports", len(e.ServicePorts))
		}
		sp := e.ServicePorts[0]
		var got []string
		for _, ep := range sp.Endpoints {
			got = append(got, ep.Address+" "+verdict(ep.Cluster)+" "+verdict(ep.Local))
		}
		if strings.Join(got, "\n") != want {
			return fmt.Errorf("endpoints:\n%s", strings.Join(got, "\n"))
		}
		if v := sp.Kernel.Verify; v == nil || v.Error != "" || len(v.Differences) > 0 {
			return fmt.Errorf("verify: %+v", v)
		}
		return nil
	})
	sp := e.ServicePorts[0]
	if e.Node != framework.NodeName || e.Zone != framework.Zone || sp.ExternalTrafficPolicy != "Local" || sp.LastSynced == nil || sp.Kernel.Mode != mode {
		t.Errorf("explanation: %+v", e)
	}

	// kube-proxy restores a deleted rule within about a second, and reads
	// the kernel for at most one verification a second: each check
	// deletes the rule once the last verification is a second old.
	time.Sleep(explain.VerifyInterval)
	lacks := deleteRuleToLocalEndpoint(t, mode, sp.Kernel.Objects)
	e, err := explanation("explain", "?verify=1")
	if err != nil {
		t.Fatal(err)
	}
	if v := e.ServicePorts[0].Kernel.Verify; v == nil || len(v.Differences) != 1 || !strings.HasPrefix(v.Differences[0], lacks+" ") {
		t.Errorf("verify after deleting a rule: %+v, want %q", v, lacks)
	}
	eventually(t, convergence, "the deleted rule restored", func() error {
		e, err := explanation("explain", "?verify=1")
		if err != nil {
			return err
		}
		if v := e.ServicePorts[0].Kernel.Verify; v == nil || v.Error != "" || len(v.Differences) > 0 {
			return fmt.Errorf("verify: %+v", v)
		}
		return nil
	})
	time.Sleep(explain.VerifyInterval)
	lacks = deleteRuleToLocalEndpoint(t, mode, sp.Kernel.Objects)

	out, err := cluster.Node.Command(cluster.KubeProxyExplain(), "default/explain", "--verify").CombinedOutput()
	if err != nil {
		t.Fatalf("kube-proxy-explain: %v\n%s", err, out)
	}
	for _, line := range []string{
		"not on this node, and the policy is Local",
		"hinted for zone zone-b; this node is in zone zone-a",
		"terminating; used only while no endpoint is ready",
		"verify: 1 difference from what this node wants",
		"- " + lacks,
	} {
		if !strings.Contains(string(out), line) {
			t.Errorf("kube-proxy-explain's table lacks %q:\n%s", line, out)
		}
	}
	t.Logf("kube-proxy-explain default/explain --verify:\n%s", out)
}

// deleteRuleToLocalEndpoint deletes by hand, as an administrator would,
// the first rule of the chain that leads to the local ready endpoint
// 10.244.0.200:8080 (iptables: its endpoint chain; nftables: the service's
// local chain, the only one sending to it alone), and returns how verify
// begins to name the rule it lacks.
func deleteRuleToLocalEndpoint(t *testing.T, mode string, objects []proxy.KernelObject) string {
	t.Helper()
	chain := ""
	for _, o := range objects {
		switch {
		case mode == iptablesMode && o.Kind == "chain" && strings.HasSuffix(o.Summary, "to 10.244.0.200:8080"):
			chain = strings.TrimPrefix(o.Name, "nat ")
		case mode == nftablesMode && o.Kind == "chain" && strings.HasPrefix(o.Name, "ip kube-proxy local-"):
			chain = strings.TrimPrefix(o.Name, "ip kube-proxy ")
		}
	}
	if chain == "" {
		t.Fatalf("no chain leads to 10.244.0.200:8080 among %+v", objects)
	}
	if mode == iptablesMode {
		if out, err := cluster.Node.Command("iptables-nft", "-t", "nat", "-D", chain, "1").CombinedOutput(); err != nil {
			t.Fatalf("deleting the first rule of %q: %v: %s", chain, err, out)
		}
		return "nat " + chain + " lacks:"
	}
	// nft deletes a rule by its handle, which `nft -a` lists after it.
	out, err := cluster.Node.Command("nft", "-a", "list", "chain", "ip", "kube-proxy", chain).CombinedOutput()
	m := regexp.MustCompile(`dnat .* # handle (\d+)`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("listing %q with handles: %v: %s", chain, err, out)
	}
	if out, err := cluster.Node.Command("nft", "delete", "rule", "ip", "kube-proxy", chain, "handle", string(m[1])).CombinedOutput(); err != nil {
		t.Fatalf("deleting rule %s of %q: %v: %s", m[1], chain, err, out)
	}
	return "chain ip kube-proxy " + chain + " lacks:"
}

// verdict is "used" or the reason a path leaves the endpoint out.
func verdict(u *state.Use) string {
	if u.Used {
		return "used"
	}
	return string(u.Reason)
}

// explainOnTheNode runs kube-proxy-explain in the node namespace and
// returns its exit code, stdout and stderr apart.
func explainOnTheNode(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := cluster.Node.Command(append([]string{cluster.KubeProxyExplain()}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Fatalf("kube-proxy-explain %q: %v", args, err)
	}
	return 0, stdout.String(), stderr.String()
}

// kube-proxy-explain on the node as an operator meets it: --help, -h and
// help (also of a subcommand) print to stdout, so that `| less` shows
// them, each with an example; --address takes a URL, with or without a
// trailing slash, as well as HOST:PORT, and a malformed one is a usage
// error saying what is wrong; and against upstream's kube-proxy, which
// serves neither /debug/services nor /debug/trace (its answer is Go's
// bare 404 page), it says that this kube-proxy is probably upstream's or
// an older one without explanations, and what to do.
func TestExplainCommandLine(t *testing.T) {
	useOurProxy(t, iptablesMode)
	createService(t, service("explain-cli", "explain-cli", v1.ProtocolTCP))
	eventually(t, convergence, "the service programmed", func() error {
		_, body, err := nodeAsk("http://127.0.0.1:10249/debug/services/default/explain-cli")
		if err != nil || !strings.Contains(body, `"servicePorts"`) {
			return fmt.Errorf("%v: %s", err, body)
		}
		return nil
	})

	const main, trace, preflight = "Usage: kube-proxy-explain [NAMESPACE/NAME]", "Usage: kube-proxy-explain trace ", "Usage: kube-proxy-explain preflight "
	for _, tc := range []struct {
		args  []string
		usage string
	}{
		{[]string{"--help"}, main}, {[]string{"-h"}, main}, {[]string{"help"}, main}, {[]string{"default/explain-cli", "--help"}, main},
		{[]string{"help", "trace"}, trace}, {[]string{"trace", "--help"}, trace}, {[]string{"trace", "-h"}, trace},
		{[]string{"help", "preflight"}, preflight}, {[]string{"preflight", "--help"}, preflight},
	} {
		code, stdout, stderr := explainOnTheNode(t, tc.args...)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, tc.usage) || !strings.Contains(stdout, "\nExamples:\n") || !strings.Contains(stdout, "\n  kube-proxy-explain ") {
			t.Errorf("kube-proxy-explain %q: exit %d, stderr %q, stdout:\n%s\nwant exit 0, nothing on stderr, and on stdout %q... with examples", tc.args, code, stderr, stdout, tc.usage)
		}
	}
	if code, _, stderr := explainOnTheNode(t, "help", "nope"); code != 2 || !strings.Contains(stderr, `no subcommand "nope"`) {
		t.Errorf("kube-proxy-explain help nope: exit %d, stderr %q", code, stderr)
	}

	for _, address := range []string{"127.0.0.1:10249", "http://127.0.0.1:10249", "http://127.0.0.1:10249/", "http://localhost:10249"} {
		code, stdout, stderr := explainOnTheNode(t, "--address", address)
		if code != 0 || !strings.Contains(stdout, "SERVICE PORT") || !strings.Contains(stdout, "default/explain-cli:tcp") {
			t.Errorf("kube-proxy-explain --address %s: exit %d, stderr %q, stdout:\n%s", address, code, stderr, stdout)
		}
		code, stdout, stderr = explainOnTheNode(t, "default/explain-cli", "--address", address)
		if code != 0 || !strings.Contains(stdout, "Service default/explain-cli on node "+framework.NodeName) {
			t.Errorf("kube-proxy-explain default/explain-cli --address %s: exit %d, stderr %q, stdout:\n%s", address, code, stderr, stdout)
		}
	}
	for address, want := range map[string]string{
		"http://127.0.0.1":               `--address "http://127.0.0.1" has no port`,
		"127.0.0.1":                      `--address "127.0.0.1" has no port`,
		"http://127.0.0.1:10249/metrics": "without a path or query (e.g. http://127.0.0.1:10249)",
		"ftp://127.0.0.1:10249":          `the scheme is "ftp"; want http or https`,
	} {
		code, stdout, stderr := explainOnTheNode(t, "default/explain-cli", "--address", address)
		if code != 2 || stdout != "" || !strings.Contains(stderr, want) {
			t.Errorf("kube-proxy-explain --address %s: exit %d, stdout %q, stderr %q; want 2 and %q", address, code, stdout, stderr, want)
		}
	}

	switchProxy(t, false, iptablesMode)
	defer switchProxy(t, true, iptablesMode)
	eventually(t, 10*time.Second, "upstream's metrics server", func() error {
		_, err := nodeGet("http://127.0.0.1:10249/proxyMode")
		return err
	})
	if code, body, err := nodeAsk("http://127.0.0.1:10249/debug/services/default/explain-cli"); err != nil || code != http.StatusNotFound || strings.TrimSpace(body) != "404 page not found" {
		t.Fatalf("upstream's /debug/services: %d %q %v, want Go's 404 page", code, body, err)
	}
	for _, args := range [][]string{
		{"default/explain-cli"},
		{"default/explain-cli", "--verify"},
		{},
		{"trace", "--source", "10.244.0.9", "--destination", "10.96.0.10", "--port", "80", "--from", "pod"},
	} {
		code, stdout, stderr := explainOnTheNode(t, args...)
		path := "/debug/services"
		if len(args) > 0 && args[0] == "trace" {
			path = "/debug/trace"
		}
		for _, want := range []string{
			"(mode iptables, from /proxyMode) does not serve " + path,
			"it is probably upstream's kube-proxy, or an older rapidproxy without explanations",
			"Run rapidproxy's kube-proxy image on this node",
		} {
			if code != 1 || stdout != "" || !strings.Contains(stderr, want) {
				t.Errorf("kube-proxy-explain %q against upstream's kube-proxy: exit %d, stdout %q, stderr %q; want 1 and %q", args, code, stdout, stderr, want)
			}
		}
		if strings.HasPrefix(stderr, "404 page not found") {
			t.Errorf("kube-proxy-explain %q against upstream's kube-proxy prints the bare 404 page: %q", args, stderr)
		}
		if len(args) == 1 {
			t.Logf("kube-proxy-explain %s against upstream's kube-proxy: exit %d:\n%s", args[0], code, stderr)
		}
	}
}
