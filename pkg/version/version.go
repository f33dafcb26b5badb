// Package version tells which build of rapidproxy this is and which
// upstream kube-proxy release it is a drop-in replacement for.
package version

import (
	"encoding/json"
	"fmt"
	"runtime"
)

// gitVersion is set at build time by the Makefile (-ldflags -X).
var gitVersion = "v0.0.0-dev"

// KubernetesCompatible is the upstream kube-proxy release whose flags,
// configuration, rules and metrics this build reproduces.
const KubernetesCompatible = "v1.36.3"

// Info describes the build.
type Info struct {
	GitVersion           string `json:"gitVersion"`
	KubernetesCompatible string `json:"kubernetesCompatible"`
	GoVersion            string `json:"goVersion"`
	Platform             string `json:"platform"`
}

// Get returns the build's version information.
func Get() Info {
	return Info{
		GitVersion:           gitVersion,
		KubernetesCompatible: KubernetesCompatible,
		GoVersion:            runtime.Version(),
		Platform:             runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// String is the one-line form printed by --version.
func (i Info) String() string {
	return fmt.Sprintf("rapidproxy %s (kube-proxy %s compatible)", i.GitVersion, i.KubernetesCompatible)
}

// JSON is the form printed by --version=raw.
func (i Info) JSON() string {
	b, _ := json.MarshalIndent(i, "", "  ")
	return string(b)
}
