//go:build tools

// Package tools pins the kubelet that runs the real nodes of the upstream e2e
// tests, and agnhost, the program of most of their pods.
// It is a module of its own so that the cache key of hack/tools (and
// with it the kube-apiserver the other tests use) does not change with it.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
