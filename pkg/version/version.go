// Package version tells which build of rapidproxy this is and which
// upstream kube-proxy release it is a drop-in replacement for.
package version

import (
	"encoding/json"
	"fmt"
	"runtime"
)

// gitVersion is rapidproxy's release (the repository's VERSION file, which
// also tags the image) and gitCommit the commit it was built from; both are
// set at build time by the Makefile and the Dockerfile (-ldflags -X).
var (
	gitVersion = "v0.0.0-dev"
	gitCommit  = "unknown"
)

// KubernetesCompatible is the upstream kube-proxy release whose flags,
// configuration, rules and metrics this build reproduces.
const KubernetesCompatible = "v1.37.2"

// Info describes the build.
type Info struct {
	GitVersion           string `json:"gitVersion"`
	GitCommit            string `json:"gitCommit"`
	KubernetesCompatible string `json:"kubernetesCompatible"`
	GoVersion            string `json:"goVersion"`
	Platform             string `json:"platform"`
}

// Get returns the build's version information.
func Get() Info {
	return Info{
		GitVersion:           gitVersion,
		GitCommit:            gitCommit,
		KubernetesCompatible: KubernetesCompatible,
		GoVersion:            runtime.Version(),
		Platform:             runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// String is the one-line form printed by --version. It starts as
// upstream's does ("Kubernetes vX.Y.Z"), naming the release whose behaviour
// this build reproduces, so that scripts reading upstream's line read ours.
func (i Info) String() string {
	return fmt.Sprintf("Kubernetes %s (rapidproxy %s, commit %s)", i.KubernetesCompatible, i.GitVersion, i.GitCommit)
}

// JSON is the form printed by --version=raw.
func (i Info) JSON() string {
	b, _ := json.MarshalIndent(i, "", "  ")
	return string(b)
}
