#!/usr/bin/env bash
# tools/testlanes.sh: what `make test` says before it runs when it cannot run
# every lane: one line per lane it skips, and why. As root with every host
# package present it says nothing (all lanes run).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then
	echo "make test: skipping the real-kernel lane (network namespaces, iptables, nft, conntrack, the xtables lock): needs root (running as uid $(id -u))"
	echo "make test: skipping the control-plane lane (real kube-apiserver, etcd, kube-proxy end to end): needs root for its network namespace; not built"
	echo "make test: skipping the VM lane (make test-vm: IPVS, cgroup v2 in QEMU): needs root"
	echo "make test: skipping the real-node lane (make test-node: kubelet, containerd, the chart's pod): needs root"
	echo "make test: skipping the privilege tests (the binary run as another user): need root"
fi
# Host packages: a missing one skips the lanes packages.txt names for it.
while read -r pkg lanes; do
	case "$pkg" in '' | '#'*) continue ;; esac
	if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
		echo "make test: package $pkg missing: skipping its tests ($lanes)"
	fi
done <"$here/hostdeps/packages.txt"
exit 0
