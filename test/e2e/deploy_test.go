package e2e

import (
	"context"
	"maps"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/rapidproxy/rapidproxy/deploy"
	"github.com/rapidproxy/rapidproxy/pkg/config"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// imageBinary is where our image has the binary, as upstream's has its own.
const imageBinary = "/usr/local/bin/kube-proxy"

func render(t *testing.T, variant string) *deploy.Rendered {
	t.Helper()
	r, err := deploy.Render(variant)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// resourceFor is the API resource an object is created in.
func resourceFor(t *testing.T, client dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s %s: %v", gvk, obj.GetName(), err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return client.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	return client.Resource(mapping.Resource)
}

// The API server accepts every object of deploy/ as kustomize renders it:
// the base and the least-privilege variant created in a dry run with
// strict field validation (the priority class and the
// namespace exist in every cluster), and the kubeadm overlay applied
// server-side over a DaemonSet as kubeadm makes it, changing its image
// and nothing else, and only when forced (kubeadm owns the field); and
// deploy/mode-migration as testModeMigration says.
func TestDeployManifestsPassServerSideDryRun(t *testing.T) {
	ctx := context.Background()
	client, mapper, err := cluster.DynamicClient()
	if err != nil {
		t.Fatal(err)
	}
	dryRun := []string{metav1.DryRunAll}
	for _, variant := range []string{deploy.Base, deploy.LeastPrivilege} {
		t.Run(variant, func(t *testing.T) {
			for _, obj := range render(t, variant).Objects {
				_, err := resourceFor(t, client, mapper, obj).Create(ctx, obj, metav1.CreateOptions{DryRun: dryRun, FieldValidation: metav1.FieldValidationStrict})
				if err != nil {
					t.Errorf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
				}
			}
		})
	}
	t.Run(deploy.Kubeadm, func(t *testing.T) {
		data, err := os.ReadFile("testdata/kubeadm-daemonset.yaml")
		if err != nil {
			t.Fatal(err)
		}
		kubeadm := &appsv1.DaemonSet{}
		if err := yaml.UnmarshalStrict(data, kubeadm); err != nil {
			t.Fatal(err)
		}
		daemonSets := cluster.Client.AppsV1().DaemonSets(kubeadm.Namespace)
		created, err := daemonSets.Create(ctx, kubeadm, metav1.CreateOptions{FieldManager: "kubeadm"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = daemonSets.Delete(context.Background(), kubeadm.Name, metav1.DeleteOptions{}) })

		overlay := render(t, deploy.Kubeadm)
		if len(overlay.Objects) != 1 {
			t.Fatalf("deploy/kubeadm renders %d objects, want only the DaemonSet", len(overlay.Objects))
		}
		obj := overlay.Objects[0]
		res := resourceFor(t, client, mapper, obj)
		opts := metav1.ApplyOptions{FieldManager: "rapidproxy", DryRun: dryRun}
		if _, err := res.Apply(ctx, obj.GetName(), obj, opts); !apierrors.IsConflict(err) {
			t.Errorf("applying deploy/kubeadm without forcing: got %v, want a conflict over kubeadm's image", err)
		}
		opts.Force = true
		applied, err := res.Apply(ctx, obj.GetName(), obj, opts)
		if err != nil {
			t.Fatal(err)
		}
		got := &appsv1.DaemonSet{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(applied.Object, got); err != nil {
			t.Fatal(err)
		}
		want := created.Spec.DeepCopy()
		want.Template.Spec.Containers[0].Image = overlay.DaemonSet.Spec.Template.Spec.Containers[0].Image
		if !equality.Semantic.DeepEqual(got.Spec, *want) {
			t.Errorf("deploy/kubeadm changes more than the image of kubeadm's DaemonSet (- want, + got):\n%s", diff.Diff(*want, got.Spec))
		}
	})
	t.Run(deploy.ModeMigration, func(t *testing.T) { testModeMigration(t, client, mapper) })
}

// migrationManager is the field manager deploy/mode-migration is applied
// with, as its kustomization says.
const migrationManager = "rapidproxy-mode-migration"

// deploy/mode-migration over a kubeadm cluster's kube-proxy, once
// deploy/kubeadm set our image, and over deploy/base's: applied
// server-side (dry run) with its own field manager and without forcing,
// the original DaemonSet gains the node affinity and keeps every other
// field, the image included (applied as deploy/kubeadm's manager instead,
// it would lose the image); the target DaemonSet and ConfigMap are valid,
// the ConfigMap's config.conf is the cluster's in the target mode, and on
// any node exactly one of the two DaemonSets runs.
func testModeMigration(t *testing.T, client dynamic.Interface, mapper meta.RESTMapper) {
	ctx := context.Background()
	kubeadmDS := &appsv1.DaemonSet{}
	readYAML(t, "testdata/kubeadm-daemonset.yaml", kubeadmDS)
	kubeadmCM := &v1.ConfigMap{}
	readYAML(t, "testdata/kubeadm-configmap.yaml", kubeadmCM)
	base := render(t, deploy.Base)
	ours := render(t, deploy.Kubeadm)
	for _, c := range []struct {
		name, manager string
		ds            *appsv1.DaemonSet
		cm            *v1.ConfigMap
	}{
		{"kubeadm", "kubeadm", kubeadmDS, kubeadmCM},
		{deploy.Base, "kubectl-client-side-apply", base.DaemonSet, base.ConfigMap},
	} {
		t.Run(c.name, func(t *testing.T) {
			daemonSets := cluster.Client.AppsV1().DaemonSets(c.ds.Namespace)
			configMaps := cluster.Client.CoreV1().ConfigMaps(c.cm.Namespace)
			original, err := daemonSets.Create(ctx, c.ds, metav1.CreateOptions{FieldManager: c.manager})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = daemonSets.Delete(context.Background(), c.ds.Name, metav1.DeleteOptions{}) })
			if _, err := configMaps.Create(ctx, c.cm, metav1.CreateOptions{FieldManager: c.manager}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = configMaps.Delete(context.Background(), c.cm.Name, metav1.DeleteOptions{}) })
			if c.name == "kubeadm" {
				obj := ours.Objects[0]
				applied, err := resourceFor(t, client, mapper, obj).Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "rapidproxy", Force: true})
				if err != nil {
					t.Fatal(err)
				}
				original = decodeDaemonSet(t, applied)
			}
			image := ours.DaemonSet.Spec.Template.Spec.Containers[0].Image
			if got := original.Spec.Template.Spec.Containers[0].Image; got != image {
				t.Fatalf("the original DaemonSet runs %s, want %s before the migration", got, image)
			}

			// config.conf as the documented command writes it from the
			// cluster's ConfigMap.
			cm, err := configMaps.Get(ctx, c.cm.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			const mode = nftablesMode
			overlay, err := deploy.RenderEdited(deploy.ModeMigration, map[string]string{
				"mode-migration/config.conf": deploy.TargetConfig(cm.Data["config.conf"], mode),
			})
			if err != nil {
				t.Fatal(err)
			}
			dryRun := []string{metav1.DryRunAll}
			var target *appsv1.DaemonSet
			for _, obj := range overlay.Objects {
				res := resourceFor(t, client, mapper, obj)
				applied, err := res.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: migrationManager, DryRun: dryRun})
				if err != nil {
					t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
				}
				switch {
				case obj.GetKind() == "DaemonSet" && obj.GetName() == original.Name:
					got := decodeDaemonSet(t, applied)
					want := original.Spec.DeepCopy()
					want.Template.Spec.Affinity = overlay.DaemonSet.Spec.Template.Spec.Affinity
					if !equality.Semantic.DeepEqual(got.Spec, *want) {
						t.Errorf("the original DaemonSet changes in more than its node affinity (- want, + got):\n%s", diff.Diff(*want, got.Spec))
					}
					original = got
					if c.name == "kubeadm" {
						_, err := res.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "rapidproxy", DryRun: dryRun})
						t.Logf("applied as deploy/kubeadm's field manager: %v", err)
						if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "image") {
							t.Errorf("applied as deploy/kubeadm's field manager: got %v, want the image removed (invalid)", err)
						}
					}
				case obj.GetKind() == "DaemonSet":
					target = decodeDaemonSet(t, applied)
				case obj.GetKind() == "ConfigMap":
					got := &v1.ConfigMap{}
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(applied.Object, got); err != nil {
						t.Fatal(err)
					}
					cfg, err := config.Decode([]byte(got.Data["config.conf"]))
					if err != nil {
						t.Fatalf("ConfigMap %s: config.conf: %v", got.Name, err)
					}
					if string(cfg.Mode) != mode {
						t.Errorf("ConfigMap %s: mode %q, want %s", got.Name, cfg.Mode, mode)
					}
				}
			}
			if target == nil || target.Name != "kube-proxy-"+mode {
				t.Fatalf("no DaemonSet kube-proxy-%s applied", mode)
			}

			node, err := cluster.Client.CoreV1().Nodes().Get(ctx, framework.NodeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			labels := maps.Clone(node.Labels)
			labels[v1.LabelOSStable] = "linux" // as the kubelet sets it
			for _, value := range []*string{nil, ptr.To(mode), ptr.To(iptablesMode), ptr.To("")} {
				delete(labels, deploy.ModeLabel)
				if value != nil {
					labels[deploy.ModeLabel] = *value
				}
				runsOriginal, err := deploy.RunsOn(original, labels)
				if err != nil {
					t.Fatal(err)
				}
				runsTarget, err := deploy.RunsOn(target, labels)
				if err != nil {
					t.Fatal(err)
				}
				if runsOriginal == runsTarget || runsTarget != (value != nil && *value == mode) {
					t.Errorf("node labels %v: the original DaemonSet runs %v, %s %v", labels, runsOriginal, target.Name, runsTarget)
				}
			}
		})
	}
}

func readYAML(t *testing.T, path string, obj any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func decodeDaemonSet(t *testing.T, obj *unstructured.Unstructured) *appsv1.DaemonSet {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, ds); err != nil {
		t.Fatal(err)
	}
	return ds
}
