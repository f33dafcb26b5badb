package deploy

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// operators are the node selector operators as label selector operators,
// which is how the scheduler and the DaemonSet controller evaluate them.
var operators = map[v1.NodeSelectorOperator]selection.Operator{
	v1.NodeSelectorOpIn:           selection.In,
	v1.NodeSelectorOpNotIn:        selection.NotIn,
	v1.NodeSelectorOpExists:       selection.Exists,
	v1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	v1.NodeSelectorOpGt:           selection.GreaterThan,
	v1.NodeSelectorOpLt:           selection.LessThan,
}

// RunsOn tells whether the DaemonSet wants a pod on a node with these
// labels: its node selector and required node affinity match them (the
// DaemonSet controller's test, taints aside; it deletes its pod from a node
// that stops matching).
func RunsOn(ds *appsv1.DaemonSet, nodeLabels map[string]string) (bool, error) {
	spec := ds.Spec.Template.Spec
	if !labels.SelectorFromSet(spec.NodeSelector).Matches(labels.Set(nodeLabels)) {
		return false, nil
	}
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true, nil
	}
	// The terms are ORed, each term's expressions ANDed.
	for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if len(term.MatchFields) > 0 {
			return false, fmt.Errorf("DaemonSet %s: matchFields, which this test does not evaluate", ds.Name)
		}
		if len(term.MatchExpressions) == 0 {
			continue // an empty term matches nothing
		}
		selector := labels.NewSelector()
		for _, e := range term.MatchExpressions {
			op, ok := operators[e.Operator]
			if !ok {
				return false, fmt.Errorf("DaemonSet %s: node selector operator %q", ds.Name, e.Operator)
			}
			r, err := labels.NewRequirement(e.Key, op, e.Values)
			if err != nil {
				return false, fmt.Errorf("DaemonSet %s: %w", ds.Name, err)
			}
			selector = selector.Add(*r)
		}
		if selector.Matches(labels.Set(nodeLabels)) {
			return true, nil
		}
	}
	return false, nil
}
