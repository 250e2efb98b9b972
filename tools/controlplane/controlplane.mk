# controlplane.mk: targets for the real control plane used by end-to-end tests.
# The top-level Makefile includes this file (`include tools/controlplane/controlplane.mk`).
#
#   make controlplane-bins   build kube-apiserver, kube-proxy (Kubernetes v1.34.4)
#                            and etcd (v3.6.4) into _output/bin (git-ignored).
#   make node-bins           build kubelet, kube-controller-manager and
#                            kube-scheduler (v1.34.4) there too (make test-node).
#                            First build ~5-10 min on 2 cores; afterwards the Go
#                            build cache makes it a link step (seconds).
#   make e2e                 build them if needed, then run only the tests that
#                            start the real control plane (needs root). With
#                            REMEDIATE_E2E_REQUIRED=1 a missing prerequisite
#                            fails instead of skipping.
#
# Run one e2e test alone:
#   make controlplane-bins
#   sudo go test -run 'TestE2E' -v ./detect/
#
# End-to-end tests are those whose name contains E2E or EndToEnd (the
# harness's own test: TestControlPlane); E2E_RUN/E2E_PKGS narrow the run.

GO ?= go
CONTROLPLANE_BIN ?= $(CURDIR)/_output/bin
E2E_PKGS ?= ./...
E2E_RUN ?= E2E|EndToEnd|^TestControlPlane$$

.PHONY: controlplane-bins node-bins e2e
controlplane-bins:
	@tools/progress.sh "control plane (kube-apiserver, kube-proxy, etcd: tools/controlplane)" env OUT=$(CONTROLPLANE_BIN) tools/controlplane/build.sh

# The real-node lane's kubelet, kube-controller-manager and kube-scheduler
# (same module and versions; ~12 min cold on 2 cores, a relink when cached).
node-bins:
	OUT=$(CONTROLPLANE_BIN) NODE=1 tools/controlplane/build.sh

e2e: controlplane-bins
	REMEDIATE_CONTROLPLANE_BIN=$(CONTROLPLANE_BIN) REMEDIATE_E2E_REQUIRED=1 \
		$(GO) test -count=1 -timeout 20m -run '$(E2E_RUN)' -v $(E2E_PKGS)
