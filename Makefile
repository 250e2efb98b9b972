# remediate — see README.md.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
BIN := bin/remediate
STATICCHECK_VERSION := v0.7.0
# Tests that need real kernels and control planes take a while on 2 cores.
TEST_TIMEOUT ?= 25m
# How many tests marked parallel one package runs at a time (go test
# -parallel; its default is the number of cores). Only end-to-end tests
# that mostly wait are marked (cmd/remediate's TestE2E*, each with a
# control plane of its own, booted one at a time: parallelE2E in
# cmd/remediate/e2e_parallel_test.go); 4 of them overlap their waits.
TEST_PARALLEL ?= 4
PKGS := ./...

.PHONY: all build run test hostdeps test-vm test-node pod-cost lint bench bench-load bench-load-cluster bench-fleet fuzz clean image stress-procs

include tools/controlplane/controlplane.mk
include tools/helm/helm.mk

all: build

# bin/kubectl-remediate is the kubectl plugin (kubectl remediate NODE):
# put it on PATH to use it.
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/remediate
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/kubectl-remediate ./cmd/kubectl-remediate

# Release binaries for the image's platforms, static, version stamped from
# git, and one SPDX SBOM of the modules linked into them (tools/sbom); then
# the image itself without a container engine or registry: deploy/Dockerfile's
# runtime stage (Debian bookworm minbase + tools/image/packages.txt, built by
# mmdebstrap in tools/image/rootfs.sh and cached outside the clone, keyed by
# the package list) plus the binary and the SBOM, packed by tools/image/mkimage
# (go-containerregistry, pinned in tools/image/go.mod) as a docker-archive
# bin/remediate-image-linux-ARCH.tar named as the chart's default image
# (`ctr -n k8s.io images import` or `docker load` it). deploy/image_test.go
# checks that this build and deploy/Dockerfile agree.
# Archives: amd64 and arm64. The arm64 rootfs runs its maintainer scripts
# under qemu-user-static through binfmt_misc (make hostdeps installs it and
# registers the handler); cold it takes minutes (docs/NODE-LANE.md), then it
# is cached like amd64's. deploy TestImageArchives checks each archive
# present (config, ELF machine, programs run in the unpacked rootfs).
# Without root and without a cached rootfs, the archive is skipped (said so).
IMAGE_ARCHES ?= amd64 arm64
IMAGE_ARCHIVE_ARCHES ?= amd64 arm64
IMAGE_REPO ?= ghcr.io/remediate-dev/remediate
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' deploy/helm/remediate/Chart.yaml)
MKIMAGE := _output/bin/mkimage
IMAGE_OUT ?= bin
image:
	@mkdir -p $(IMAGE_OUT)
	@for arch in $(IMAGE_ARCHES); do \
	  echo "$(IMAGE_OUT)/remediate-linux-$$arch ($(VERSION))"; \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" \
	    -o $(IMAGE_OUT)/remediate-linux-$$arch ./cmd/remediate || exit 1; \
	done
	$(GO) run ./tools/sbom -o $(IMAGE_OUT)/remediate.spdx.json $(addprefix $(IMAGE_OUT)/remediate-linux-,$(IMAGE_ARCHES))
	@$(MAKE) --no-print-directory image-archive

.PHONY: image-archive mkimage
mkimage:
	cd tools/image && GOFLAGS=-mod=readonly CGO_ENABLED=0 $(GO) build -trimpath -o $(CURDIR)/$(MKIMAGE) ./mkimage

image-archive: mkimage
	@for arch in $(IMAGE_ARCHIVE_ARCHES); do \
	  rootfs=$$(tools/image/rootfs.sh $$arch) || { \
	    if [ "$$(id -u)" != 0 ]; then echo "not root and no cached rootfs: $(IMAGE_OUT)/remediate-image-linux-$$arch.tar skipped"; continue; fi; exit 1; }; \
	  echo "$(IMAGE_OUT)/remediate-image-linux-$$arch.tar ($(IMAGE_REPO):$(IMAGE_TAG), rootfs $$rootfs)"; \
	  $(MKIMAGE) -base $$rootfs -spec tools/image/image.json -srcdir $(IMAGE_OUT) -arch $$arch \
	    -label org.opencontainers.image.version=$(VERSION) \
	    -name $(IMAGE_REPO):$(IMAGE_TAG) -out $(IMAGE_OUT)/remediate-image-linux-$$arch.tar || exit 1; \
	done

