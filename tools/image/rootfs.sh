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
# suite, the architecture, the archive and the recipe, so a change to any of
# them builds a new rootfs; delete the directory to pick up Debian's newer updates.
#
# Usage: tools/image/rootfs.sh [ARCH]   (ARCH: amd64 (default) or arm64)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
arch=${1:-amd64}
suite=bookworm
# The Debian archive is the one apt uses on this machine (its deb822 sources,
# else sources.list), or the environment's.
apt_uri() { # apt_uri SUITE: the first archive URI apt lists for SUITE
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		awk -v suite="$1" '
			/^$/ { if (ok && uri != "") { print uri; exit } ok = 0; uri = "" }
			/^URIs:/ { uri = $2 }
			/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
			END { if (ok && uri != "") print uri }' "$f"
	done | head -n 1
	[ -r /etc/apt/sources.list ] && awk -v suite="$1" '$1 == "deb" && $3 == suite { print $2; exit }' /etc/apt/sources.list
}
mirror=${REMEDIATE_DEBIAN_MIRROR:-$(apt_uri "$suite" | head -n 1)}
security=${REMEDIATE_DEBIAN_SECURITY_MIRROR:-$(apt_uri "$suite-security" | head -n 1)}
if [ -z "$mirror" ] || [ -z "$security" ]; then
	echo "rootfs.sh: no Debian $suite archive in apt's sources; set REMEDIATE_DEBIAN_MIRROR and REMEDIATE_DEBIAN_SECURITY_MIRROR" >&2
	exit 1
fi
pkgs=$(grep -v '^#' "$here/packages.txt" | awk 'NF{print $1}' | paste -sd, -)
if [ -n "${REMEDIATE_IMAGE_CACHE:-}" ]; then cache=$REMEDIATE_IMAGE_CACHE
elif [ "$(id -u)" = 0 ]; then cache=/var/cache/remediate/rootfs
else cache=${XDG_CACHE_HOME:-$HOME/.cache}/remediate/rootfs; fi
# What the rootfs is made of: the key changes with any of it (the hooks and
# options below are part of it), not with comments or this script's layout.
recipe="minbase; path-exclude man doc locale; hooks: no apt lists, no setuid/setgid, /var/lib/remediate /etc/remediate; $suite $suite-updates $suite-security main"
key=$(echo "$suite $arch $pkgs $mirror $security $recipe" | sha256sum | cut -c1-16)
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
