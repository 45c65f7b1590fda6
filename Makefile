# etcd-manager: the Makefile tells the story.
#   make demo   run a real local cluster (Ctrl-C stops it); builds only
#               what it runs: one etcd and the three binaries
#   make test   run every test; installs the Debian packages and builds
#               the tools they need first

ETCD_VERSIONS ?= 3.6.16 3.5.35 3.7.3
# etcd 3.4 comes from Debian's package (for migrations from 3.4).
DEBIAN_ETCD   ?= 3.4.23 3.4.23-4+b4
GO            ?= go
export GOTOOLCHAIN := local
# Build tags of every build and test here, the harness's and the image's
# included. disable_grpc_modules leaves out the Google Cloud Storage
# client's gRPC transport (DirectPath, xDS), which gs:// stores do not use
# (gocloud speaks its JSON API over HTTP). The agent's binary is 57 MB
# instead of 76, and `etcd-manager --help` peaks at 30 MiB of RSS instead
# of 39: every package linked is initialised at start.
GO_TAGS ?= disable_grpc_modules
export GOFLAGS += -tags=$(GO_TAGS)
# The tests' builds add testhooks: crash, pause and clock hooks
# (internal/testhook) that release builds (build, image, bench) leave out.
TEST_TAGS := -tags=$(GO_TAGS),testhooks

.PHONY: all release release-check packages tools etcd demo-etcd kube build image generate demo test unit integration e2e-kube bench bench-large chaos lint clean

all: build

## tools: real etcd/etcdctl/etcdutl per version into bin/etcd-v<version>/ (3.4 from Debian's package), staticcheck,
## controller-gen, Helm (bin/helm, to render the chart in the tests), MinIO (bin/minio), the Azure blob emulator
## (bin/azurite-blob), the GCS emulator (bin/fake-gcs-server) and Kubernetes v1.37.0 (bin/kubernetes/), each pinned
## under hack/tools/.
## Built once into ~/.cache/etcd-manager/tools and linked; a changed pin rebuilds.
tools: etcd kube
	@hack/fetch-debian-etcd.sh $(DEBIAN_ETCD)
	@hack/build-go-tool.sh staticcheck honnef.co/go/tools/cmd/staticcheck
	@hack/build-go-tool.sh controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen
	@hack/build-go-tool.sh helm helm.sh/helm/v4/cmd/helm
	@hack/build-go-tool.sh minio github.com/minio/minio
	@hack/build-go-tool.sh fake-gcs-server github.com/fsouza/fake-gcs-server
	@hack/build-npm-tool.sh azurite azurite-blob

## packages: the Debian packages the tests need (containerd, runc, CNI plugins, openssl, curl, systemd, chromium,
## npm), through apt, when they are missing; it starts and stops no service.
packages:
	@hack/packages.sh

## kube: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl v1.37.0, built from the Go
## module proxy into the cache (cold: about 21 CPU-minutes) and linked as bin/kubernetes/.
kube:
	@hack/build-kube.sh

## build: bin/etcd-manager, bin/etcd-manager-ctl and bin/etcd-manager-operator.
## The binaries carry the commit they were built from (--version), whatever GOFLAGS says.
build:
	$(GO) build -buildvcs=auto -o bin/ ./cmd/etcd-manager ./cmd/etcd-manager-ctl ./cmd/etcd-manager-operator

## generate: the API's deep copies, the CRDs (deploy/crds/) and the operator's RBAC (deploy/operator/rbac/), with
## controller-gen, and their copies in the Helm chart; make lint fails when they are stale.
generate:
	@hack/build-go-tool.sh controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen
	bin/controller-gen object paths=./api/... crd:crdVersions=v1 output:crd:artifacts:config=deploy/crds \
	  rbac:roleName=etcd-manager-operator paths=./internal/operator/... output:rbac:artifacts:config=deploy/operator/rbac
	@# The Helm chart carries the same CRDs and rules (its templates render them
	@# as a ClusterRole, or as a Role per watched namespace), and so does the
	@# kustomization that watches one namespace.
	cp deploy/crds/etcd-manager.dev_*.yaml deploy/helm/etcd-manager-operator/files/crds/
	cp deploy/operator/rbac/role.yaml deploy/helm/etcd-manager-operator/files/rbac-rules.yaml
	sed -e 's/^kind: ClusterRole$$/kind: Role/' deploy/operator/rbac/role.yaml > deploy/operator-namespaced/role.yaml

