package deploy

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/diff"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/rapidproxy/rapidproxy/pkg/config"
)

// Every variant builds, and its DaemonSet runs our binary with upstream's
// command line; in mode-migration, the second DaemonSet, with config.conf
// written as its comment says (the one from deploy/base here).
func TestEveryVariantRenders(t *testing.T) {
	for _, variant := range Variants {
		var edits map[string]string
		if variant == ModeMigration {
			edits = map[string]string{"mode-migration/config.conf": TargetConfig(readFile(t, "base/config.conf"), "nftables")}
		}
		r, err := RenderEdited(variant, edits)
		if err != nil {
			t.Fatal(err)
		}
		ds, cm := r.DaemonSet, r.ConfigMap
		if variant == ModeMigration {
			ds, cm = r.Target, r.TargetConfigMap
		}
		c := ds.Spec.Template.Spec.Containers
		if len(c) != 1 || c[0].Name != "kube-proxy" || c[0].Image != ourImage(t) {
			t.Errorf("deploy/%s: containers %+v, want kube-proxy with our image", variant, c)
		}
		if variant != Kubeadm && (cm == nil || cm.Data["config.conf"] == "") {
			t.Errorf("deploy/%s: no ConfigMap with config.conf", variant)
		}
		if variant != Kubeadm && variant != ModeMigration && cm.Data["kubeconfig.conf"] == "" {
			t.Errorf("deploy/%s: the ConfigMap has no kubeconfig.conf", variant)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// kubeadmConfig is config.conf of the ConfigMap kubeadm makes.
func kubeadmConfig(t *testing.T) string {
	t.Helper()
	cm := &v1.ConfigMap{}
	if err := yaml.UnmarshalStrict([]byte(readFile(t, "../test/e2e/testdata/kubeadm-configmap.yaml")), cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data["config.conf"]
}

// modeLine is the target mode's line in mode-migration's kustomization.
var modeLine = regexp.MustCompile(`(?m)^      - mode=.*$`)

// renderMigration renders mode-migration with the target mode set in its
// kustomization and config.conf made from the cluster's as documented.
func renderMigration(t *testing.T, clusterConfig, mode string) *Rendered {
	t.Helper()
	kustomization := readFile(t, "mode-migration/kustomization.yaml")
	if n := len(modeLine.FindAllString(kustomization, -1)); n != 1 {
		t.Fatalf("mode-migration/kustomization.yaml has %d lines %q, want one", n, modeLine)
	}
	r, err := RenderEdited(ModeMigration, map[string]string{
		"mode-migration/kustomization.yaml": modeLine.ReplaceAllString(kustomization, "      - mode="+mode),
		"mode-migration/config.conf":        TargetConfig(clusterConfig, mode),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The documented command that writes config.conf (kubectl prints the
// ConfigMap's value as it is, kubeadm's without a final newline) does what
// TargetConfig does.
func TestTargetConfigIsTheDocumentedCommand(t *testing.T) {
	for name, in := range map[string]string{"kubeadm": kubeadmConfig(t), "base": readFile(t, "base/config.conf")} {
		cmd := exec.Command("sh", "-c", `{ cat | grep -v '^mode:'; echo 'mode: nftables'; }`)
		cmd.Stdin = strings.NewReader(in)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		if want := TargetConfig(in, "nftables"); string(out) != want {
			t.Errorf("%s: the command writes:\n%s\nTargetConfig:\n%s", name, out, want)
		}
	}
}

// mode-migration, for each target mode and over kubeadm's config.conf and
// deploy/base's: a partial original DaemonSet that names only a node
// affinity; a second DaemonSet, deploy/base's but for its name, labels,
// affinities and volume, whose pods the original's selector does not
// select and which keeps off nodes with the original's pods; its
// ConfigMap's config.conf the cluster's in the target mode, valid; and on
// every node exactly one of the two DaemonSets.
func TestModeMigrationRenders(t *testing.T) {
	base, err := Render(Base)
	if err != nil {
		t.Fatal(err)
	}
	modes := []string{string(config.ModeNFTables), string(config.ModeIPTables), string(config.ModeIPVS)}
	for name, clusterConfig := range map[string]string{"kubeadm": kubeadmConfig(t), "base": base.ConfigMap.Data["config.conf"]} {
		for _, mode := range modes {
			t.Run(name+"/"+mode, func(t *testing.T) {
				r := renderMigration(t, clusterConfig, mode)
				if len(r.Objects) != 3 || r.Target == nil || r.TargetConfigMap == nil {
					t.Fatalf("%d objects, want the original DaemonSet, the target one and its ConfigMap", len(r.Objects))
				}
				for _, obj := range r.Objects {
					if obj.GetNamespace() != "kube-system" {
						t.Errorf("%s %s in namespace %q", obj.GetKind(), obj.GetName(), obj.GetNamespace())
					}
				}

				original := r.Objects[slices.IndexFunc(r.Objects, func(o *unstructured.Unstructured) bool { return o.GetName() == "kube-proxy" })]
				spec, _, _ := unstructured.NestedMap(original.Object, "spec")
				affinity, _, _ := unstructured.NestedMap(original.Object, "spec", "template", "spec", "affinity")
				if !reflect.DeepEqual(spec, map[string]any{"template": map[string]any{"spec": map[string]any{"affinity": affinity}}}) || len(affinity) != 1 || affinity["nodeAffinity"] == nil {
					t.Errorf("the original DaemonSet names more than its node affinity: %v", spec)
				}

				target := r.Target
				if target.Name != "kube-proxy-"+mode || r.TargetConfigMap.Name != "kube-proxy-"+mode {
					t.Errorf("DaemonSet %s and ConfigMap %s, want both kube-proxy-%s", target.Name, r.TargetConfigMap.Name, mode)
				}
				podLabels := labels.Set(target.Spec.Template.Labels)
				if !reflect.DeepEqual(target.Spec.Selector.MatchLabels, target.Spec.Template.Labels) || !reflect.DeepEqual(target.Labels, target.Spec.Template.Labels) {
					t.Errorf("labels %v, selector %v, pod labels %v: want all the same", target.Labels, target.Spec.Selector.MatchLabels, podLabels)
				}
				originalPods := labels.Set(base.DaemonSet.Spec.Template.Labels)
				if labels.SelectorFromSet(base.DaemonSet.Spec.Selector.MatchLabels).Matches(podLabels) {
					t.Errorf("the original's selector %v selects the target's pods %v", base.DaemonSet.Spec.Selector.MatchLabels, podLabels)
				}

				anti := target.Spec.Template.Spec.Affinity.PodAntiAffinity
				if anti == nil || len(anti.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
					t.Fatalf("pod anti-affinity %+v, want one required term", anti)
				}
				term := anti.RequiredDuringSchedulingIgnoredDuringExecution[0]
				if term.TopologyKey != v1.LabelHostname || len(term.Namespaces) != 0 || term.NamespaceSelector != nil {
					t.Errorf("anti-affinity term %+v: want the node (%s), in the DaemonSet's namespace", term, v1.LabelHostname)
				}
				selector, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
				if err != nil {
					t.Fatal(err)
				}
				if !selector.Matches(originalPods) || selector.Matches(podLabels) {
					t.Errorf("anti-affinity to %v: want the original's pods %v and not the target's own %v", selector, originalPods, podLabels)
				}

				// Everything else is deploy/base's DaemonSet.
				got := target.Spec.Template.DeepCopy()
				want := base.DaemonSet.Spec.Template.DeepCopy()
				got.Labels, want.Labels = nil, nil
				got.Spec.Affinity = nil
				var projected *v1.ProjectedVolumeSource
				for i, v := range got.Spec.Volumes {
					if v.Name == "kube-proxy" {
						projected = v.Projected
						got.Spec.Volumes[i].VolumeSource = want.Spec.Volumes[i].VolumeSource
					}
				}
				if !equality.Semantic.DeepEqual(got, want) || target.Spec.UpdateStrategy != base.DaemonSet.Spec.UpdateStrategy {
					t.Errorf("the target DaemonSet differs from deploy/base's in more than its labels, affinities and ConfigMap volume (- base, + target):\n%s", diff.Diff(want, got))
				}
				wantSources := []v1.VolumeProjection{
					{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: r.TargetConfigMap.Name}, Items: []v1.KeyToPath{{Key: "config.conf", Path: "config.conf"}}}},
					{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-proxy"}, Items: []v1.KeyToPath{{Key: "kubeconfig.conf", Path: "kubeconfig.conf"}}}},
				}
				if projected == nil || !equality.Semantic.DeepEqual(projected.Sources, wantSources) {
					t.Errorf("volume kube-proxy %+v: want config.conf from %s and kubeconfig.conf from kube-proxy", projected, r.TargetConfigMap.Name)
				}

				if keys := slices.Sorted(maps.Keys(r.TargetConfigMap.Data)); !slices.Equal(keys, []string{"config.conf"}) {
					t.Errorf("ConfigMap %s has %v, want config.conf only", r.TargetConfigMap.Name, keys)
				}
				cfg, err := config.Decode([]byte(r.TargetConfigMap.Data["config.conf"]))
				if err != nil {
					t.Fatal(err)
				}
				if errs := config.Validate(cfg); len(errs) > 0 {
					t.Errorf("config.conf does not validate: %v", errs.ToAggregate())
				}
				// The same document but for the mode.
				var targetDoc, clusterDoc map[string]any
				if err := yaml.Unmarshal([]byte(r.TargetConfigMap.Data["config.conf"]), &targetDoc); err != nil {
					t.Fatal(err)
				}
				if err := yaml.Unmarshal([]byte(clusterConfig), &clusterDoc); err != nil {
					t.Fatal(err)
				}
				delete(targetDoc, "mode")
				delete(clusterDoc, "mode")
				if string(cfg.Mode) != mode || !reflect.DeepEqual(targetDoc, clusterDoc) {
					t.Errorf("config.conf is not the cluster's in mode %s: mode %q, (- cluster's, + target's)\n%s", mode, cfg.Mode, diff.Diff(clusterDoc, targetDoc))
				}

				originalDS := &appsv1.DaemonSet{}
				originalDS.Spec.Template.Spec = *base.DaemonSet.Spec.Template.Spec.DeepCopy()
				originalDS.Spec.Template.Spec.Affinity = r.DaemonSet.Spec.Template.Spec.Affinity
				exactlyOne(t, originalDS, target, mode, modes)
			})
		}
	}
}

// exactlyOne checks that on every node, with the label or without it, with
// the target mode or any other value, exactly one of the DaemonSets runs.
func exactlyOne(t *testing.T, original, target *appsv1.DaemonSet, mode string, modes []string) {
	t.Helper()
	linux := map[string]string{v1.LabelOSStable: "linux", v1.LabelHostname: "node-1"}
	nodes := []map[string]string{linux}
	for _, value := range append([]string{"", "other"}, modes...) {
		node := maps.Clone(linux)
		node[ModeLabel] = value
		nodes = append(nodes, node)
	}
	for _, node := range nodes {
		runsOriginal, err := RunsOn(original, node)
		if err != nil {
			t.Fatal(err)
		}
		runsTarget, err := RunsOn(target, node)
		if err != nil {
			t.Fatal(err)
		}
		_, labelled := node[ModeLabel]
		if runsOriginal == runsTarget || runsTarget != (labelled && node[ModeLabel] == mode) {
			t.Errorf("node labels %v: original runs %v, target (%s) runs %v", node, runsOriginal, mode, runsTarget)
		}
	}
}

// mode-migration as shipped, before config.conf is written over, does not
// build, and says why and what to do: the build error (kubectl's, from
// the directory on disk, and from Render) holds the shipped file's text,
// which names the file and the documented command. Once it is written, in
// YAML or JSON, it builds, and the check leaves nothing in the output.
func TestModeMigrationWithoutConfigSaysWhatToDo(t *testing.T) {
	const command = `{ kubectl -n kube-system get configmap kube-proxy -o jsonpath='{.data.config\.conf}' |
      grep -v '^mode:'; echo 'mode: nftables'; } > config.conf`
	for _, want := range []string{"config.conf is not written yet", command, "then apply\nagain"} {
		if !strings.Contains(readFile(t, "mode-migration/config.conf"), want) {
			t.Errorf("the shipped config.conf does not say %q", want)
		}
	}
	words := func(s string) string { return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n#", "\n")), " ") }
	if !strings.Contains(words(readFile(t, "mode-migration/kustomization.yaml")), words(command)) {
		t.Errorf("kustomization.yaml's comment does not give the command the shipped config.conf gives:\n%s", command)
	}
	onDisk := func() error {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(".")); err != nil {
			t.Fatal(err)
		}
		_, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(dir, ModeMigration))
		return err
	}
	_, inMemory := Render(ModeMigration)
	for name, err := range map[string]error{"kustomize build on disk": onDisk(), "Render": inMemory} {
		if err == nil || !strings.Contains(err.Error(), "deploy/mode-migration/config.conf is not written yet") || !strings.Contains(err.Error(), command) {
			t.Errorf("%s, as shipped: %v; want an error saying config.conf is not written and how to write it", name, err)
		}
	}

	yamlConfig := TargetConfig(readFile(t, "base/config.conf"), "nftables")
	jsonConfig := `{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "mode": "nftables"}`
	for name, cfg := range map[string]string{"YAML": yamlConfig, "JSON": jsonConfig} {
		r, err := RenderEdited(ModeMigration, map[string]string{"mode-migration/config.conf": cfg})
		if err != nil {
			t.Errorf("%s config.conf written: %v", name, err)
			continue
		}
		if got := r.TargetConfigMap.Data["config.conf"]; got != cfg {
			t.Errorf("%s: the ConfigMap holds %q, want the file as written", name, got)
		}
		for _, obj := range r.Objects {
			if obj.GetName() == "mode-migration" || strings.Contains(fmt.Sprint(obj.Object), "configured") {
				t.Errorf("%s: the check shows in the output: %s %s", name, obj.GetKind(), obj.GetName())
			}
		}
	}
}
