#!/usr/bin/env bash
# tools/hostdeps/ensure.sh: make sure the Debian packages of packages.txt are
# installed. As root, installs what is missing (one line says what) with
# apt-get; without root, installs nothing and says which are missing.
#
#   tools/hostdeps/ensure.sh           exit 0 when all are present or installed
#   tools/hostdeps/ensure.sh --check   only report; exit 1 when some are missing
#
# Exit status 2: root, but the install failed (the apt-get output is shown).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check_only=0
[ "${1:-}" = --check ] && check_only=1

missing=()
while read -r pkg lanes; do
	case "$pkg" in ''|'#'*) continue ;; esac
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done <"$here/packages.txt"

# binfmt_misc: as root, mount it when it is not and register qemu-user-static's
# aarch64 handler (the arm64 image's rootfs runs its maintainer scripts under
# emulation: tools/image/rootfs.sh arm64); idempotent, one line when it acts.
binfmt() {
	[ "$(id -u)" = 0 ] && [ "$check_only" = 0 ] || return 0
	local conf=/usr/lib/binfmt.d/qemu-aarch64.conf dir=/proc/sys/fs/binfmt_misc
	[ -r "$conf" ] || return 0
	if [ ! -e "$dir/register" ]; then
		mount -t binfmt_misc binfmt_misc "$dir" || { echo "hostdeps: cannot mount binfmt_misc on $dir" >&2; return 1; }
	fi
	[ -e "$dir/qemu-aarch64" ] && return 0
	echo "hostdeps: registering qemu-aarch64 with binfmt_misc ($conf)" >&2
	grep -v '^#' "$conf" >"$dir/register" || { echo "hostdeps: binfmt_misc refused $conf" >&2; return 1; }
}

if [ ${#missing[@]} -eq 0 ]; then
	binfmt
	exit
fi
if ! command -v dpkg-query >/dev/null 2>&1; then
	echo "hostdeps: not a Debian-like system (no dpkg-query); install by hand: ${missing[*]}" >&2
	exit 1
fi
if [ "$check_only" = 1 ] || [ "$(id -u)" != 0 ]; then
	echo "hostdeps: missing Debian packages: ${missing[*]} (see tools/hostdeps/packages.txt for the lanes that need each)" >&2
	exit 1
fi
echo "hostdeps: installing ${missing[*]} (apt-get; see tools/hostdeps/packages.txt)" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
	cat "$log" >&2
	echo "hostdeps: apt-get failed installing: ${missing[*]}" >&2
	exit 2
fi
binfmt
