//go:build tools

// Package tools pins the upstream programs the tests and benchmarks run:
// kube-apiserver and kube-controller-manager for the local cluster, and
// upstream kube-proxy to compare with and to take over from.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
