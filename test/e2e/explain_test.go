package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// explanation fetches our kube-proxy's explanation of a default-namespace
// service from the node's metrics address.
func explanation(name, query string) (proxy.Explanation, error) {
	var e proxy.Explanation
	url := "http://" + net.JoinHostPort(framework.NodeIPv4, "10249") + "/debug/services/" + framework.DefaultNamespace + "/" + name + query
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return e, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return e, fmt.Errorf("%d: %s", resp.StatusCode, body)
	}
	return e, json.Unmarshal(body, &e)
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

	lacks := deleteRuleToLocalEndpoint(t, mode, sp.Kernel.Objects)
	e, err := explanation("explain", "?verify=1")
	if err != nil {
		t.Fatal(err)
	}
	if v := e.ServicePorts[0].Kernel.Verify; v == nil || len(v.Differences) != 1 || !strings.HasPrefix(v.Differences[0], lacks+" ") {
		t.Errorf("verify after deleting a rule: %+v, want %q", v, lacks)
	}

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
