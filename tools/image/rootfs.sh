#!/bin/sh
# rootfs.sh prints the path of a tar of the image's Debian bookworm root
# filesystem (deploy/Dockerfile's runtime stage without a container engine:
# minbase + tools/image/packages.txt, no setuid/setgid files, no apt lists,
# /var/lib/remediate and /etc/remediate made), building it with mmdebstrap
# (as root) only when the cache has none.
#
# The cache lives outside the clone (CI runs in a fresh clone on the same
# machine): $REMEDIATE_IMAGE_CACHE, else /var/cache/remediate/rootfs as root,
# else ~/.cache/remediate/rootfs. The key hashes the package list, the
# suite, the architecture and this script, so a change to any of them builds
# a new rootfs; delete the directory to pick up Debian's newer updates.
#
# Usage: tools/image/rootfs.sh [ARCH]   (ARCH: amd64 (default) or arm64)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
arch=${1:-amd64}
suite=bookworm
mirror=${REMEDIATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${REMEDIATE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
pkgs=$(grep -v '^#' "$here/packages.txt" | awk 'NF{print $1}' | paste -sd, -)
if [ -n "${REMEDIATE_IMAGE_CACHE:-}" ]; then cache=$REMEDIATE_IMAGE_CACHE
elif [ "$(id -u)" = 0 ]; then cache=/var/cache/remediate/rootfs
else cache=${XDG_CACHE_HOME:-$HOME/.cache}/remediate/rootfs; fi
key=$( (echo "$suite $arch $pkgs $mirror $security"; cat "$0") | sha256sum | cut -c1-16)
out=$cache/rootfs-$suite-$arch-$key.tar
if [ -s "$out" ]; then echo "$out"; exit 0; fi
if [ "$(id -u)" != 0 ]; then
	echo "rootfs.sh: no cached rootfs at $out and not root (mmdebstrap --mode=root needs root)" >&2
	exit 1
fi
command -v mmdebstrap >/dev/null || { echo "rootfs.sh: mmdebstrap missing (tools/hostdeps/packages.txt; make hostdeps)" >&2; exit 1; }
mkdir -p "$cache"
tmp=$out.tmp.$$
trap 'rm -f "$tmp"' EXIT
echo "rootfs.sh: building $out with mmdebstrap ($pkgs; ~10 min cold)" >&2
# The hooks are those of deploy/Dockerfile's RUN line: no apt lists, no
# setuid/setgid programs, the state and policy directories.
mmdebstrap --mode=root --variant=minbase --architectures="$arch" --include="$pkgs" \
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
	--customize-hook='find "$1" -xdev -perm /6000 -type f -exec chmod a-s {} +' \
	--customize-hook='mkdir -p "$1"/var/lib/remediate "$1"/etc/remediate' \
	--format=tar "$suite" "$tmp" \
	"deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main" >&2
mv "$tmp" "$out"
trap - EXIT
echo "$out"
