# rapidproxy: a drop-in replacement for kube-proxy.
# Targets that touch the kernel (test, demo) need root on Debian/Ubuntu.

GO      ?= go
OUT     := $(CURDIR)/_output
BIN     := $(OUT)/bin
# Our release (the VERSION file: it also tags the image) and the commit built.
VERSION ?= $(shell cat VERSION)
COMMIT  ?= $(shell git describe --always --dirty 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/rapidproxy/rapidproxy/pkg/version.gitVersion=$(VERSION) \
	-X github.com/rapidproxy/rapidproxy/pkg/version.gitCommit=$(COMMIT)
MODE    ?= iptables

# Tests and the demo find the binaries they drive through these.
export RAPIDPROXY_KUBE_PROXY := $(BIN)/kube-proxy
export RAPIDPROXY_KUBE_PROXY_EXPLAIN := $(BIN)/kube-proxy-explain
export RAPIDPROXY_PODSERVER  := $(BIN)/podserver
export CGO_ENABLED           := 0
# The upstream tools' and node tools' directories, known once `tools` and `node-tools` have run
# (each script prints its directory last).
TOOLS_DIR = $(shell hack/build-tools.sh | tail -n 1)
NODE_TOOLS_DIR = $(shell hack/build-node-tools.sh | tail -n 1)

.PHONY: all build deps tools node-tools image image-upstream e2e-node-daemonset e2e-node-takeover test test-ipvs e2e-node-smoke e2e-upstream e2e-apiversions unit fuzz lint demo demo-shell dashboard-chart bench synloss soak clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/kube-proxy ./cmd/kube-proxy
	$(GO) build -o $(BIN)/kube-proxy-explain ./cmd/kube-proxy-explain
	$(GO) build -o $(BIN)/podserver ./test/podserver

deps:
	hack/install-deps.sh

# kube-apiserver, kube-controller-manager and upstream kube-proxy, built once and cached.
tools:
	hack/build-tools.sh

# kubelet, containerd 2.x, CNI plugins and the pause and busybox images for real nodes
# (hack/build-node-tools.sh), built once and cached under a key of their own.
node-tools:
	hack/build-node-tools.sh

# The kube-proxy image, ghcr.io/rapidproxy/kube-proxy:$(VERSION), as an archive for `ctr -n k8s.io
# images import`, `docker load`, `podman load` or `skopeo copy oci-archive:...`, built with no
# container engine from our binaries and Debian's packages (hack/build-image.sh; the same commit
# gives the same digest): _output/images/rapidproxy-kube-proxy.tar.
image:
	VERSION=$(VERSION) COMMIT=$(COMMIT) hack/build-image.sh ours $(OUT)/images

# Upstream's kube-proxy (hack/tools' version) in an image made the same way, with the same Debian
# packages, as a reference: _output/images/upstream-kube-proxy.tar, registry.k8s.io/kube-proxy:<version>.
image-upstream: tools
	hack/build-image.sh upstream $(OUT)/images

# One real node (kubelet and containerd in the node namespace, bridge CNI) joined to the local
# control plane, running one pod to Ready, reached through our kube-proxy (test/node; `test`
# runs it too).
e2e-node-smoke: deps build tools node-tools
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) RAPIDPROXY_NODE_TOOLS_DIR=$(NODE_TOOLS_DIR) \
		$(GO) test -tags realnode -count=1 -timeout 30m -v -run TestNodeSmoke ./test/node

# Our image (make image) as deploy/base's and deploy/least-privilege's DaemonSet pod on a real
# node, serving a ClusterIP, then `kube-proxy --cleanup` as a pod (test/node; `test` runs it too).
e2e-node-daemonset: deps build tools node-tools image
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) RAPIDPROXY_NODE_TOOLS_DIR=$(NODE_TOOLS_DIR) \
		RAPIDPROXY_IMAGE=$(OUT)/images/rapidproxy-kube-proxy.tar \
		$(GO) test -tags realnode -count=1 -timeout 30m -v -run TestKubeProxyDaemonSet ./test/node

