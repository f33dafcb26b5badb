#!/usr/bin/env bash
# Builds the kube-proxy image with no container engine, as an archive that `ctr images import`,
# `docker load` and `podman load` read (hack/image): Debian's packages of hack/image/packages.txt
# with their dependency closure (this machine's apt resolves it against its Debian release, which
# must be the Dockerfile's, bookworm), and the kube-proxy binary at /usr/local/bin.
#
#   hack/build-image.sh [ours|upstream] [OUTDIR]
#
#   ours      ghcr.io/rapidproxy/kube-proxy:$VERSION (the VERSION file): our kube-proxy and
#             kube-proxy-explain, static, stamped with VERSION and COMMIT as the Makefile does;
#             written to OUTDIR/rapidproxy-kube-proxy.tar
#   upstream  registry.k8s.io/kube-proxy:<hack/tools' k8s.io/kubernetes version>: upstream's
#             kube-proxy (hack/build-tools.sh) with the same packages; OUTDIR/upstream-kube-proxy.tar
#
# OUTDIR defaults to _output/images. The .debs are kept in $RAPIDPROXY_TOOLS_CACHE/image-debs (or
# _output/tools/image-debs), so a second build downloads nothing. Every file's mtime is the
# commit's time: the same commit and package versions give the same image digest. Prints the
# archive on its last line.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-ours}
out=${2:-$root/_output/images}
cache=${RAPIDPROXY_TOOLS_CACHE:-$root/_output/tools}/image-debs
mkdir -p "$out" "$cache"
out=$(cd "$out" && pwd)
cd "$root"

VERSION=${VERSION:-$(cat VERSION)}
COMMIT=${COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The packages' closure as apt would install it on an empty system: a private, empty dpkg
# status, so nothing of this machine's installed set counts. Only apt's lists are read.
mapfile -t packages < <(grep -v '^#' hack/image/packages.txt | grep .)
: > "$work/status"
apt_opts=(-o Dir::State::status="$work/status" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
resolve() {
  apt-get -s -q --no-install-recommends "${apt_opts[@]}" install "${packages[@]}" 2>"$work/apt.err" |
    sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*\[\([a-z0-9]\+\)\].*/\1 \2 \3/p'
}
mapfile -t closure < <(resolve || true)
if [ ${#closure[@]} -eq 0 ]; then
  echo "build-image: apt-get update (no package lists)" >&2
  apt-get update -qq >&2
  mapfile -t closure < <(resolve)
fi
[ ${#closure[@]} -gt 0 ] || { echo "build-image: apt resolved nothing:" >&2; cat "$work/apt.err" >&2; exit 1; }

debs=()
for line in "${closure[@]}"; do
  read -r name version arch <<<"$line"
  # apt-get download's file name: the epoch's colon escaped.
  file="$cache/${name}_${version//:/%3a}_${arch}.deb"
  if [ ! -f "$file" ]; then
    # Downloaded aside and moved in whole: the cache never holds a partial .deb.
    mkdir -p "$work/download"
    (cd "$work/download" && apt-get download -q "${apt_opts[@]}" "$name=$version" >&2)
    mv "$work/download/$(basename "$file")" "$file"
  fi
  debs+=("$file")
done
printf '%s\n' "${closure[@]}" | LC_ALL=C sort > "$work/packages"

CGO_ENABLED=0 go build -trimpath -o "$work/image" ./hack/image
case "$which" in
  ours)
    name="ghcr.io/rapidproxy/kube-proxy:$VERSION"
    archive="$out/rapidproxy-kube-proxy.tar"
    # The Makefile's LDFLAGS, and -s -w as the Dockerfile's build stage.
    ldflags="-s -w -X github.com/rapidproxy/rapidproxy/pkg/version.gitVersion=$VERSION \
      -X github.com/rapidproxy/rapidproxy/pkg/version.gitCommit=$COMMIT"
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$work/bin/" ./cmd/kube-proxy ./cmd/kube-proxy-explain
    files=(-file "/usr/local/bin/kube-proxy=$work/bin/kube-proxy"
      -file "/usr/local/bin/kube-proxy-explain=$work/bin/kube-proxy-explain"
      # As upstream's image's iptables wrapper: nft when no marker chain or rule decides (the
      # Dockerfile's ENV says the same).
      -env KUBE_PROXY_IPTABLES_BACKEND_FALLBACK=nft)
    labels=(-annotation "org.opencontainers.image.version=$VERSION"
      -annotation "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
      -annotation "org.opencontainers.image.source=https://github.com/rapidproxy/rapidproxy"
      -annotation "org.opencontainers.image.title=rapidproxy kube-proxy")
    ;;
  upstream)
    k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' hack/tools/go.mod)
    name="registry.k8s.io/kube-proxy:$k8s_version"
    archive="$out/upstream-kube-proxy.tar"
    tools=$(hack/build-tools.sh | tail -n 1)
    files=(-file "/usr/local/bin/kube-proxy=$tools/kube-proxy-upstream")
    labels=(-annotation "org.opencontainers.image.version=$k8s_version"
      -annotation "org.opencontainers.image.source=https://github.com/kubernetes/kubernetes"
      -annotation "org.opencontainers.image.title=upstream kube-proxy, built from source with rapidproxy's Debian packages")
    ;;
  *)
    echo "usage: $0 [ours|upstream] [OUTDIR]" >&2
    exit 2
    ;;
esac
labels+=(-annotation "org.opencontainers.image.created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)")

deb_args=()
while read -r d; do deb_args+=(-deb "$d"); done < <(printf '%s\n' "${debs[@]}" | LC_ALL=C sort)
"$work/image" -name "$name" -o "$archive" -epoch "$epoch" -entrypoint /usr/local/bin/kube-proxy \
  "${deb_args[@]}" "${files[@]}" "${labels[@]}" | tee "$archive.txt" >&2
cp "$work/packages" "${archive%.tar}.packages"
echo "$archive"
