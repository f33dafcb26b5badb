package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/deploy"
	"github.com/rapidproxy/rapidproxy/internal/iptables"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// The DaemonSet as deployed, run on this node: its command line, init containers and capabilities.

// The DaemonSet's exact command line, with the ConfigMap's files where its
// volume is mounted and the kubeconfig pointing at this cluster, starts
// our binary in the node namespace, which then answers the probes and
// serves traffic; in each mode config.conf may name but IPVS, which this
// machine's kernel may lack (test/vm runs the IPVS mode). In the
// least-privilege variant the init container runs first, privileged, and
// the proxy then runs as in its container: with only the capabilities it
// adds, and /proc/sys read-only.
func TestDeployedDaemonSetServesTraffic(t *testing.T) {
	for _, variant := range []string{deploy.Base, deploy.LeastPrivilege} {
		rendered := render(t, variant)
		for _, mode := range modes {
			t.Run(variant+"/"+mode, func(t *testing.T) {
				stopProxy() // the next test that needs the shared one starts it again
				const routeLocalnet = "net.ipv4.conf.all.route_localnet"
				if err := cluster.Node.Sysctl(routeLocalnet, "0"); err != nil {
					t.Fatal(err)
				}
				pod := newDeployedPod(t, rendered, mode)
				pod.runInitContainers(t)
				if variant == deploy.LeastPrivilege && mode == iptablesMode {
					if got, _ := cluster.Node.Exec("sysctl", "-n", routeLocalnet); strings.TrimSpace(got) != "1" {
						t.Errorf("after the --init-only init container %s is %q, want 1 (NodePorts on localhost)", routeLocalnet, got)
					}
				}
				proxy := pod.start(t, pod.spec.Containers[0])
				defer proxy.Stop()
				pod.probesPass(t, proxy)
				addPod(t, "deploy-a", framework.PodOptions{Labels: map[string]string{"app": "deploy"}})
				client := addPod(t, "deploy-client", framework.PodOptions{})
				svc := service("deploy", "deploy", v1.ProtocolTCP)
				svc.Spec.Type = v1.ServiceTypeNodePort
				svc = createService(t, svc)
				nodePort := svc.Spec.Ports[0].NodePort
				for _, ip := range svc.Spec.ClusterIPs {
					eventually(t, convergence, "the client pod to "+ip, func() error {
						_, err := answeredBy(client.Netns, "tcp", ip, 80, "deploy-a")
						return err
					})
				}
				eventually(t, convergence, "external to the node port", func() error {
					_, err := answeredBy(cluster.External, "tcp", framework.NodeIPv4, nodePort, "deploy-a")
					return err
				})
				if mode == iptablesMode {
					eventually(t, convergence, "the node to 127.0.0.1:nodePort", func() error {
						_, err := answeredBy(cluster.Node, "tcp", "127.0.0.1", nodePort, "deploy-a")
						return err
					})
				}
				select {
				case <-proxy.Exited():
					t.Fatalf("kube-proxy exited: %v\n%s", proxy.Err(), proxy.LogTail(20))
				default:
				}
			})
		}
	}
}

// deployedPod is the DaemonSet's pod on the test node: its spec, and the
// host directories its volumes stand for.
type deployedPod struct {
	spec v1.PodSpec
	// volumes maps a volume's name to the directory that holds it here;
	// the hostPath volumes are used as they are.
	volumes map[string]string
	// binary stands for the image's; ours unless set.
	binary string
	// env is added to each container's environment ("NAME=value").
	env []string
}

