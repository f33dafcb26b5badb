#!/usr/bin/env bash
# Builds what a real node needs, beside the upstream programs of hack/build-tools.sh and in the
# same cache (RAPIDPROXY_TOOLS_CACHE), under a key of its own (node-<hash of hack/node-tools, this
# script and the Go version>) so that changing one never rebuilds the other:
#   kubelet, kube-scheduler, kubectl          k8s.io/kubernetes cmd/... (hack/node-tools/kubernetes)
#   e2e.test                                  `go test -c` of k8s.io/kubernetes/test/e2e
#   containerd, containerd-shim-runc-v2, ctr  containerd 2.x: kubelet (v1.36 on) needs it, Debian has 1.6
#   cni/{bridge,host-local,loopback,portmap}  Debian's containernetworking-plugins
#   images/pause.tar                          registry.k8s.io/pause:<tag> from the module's pause.c
#   images/busybox.tar                        a static busybox from Debian's busybox-static
#   images/agnhost.tar                        agnhost from the same module, with that busybox as
#                                             its shell and tools (upstream's has Alpine's)
# runc is Debian's (/usr/sbin/runc), installed if missing. The images are OCI archives for
# `ctr images import`: nothing is pulled from a registry. Prints the directory on its last line.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
nt="$root/hack/node-tools"
cache=${RAPIDPROXY_TOOLS_CACHE:-$root/_output/tools}
key=$(cat "$0" "$nt"/*/go.mod "$nt"/*/go.sum "$nt"/images/*.go <(go version) | sha256sum | cut -c1-16)
dir="$cache/node-$key"

if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir/cni" "$dir/images"

# Debian's packages: apt only when something is missing, so a warm machine never needs the network.
need=()
[ -x /usr/sbin/runc ] || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "build-node-tools: apt-get install ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi
for p in bridge host-local loopback portmap; do
  cp /usr/lib/cni/$p "$dir/cni/$p"
done

start=$SECONDS
build() { # module-dir output package [go build args...]
  local mod=$1 out=$2 pkg=$3
  shift 3
  if [ -x "$dir/$out" ]; then return; fi
  echo "build-node-tools: building $out (first time only; minutes on 2 cores)..." >&2
  (cd "$nt/$mod" && CGO_ENABLED=0 nice -n 10 go build -trimpath "$@" -o "$dir/$out.tmp" "$pkg")
  mv "$dir/$out.tmp" "$dir/$out"
  echo "build-node-tools: $out done after $((SECONDS - start))s" >&2
}

k8s_version=$(cd "$nt/kubernetes" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
# An empty version builds binaries that panic at start (component-base parses it).
[ -n "$k8s_version" ] || { echo "build-node-tools: no k8s.io/kubernetes version" >&2; exit 1; }
major_minor=${k8s_version#v}
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=${major_minor%%.*} \
 -X k8s.io/component-base/version.gitMinor=$(echo "$major_minor" | cut -d. -f2) \
 -X k8s.io/component-base/version.gitTreeState=clean"
for cmd in kubelet kube-scheduler kubectl; do
  build kubernetes $cmd k8s.io/kubernetes/cmd/$cmd -ldflags "$k8s_ldflags"
done
# The suite: the largest of all (about 17 minutes cold on 2 cores).
if [ ! -x "$dir/e2e.test" ]; then
  echo "build-node-tools: building e2e.test (first time only)..." >&2
  (cd "$nt/kubernetes" && CGO_ENABLED=0 nice -n 10 go test -c -trimpath -ldflags "$k8s_ldflags" \
    -o "$dir/e2e.test.tmp" k8s.io/kubernetes/test/e2e)
  mv "$dir/e2e.test.tmp" "$dir/e2e.test"
  echo "build-node-tools: e2e.test done after $((SECONDS - start))s" >&2
fi

ctrd_version=$(cd "$nt/containerd" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
ctrd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$ctrd_version \
 -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
# The tags of containerd's own static release build; no_grpc keeps the shim small, as upstream.
build containerd containerd github.com/containerd/containerd/v2/cmd/containerd \
  -tags "urfave_cli_no_docs osusergo netgo static_build" -ldflags "$ctrd_ldflags"
build containerd ctr github.com/containerd/containerd/v2/cmd/ctr \
  -tags "urfave_cli_no_docs osusergo netgo static_build" -ldflags "$ctrd_ldflags"
build containerd containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  -tags "urfave_cli_no_docs osusergo netgo static_build no_grpc" -ldflags "$ctrd_ldflags"
build images ociimage .
k8s_src=$(cd "$nt/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
agnhost_version=$(cat "$k8s_src/test/images/agnhost/VERSION")
build kubernetes agnhost k8s.io/kubernetes/test/images/agnhost -ldflags "-s -w"

# pause: the source and flags of the module's build/pause, the tag its Makefile names.
pause_tag=$(awk -F'[ ?=]+' '$1 == "TAG" {print $2}' "$k8s_src/build/pause/Makefile")
if [ ! -f "$dir/images/pause.tar" ]; then
  gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag-rapidproxy" -o "$dir/images/pause" "$k8s_src/build/pause/linux/pause.c"
  "$dir/ociimage" -name "registry.k8s.io/pause:$pause_tag" -o "$dir/images/pause.tar" \
    -entrypoint /pause -user 65535:65535 -file "/pause=$dir/images/pause"
fi
# Every applet busybox has, linked in /bin: the tests' commands run through sh, nc, wget, ...
applets=()
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || applets+=(-link "/bin/$applet=busybox")
done
# The busybox tag e2e.test names (test/utils/image/manifest.go).
busybox_tag=$(sed -n 's/.*configs\[BusyBox\] = Config{[^,]*, "busybox", "\([^"]*\)"}.*/\1/p' "$k8s_src/test/utils/image/manifest.go")
[ -n "$busybox_tag" ] || { echo "build-node-tools: no busybox tag in the e2e image manifest" >&2; exit 1; }
if [ ! -f "$dir/images/busybox.tar" ]; then
  "$dir/ociimage" -name "registry.k8s.io/e2e-test-images/busybox:$busybox_tag" -o "$dir/images/busybox.tar" \
    -cmd /bin/sh -file /bin/busybox=/bin/busybox "${applets[@]}"
fi
if [ ! -f "$dir/images/agnhost.tar" ]; then
  # As upstream's Dockerfile: /agnhost, an agnhost-2 link, porter's certificate, `pause` by default.
  porter="$k8s_src/test/images/agnhost/porter"
  "$dir/ociimage" -name "registry.k8s.io/e2e-test-images/agnhost:$agnhost_version" -o "$dir/images/agnhost.tar" \
    -entrypoint /agnhost -cmd pause -file "/agnhost=$dir/agnhost" -link /agnhost-2=agnhost \
    -file "/localhost.crt=$porter/localhost.crt" -file "/localhost.key=$porter/localhost.key" \
    -file /bin/busybox=/bin/busybox "${applets[@]}"
fi
echo "$pause_tag" > "$dir/images/pause.tag"
touch "$dir/.complete"
echo "$dir"
