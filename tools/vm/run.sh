#!/usr/bin/env bash
# tools/vm/run.sh: run Go tests inside a throwaway QEMU VM booting Debian's
# cloud kernel, which has IPVS (this machine's kernel does not) and a
# cgroup v2 cpu controller the tests may use (this machine's is v1). See
# tools/vm/README.md.
#
#   tools/vm/run.sh [PKG...]      default: the packages in VM_PKGS
#
# Environment:
#   VM_CACHE    kernel cache (default _output/vm, git-ignored)
#   VM_RUN      -test.run pattern inside the guest (default ^TestVM)
#   VM_TIMEOUT  seconds the guest may run (each test binary and, plus 60 s
#               for boot, the whole VM) before it is killed (default 480)
#   VM_MEM      guest memory in MiB (default 1536)
#   VM_CGO      CGO_ENABLED for the test binaries (default: go env CGO_ENABLED)
#   VM_KEEP=1   keep the work directory (initramfs, logs) for debugging
#   VM_SKIP     -test.skip pattern inside the guest (default ^TestVMKubeProxy:
#               the kube-proxy scenario needs the host side of
#               TestIPVSKubeProxyInVM, which runs it with the variables below)
#   VM_NET=user QEMU user networking, isolated (restrict=on): the guest is
#               192.168.100.15/24 and reaches nothing but, for each port P in
#               VM_FORWARD_PORTS, 192.168.100.100:P forwarded to 127.0.0.1:P
#               of the network namespace QEMU runs in (`busybox nc` per
#               connection)
#   VM_FILES    a directory copied into the guest as /hostfiles (its
#               dynamic programs with their libraries); the tests see
#               REMEDIATE_VM_FILES=/hostfiles
#   VM_EXTRA_MODULES, VM_EXTRA_PROGRAMS  more modules / host programs
#   VM_PREPARE_ONLY=1  resolve and cache the kernel, then exit (a caller
#               that boots the VM in a network namespace without a route
#               out downloads it first)
#   REMEDIATE_E2E_REQUIRED=1  a missing prerequisite fails instead of skipping
#
# Exit status: the guest's (0 = every test binary passed), 1 when the VM
# could not be prepared or booted, did not report, ran out of time, or a
# TestVM test skipped inside it.
# The body is one function, read whole before it runs: editing this file
# while a run is under way cannot derail that run.
main() {
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

VM_PKGS_DEFAULT="./internal/ipvs ./internal/cpustat ./detect ./remediate/action"
VM_CACHE=${VM_CACHE:-$ROOT/_output/vm}
VM_RUN=${VM_RUN:-^TestVM}
VM_SKIP=${VM_SKIP-^TestVMKubeProxy}
VM_NET=${VM_NET:-}
VM_FILES=${VM_FILES:-}
VM_FORWARD_PORTS=${VM_FORWARD_PORTS:-}
VM_TIMEOUT=${VM_TIMEOUT:-480}
VM_MEM=${VM_MEM:-1536}
GO=${GO:-go}
# VM_CGO=0 builds static test binaries. The default is the host's setting:
# `make test` has just compiled every package that way, so the VM's test
# binaries are a link step from the build cache, while CGO_ENABLED=0 (a
# different cache key for net, os/user and all that imports them, i.e.
# client-go) recompiles the dependency tree: minutes on 2 cores. A cgo
# binary is dynamic; its libc is copied into the guest like ipvsadm's.
VM_CGO=${VM_CGO:-$($GO env CGO_ENABLED)}
META=linux-image-cloud-amd64
# Modules the tests need (their dependencies are added from modules.dep).
MODULES="ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack nf_conntrack_netlink nf_tables nft_ct veth dummy ${VM_EXTRA_MODULES:-}"
[ "$VM_NET" = user ] && MODULES="$MODULES virtio_pci virtio_net"
# Host programs copied into the guest with their shared libraries.
PROGRAMS="ipvsadm conntrack ip flock nft ${VM_EXTRA_PROGRAMS:-}"

log() { echo "vm: $*" >&2; }
skip_or_fail() {
	if [ "${REMEDIATE_E2E_REQUIRED:-}" = 1 ]; then
		log "FAIL: $* (REMEDIATE_E2E_REQUIRED=1)"
		exit 1
	fi
	log "SKIP: $*"
	exit 0
}

pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || read -r -a pkgs <<<"$VM_PKGS_DEFAULT"

for c in qemu-system-x86_64 busybox cpio apt-get apt-cache dpkg-deb $PROGRAMS; do
	command -v "$c" >/dev/null || skip_or_fail "needs $c (tools/hostdeps/packages.txt lists its Debian package; make hostdeps as root installs them)"
done
BUSYBOX=$(command -v busybox)
if ldd "$BUSYBOX" >/dev/null 2>&1; then
	skip_or_fail "$BUSYBOX is not static (install busybox-static)"
fi
QBOOT=/usr/share/qemu/qboot.rom
[ -f "$QBOOT" ] || skip_or_fail "needs $QBOOT (Debian package qemu-system-data)"

# --- kernel: resolve the meta-package's current dependency, cache per version
resolve_kernel() {
	apt-cache depends "$META" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'
}
kpkg=$(resolve_kernel || true)
if [ -z "$kpkg" ]; then
	log "apt-cache does not know $META; apt-get update"
	apt-get update -q >/dev/null 2>&1 || true
	kpkg=$(resolve_kernel || true)
fi
if [ -z "$kpkg" ]; then
	# Offline: the newest cached kernel, if any.
	kpkg=$(ls -1 "$VM_CACHE/kernel" 2>/dev/null | sort -V | tail -1 || true)
	[ -n "$kpkg" ] || skip_or_fail "cannot resolve $META (no apt lists, nothing cached in $VM_CACHE/kernel)"
	log "using cached $kpkg (could not resolve $META)"
fi
KVER=${kpkg#linux-image-}
KDIR=$VM_CACHE/kernel/$kpkg
if [ ! -f "$KDIR/.complete" ]; then
	log "downloading $kpkg into $KDIR"
	mkdir -p "$VM_CACHE/kernel"
	dl=$(mktemp -d "$VM_CACHE/kernel/.download.XXXXXX") # private: concurrent runs do not collide
	mkdir -p "$dl/deb"
	# apt-get download writes into the current directory; as root it
	# warns that _apt cannot write there, which is harmless.
	if ! (cd "$dl/deb" && apt-get download -q "$kpkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) ||
		! ls "$dl"/deb/*.deb >/dev/null 2>&1; then
		rm -rf "$dl"
		skip_or_fail "apt-get download $kpkg failed"
	fi
	dpkg-deb -x "$dl"/deb/*.deb "$dl/root"
	# The package ships no modules.dep; never install it on the host.
	busybox depmod -b "$dl/root" "$KVER"
	touch "$dl/root/.complete"
	rm -rf "$KDIR"
	mv "$dl/root" "$KDIR" 2>/dev/null || true # another run may have won the race
	rm -rf "$dl"
fi
VMLINUZ=$KDIR/boot/vmlinuz-$KVER
MODDIR=$KDIR/lib/modules/$KVER
[ -f "$VMLINUZ" ] && [ -f "$MODDIR/modules.dep" ] || { log "FAIL: broken kernel cache $KDIR (delete it)"; exit 1; }
if [ "${VM_PREPARE_ONLY:-}" = 1 ]; then
	log "kernel $KVER cached in $KDIR"
	exit 0
fi

# --- work directory, cleaned on exit; QEMU killed by its PID
WORK=$(mktemp -d "${TMPDIR:-/tmp}/remediate-vm.XXXXXX")
QPID=
cleanup() {
	if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
		kill "$QPID" 2>/dev/null || true
		sleep 1
		kill -9 "$QPID" 2>/dev/null || true
	fi
	if [ "${VM_KEEP:-}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
R=$WORK/root
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,tests,lib/modules}
mkdir -p "$R/var" && ln -s /run "$R/var/run"

# --- the test binaries, static, one per package, with its testdata
t0=$(date +%s)
names=()
for p in "${pkgs[@]}"; do
	name=$(echo "${p#./}" | tr / _)
	dir=$R/tests/$name
	mkdir -p "$dir"
	log "building $p (CGO_ENABLED=$VM_CGO go test -c)"
	CGO_ENABLED=$VM_CGO $GO test -c -ldflags='-s -w' -o "$dir/pkg.test" "$p"
	if [ ! -f "$dir/pkg.test" ]; then
		log "$p has no tests"
		rm -rf "$dir"
		continue
	fi
	[ -d "$p/testdata" ] && cp -r "$p/testdata" "$dir/"
	names+=("$name")
done
log "test binaries built in $(($(date +%s) - t0))s"

# --- busybox, host programs and their libraries, modules
cp "$BUSYBOX" "$R/bin/busybox"
copy_libs() {
	# A static program has none (ldd fails; so does grep without a match).
	{ ldd "$1" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do
		[ -e "$R$lib" ] && continue
		mkdir -p "$R$(dirname "$lib")"
		cp -L "$lib" "$R$lib"
	done
}
copy_with_libs() {
	mkdir -p "$R$(dirname "$1")"
	cp -L "$1" "$R$1"
	copy_libs "$1"
}
for c in $PROGRAMS; do copy_with_libs "$(command -v "$c")"; done
for n in "${names[@]}"; do copy_libs "$R/tests/$n/pkg.test"; done # VM_CGO=1: libc
# iptables' extensions are shared objects it opens at run time (not in ldd).
for c in $PROGRAMS; do
	case $(readlink -f "$(command -v "$c")") in
	*xtables-*-multi)
		# Where it was built to look (merged /usr: /lib/... -> /usr/lib/...).
		x=$(readlink -f "$(dirname "$(ldd "$(command -v "$c")" | grep -o '/[^ ]*libxtables[^ ]*' | head -1)")/xtables")
		if [ -d "$x" ] && [ ! -d "$R$x" ]; then
			mkdir -p "$R$x"
			cp -L "$x"/*.so "$R$x/"
			for so in "$R$x"/*.so; do copy_libs "$so"; done
		fi
		;;
	esac
done
if [ -n "$VM_FILES" ]; then
	cp -rL "$VM_FILES" "$R/hostfiles"
	for f in "$R"/hostfiles/*; do [ -x "$f" ] && copy_libs "$f"; done
fi
cp /etc/protocols /etc/services "$R/etc/" 2>/dev/null || true
echo "root:x:0:0:root:/:/bin/sh" >"$R/etc/passwd"

mods=()
declare -A seen=()
add_mod() { # $1 = path relative to MODDIR
	[ -n "${seen[$1]:-}" ] && return
	seen[$1]=1
	local deps
	deps=$(awk -v m="$1:" '$1 == m { $1 = ""; print }' "$MODDIR/modules.dep")
	for d in $deps; do add_mod "$d"; done
	mods+=("$1")
}
for m in $MODULES; do
	if grep -qE "/$m\.ko:" "$MODDIR/modules.dep"; then
		add_mod "$(grep -oE "^[^:]*/$m\.ko" "$MODDIR/modules.dep" | head -1)"
	elif ! grep -qE "/$m\.ko\$" "$MODDIR/modules.builtin"; then
		log "FAIL: module $m is neither in modules.dep nor built in"
		exit 1
	fi
done
KR=$R/lib/modules/$KVER
for m in "${mods[@]}"; do
	mkdir -p "$KR/$(dirname "$m")"
	cp "$MODDIR/$m" "$KR/$m"
done
cp "$MODDIR"/modules.{dep,builtin,order} "$KR/" 2>/dev/null || true

# --- /init: mount, load modules, run each test binary, report on ttyS1
{
	echo '#!/bin/busybox sh'
	echo '/bin/busybox --install -s /bin'
	echo 'export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp' # host programs before busybox applets
	echo 'mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev'
	echo 'mount -t tmpfs run /run; mount -t tmpfs tmp /tmp; mkdir -p /run/netns'
	echo 'ip link set lo up'
	echo "for m in $MODULES; do modprobe \$m 2>/dev/null || grep -q \"/\$m.ko\$\" /lib/modules/\$(uname -r)/modules.builtin || echo \"vm: modprobe \$m failed\"; done"
	if [ "$VM_NET" = user ]; then
		echo 'i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done'
		echo 'ip link set eth0 up && ip addr add 192.168.100.15/24 dev eth0 || echo "vm: no network"'
	fi
	echo 'echo "vm: guest up in $(cut -d" " -f1 /proc/uptime)s, kernel $(uname -r), $(nproc) cpus"'
	echo 'rc=0'
	echo "for t in ${names[*]}; do"
	echo '  echo "=== vm: $t"'
	echo '  cd /tests/$t'
	printf '  REMEDIATE_IN_VM=1 REMEDIATE_E2E_REQUIRED=1 REMEDIATE_VM_FILES=/hostfiles ./pkg.test -test.v -test.count=1 -test.timeout=%ss -test.run %q -test.skip %q\n' "$VM_TIMEOUT" "$VM_RUN" "$VM_SKIP"
	echo '  r=$?; echo "=== vm: $t exit $r (guest uptime $(cut -d" " -f1 /proc/uptime)s)"; [ $r -ne 0 ] && rc=$r'
	echo 'done'
	echo 'echo "VM_RC=$rc" >/dev/ttyS1'
	echo 'sync; poweroff -f'
} >"$R/init"
chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet) >"$WORK/initrd.cpio"
log "initramfs $(du -m "$WORK/initrd.cpio" | cut -f1) MiB, kernel $KVER"

# --- boot. KVM only when the CPU really has it (a nested /dev/kvm without
# vmx/svm hangs a stock kernel); TCG otherwise.
if grep -qwE 'vmx|svm' /proc/cpuinfo && [ -w /dev/kvm ]; then
	accel=(-accel kvm -cpu host)
else
	accel=(-accel tcg -cpu max)
fi
nic=(-nic none)
if [ "$VM_NET" = user ]; then
	# restrict=on: the guest reaches neither the host nor the outside,
	# only the explicit forwards to this network namespace's loopback.
	spec="user,model=virtio-net-pci,net=192.168.100.0/24,restrict=on"
	for p in $VM_FORWARD_PORTS; do
		case $p in *[!0-9]*) log "FAIL: VM_FORWARD_PORTS: bad port $p"; exit 1 ;; esac
		spec="$spec,guestfwd=tcp:192.168.100.100:$p-cmd:$BUSYBOX nc 127.0.0.1 $p"
	done
	nic=(-nic "$spec")
fi
: >"$WORK/result"
tb=$(date +%s)
qemu-system-x86_64 "${accel[@]}" -M q35 -bios "$QBOOT" -m "$VM_MEM" -smp "$(nproc)" \
	-nographic -no-reboot "${nic[@]}" \
	-kernel "$VMLINUZ" -initrd "$WORK/initrd.cpio" \
	-append "console=ttyS0 quiet panic=-1" \
	-serial mon:stdio -serial "file:$WORK/result" \
	</dev/null > >(sed -u 's/\r$//' | tee "$WORK/console.log") 2>&1 & # sed -u: stream, do not buffer
QPID=$!
deadline=$((tb + VM_TIMEOUT + 60))
while kill -0 "$QPID" 2>/dev/null; do
	if [ "$(date +%s)" -ge "$deadline" ]; then
		log "FAIL: guest still running after $((VM_TIMEOUT + 60))s; killing QEMU (pid $QPID)"
		exit 1
	fi
	sleep 1
done
wait "$QPID" || true
QPID=
sleep 0.2 # let tee drain
log "guest ran $(($(date +%s) - tb))s"
rc=$(tr -d '\r' <"$WORK/result" | sed -n 's/^VM_RC=\([0-9]*\)$/\1/p' | tail -1)
if [ -z "$rc" ]; then
	log "FAIL: the guest did not report a result (did it boot?)"
	exit 1
fi
if grep -qE '^\s*--- SKIP: TestVM' "$WORK/console.log"; then
	log "FAIL: a TestVM test skipped inside the VM:"
	grep -E '^\s*--- SKIP: TestVM' "$WORK/console.log" >&2
	exit 1
fi
if ! grep -qE '^--- PASS: TestVM' "$WORK/console.log" && [ "$rc" = 0 ]; then
	log "FAIL: no TestVM test ran (VM_RUN=$VM_RUN)"
	exit 1
fi
log "guest exit $rc"
exit "$rc"
}
main "$@"
