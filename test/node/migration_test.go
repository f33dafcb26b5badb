//go:build realnode

package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/deploy"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDaemonSetModeMigration moves takeoverCluster's nodes from iptables
// to nftables mode and back, one node at a time, through
// deploy/mode-migration as docs/migrating.md says, under the same traffic
// as the takeover, counted per phase:
//
//	overlay             `kubectl apply --server-side --field-manager=rapidproxy-mode-migration -k DIR`,
//	                    config.conf written from the cluster's: the original DaemonSet's pods replaced once, in iptables mode
//	iptables->nftables  `kubectl label node NODE rapidproxy.io/mode=nftables`, node after node
//	nftables->iptables  `kubectl label node NODE rapidproxy.io/mode-`, node after node
//
// A node's step ends when its one kube-proxy pod is the target
// DaemonSet's, Ready, /proxyMode names the mode, /healthz answers 200 and
// a sync is done, and the switch is over (kubeproxy_mode_switch_in_progress
// 0: the old mode's rules are gone). Ours must fail no new connection,
// break no long-lived one and move no UDP flow; upstream's image through
// the same steps is the baseline, logged.
func TestDaemonSetModeMigration(t *testing.T) {
	tc := startTakeoverCluster(t)
	for _, kp := range []struct {
		name, image string
		ours        bool
	}{{"ours", tc.oursRef, true}, {"upstream", tc.upstreamRef, false}} {
		t.Run(kp.name, func(t *testing.T) {
			objs := kubeadmObjects(t, "iptables", kp.image)
			create(tc.ctx, t, tc.client, tc.mapper, objs)
			defer remove(tc.ctx, t, tc.c, tc.client, tc.mapper, objs)
			waitRolledOut(tc.ctx, t, tc.c, tc.nodes, kp.image, nil)
			flows := tc.serving(t, kp.name+" kube-proxy")
			dir := tc.modeMigrationDir(t, kp.image, "nftables")
			defer func() {
				for _, n := range tc.nodes {
					_ = tc.kubectl(t, "label", "node", n.Name, deploy.ModeLabel+"-")
				}
				_ = tc.kubectl(t, "-n", "kube-system", "delete", "daemonset/kube-proxy-nftables", "configmap/kube-proxy-nftables", "--ignore-not-found", "--wait")
			}()

			phases := []struct {
				name string
				act  func() error
			}{
				{"overlay", func() error {
					before := kubeProxyPodUIDs(tc.ctx, t, tc.c)
					err := tc.kubectl(t, "apply", "--server-side", "--field-manager=rapidproxy-mode-migration", "-k", dir)
					if err == nil {
						err = tc.kubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/kube-proxy", "--timeout=5m")
					}
					if err == nil {
						waitRolledOut(tc.ctx, t, tc.c, tc.nodes, kp.image, before)
					}
					return err
				}},
				{"iptables->nftables", tc.moveEach(t, deploy.ModeLabel+"=nftables", "kube-proxy-nftables", kp.image, "nftables")},
				{"nftables->iptables", tc.moveEach(t, deploy.ModeLabel+"-", "kube-proxy", kp.image, "iptables")},
			}
			counts := map[string]phaseCounts{}
			var names []string
			for _, p := range phases {
				counts[p.name] = tc.phase(t, p.name+" ("+kp.name+")", kp.ours, flows, p.act)
				names = append(names, p.name)
			}
			t.Log(countsTable(fmt.Sprintf("phase (%s, %d nodes)", kp.name, len(tc.nodes)), names, counts))
		})
	}
}

