package deploy

import "testing"

// Every variant builds, and its DaemonSet runs our binary with upstream's
// command line.
func TestEveryVariantRenders(t *testing.T) {
	for _, variant := range Variants {
		r, err := Render(variant)
		if err != nil {
			t.Fatal(err)
		}
		c := r.DaemonSet.Spec.Template.Spec.Containers
		if len(c) != 1 || c[0].Name != "kube-proxy" || c[0].Image != "ghcr.io/rapidproxy/kube-proxy:latest" {
			t.Errorf("deploy/%s: containers %+v, want kube-proxy with our image", variant, c)
		}
		if variant != Kubeadm && (r.ConfigMap == nil || r.ConfigMap.Data["config.conf"] == "" || r.ConfigMap.Data["kubeconfig.conf"] == "") {
			t.Errorf("deploy/%s: no ConfigMap kube-proxy with config.conf and kubeconfig.conf", variant)
		}
	}
}
