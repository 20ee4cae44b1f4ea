# hwipam — build, test, lint, generate. `make help` lists the targets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

BIN_DIR       := $(CURDIR)/bin
VERSION       ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT        ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
# -s -w: no symbol table or DWARF (stack traces keep their names); the plugin is
# exec'd for every CNI call, and a smaller file starts faster.
LDFLAGS       := -s -w -X github.com/hwipam/hwipam/pkg/version.Version=$(VERSION) \
                 -X github.com/hwipam/hwipam/pkg/version.Commit=$(COMMIT)
BINARIES      := $(notdir $(wildcard cmd/*))
# The plugin's own ELF entry point on linux/amd64: it starts the Go runtime sized
# for one CPU (see cmd/nv-ipam/entry_linux_amd64.go). Elsewhere it is built as is.
# GOOS/GOARCH given on make's command line reach `go env` too (make < 4.4 does not
# export them to $(shell)), so `make build GOARCH=arm64` links without it.
PLUGIN_LDFLAGS := $(if $(filter linux/amd64,$(shell GOOS=$(GOOS) GOARCH=$(GOARCH) go env GOOS GOARCH | paste -sd/)),-E main.entry)

# Tools, pinned, installed through the Go module proxy into bin/.
GOLANGCI_LINT_VERSION  := v2.15.0
CONTROLLER_GEN_VERSION := v0.23.0
PROTOC_GEN_GO_VERSION  := v1.36.11
PROTOC_GEN_GRPC_VERSION := v1.6.1
GOLANGCI_LINT  := $(BIN_DIR)/golangci-lint-$(GOLANGCI_LINT_VERSION)
CONTROLLER_GEN := $(BIN_DIR)/controller-gen-$(CONTROLLER_GEN_VERSION)
PROTOC_GEN_GO   := $(BIN_DIR)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
PROTOC_GEN_GRPC := $(BIN_DIR)/protoc-gen-go-grpc-$(PROTOC_GEN_GRPC_VERSION)

# Debian packages the tests need: `ip` (iproute2) for network namespaces, ping.
# runc (with seccomp), busybox-static (the workload image) and iptables (the node's
# service address) for the real node.
APT_PACKAGES := iproute2 iputils-ping runc busybox-static iptables

# Loads KUBEBUILDER_ASSETS and HWIPAM_CNI_BIN_DIR, building the assets on first use.
ASSETS_ENV := eval "$$(hack/test-assets.sh env)"

TEST_FLAGS ?= -timeout 25m
# make test runs every package but the real node this many at a time: they wait on
# API servers, daemons and timers far more than they compute (at 4, 1.3–1.6 of the 2
# cores were busy), so more than one per core shortens the run. The slowest are
# named first: go test starts packages in the order given as slots free up.
TEST_PARALLEL  ?= 4
SLOW_TEST_PKGS := ./test/system ./pkg/ipamnode ./pkg/ipamcontroller ./test/privilege ./pkg/nicdra ./pkg/ipamctl
# Named last, to run beside the slowest packages' last minutes: make demo's steps
# (a real node of its own, about a minute), checked for output that reads as a failure.
LAST_TEST_PKGS := ./hack/demo
# An execution count, not a duration: Go 1.26's fuzz coordinator can fail a run that
# ends on a -fuzztime deadline with a bare "context deadline exceeded" and no crasher
# (golang/go#75804, fixed in Go 1.27). 30000 executions take 1-10 s per target here.
FUZZ_TIME  ?= 30000x

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z_-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Build

.PHONY: build
build: ## Build every binary under cmd/ into bin/.
	@mkdir -p $(BIN_DIR)
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN_DIR)/ $(addprefix ./cmd/,$(filter-out nv-ipam,$(BINARIES)))
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS) $(PLUGIN_LDFLAGS)" -o $(BIN_DIR)/ ./cmd/nv-ipam

# The image: the layout of the Dockerfile (binaries at /, distroless-like /etc/passwd,
# default user 65532 "nonroot"; ipam-node's DaemonSet runs it as root), built with
# go-containerregistry by hack/image, no Docker engine needed. One OCI image index
# for IMAGE_PLATFORMS: each platform's static binaries in $(BIN_DIR)/<os>_<arch>/, its
# image's configuration naming that platform; a node pulls its own.
IMAGE_NAME      ?= hwipam
IMAGE_TAG       ?= $(VERSION)
IMAGE_TAR       := $(BIN_DIR)/hwipam-image.tar
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
REGISTRY        ?=
IMAGE_TOOL       = $$(hack/test-assets.sh image-tool)

# build-for OS/ARCH: every binary for that platform into $(BIN_DIR)/<os>_<arch>/, the
# plugin with its own entry point only on linux/amd64 (as PLUGIN_LDFLAGS).
define build-for
	@mkdir -p $(BIN_DIR)/$(subst /,_,$(1))
	CGO_ENABLED=0 GOOS=$(word 1,$(subst /, ,$(1))) GOARCH=$(word 2,$(subst /, ,$(1))) go build -trimpath -ldflags "$(LDFLAGS)" \
		-o $(BIN_DIR)/$(subst /,_,$(1))/ $(addprefix ./cmd/,$(filter-out nv-ipam,$(BINARIES)))
	CGO_ENABLED=0 GOOS=$(word 1,$(subst /, ,$(1))) GOARCH=$(word 2,$(subst /, ,$(1))) go build -trimpath \
		-ldflags "$(LDFLAGS) $(if $(filter linux/amd64,$(1)),-E main.entry)" -o $(BIN_DIR)/$(subst /,_,$(1))/ ./cmd/nv-ipam

endef

.PHONY: image
image: ## Build the hwipam image index (IMAGE_PLATFORMS: linux/amd64 linux/arm64) into bin/hwipam-image.tar, an OCI layout (no Docker; `ctr images import` or `make image-push`).
	$(foreach p,$(IMAGE_PLATFORMS),$(call build-for,$(p)))
	@mkdir -p $(BIN_DIR)/image-root
	@printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > $(BIN_DIR)/image-root/passwd
	@printf 'root:x:0:\nnonroot:x:65532:\n' > $(BIN_DIR)/image-root/group
	$(IMAGE_TOOL) build -o $(IMAGE_TAR) --tag $(IMAGE_NAME):$(IMAGE_TAG) --user 65532:65532 \
		$(addprefix --platform ,$(IMAGE_PLATFORMS)) --dir /tmp:1777 --dir /home/nonroot:0700 \
		/etc/passwd=$(BIN_DIR)/image-root/passwd:0644 /etc/group=$(BIN_DIR)/image-root/group:0644 \
		$(foreach b,$(BINARIES),/$(b)=$(BIN_DIR)/{os}_{arch}/$(b))

.PHONY: image-push
image-push: ## Push the image index to $(REGISTRY)/$(IMAGE_NAME):$(IMAGE_TAG) (plain HTTP for a loopback registry).
	@if [ -z "$(REGISTRY)" ]; then echo "set REGISTRY, e.g. make image-push REGISTRY=registry.example.com/hwipam" >&2; exit 2; fi
	@$(MAKE) --no-print-directory image
	$(IMAGE_TOOL) push $(if $(filter localhost% 127.%,$(REGISTRY)),--insecure) $(IMAGE_TAR) $(REGISTRY)/$(IMAGE_NAME):$(IMAGE_TAG)

.PHONY: clean
clean: ## Remove build outputs (bin/). The test-asset cache is kept.
	rm -rf $(BIN_DIR)

##@ Demo

.PHONY: demo
demo: root-check deps test-assets ## A real node running hwipam: NIC labels, rail pools, Multus NADs, pods and their addresses (root).
	@$(ASSETS_ENV) && go run ./hack/demo up

.PHONY: demo-down
demo-down: root-check ## Stop the demo and remove everything it made.
	@go run ./hack/demo down

.PHONY: root-check
root-check:
	@if [ "$$(id -u)" != 0 ]; then \
		echo "the demo runs a real kubelet and containerd and needs root (links, mounts, cgroups, iptables): run it as root, e.g. sudo make demo" >&2; exit 1; fi

##@ Test

.PHONY: deps
deps: ## Install what tests need: Debian packages (apt-get) and Go modules.
	@missing=(); for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing+=($$p); done; \
	if [ $${#missing[@]} -gt 0 ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian packages: $${missing[*]}"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$${missing[@]}"; \
		else \
			echo "warning: missing Debian packages $${missing[*]} (run as root to install them); netns tests will fail" >&2; \
		fi; \
	fi
	go mod download

.PHONY: test-assets
test-assets: ## Build (once, then cached) kube-apiserver, etcd and the CNI reference plugins.
	hack/test-assets.sh

.PHONY: test
test: deps test-assets check-generated ## Install everything needed and run all tests (root for the netns tests).
	$(ASSETS_ENV) && HWIPAM_SYSTEM_SEEDS=$${HWIPAM_SYSTEM_SEEDS:-2} go test -p $(TEST_PARALLEL) $(TEST_FLAGS) $(SLOW_TEST_PKGS) \
		$$(go list ./... | grep -v -e '/test/realnode$$' $(foreach p,$(SLOW_TEST_PKGS) $(LAST_TEST_PKGS),-e '$(patsubst .%,%,$(p))$$')) \
		$(LAST_TEST_PKGS)
	@# The real node (kubelet, containerd, probes with deadlines) runs without other
	@# packages' tests beside it (it keeps a fifth of the 2 cores busy); the fuzz
	@# targets run beside it on one core, their output printed after its.
	@fuzzlog=$$(mktemp -t hwipam-fuzz.XXXXXX); \
	$(MAKE) --no-print-directory fuzz FUZZ_FLAGS=-parallel=1 > $$fuzzlog 2>&1 & fuzz=$$!; \
	rc=0; $(ASSETS_ENV) && go test $(TEST_FLAGS) ./test/realnode || rc=$$?; \
	frc=0; wait $$fuzz || frc=$$?; echo "make fuzz, beside the real node:"; cat $$fuzzlog; rm -f $$fuzzlog; \
	if [ $$frc != 0 ]; then echo "make fuzz failed" >&2; fi; \
	exit $$(( rc != 0 ? rc : frc ))

.PHONY: test-long
test-long: deps test-assets ## The heaviest randomised runs: the whole-system test with faults, 10 seeds of 150 steps (~15 minutes).
	$(ASSETS_ENV) && HWIPAM_SYSTEM_FAULTS=1 HWIPAM_SYSTEM_SEEDS=$${HWIPAM_SYSTEM_SEEDS:-10} HWIPAM_SYSTEM_STEPS=$${HWIPAM_SYSTEM_STEPS:-150} \
		go test -timeout 90m -run 'TestWholeSystemInvariants$$' -v ./test/system

.PHONY: fuzz
fuzz: ## Run every fuzz target briefly (FUZZ_TIME each).
	@# The packages with fuzz targets, found in their sources (listing every
	@# package's tests would build them all once more).
	@for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for f in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
			echo "fuzz $$dir $$f ($(FUZZ_TIME))"; \
			go test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZ_TIME) $(FUZZ_FLAGS) $$dir || exit 1; \
		done; \
	done

.PHONY: bench
bench: deps test-assets build ## Run the benchmarks (real apiserver, real daemon and plugins).
	$(ASSETS_ENV) && go test -run '^$$' -bench . -benchmem -timeout 180m ./...

##@ Code quality

.PHONY: vet
vet: ## go vet.
	go vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (pinned, built into bin/).
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	@mkdir -p $(BIN_DIR)
	GOBIN=$(BIN_DIR) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN_DIR)/golangci-lint $@

$(CONTROLLER_GEN):
	@mkdir -p $(BIN_DIR)
	GOBIN=$(BIN_DIR) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN_DIR)/controller-gen $@

$(PROTOC_GEN_GO):
	@mkdir -p $(BIN_DIR)
	GOBIN=$(BIN_DIR) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	mv $(BIN_DIR)/protoc-gen-go $@

$(PROTOC_GEN_GRPC):
	@mkdir -p $(BIN_DIR)
	GOBIN=$(BIN_DIR) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GRPC_VERSION)
	mv $(BIN_DIR)/protoc-gen-go-grpc $@

.PHONY: protoc
protoc: ## Install protoc (Debian's protobuf-compiler) when missing.
	@command -v protoc >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends protobuf-compiler; \
		else echo "protoc is missing: install Debian's protobuf-compiler" >&2; exit 1; fi; }

##@ Generated code

# Paths whose content is generated; verify-generated fails when they differ from what
# the generators produce now.
GENERATED_PATHS := api deploy/crds deploy/webhook deploy/rbac/controller deploy/rbac/node/role.yaml

.PHONY: generate
PROTO_FILES := $(shell find api/grpc -name '*.proto')

generate: $(CONTROLLER_GEN) $(PROTOC_GEN_GO) $(PROTOC_GEN_GRPC) protoc ## Generate code: deepcopy for api/..., gRPC from api/grpc/**/*.proto.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./api/..."
	protoc -I api/grpc \
		--plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=api/grpc --go_opt=paths=source_relative \
		--plugin=protoc-gen-go-grpc=$(PROTOC_GEN_GRPC) --go-grpc_out=api/grpc --go-grpc_opt=paths=source_relative \
		$(PROTO_FILES)

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs (deploy/crds), webhook (deploy/webhook), RBAC (deploy/rbac/{controller,node}).
	$(CONTROLLER_GEN) crd webhook paths="./api/..." output:crd:artifacts:config=deploy/crds \
		output:webhook:artifacts:config=deploy/webhook
	$(CONTROLLER_GEN) rbac:roleName=hwipam-controller paths="./pkg/poolcontroller/..." \
		output:rbac:artifacts:config=deploy/rbac/controller
	$(CONTROLLER_GEN) rbac:roleName=hwipam-node paths="./pkg/ipamnode/..." \
		output:rbac:artifacts:config=deploy/rbac/node

.PHONY: check-generated
check-generated: ## Fail when `make generate manifests` would change a file of the work tree (make test runs it).
	@snap=$$(mktemp -d) && trap 'rm -rf "$$snap"' EXIT && \
	tar -cf "$$snap/before.tar" $(GENERATED_PATHS) && mkdir "$$snap/before" && tar -xf "$$snap/before.tar" -C "$$snap/before" && \
	$(MAKE) --no-print-directory generate manifests >"$$snap/log" 2>&1 || { cat "$$snap/log"; exit 1; }; \
	stale=0; for p in $(GENERATED_PATHS); do diff -rq "$$snap/before/$$p" "$$p" || stale=1; done; \
	if [ $$stale = 1 ]; then echo "generated files were stale: make generate manifests changed the files above (keep the change and commit it)" >&2; exit 1; fi; \
	echo "generated files are current"

.PHONY: verify-generated
verify-generated: generate manifests ## Fail when checked-in generated files are stale.
	@if ! git diff --quiet -- $(GENERATED_PATHS) || [ -n "$$(git ls-files --others --exclude-standard -- $(GENERATED_PATHS))" ]; then \
		git status --short -- $(GENERATED_PATHS); \
		echo "generated files are stale: run 'make generate manifests' and commit the result" >&2; exit 1; \
	fi; echo "generated files are current"