# The main job: one detection pass on this machine with the example audit
# policy, forced dry-run. Exit 2 means "findings present", which is a
# normal answer here, so it does not fail make.
run: build
	@mkdir -p .state
	./$(BIN) --once --dry-run --policy examples/audit.yaml --state-dir .state $(RUN_ARGS); \
	  rc=$$?; if [ $$rc -eq 2 ]; then echo "(exit 2: findings present)"; exit 0; fi; exit $$rc

# As root, the real control plane (kube-apiserver, etcd, kube-proxy built
# from the Go module proxy, cached by the Go build cache) is built first so
# the end-to-end tests run instead of skipping. helm (for the chart tests)
# is always built: cached, it is a link step.
test: hostdeps helm-bin
	@tools/testlanes.sh
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory controlplane-bins; fi
	REMEDIATE_CONTROLPLANE_BIN=$(CONTROLPLANE_BIN) REMEDIATE_HELM=$(HELM_BIN)/helm $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -parallel $(TEST_PARALLEL) $(PKGS)
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-vm; fi
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-node; fi

# The host's Debian packages the tests use (tools/hostdeps/packages.txt, the
# same list .ci/run installs): as root, missing ones are installed; without
# root, the missing ones are named and the lanes needing them skip.
hostdeps:
	@tools/hostdeps/ensure.sh || [ "$$(id -u)" != 0 ]

# The real-kernel lane: the TestVM* tests of VM_PKGS run inside a QEMU VM
# booting Debian's cloud kernel (which has ip_vs, and cgroup v2 with the cpu
# controller for internal/cpustat); see tools/vm/README.md.
VM_PKGS ?= ./internal/ipvs ./internal/cpustat ./detect ./remediate/action
# Then the real kube-proxy in IPVS mode inside the VM against the real
# apiserver on this host (TestIPVSKubeProxyInVM boots the VM itself, inside
# the control plane's network namespace).
test-vm:
	GO=$(GO) tools/vm/run.sh $(VM_PKGS)
	REMEDIATE_VM_KUBEPROXY=1 REMEDIATE_CONTROLPLANE_BIN=$(CONTROLPLANE_BIN) $(GO) test -count=1 -timeout 20m -run '^TestIPVSKubeProxyInVM$$' ./remediate/action

# The real-node lane (root): one real node (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd + runc + the CNI bridge,
# the kubelet; internal/testing/realnode) in a network namespace, the chart
# installed with helm under the real kubelet, the scenarios of
# internal/testing/realnode/lane_test.go, then everything torn down by PID.
# The lane's image is built into _output/node (amd64 only), from the cached
# rootfs (tools/image/rootfs.sh). NODE_RUN narrows the scenarios.
NODE_RUN ?= .
test-node: hostdeps helm-bin controlplane-bins node-bins
	@$(MAKE) --no-print-directory image IMAGE_ARCHES=amd64 IMAGE_ARCHIVE_ARCHES=amd64 IMAGE_OUT=_output/node
	REMEDIATE_NODE_LANE=1 REMEDIATE_CONTROLPLANE_BIN=$(CONTROLPLANE_BIN) REMEDIATE_HELM=$(HELM_BIN)/helm \
	  REMEDIATE_MKIMAGE=$(CURDIR)/$(MKIMAGE) REMEDIATE_NODE_ROOTFS=$$(tools/image/rootfs.sh amd64) \
	  REMEDIATE_NODE_IMAGE=$(CURDIR)/_output/node/remediate-image-linux-amd64.tar \
	  $(GO) test -count=1 -timeout 30m -v -run '$(NODE_RUN)' ./internal/testing/realnode/

# What the chart's pod costs at idle on the real node (not a CI test):
# CPU millicores and RSS from its pod cgroup over POD_COST_WINDOW.
POD_COST_WINDOW ?= 10m
pod-cost:
	REMEDIATE_NODE_POD_COST=$(POD_COST_WINDOW) $(MAKE) --no-print-directory test-node NODE_RUN='^TestNodePodCost$$'

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(PKGS)

