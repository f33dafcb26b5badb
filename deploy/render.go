// Package deploy holds the Kubernetes manifests, a kustomize base and its
// variants, and renders them with the kustomize Go API for the tests that
// check them (this package, and test/e2e against a real API server).
package deploy

import (
	"embed"
	"fmt"
	"io/fs"

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
)

// Variants are all of them.
var Variants = []string{Base, Kubeadm, LeastPrivilege}

//go:embed base kubeadm least-privilege
var manifests embed.FS

// Rendered is what `kubectl apply -k deploy/VARIANT` would send.
type Rendered struct {
	Objects []*unstructured.Unstructured
	// DaemonSet and ConfigMap are the kube-proxy ones, decoded; ConfigMap
	// is nil where the variant has none.
	DaemonSet *appsv1.DaemonSet
	ConfigMap *v1.ConfigMap
}

// Render builds a variant with kustomize, from an in-memory copy of the
// manifests.
func Render(variant string) (*Rendered, error) {
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