// modeMigrationDir is a copy of deploy/mode-migration as an operator
// prepares it: config.conf written from the cluster's kube-proxy
// ConfigMap by the documented command's rule, the target mode on the
// kustomization's mode= line, and the image the original DaemonSet runs.
func (tc *takeoverCluster) modeMigrationDir(t *testing.T, image, mode string) string {
	t.Helper()
	src := filepath.Join(tc.root, "deploy", "mode-migration")
	dir := filepath.Join(t.TempDir(), "mode-migration")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := tc.c.Client.CoreV1().ConfigMaps("kube-system").Get(tc.ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(image, ":")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		switch e.Name() {
		case "config.conf":
			data = []byte(deploy.TargetConfig(cm.Data["config.conf"], mode))
		case "kustomization.yaml":
			k := strings.Replace(string(data), "- mode=nftables", "- mode="+mode, 1)
			k = strings.Replace(k, "    newTag: "+imageTag(t, tc.root), "    newName: "+name+"\n    newTag: "+tag, 1)
			if !strings.Contains(k, "newName: "+name) {
				t.Fatalf("deploy/mode-migration/kustomization.yaml: no image tag %s to set", imageTag(t, tc.root))
			}
			data = []byte(k)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// moveEach labels the nodes one after the other with label (KEY=VALUE, or
// KEY- to remove it), each once the one before runs its new pod: of the
// DaemonSet whose pods are labelled k8s-app=app, in mode.
func (tc *takeoverCluster) moveEach(t *testing.T, label, app, image, mode string) func() error {
	return func() error {
		for _, n := range tc.nodes {
			before := kubeProxyPodUIDs(tc.ctx, t, tc.c)
			if err := tc.kubectl(t, "label", "node", n.Name, label); err != nil {
				return err
			}
			if err := tc.waitNodeMode(n, app, image, mode, before); err != nil {
				return err
			}
		}
		return nil
	}
}

// waitNodeMode waits until the node runs one kube-proxy pod, of the
// DaemonSet whose pods are labelled k8s-app=app, of the image, not one of
// before, Ready; and it answers /proxyMode with mode, /healthz with 200,
// has synced, and is not switching modes any more.
func (tc *takeoverCluster) waitNodeMode(n *Node, app, image, mode string, before map[string]bool) error {
	err := waitFor(tc.ctx, 3*time.Minute, func() (bool, string) {
		pods, err := tc.c.Client.CoreV1().Pods("kube-system").List(tc.ctx, metav1.ListOptions{
			LabelSelector: "k8s-app in (kube-proxy,kube-proxy-nftables)", FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 {
			var names []string
			for _, p := range pods.Items {
				names = append(names, p.Name+": "+podSummary(&p))
			}
			return false, fmt.Sprintf("%d kube-proxy pods: %s", len(pods.Items), strings.Join(names, "; "))
		}
		p := &pods.Items[0]
		switch {
		case before[string(p.UID)]:
			return false, p.Name + " is still there"
		case p.Labels["k8s-app"] != app || p.Spec.Containers[0].Image != image:
			return false, fmt.Sprintf("%s is %s's, of %s", p.Name, p.Labels["k8s-app"], p.Spec.Containers[0].Image)
		case p.DeletionTimestamp != nil || !podReady(p):
			return false, p.Name + ": " + podSummary(p)
		}
		out, err := n.Command("curl", "-sS", "--max-time", "2", "http://127.0.0.1:10249/proxyMode").CombinedOutput()
		if err != nil || string(out) != mode {
			return false, fmt.Sprintf("/proxyMode: %q %v", out, err)
		}
		out, err = n.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2",
			"http://"+n.IP+":10256/healthz").CombinedOutput()
		if err != nil || string(out) != "200" {
			return false, fmt.Sprintf("/healthz: %q %v", out, err)
		}
		metrics, err := n.Command("curl", "-sS", "--max-time", "2", "http://127.0.0.1:10249/metrics").CombinedOutput()
		if err != nil {
			return false, fmt.Sprintf("/metrics: %v: %s", err, metrics)
		}
		if !synced(string(metrics)) {
			return false, "kubeproxy_sync_proxy_rules_last_timestamp_seconds is not set"
		}
		return !switching(string(metrics)), "kubeproxy_mode_switch_in_progress is 1"
	})
	if err != nil {
		return fmt.Errorf("%s in %s mode: %w", n.Name, mode, err)
	}
	return nil
}

// switching says whether metrics show a mode switch under way; upstream's
// kube-proxy has no such gauge and never says so.
func switching(metrics string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "kubeproxy_mode_switch_in_progress" {
			v, err := strconv.ParseFloat(f[1], 64)
			return err != nil || v != 0
		}
	}
	return false
}
