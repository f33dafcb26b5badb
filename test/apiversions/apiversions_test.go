// Package apiversions runs our kube-proxy against the API server versions
// an operator may have: the release it matches and older ones, since
// kube-proxy may be up to three minors older than the API server (never
// newer) and one image is kept across a control-plane upgrade. Each
// version gets its own local cluster, one after another: a service
// answers, an endpoint change is applied, and EndpointSlices and
// ServiceCIDRs are read.
//
// The control plane of the tools (hack/tools) always runs; older ones run
// when RAPIDPROXY_OLDER_CONTROL_PLANES names their directories, as
// `make e2e-apiversions` does: "v1.36=DIR,v1.35=DIR" (each built by
// hack/build-tools.sh hack/skew/vX.Y).
package apiversions

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// OlderControlPlanesEnv names the older control planes to test against.
const OlderControlPlanesEnv = "RAPIDPROXY_OLDER_CONTROL_PLANES"

// convergence bounds how long kube-proxy may take to act on a change: a
// deadline for correctness, not a speed measurement.
const convergence = 30 * time.Second

type controlPlane struct {
	version string // the major.minor the API server must report, e.g. "v1.36"
	dir     string // "" for the tools' own
}

func controlPlanes(t *testing.T) []controlPlane {
	planes := []controlPlane{{version: "v1.37"}}
	env := os.Getenv(OlderControlPlanesEnv)
	if env == "" {
		return planes
	}
	for _, entry := range strings.Split(env, ",") {
		version, dir, ok := strings.Cut(entry, "=")
		if !ok || !strings.HasPrefix(version, "v1.") || dir == "" {
			t.Fatalf("%s: %q is not vX.Y=DIR", OlderControlPlanesEnv, entry)
		}
		planes = append(planes, controlPlane{version: version, dir: dir})
	}
	return planes
}

func TestAgainstAPIServerVersions(t *testing.T) {
	testutil.RequireRoot(t)
	for _, plane := range controlPlanes(t) {
		t.Run(plane.version, func(t *testing.T) { againstControlPlane(t, plane) })
	}
}

func againstControlPlane(t *testing.T, plane controlPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cluster, err := framework.StartWith(ctx, framework.Options{ControlPlane: plane.dir})
	if err != nil {
		t.Fatalf("starting a cluster with the %s control plane: %v", plane.version, err)
	}
	defer cluster.Stop()

	info, err := cluster.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.GitVersion, plane.version+".") {
		t.Fatalf("the API server reports %s, want %s.x", info.GitVersion, plane.version)
	}
	t.Logf("API server %s", info.GitVersion)

	kp, err := cluster.StartKubeProxy("kube-proxy", cluster.KubeProxy(), cluster.KubeProxyConfig("mode: nftables\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		kp.Stop()
		if out, err := cluster.Node.Exec(cluster.KubeProxy(), "--config="+kp.ConfigPath, "--cleanup"); err != nil {
			t.Errorf("--cleanup: %v\n%s", err, out)
		}
	}()
	if err := kp.WaitHealthy(ctx, 2*time.Minute); err != nil {
		t.Fatalf("kube-proxy against API server %s: %v\n%s", info.GitVersion, err, kp.LogTail(30))
	}

	pod := func(name string, labels map[string]string) *framework.Pod {
		p, err := cluster.AddPod(ctx, name, framework.PodOptions{Labels: labels})
		if err != nil {
			t.Fatalf("adding pod %s: %v", name, err)
		}
		return p
	}
	pod("ver-a", map[string]string{"app": "ver"})
	client := pod("ver-client", nil)
	svc, err := cluster.Client.CoreV1().Services(framework.DefaultNamespace).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ver"},
		Spec: v1.ServiceSpec{
			Selector: map[string]string{"app": "ver"},
			Ports:    []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(svc.Spec.ClusterIP, "80")

	// EndpointSlices: the service answers from its one pod.
	answeredOnlyBy(t, client.Netns, target, "ver-a")

	// An endpoint change: a second pod joins, the first leaves.
	pod("ver-b", map[string]string{"app": "ver"})
	if err := cluster.RemovePod(ctx, "ver-a"); err != nil {
		t.Fatal(err)
	}
	answeredOnlyBy(t, client.Netns, target, "ver-b")

	// ServiceCIDRs: the table drops traffic to the unallocated addresses
	// of the cluster's service ranges, which only the ServiceCIDR objects
	// tell kube-proxy.
	v4Range, _, _ := strings.Cut(framework.ServiceCIDRs, ",")
	deadline := time.Now().Add(convergence)
	for {
		out, err := cluster.Node.Exec("nft", "list", "chain", "ip", "kube-proxy", "cluster-ips-check")
		if err == nil && strings.Contains(out, v4Range+" drop") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster-ips-check does not drop %s (ServiceCIDRs not read?): %v\n%s", v4Range, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Nothing kube-proxy watches was missing or refused.
	log, err := os.ReadFile(cluster.LogPath("kube-proxy"))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"Failed to watch", "failed to list", "the server could not find the requested resource", "is forbidden"} {
		if strings.Contains(string(log), bad) {
			t.Errorf("kube-proxy's log against %s says %q:\n%s", info.GitVersion, bad, kp.LogTail(30))
		}
	}
}

// answeredOnlyBy waits until ten requests in a row are answered by pod.
func answeredOnlyBy(t *testing.T, from *framework.Netns, target, pod string) {
	t.Helper()
	deadline := time.Now().Add(convergence)
	inARow := 0
	var last error
	for inARow < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not answered only by %s within %s: %v", target, pod, convergence, last)
		}
		reply, err := from.Request("tcp", target, 2*time.Second)
		switch {
		case err != nil:
			inARow, last = 0, err
			time.Sleep(200 * time.Millisecond)
		case reply.Pod != pod:
			inARow, last = 0, fmt.Errorf("answered by %s", reply.Pod)
			time.Sleep(200 * time.Millisecond)
		default:
			inARow++
		}
	}
}
