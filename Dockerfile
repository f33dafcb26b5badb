# syntax=docker/dockerfile:1
# The kube-proxy image: our binary plus the tools it drives (iptables in both backends, nft,
# ipset, conntrack, kmod). The binary picks the iptables backend (legacy or nft) the host already uses,
# so no wrapper script is needed. kube-proxy-explain, for `kubectl exec`, prints what the node
# does with a service, and with `preflight --to MODE` what would break in another mode. It runs as root, as upstream's image. deploy/image_test.go checks that the
# runtime stage installs every program the binary may run, the same packages as `make image`
# (hack/image/packages.txt), and that ENTRYPOINT is the path the DaemonSet's command names.
# `make image` builds the same image with no container engine (hack/build-image.sh).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=v0.0.0-dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/rapidproxy/rapidproxy/pkg/version.gitVersion=${VERSION} -X github.com/rapidproxy/rapidproxy/pkg/version.gitCommit=${COMMIT}" \
      -o /out/ ./cmd/kube-proxy ./cmd/kube-proxy-explain

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables ipset conntrack kmod nftables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kube-proxy /out/kube-proxy-explain /usr/local/bin/
# The iptables backend when no marker chain or rule on the node decides: nft, as upstream's
# image's wrapper (a binary on a bare-metal node follows the host's `iptables` instead).
ENV KUBE_PROXY_IPTABLES_BACKEND_FALLBACK=nft
ENTRYPOINT ["/usr/local/bin/kube-proxy"]