# A kubeadm-made kube-proxy DaemonSet (upstream's image) on three real nodes moved to ours by
# `kubectl apply --server-side --force-conflicts -k deploy/kubeadm`, rolled back with `rollout undo`,
# then restarted as upstream for a baseline, in iptables and in nftables mode, with new, long-lived
# and UDP connections counted per phase; then deploy/mode-migration moving the nodes one by one
# from iptables to nftables mode and back, ours and upstream's (test/node; `test` runs both: about
# six minutes).
e2e-node-takeover: deps build tools node-tools image image-upstream
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) RAPIDPROXY_NODE_TOOLS_DIR=$(NODE_TOOLS_DIR) \
		RAPIDPROXY_IMAGE=$(OUT)/images/rapidproxy-kube-proxy.tar RAPIDPROXY_UPSTREAM_IMAGE=$(OUT)/images/upstream-kube-proxy.tar \
		$(GO) test -tags realnode -count=1 -timeout 60m -v -run 'TestDaemonSetTakeoverAndRollback|TestDaemonSetModeMigration' ./test/node

# Upstream's e2e.test (v1.37.2) with a focus (FOCUS, default the Services conformance tests; PROCS
# ginkgo processes in parallel) against NODES real nodes (default 3), each in its network namespace
# on an underlay bridge (MODE=ipvs: default 2, each in a VM of test/vm's), whose kube-proxies are ours or
# upstream's (KUBE_PROXY; upstream,ours runs both in turn on one cluster) in MODE, with
# KUBE_PROXY_FLAGS beside their config file (say --v=4); DEPLOY=daemonset runs them instead as
# kubeadm's DaemonSet, pods of the images (make image, make image-upstream) started by the nodes'
# kubelets (not in IPVS mode). The JUnit report and results.tsv go to
# _output/e2e-upstream/MODE-KUBE_PROXY (test/node; `test` runs its defaults: ours, iptables, three
# nodes, the Services [Conformance] specs, as processes).
MODE ?= iptables
KUBE_PROXY ?= ours
PROCS ?= 1
NODES ?=
KUBE_PROXY_FLAGS ?=
DEPLOY ?= process
e2e-upstream: deps build tools node-tools $(if $(filter daemonset,$(DEPLOY)),image image-upstream)
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) RAPIDPROXY_NODE_TOOLS_DIR=$(NODE_TOOLS_DIR) \
		RAPIDPROXY_E2E_MODE=$(MODE) RAPIDPROXY_E2E_KUBE_PROXY=$(KUBE_PROXY) RAPIDPROXY_E2E_FOCUS='$(FOCUS)' RAPIDPROXY_E2E_PROCS=$(PROCS) RAPIDPROXY_E2E_NODES=$(NODES) \
		RAPIDPROXY_E2E_KUBE_PROXY_FLAGS='$(KUBE_PROXY_FLAGS)' RAPIDPROXY_E2E_DEPLOY=$(DEPLOY) \
		RAPIDPROXY_IMAGE=$(OUT)/images/rapidproxy-kube-proxy.tar RAPIDPROXY_UPSTREAM_IMAGE=$(OUT)/images/upstream-kube-proxy.tar \
		$(GO) test -tags realnode -count=1 -timeout 180m -v -run TestE2EUpstream ./test/node

# Our kube-proxy against the API server versions an operator may run it with (test/apiversions):
# the tools' own (v1.37) and the older control planes of hack/skew (v1.36, v1.35), each built once
# by hack/build-tools.sh and cached; `test` runs the tools' own only.
OLDER_CONTROL_PLANES = $(shell for v in v1.36 v1.35; do printf '%s=%s,' $$v "$$(hack/build-tools.sh hack/skew/$$v | tail -n 1)"; done | sed 's/,$$//')
e2e-apiversions: deps build tools
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) RAPIDPROXY_OLDER_CONTROL_PLANES='$(OLDER_CONTROL_PLANES)' \
		$(GO) test -count=1 -timeout 30m -v ./test/apiversions

# Every test: unit tests and the end-to-end tests against a real API server and kernel, with
# real nodes (-tags realnode: test/node's smoke test, our image as the DaemonSet's pod under a
# kubelet, and upstream's Services [Conformance] e2e tests against our kube-proxy in iptables mode
# on three nodes), then every fuzz target for a while.
test: deps build tools node-tools image image-upstream
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) RAPIDPROXY_NODE_TOOLS_DIR=$(NODE_TOOLS_DIR) \
		RAPIDPROXY_IMAGE=$(OUT)/images/rapidproxy-kube-proxy.tar RAPIDPROXY_UPSTREAM_IMAGE=$(OUT)/images/upstream-kube-proxy.tar \
		$(GO) test -tags realnode -count=1 -timeout 70m ./...
	$(MAKE) fuzz

# The IPVS tests, in a VM booting Debian's kernel (test/vm, internal/ipvs): this machine's
# kernel may lack IPVS.
test-ipvs: deps build tools
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) $(GO) test -count=1 -timeout 70m -v ./test/vm/... ./internal/ipvs/...

