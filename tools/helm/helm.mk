# helm.mk: the pinned helm CLI the chart tests run (deploy/helm_test.go).
# The top-level Makefile includes this file.
#
#   make helm-bin   build helm (version in tools/helm/go.mod) into
#                   _output/bin/helm from the Go module proxy. Cold: ~3 min
#                   of CPU (15 min wall measured on a 2-core machine shared by
#                   other builds); afterwards the Go build cache makes it a
#                   link step (~15 s).
#
# The deploy tests find it there (or through REMEDIATE_HELM); without it
# they skip, and with REMEDIATE_E2E_REQUIRED=1 (CI) they fail.

HELM_BIN ?= $(CURDIR)/_output/bin

.PHONY: helm-bin
helm-bin:
	@tools/progress.sh "helm (tools/helm)" env OUT=$(HELM_BIN) tools/helm/build.sh
