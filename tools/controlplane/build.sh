#!/bin/sh
# build.sh builds the pinned kube-apiserver, kube-proxy (Kubernetes v1.34.4) and
# etcd (v3.6.4) that the end-to-end tests run, from the Go module proxy, into
# OUT (default: <repo>/_output/bin, ignored by git).
#
# Idempotent: `go build` reuses the Go build cache, so a second run only links
# (a few seconds) and a run with nothing changed rewrites identical binaries.
# The versions are those of tools/controlplane/go.mod and go.sum (committed).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${OUT:-$repo/_output/bin}
mkdir -p "$out"
cd "$here"
# -mod=readonly: never rewrite go.mod/go.sum here; a mismatch is an error.
# -trimpath: binaries do not depend on where the module cache lives.
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
export CGO_ENABLED=0
# kube-apiserver and the node's binaries report v1.34.4 (a plain module
# build says v0.0.0-master, which helm's kubeVersion check refuses); the
# version only changes the link step. kube-proxy keeps the module's version.
v=v1.34.4
ver="-X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1"
ver="$ver -X k8s.io/component-base/version.gitMinor=34 -X k8s.io/component-base/version.gitTreeState=clean"
ver="$ver -X k8s.io/client-go/pkg/version.gitVersion=$v -X k8s.io/client-go/pkg/version.gitMajor=1"
ver="$ver -X k8s.io/client-go/pkg/version.gitMinor=34"
if [ "${NODE:-}" = 1 ]; then
	# The real-node lane (make node-bins): kubelet, controller manager, scheduler.
	go build -ldflags "$ver" -o "$out/" k8s.io/kubernetes/cmd/kubelet \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
	ls -l "$out/kubelet" "$out/kube-controller-manager" "$out/kube-scheduler"
	exit 0
fi
go build -ldflags "$ver" -o "$out/" k8s.io/kubernetes/cmd/kube-apiserver
go build -o "$out/" k8s.io/kubernetes/cmd/kube-proxy
go build -o "$out/etcd" go.etcd.io/etcd/server/v3
ls -l "$out/kube-apiserver" "$out/kube-proxy" "$out/etcd"
