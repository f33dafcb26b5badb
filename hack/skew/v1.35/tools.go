//go:build tools

// Package tools pins an older control plane (kube-apiserver and
// kube-controller-manager) for the API server version tests: kube-proxy may
// be up to three minor versions older than the API server, never newer,
// and operators keep one kube-proxy image across a control-plane upgrade.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
