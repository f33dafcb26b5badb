#!/usr/bin/env bash
# Builds the upstream programs the tests, demo and benchmarks run (kube-apiserver,
# kube-controller-manager and upstream kube-proxy) from the tools module, once: the result is
# cached under a key of the tools' go.sum and the Go version, and reused until either changes.
# Prints the directory holding the binaries on its last line.
#
# With a module directory as argument (hack/skew/v1.36, say) it builds the commands that module's
# tools.go imports, of the Kubernetes version it pins, into a directory of its own: older control
# planes for the API server version tests.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=$(cd "${1:-$root/hack/tools}" && pwd)
cache=${RAPIDPROXY_TOOLS_CACHE:-$root/_output/tools}
key=$(cat "$tools/go.mod" "$tools/go.sum" <(go version) | sha256sum | cut -c1-16)
dir="$cache/$key"

if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$dir"
k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$tools/go.mod")
major_minor=${k8s_version#v}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=${major_minor%%.*} \
 -X k8s.io/component-base/version.gitMinor=$(echo "$major_minor" | cut -d. -f2) \
 -X k8s.io/component-base/version.gitTreeState=clean"

start=$SECONDS
for cmd in $(sed -n 's#^[[:space:]]*_ "k8s.io/kubernetes/cmd/\([a-z-]*\)"$#\1#p' "$tools/tools.go"); do
  out=$cmd
  [ "$cmd" = kube-proxy ] && out=kube-proxy-upstream
  if [ -x "$dir/$out" ]; then continue; fi
  echo "build-tools: building $cmd $k8s_version (first time only; several minutes on 2 cores)..." >&2
  (cd "$tools" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/$out.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv "$dir/$out.tmp" "$dir/$out"
  echo "build-tools: $cmd done after $((SECONDS - start))s" >&2
done
touch "$dir/.complete"
echo "$dir"