// newDeployedPod writes the ConfigMap's files for the test node: config.conf
// in the given mode, with its paths where the volume is, the conntrack table
// size left alone (the node namespace cannot change it); kubeconfig.conf
// this cluster's kube-proxy kubeconfig.
func newDeployedPod(t *testing.T, r *deploy.Rendered, mode string) *deployedPod {
	t.Helper()
	p := &deployedPod{spec: r.DaemonSet.Spec.Template.Spec, volumes: map[string]string{}}
	dir := t.TempDir()
	for _, v := range p.spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == r.ConfigMap.Name {
			p.volumes[v.Name] = dir
		}
	}
	if len(p.volumes) != 1 {
		t.Fatalf("the DaemonSet mounts the ConfigMap %s as %d volumes, want 1", r.ConfigMap.Name, len(p.volumes))
	}
	config := r.ConfigMap.Data["config.conf"]
	modeLine := "\nmode: iptables\n"
	if !strings.Contains(config, modeLine) {
		t.Fatalf("config.conf has no line %q:\n%s", strings.TrimSpace(modeLine), config)
	}
	config = strings.Replace(config, modeLine, "\nmode: "+mode+"\n", 1) + "conntrack:\n  maxPerCore: 0\n"
	kubeconfig, err := os.ReadFile(cluster.KubeProxyKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"config.conf": p.inVolumes(p.spec.Containers[0], config), "kubeconfig.conf": string(kubeconfig)}
	for key := range r.ConfigMap.Data {
		content, ok := files[key]
		if !ok {
			t.Fatalf("the ConfigMap has %s, which this test does not know", key)
		}
		if err := os.WriteFile(filepath.Join(dir, key), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// inVolumes rewrites the container's mount paths of the volumes held in
// directories here.
func (p *deployedPod) inVolumes(c v1.Container, s string) string {
	for _, m := range c.VolumeMounts {
		if dir, ok := p.volumes[m.Name]; ok {
			s = strings.ReplaceAll(s, m.MountPath, dir)
		}
	}
	return s
}

// commandLine is the container's command and arguments as the kubelet
// runs them: $(VAR) from its environment (NODE_NAME from the downward
// API), with our binary for the image's and the volumes' directories.
func (p *deployedPod) commandLine(t *testing.T, c v1.Container) []string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = framework.NodeName
		default:
			t.Fatalf("container %s: env %s: this test knows only values and spec.nodeName", c.Name, e.Name)
		}
	}
	args := append(append([]string{}, c.Command...), c.Args...)
	if len(args) == 0 || args[0] != imageBinary {
		t.Fatalf("container %s runs %q, want %s", c.Name, args, imageBinary)
	}
	args[0] = cluster.KubeProxy()
	if p.binary != "" {
		args[0] = p.binary
	}
	for i, arg := range args {
		for name, value := range env {
			arg = strings.ReplaceAll(arg, "$("+name+")", value)
		}
		args[i] = p.inVolumes(c, arg)
	}
	if len(p.env) > 0 {
		args = append(append([]string{"env"}, p.env...), args...)
	}
	return args
}

// start runs the container's command line in the node namespace; an
// unprivileged container's under the limits its runtime would set: the
// capabilities it adds (all others dropped) and /proc/sys read-only.
func (p *deployedPod) start(t *testing.T, c v1.Container) *framework.KubeProxy {
	t.Helper()
	proxy := p.launch(t, c)
	if err := proxy.WaitHealthy(context.Background(), time.Minute); err != nil {
		proxy.Stop()
		t.Fatal(err)
	}
	return proxy
}

// launch is start without waiting for the proxy to be healthy.
func (p *deployedPod) launch(t *testing.T, c v1.Container) *framework.KubeProxy {
	t.Helper()
	args := p.commandLine(t, c)
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		args = append(unprivileged(t, c), args...)
		// The limits hold: a sysctl cannot be written under them.
		const sysctl = "/proc/sys/net/ipv4/conf/all/forwarding"
		probe := append(unprivileged(t, c), "sh", "-c", "v=$(cat "+sysctl+") && echo $v > "+sysctl)
		if out, err := cluster.Node.Command(probe...).CombinedOutput(); err == nil || !strings.Contains(string(out), "Read-only file system") {
			t.Fatalf("writing a sysctl under the container's limits: %v, %s; want a read-only file system", err, out)
		}
	}
	started++
	proxy, err := cluster.StartKubeProxyCommand(fmt.Sprintf("%s-deployed-%d", c.Name, started), args...)
	if err != nil {
		t.Fatal(err)
	}
	return proxy
}

// runInitContainers runs the pod's init containers to completion, in the
// node namespace as they are (privileged).
func (p *deployedPod) runInitContainers(t *testing.T) {
	t.Helper()
	for _, c := range p.spec.InitContainers {
		if out, err := cluster.Node.Command(p.commandLine(t, c)...).CombinedOutput(); err != nil {
			t.Fatalf("init container %s: %v\n%s", c.Name, err, out)
		}
	}
}

