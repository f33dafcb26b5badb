package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/test/framework"
	v1 "k8s.io/api/core/v1"
)

// servedService makes a single-stack TCP service over two pods labelled
// app=name and a client pod, and waits until the service answers.
func servedService(t *testing.T, name string) (*v1.Service, *framework.Pod) {
	t.Helper()
	addPod(t, name+"-a", framework.PodOptions{Labels: map[string]string{"app": name}})
	addPod(t, name+"-b", framework.PodOptions{Labels: map[string]string{"app": name}})
	client := addPod(t, name+"-client", framework.PodOptions{})
	svc := service(name, name, v1.ProtocolTCP)
	svc.Spec.IPFamilyPolicy = ptrTo(v1.IPFamilyPolicySingleStack)
	svc = createService(t, svc)
	answersTheNode(t, net.JoinHostPort(svc.Spec.ClusterIP, "80"))
	eventually(t, convergence, "the service answers", func() error {
		_, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, name+"-a", name+"-b")
		return err
	})
	return svc, client
}

// answersTheNode waits until the service at target answers the node. Wait
// there, not from a client pod that goes on to load the service: a request
// it sent before the rules existed leaves a conntrack flow that no DNAT
// changed, and a later connection that reuses its source port within 2
// minutes follows that flow past the rules (docs/reliability.md).
func answersTheNode(t *testing.T, target string) {
	t.Helper()
	eventually(t, convergence, "the service answers the node", func() error {
		_, err := cluster.Node.Request("tcp", target, time.Second)
		return err
	})
}

// startLoad starts a client loop from the pod to the service's port 80.
func startLoad(t *testing.T, client *framework.Pod, svc *v1.Service, d time.Duration) *framework.Load {
	t.Helper()
	load, err := client.Netns.StartLoad("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), d, loadInterval)
	if err != nil {
		t.Fatal(err)
	}
	return load
}

// waitLoad waits for the load, logs what it saw and returns it.
func waitLoad(t *testing.T, what string, load *framework.Load) framework.LoadResult {
	t.Helper()
	seen, err := load.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s", what, seen)
	return seen
}

// reachesPod waits until requests through the service reach pod.
func reachesPod(t *testing.T, client *framework.Pod, svc *v1.Service, pod string) {
	t.Helper()
	reachesPodWithin(t, client, svc, pod, time.Minute)
}

func reachesPodWithin(t *testing.T, client *framework.Pod, svc *v1.Service, pod string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, pod+" answers through the service", func() error {
		for range 30 {
			if r, err := client.Netns.Request("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), time.Second); err == nil && r.Pod == pod {
				return nil
			}
		}
		return fmt.Errorf("30 requests did not reach %s", pod)
	})
}

// modeTable is the nftables table holding a mode's service rules (the
// iptables mode's through iptables-nft).
func modeTable(mode string) (family, table string) {
	if mode == nftablesMode {
		return "ip", "kube-proxy"
	}
	return "ip", "nat"
}

// serviceChain is the chain of a service's port "tcp" in the mode.
func serviceChain(mode, name string) string {
	if mode == nftablesMode {
		return framework.NFTablesServiceChain(framework.DefaultNamespace, name, "tcp", "tcp")
	}
	return framework.ServiceChain(framework.DefaultNamespace, name, "tcp", "tcp")
}

func tableRules(t *testing.T, mode string) map[string][]framework.TableRule {
	t.Helper()
	rules, err := cluster.Node.TableRules(modeTable(mode))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// sameTexts tells whether two listings hold the same rules, handles aside.
func sameTexts(a, b map[string][]framework.TableRule) bool {
	return maps.EqualFunc(a, b, func(x, y []framework.TableRule) bool {
		return slices.EqualFunc(x, y, func(r, s framework.TableRule) bool { return r.Text == s.Text })
	})
}

// logSize and logSince read our kube-proxy's log from a point on.
func logSize(t *testing.T) int64 {
	t.Helper()
	info, err := os.Stat(running.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

func logSince(t *testing.T, offset int64) string {
	t.Helper()
	data, err := os.ReadFile(running.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(data[min(int64(len(data)), offset):])
}

// healthCodes are the status codes /healthz and /livez answered, counted.
type healthCodes map[string]map[int]int

func (h healthCodes) poll() {
	for _, path := range []string{"/healthz", "/livez"} {
		code := 0
		if resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + net.JoinHostPort(framework.NodeIPv4, "10256") + path); err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		if h[path] == nil {
			h[path] = map[int]int{}
		}
		h[path][code]++
	}
}

// onlyOK tells whether every answer was 200.
func (h healthCodes) onlyOK() bool {
	for _, codes := range h {
		for code := range codes {
			if code != http.StatusOK {
				return false
			}
		}
	}
	return true
}

// apiServerLists counts the LIST requests the API server served per
// resource since it started.
func apiServerLists(t *testing.T) map[string]float64 {
	t.Helper()
	body, err := cluster.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	samples, err := framework.ParseMetrics(string(body))
	if err != nil {
		t.Fatal(err)
	}
	lists := map[string]float64{}
	for _, s := range samples {
		if s.Name == "apiserver_request_total" && s.Labels["verb"] == "LIST" {
			lists[s.Labels["resource"]] += s.Value
		}
	}
	return lists
}
