#!/bin/sh
# build.sh builds the pinned helm CLI (helm.sh/helm/v3, version in go.mod)
# from the Go module proxy into OUT (default: <repo>/_output/bin, ignored by
# git). Idempotent: `go build` reuses the Go build cache; a second run only
# links (a few seconds).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${OUT:-$repo/_output/bin}
mkdir -p "$out"
cd "$here"
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
export CGO_ENABLED=0
# The ldflags helm's own Makefile sets: its version, and the Kubernetes
# version `helm template` and `helm lint` assume (that of its client-go).
ver=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)
k8s=$(go list -m -f '{{.Version}}' k8s.io/client-go) # v0.MINOR.PATCH
minor=$(echo "$k8s" | cut -d. -f2)
ld="-X helm.sh/helm/v3/internal/version.version=$ver"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ld="$ld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
done
go build -ldflags "$ld" -o "$out/helm" helm.sh/helm/v3/cmd/helm
"$out/helm" version --short