# Unit tests only: no root, no cluster.
unit:
	$(GO) test -short ./...

# Every fuzz target for FUZZTIME, one at a time (hack/fuzz.sh). A crasher lands in the package's
# testdata/fuzz/FuzzX, where it stays as a seed once fixed.
FUZZTIME ?= 10s
fuzz:
	GO=$(GO) hack/fuzz.sh $(FUZZTIME)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# The local cluster with our kube-proxy serving real traffic; Ctrl-C ends it.
# MODE=ipvs runs the node and its pods in a VM booting Debian's kernel (test/vm).
demo: deps build tools
	$(GO) build -o $(BIN)/demo ./test/demo
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) $(BIN)/demo -mode $(MODE)

# docs/img/dashboard.png: the dashboard's main panels (deploy/monitoring) over a real run of a few
# minutes: our kube-proxy in MODE in the local cluster under endpoint and service churn, scraped by
# Debian's prometheus on loopback, the panels' own expressions queried through its HTTP API and
# plotted (test/dashboardchart).
dashboard-chart: deps build tools
	$(GO) build -o $(BIN)/dashboardchart ./test/dashboardchart
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) $(BIN)/dashboardchart -mode $(MODE) -out docs/img/dashboard.png

# Our kube-proxy against upstream's in the local cluster (not part of `test`):
# N services x E endpoints (comma lists: every N x E shape runs), on each
# iptables BACKEND, with MODE=nftables in nftables mode (BACKENDS unused), or
# with MODE=ipvs in IPVS mode, each proxy in a VM (test/vm); MODE=iptables,nftables
# runs both in one cluster. CAP bounds any one sync wait, IDLE the idle-CPU window.
# More flags (e.g. -profile-dir DIR): BENCH_FLAGS; BENCH_FLAGS="-switch iptables,nftables"
# times a mode switch instead, on the one BACKEND. It also writes each table to
# _output/bench/bench-NxE.md and, from the same results, an SVG chart of ours / upstream per
# mode and backend beside it (`_output/bin/bench -chart-from FILE -chart-dir DIR` redraws the
# charts from such a file). See docs/performance.md.
N        ?= 1000
E        ?= 5
BACKENDS ?= nft
CAP      ?= 10m
IDLE     ?= 60s
bench: deps build tools
	$(GO) build -o $(BIN)/bench ./test/bench
	$(GO) build -o $(BIN)/vm-agent ./test/vm/agent
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) $(BIN)/bench -mode $(MODE) -agent $(BIN)/vm-agent \
		-n $(N) -e $(E) -backends $(BACKENDS) -cap $(CAP) -idle $(IDLE) -chart-dir $(OUT)/bench $(BENCH_FLAGS)

# Packets during rule changes: a fresh TCP connection every 5 ms to a service
# whose endpoints change CHANGES times, ours against upstream's, on each
# iptables BACKEND and in nftables mode; counts lost SYNs and resets. See
# docs/reliability.md.
CHANGES ?= 200
synloss: deps build tools
	$(GO) build -o $(BIN)/bench ./test/bench
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) $(BIN)/bench -synloss $(CHANGES) -mode iptables,nftables \
		-backends nft,legacy -cap 2m $(BENCH_FLAGS)

# The churn soak (not part of `test`, which runs a one-minute version): our kube-proxy over
# SOAK_N services x SOAK_E endpoints while Services and EndpointSlices change at SOAK_RATE writes/s
# for SOAK_FOR, sampling its RSS and goroutines; then the kernel's rules are checked against the
# API. Prints a markdown report, also kept in _output/soak.md. See docs/reliability.md.
SOAK_N    ?= 10000
SOAK_E    ?= 5
SOAK_RATE ?= 50
SOAK_FOR  ?= 10m
soak: deps build tools
	$(GO) build -o $(BIN)/bench ./test/bench
	RAPIDPROXY_TOOLS_DIR=$(TOOLS_DIR) $(BIN)/bench -soak $(SOAK_FOR) -soak-rate $(SOAK_RATE) \
		-n $(SOAK_N) -e $(SOAK_E) -cap $(CAP) > $(OUT)/soak.md; status=$$?; cat $(OUT)/soak.md; exit $$status

# A shell in the demo's client pod (run while `make demo` is up).
demo-shell:
	ip netns exec rpx-pod-client bash

clean:
	rm -rf $(OUT)
