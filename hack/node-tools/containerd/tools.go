//go:build tools

// Package tools pins containerd 2.x, the container runtime of the real nodes:
// kubelet v1.36 no longer supports containerd 1.x, which is what Debian ships.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