// unprivileged is the command that runs the rest of a command line as the
// container's security context says: in a mount namespace of its own with
// /proc/sys read-only, and with only the capabilities it adds after
// dropping all.
func unprivileged(t *testing.T, c v1.Container) []string {
	t.Helper()
	caps := c.SecurityContext.Capabilities
	if caps == nil || len(caps.Drop) != 1 || caps.Drop[0] != "ALL" {
		t.Fatalf("container %s: capabilities %+v; this test knows only drop: [ALL] and a list to add", c.Name, caps)
	}
	keep := "-all"
	for _, c := range caps.Add {
		keep += ",+" + strings.ToLower(string(c))
	}
	script := `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec setpriv --inh-caps=-all --bounding-set=` + keep + ` -- "$@"`
	return []string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"}
}

// probesPass checks that the probes of the proxy's container answer 200,
// on the node's IP as the kubelet asks a host-network pod.
func (p *deployedPod) probesPass(t *testing.T, proxy *framework.KubeProxy) {
	t.Helper()
	c := p.spec.Containers[0]
	for what, probe := range map[string]*v1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Fatalf("container %s has no HTTP %s probe", c.Name, what)
		}
		url := fmt.Sprintf("http://%s:%s%s", framework.NodeIPv4, probe.HTTPGet.Port.String(), probe.HTTPGet.Path)
		eventually(t, time.Minute, what+" probe "+url, func() error {
			resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", resp.Status, body)
			}
			return nil
		})
	}
}

