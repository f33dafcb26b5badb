// Package deps pins the project's chosen libraries in go.mod while the
// packages that use them are being written. Remove once they are all used.
package deps

import (
	_ "github.com/moby/ipvs"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "github.com/spf13/pflag"
	_ "github.com/vishvananda/netlink"
	_ "k8s.io/api/discovery/v1"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/kubernetes/fake"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "k8s.io/client-go/tools/events"
	_ "k8s.io/component-base/featuregate"
	_ "k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json"
	_ "k8s.io/klog/v2"
	_ "k8s.io/kube-proxy/config/v1alpha1"
	_ "k8s.io/utils/ptr"
	_ "sigs.k8s.io/yaml"
)