## image: the container image as a tarball, bin/etcd-manager-image.tar, tagged $(IMAGE_TAG); built without a
## Docker engine, reproducibly; docker load, podman load and ctr images import accept it.
IMAGE_TAG ?= etcd-manager:dev
image: etcd
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -o bin/image/ ./cmd/etcd-manager ./cmd/etcd-manager-ctl ./cmd/etcd-manager-operator
	IMAGE_TAG='$(IMAGE_TAG)' $(GO) run ./hack/image -bin-dir=bin/image -etcd-dir=bin -etcd-versions='$(ETCD_VERSIONS)' -output=bin/etcd-manager-image.tar

## release: static binaries for linux/amd64 and linux/arm64 (tarballs), the image tarball and SHA256SUMS under
## bin/release/, reproducibly; VERSION defaults to git describe. release-check builds it twice and compares.
release: etcd
	@hack/release.sh

release-check: etcd
	@RELEASE_DIR=bin/release-a hack/release.sh >/dev/null && RELEASE_DIR=bin/release-b hack/release.sh >/dev/null
	@diff bin/release-a/SHA256SUMS bin/release-b/SHA256SUMS && echo "release-check: two builds gave the same files" && cat bin/release-a/SHA256SUMS

## etcd: the etcd builds only ($(ETCD_VERSIONS)), cached like the other tools.
etcd:
	@for v in $(ETCD_VERSIONS); do hack/build-etcd.sh $$v || exit 1; done

## demo: a real local cluster on loopback with a file:// store under .demo/. It builds only what it runs: etcd
## $(DEMO_ETCD_VERSION) and the three binaries.
DEMO_ETCD_VERSION ?= 3.6.16
demo-etcd:
	@hack/build-etcd.sh $(DEMO_ETCD_VERSION)

demo: demo-etcd build
	DEMO_ETCD_VERSION=$(DEMO_ETCD_VERSION) hack/demo.sh

## test: every test, unit and integration, against real etcd; benchmarks at small scale. Installs the packages and
## builds the tools first.
test: packages tools
	BENCH_SCALE=small $(GO) test $(TEST_TAGS) -count=1 -timeout 45m ./...
	cd deploy/monitoring && $(GO) test -count=1 ./...

unit:
	$(GO) test $(TEST_TAGS) -count=1 ./internal/... ./cmd/...

integration: tools
	$(GO) test $(TEST_TAGS) -count=1 -timeout 45m ./test/...

## e2e-kube: the operator end to end on a real single-node Kubernetes v1.37.0 (hack/kube.sh) with the shipped CRDs,
## RBAC and image: create, scale, pod loss, a wiped member, a version roll under a writer, backup and restore,
## deletion. Prints its figures last. Needs root, and Debian's containerd, runc and containernetworking-plugins.
e2e-kube: packages tools build image
	$(GO) test -count=1 -tags e2ekube -timeout 60m -v ./test/kube/

## bench: figures against baselines measured in the same run; writes bench/results/latest.json.
BENCH_SCALE ?= full
bench: tools
	BENCH_SCALE=$(BENCH_SCALE) $(GO) test -count=1 -timeout 60m -run TestBench -v ./bench/

## bench-large: the backup, restore and backup-RSS figures on an 8 GiB DB (etcd's recommended largest); it checks
## the free disk under TMPDIR first (the restore needs about 58 GiB, the backups 60) and writes bench/results/large.json.
bench-large: tools
	BENCH_SCALE=large $(GO) test -count=1 -timeout 150m -run TestBench -v ./bench/

## chaos: ROUNDS rounds of faults under a linearizability-checked workload (test/chaos); the report goes to
## chaos-report/, and the last line printed is the summary.
ROUNDS ?= 20
chaos: tools
	@rm -rf chaos-report
	@CHAOS_ROUNDS=$(ROUNDS) CHAOS_REPORT_DIR=$(CURDIR)/chaos-report $(GO) test $(TEST_TAGS) -count=1 -timeout 12h -run TestChaos -v ./test/chaos/; \
	  rc=$$?; tail -n 1 chaos-report/summary.txt 2>/dev/null || echo "chaos: no summary (see the output above)"; exit $$rc

## lint: gofmt, go vet, staticcheck, and generated files that match their sources.
lint: tools
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(MAKE) -s generate >/dev/null
	@git diff --exit-code -- api deploy || { echo "generated files are stale: run make generate and commit"; exit 1; }
	$(GO) vet ./...
	$(GO) vet $(TEST_TAGS) ./...
	bin/staticcheck ./...
	bin/staticcheck $(TEST_TAGS) ./internal/testhook/
	cd deploy/monitoring && $(GO) vet ./... && ../../bin/staticcheck ./...

clean:
	rm -rf bin .demo