// After the least-privilege DaemonSet's --init-only init container, the
// proxy needs CAP_NET_ADMIN alone where it reaches the kernel through
// netlink only (nftables, iptables-nft, conntrack, nfacct): ours and
// upstream's, each after its own init container, run with that one
// capability (the bounding set, so the permitted and effective sets of
// root; nothing inheritable or ambient) and serve a ClusterIP and a
// NodePort, in nftables mode and in iptables mode on the nft backend,
// which ours picks without seeing the legacy tables. iptables-legacy
// reads and replaces its tables through a raw socket, which takes
// CAP_NET_RAW: on the legacy backend (KUBE_PROXY_IPTABLES_BACKEND for
// ours, iptables-legacy first in PATH for upstream's) ours exits saying
// so and serves once NET_RAW is added, and upstream's, driving the same
// tool, exits with iptables-legacy's "Permission denied".
func TestNetAdminAloneServesAfterInitOnly(t *testing.T) {
	rendered := render(t, deploy.LeastPrivilege)
	alternatives := map[framework.IPTablesBackend]string{}
	for _, b := range []framework.IPTablesBackend{framework.IPTablesNFT, framework.IPTablesLegacy} {
		alternatives[b] = filepath.Join(cluster.Dir, "iptables-"+string(b))
		if err := framework.IPTablesAlternatives(alternatives[b], b); err != nil {
			t.Fatal(err)
		}
	}
	for _, setup := range []struct {
		name, mode string
		backend    framework.IPTablesBackend
	}{
		{iptablesMode + "/nft", iptablesMode, framework.IPTablesNFT},
		{iptablesMode + "/legacy", iptablesMode, framework.IPTablesLegacy},
		{nftablesMode, nftablesMode, ""},
	} {
		t.Run(setup.name, func(t *testing.T) {
			reset := func() {
				stopProxy() // the next test that needs the shared one starts it again
				if err := cluster.Node.ResetIPTables(); err != nil {
					t.Fatal(err)
				}
			}
			// Registered first, so it runs after the pods and service are
			// gone: no legacy rule is left to steer the next test's proxy.
			t.Cleanup(reset)
			addPod(t, "caps-a", framework.PodOptions{Labels: map[string]string{"app": "caps"}})
			client := addPod(t, "caps-client", framework.PodOptions{})
			svc := service("caps", "caps", v1.ProtocolTCP)
			svc.Spec.Type = v1.ServiceTypeNodePort
			svc = createService(t, svc)
			serves := func() error {
				if _, err := answeredBy(client.Netns, "tcp", svc.Spec.ClusterIP, 80, "caps-a"); err != nil {
					return fmt.Errorf("the client pod to the ClusterIP: %w", err)
				}
				if _, err := answeredBy(cluster.External, "tcp", framework.NodeIPv4, svc.Spec.Ports[0].NodePort, "caps-a"); err != nil {
					return fmt.Errorf("external to the NodePort: %w", err)
				}
				return nil
			}
			// launch runs a kube-proxy from a kernel without rules: the
			// init container, then the proxy with only caps.
			launch := func(t *testing.T, ours bool, caps ...v1.Capability) *framework.KubeProxy {
				t.Helper()
				reset()
				pod := newDeployedPod(t, rendered, setup.mode)
				if !ours {
					pod.binary = cluster.UpstreamKubeProxy()
				}
				if setup.backend != "" {
					pod.env = []string{"PATH=" + alternatives[setup.backend] + ":" + os.Getenv("PATH")}
				}
				if setup.backend == framework.IPTablesLegacy {
					pod.env = append(pod.env, iptables.BackendEnv+"="+string(iptables.Legacy))
				}
				pod.runInitContainers(t)
				c := *pod.spec.Containers[0].DeepCopy()
				c.SecurityContext.Capabilities.Add = caps
				proxy := pod.launch(t, c)
				t.Cleanup(proxy.Stop)
				return proxy
			}
			servesWith := func(t *testing.T, ours bool, caps ...v1.Capability) {
				t.Helper()
				proxy := launch(t, ours, caps...)
				if err := proxy.WaitHealthy(context.Background(), time.Minute); err != nil {
					t.Fatal(err)
				}
				eventually(t, convergence, "traffic", serves)
				select {
				case <-proxy.Exited():
					t.Fatalf("exited: %v\n%s", proxy.Err(), proxy.LogTail(20))
				default:
				}
				if refused := refusals(t, proxy); refused != "" && ours {
					t.Errorf("refused something with %v:\n%s", caps, refused)
				} else if refused != "" {
					t.Logf("upstream's was refused something with %v:\n%s", caps, refused)
				}
			}

			if setup.backend != framework.IPTablesLegacy {
				t.Run("ours", func(t *testing.T) { servesWith(t, true, "NET_ADMIN") })
				t.Run("upstream", func(t *testing.T) { servesWith(t, false, "NET_ADMIN") })
				return
			}
			// exits waits for a kube-proxy that cannot start to exit, and
			// returns the end of its log.
			exits := func(t *testing.T, proxy *framework.KubeProxy) string {
				t.Helper()
				select {
				case <-proxy.Exited():
				case <-time.After(time.Minute):
					t.Fatalf("still running after a minute with NET_ADMIN only on the legacy backend:\n%s", proxy.LogTail(20))
				}
				return proxy.LogTail(10)
			}
			t.Run("ours", func(t *testing.T) {
				if log := exits(t, launch(t, true, "NET_ADMIN")); !strings.Contains(log, "needs CAP_NET_RAW") {
					t.Errorf("exited without naming CAP_NET_RAW:\n%s", log)
				} else {
					t.Logf("with NET_ADMIN only, exited:\n%s", grepLines(log, "CAP_NET_RAW"))
				}
				servesWith(t, true, "NET_ADMIN", "NET_RAW")
			})
			t.Run("upstream", func(t *testing.T) {
				if log := exits(t, launch(t, false, "NET_ADMIN")); !strings.Contains(log, "Permission denied") {
					t.Errorf("exited without iptables-legacy's refusal:\n%s", log)
				} else {
					t.Logf("with NET_ADMIN only, exited:\n%s", grepLines(log, "Permission denied"))
				}
			})
		})
	}
}

// refusals are the lines of a kube-proxy's log that tell of an operation
// the kernel refused for lack of a capability, but for two expected ones:
// our note that the legacy backend's tables go unseen without CAP_NET_RAW,
// and oom_score_adj, which only CAP_SYS_RESOURCE may lower (upstream's
// write fails the same, logged at -v=2; in a pod the kubelet sets it).
func refusals(t *testing.T, proxy *framework.KubeProxy) string {
	t.Helper()
	log, err := os.ReadFile(proxy.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(log), "\n") {
		if (strings.Contains(line, "not permitted") || strings.Contains(line, "ermission denied")) && !strings.Contains(line, "CAP_NET_RAW") && !strings.Contains(line, "oom_score_adj") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
