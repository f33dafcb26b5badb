// Package deploy holds the Kubernetes manifests, a kustomize base and its
// variants, and renders them with the kustomize Go API for the tests that
// check them (this package, and test/e2e against a real API server).
package deploy

import (
	"embed"
	"fmt"
	"io/fs"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The variants, each a kustomization directory.
const (
	// Base is every object of a new cluster's kube-proxy.
	Base = "base"
	// Kubeadm swaps only the image of kubeadm's DaemonSet (server-side apply).
	Kubeadm = "kubeadm"
	// LeastPrivilege is the base with an --init-only init container and a
	// main container with NET_ADMIN and NET_RAW instead of privileged.
	LeastPrivilege = "least-privilege"
	// ModeMigration adds a DaemonSet in another mode on the nodes labelled
	// for it, and keeps the original DaemonSet off them (server-side apply).
	ModeMigration = "mode-migration"
)

// Variants are all of them.
var Variants = []string{Base, Kubeadm, LeastPrivilege, ModeMigration}

//go:embed base kubeadm least-privilege mode-migration
var manifests embed.FS

// ModeLabel is the node label that moves a node to ModeMigration's
// DaemonSet; its value is the target mode.
const ModeLabel = "rapidproxy.io/mode"

// Rendered is what `kubectl apply -k deploy/VARIANT` would send.
type Rendered struct {
	Objects []*unstructured.Unstructured
	// DaemonSet and ConfigMap are the kube-proxy ones, decoded; ConfigMap
	// is nil where the variant has none.
	DaemonSet *appsv1.DaemonSet
	ConfigMap *v1.ConfigMap
	// Target and TargetConfigMap are ModeMigration's second DaemonSet and
	// its ConfigMap; nil in the other variants.
	Target          *appsv1.DaemonSet
	TargetConfigMap *v1.ConfigMap
}

// Render builds a variant with kustomize, from an in-memory copy of the
// manifests.
func Render(variant string) (*Rendered, error) {
	return RenderEdited(variant, nil)
}

// RenderEdited is Render after writing files of deploy/ (paths relative
// to it) as an operator would: ModeMigration builds only with its
// config.conf written.
func RenderEdited(variant string, edits map[string]string) (*Rendered, error) {
	mem := filesys.MakeFsInMemory()
	err := fs.WalkDir(manifests, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := manifests.ReadFile(path)
		if err != nil {
			return err
		}
		return mem.WriteFile("/"+path, data)
	})
	if err != nil {
		return nil, err
	}
	for path, data := range edits {
		if err := mem.WriteFile("/"+path, []byte(data)); err != nil {
			return nil, err
		}
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/"+variant)
	if err != nil {
		return nil, fmt.Errorf("kustomize build deploy/%s: %w", variant, err)
	}
	out := &Rendered{}
	for _, r := range resources.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{Object: m}
		out.Objects = append(out.Objects, obj)
		switch {
		case obj.GetKind() == "DaemonSet" && obj.GetName() == "kube-proxy":
			out.DaemonSet = &appsv1.DaemonSet{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m, out.DaemonSet, true)
		case obj.GetKind() == "ConfigMap" && obj.GetName() == "kube-proxy":
			out.ConfigMap = &v1.ConfigMap{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m, out.ConfigMap, true)
		case obj.GetKind() == "DaemonSet":
			out.Target = &appsv1.DaemonSet{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m, out.Target, true)
		case obj.GetKind() == "ConfigMap":
			out.TargetConfigMap = &v1.ConfigMap{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m, out.TargetConfigMap, true)
		}
		if err != nil {
			return nil, fmt.Errorf("deploy/%s: %s %s: %w", variant, obj.GetKind(), obj.GetName(), err)
		}
	}
	if out.DaemonSet == nil {
		return nil, fmt.Errorf("deploy/%s has no kube-proxy DaemonSet", variant)
	}
	return out, nil
}

// TargetConfig is ModeMigration's config.conf as its documented command
// writes it from the cluster's: every top-level mode line dropped and one
// naming the target mode appended.
func TargetConfig(config, mode string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(config, "\n") {
		if line != "" && !strings.HasPrefix(line, "mode:") {
			b.WriteString(strings.TrimSuffix(line, "\n") + "\n")
		}
	}
	return b.String() + "mode: " + mode + "\n"
}