# docs/PERFORMANCE.md from benchmark output (never edited by hand): the
# benchmarks of PERF_PKGS matching PERF_BENCH, PERF_COUNT runs each, are
# recorded with the machine and the date in docs/perf/bench.txt (the
# input, kept), then tools/perfdocs renders the page from it; its test
# fails when the page is not what the recorded input renders to.
# `make perf-docs-render` re-renders from the recorded input only. The
# real-kernel benchmarks need root; a full run takes tens of minutes.
PERF_PKGS ?= $(PKGS)
PERF_BENCH ?= .
PERF_COUNT ?= 5
PERF_IN := docs/perf/bench.txt
.PHONY: perf-docs perf-docs-render
perf-docs:
	@mkdir -p $(dir $(PERF_IN))
	{ echo "date: $$(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "kernel: $$(uname -sr)"; echo "cores: $$(nproc)"; \
	  echo "go: $$($(GO) env GOVERSION)"; echo "loadavg: $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	  echo "command: go test -run '^$$' -bench '$(PERF_BENCH)' -benchmem -count $(PERF_COUNT) $(PERF_PKGS)"; \
	  $(GO) test -run '^$$' -bench '$(PERF_BENCH)' -benchmem -count $(PERF_COUNT) -timeout 60m $(PERF_PKGS); } > $(PERF_IN).tmp
	mv $(PERF_IN).tmp $(PERF_IN)
	@$(MAKE) --no-print-directory perf-docs-render
perf-docs-render:
	$(GO) run ./tools/perfdocs -in $(PERF_IN) -out docs/PERFORMANCE.md

# The real binary on a loaded node (root): ~20k kube-proxy-shaped nat rules
# in iptables-legacy in a namespace of its own, 1,000 extra processes, no
# kube-proxy, no cluster access; prints CPU per cycle (own + children) and
# RSS, idle and loaded (internal/testing/benchload); then the same binary
# beside a real apiserver and kube-proxy (internal/testing/clusterload,
# below; figures in docs/SCALE.md).
# The binary measured is built as released (static, stripped: the file-backed
# part of its RSS depends on it), not the development build.
BENCH_BIN := _output/bench/remediate
bench-load:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(BENCH_BIN) ./cmd/remediate
	$(GO) run ./internal/testing/benchload -bin $(BENCH_BIN) $(BENCHLOAD_ARGS)
	REMEDIATE_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) $(GO) test -run '^$$' -bench BenchmarkCycleWithClusterView -benchtime 1x -timeout 30m ./internal/testing/clusterload/

# Only the cluster part of bench-load (docs/SCALE.md): a real apiserver and
# kube-proxy, the released binary beside them, CPU per cycle and RSS at
# CLUSTERLOAD_SERVICES (default 500,5000,10000) Services, steady and under
# CLUSTERLOAD_CHURN (20) changes a minute.
bench-load-cluster:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(BENCH_BIN) ./cmd/remediate
	REMEDIATE_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) $(GO) test -run '^$$' -bench BenchmarkCycleWithClusterView -benchtime 1x -timeout 30m ./internal/testing/clusterload/

# What N nodes of remediate cost the control plane, beside N real kube-proxies
# (docs/SCALE.md "Fleet cost on the control plane"): the real apiserver with
# a Metadata audit log, FLEET_SERVICES (5000) Services, then FLEET_NODES
# (10,25,50) nodes, each a network namespace with kube-proxy and the released
# daemon; requests per node and role from the audit log, steady and under
# churn. Root; tens of minutes.
bench-fleet:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(BENCH_BIN) ./cmd/remediate
	REMEDIATE_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) $(GO) test -run '^$$' -bench '^BenchmarkFleet$$' -benchtime 1x -timeout 150m ./internal/testing/clusterload/

# Every real-process test of the process scan (internal/procs), STRESS_COUNT
# times in one test binary (built once): a test that fails 1 in 50 runs is a
# failing test. Run as root (other users' processes are read) and after any
# change to the scan; the last run's counts are in docs/TESTING.md.
STRESS_COUNT ?= 300
STRESS_PROCS_RUN := ^(TestReal.*|TestListProcInodes|TestScanConcurrent|TestScanCommsShared|TestFindRereadsAnArgvReadEmpty)$$
stress-procs:
	@mkdir -p _output/stress
	$(GO) test -c -o _output/stress/procs.test ./internal/procs
	cd internal/procs && ../../_output/stress/procs.test -test.run '$(STRESS_PROCS_RUN)' -test.count $(STRESS_COUNT) -test.timeout 60m

# Short fuzz run of every fuzz target (FUZZTIME each).
FUZZTIME ?= 30s
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg || exit 1; \
	  done; done

clean:
	rm -rf bin _output .state
