# etcd-manager: the Makefile tells the story.
#   make demo   run a real local cluster (Ctrl-C stops it)
#   make test   run every test (builds the real etcd binaries first)

ETCD_VERSIONS ?= 3.6.16 3.5.35
GO            ?= go
export GOTOOLCHAIN := local

.PHONY: all tools build demo test unit integration lint clean

all: build

## tools: real etcd/etcdctl/etcdutl per version into bin/etcd-v<version>/, and staticcheck.
## Built once into ~/.cache/etcd-manager/tools and linked; a changed pin rebuilds.
tools:
	@for v in $(ETCD_VERSIONS); do hack/build-etcd.sh $$v || exit 1; done
	@hack/build-go-tool.sh staticcheck honnef.co/go/tools/cmd/staticcheck

## build: bin/etcd-manager and bin/etcd-manager-ctl.
build:
	$(GO) build -o bin/ ./cmd/etcd-manager ./cmd/etcd-manager-ctl

## demo: a real local cluster on loopback with a file:// store under .demo/.
demo: tools build
	hack/demo.sh

## test: every test, unit and integration, against real etcd.
test: tools
	$(GO) test -count=1 -timeout 30m ./...

unit:
	$(GO) test -count=1 ./internal/... ./cmd/...

integration: tools
	$(GO) test -count=1 -timeout 30m ./test/...

## lint: go vet plus staticcheck.
lint: tools
	$(GO) vet ./...
	bin/staticcheck ./...

clean:
	rm -rf bin .demo
