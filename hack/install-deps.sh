#!/usr/bin/env bash
# Installs the OS packages the build, the tests and the demo need (Debian/Ubuntu, as root).
# Installs only what is missing, so it is cheap to call every time.
set -euo pipefail

packages=(
  iptables ipset conntrack iproute2 kmod procps nftables   # the kernel tools kube-proxy drives
  etcd-server                                     # the local cluster's store
  qemu-system-x86 busybox-static ipvsadm xz-utils   # the IPVS test VM (test/vm)
  curl ca-certificates make git gcc               # build and test plumbing
  prometheus                                      # promtool for deploy/monitoring's rule tests; the dashboard chart's server
  runc containernetworking-plugins                # real nodes (test/node): containerd's runtime, the pods' CNI
  netcat-openbsd wget dash                        # what the e2e tests' agnhost image takes from Debian (test/node/images.go)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages (${missing[*]}); run as root to install them" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
