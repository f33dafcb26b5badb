# rapidproxy: a drop-in replacement for kube-proxy.
# Targets that touch the kernel (test, demo) need root on Debian/Ubuntu.

GO      ?= go
OUT     := $(CURDIR)/_output
BIN     := $(OUT)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
LDFLAGS := -X github.com/rapidproxy/rapidproxy/pkg/version.gitVersion=$(VERSION)

# Tests find the binaries they drive through these.
export RAPIDPROXY_KUBE_PROXY := $(BIN)/kube-proxy

.PHONY: all build deps test unit lint demo clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/kube-proxy ./cmd/kube-proxy

deps:
	hack/install-deps.sh

# Every test: unit tests and the end-to-end tests against a real API server and kernel.
test: deps build
	$(GO) test -count=1 -timeout 40m ./...

# Unit tests only: no root, no cluster.
unit:
	$(GO) test -short ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf $(OUT)
