#!/usr/bin/env bash
# Prepare everything the RDMA test VM needs, caching it per kernel version:
#   - host tools (qemu, busybox-static, kmod, cpio, iproute2, compiler);
#   - Debian's current linux-image-amd64 kernel, its headers and the matching
#     linux-source, downloaded as .debs and extracted into the cache (never
#     installed on the host: that would drag in initramfs-tools/bootloader
#     hooks for a kernel the host never boots);
#   - rdma_rxe built out of tree from that source with scripts/rxe/*.patch;
#   - Debian's rdma-core userspace (ibverbs-utils, rdmacm-utils, perftest,
#     the rxe provider and their libraries), downloaded as .debs for the guest;
#   - the unchanging part of the guest initramfs (busybox, iproute2, kmod,
#     the RDMA userspace, their libraries, the kernel modules), packed as
#     base.cpio.
#
# Idempotent: every step is skipped when its stamp matches its inputs, so a
# second run takes a few seconds (a few apt-cache look-ups and hashes).
#
# Usage: vm-prepare.sh [--print-env]
#   --print-env  after preparing, print KEY=VALUE lines on stdout (for eval);
#                all progress messages go to stderr.
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PATCH_DIR="$SCRIPTS_DIR/rxe"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/rdma-netns"

PRINT_ENV=0
case "${1:-}" in
  --print-env) PRINT_ENV=1 ;;
  "") ;;
  *) echo "usage: $0 [--print-env]" >&2; exit 2 ;;
esac

log() { printf '[vm-prepare] %s\n' "$*" >&2; }
die() { printf '[vm-prepare] ERROR: %s\n' "$*" >&2; exit 1; }
# Run a step quietly but show its output if it fails (loud failure, quiet success).
run_logged() {
  local logf; logf=$(mktemp)
  if ! "$@" >"$logf" 2>&1; then
    cat "$logf" >&2; rm -f "$logf"
    die "command failed: $*"
  fi
  rm -f "$logf"
}

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || die "not root and no sudo: cannot install packages"
  SUDO=sudo
fi

APT_UPDATED=0
apt_update_once() {
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    run_logged $SUDO "$SCRIPTS_DIR/apt.sh" update
    APT_UPDATED=1
  fi
}

mkdir -p "$CACHE_ROOT"
# Two test runs started together must not build the same cache concurrently.
exec 9>"$CACHE_ROOT/.lock"
flock 9

# ---------------------------------------------------------------------------
# Which kernel: a set the archive holds (kernel-set.sh: linux-image-amd64's
# candidate, its headers, and kbuild and source at versions the archive
# still offers), asked of apt at run time so a Debian update is picked up
# without editing anything here.
# ---------------------------------------------------------------------------
resolve_kernel() {
  local out
  out=$("$SCRIPTS_DIR/kernel-set.sh" 2>"$CACHE_ROOT/.kernel-set.err") || return 1
  eval "$out"
}
# A kernel that is not cached yet is about to be downloaded: a machine's apt
# lists may be weeks old and name versions the mirror no longer carries, so
# refresh them first. A cached kernel needs no network at all.
# One directory per set: a checkout that chooses another set (an older
# vm-prepare.sh, which named its directory ABI_KVER and emptied it when its
# own key differed) never touches this one's files, and two checkouts of
# different sets share a machine's cache without rebuilding each other's.
set_dir() { echo "$CACHE_ROOT/${ABI}_${KVER}_kbuild-${KBUILD_VER}_source-${SOURCE_VER}"; }
if ! resolve_kernel || [ ! -f "$(set_dir)/.root.stamp" ]; then
  apt_update_once
  resolve_kernel || die "$(cat "$CACHE_ROOT/.kernel-set.err")"
fi
SERIES=$(echo "$ABI" | cut -d. -f1-2)                # e.g. 6.1
KDIR=$(set_dir)
mkdir -p "$KDIR"
log "kernel $ABI (package version $KVER), cache $KDIR"
[ -z "$NOTE" ] || log "chosen: $NOTE"

# ---------------------------------------------------------------------------
# Host packages.
# ---------------------------------------------------------------------------
HOST_PKGS="qemu-system-x86 busybox-static kmod cpio iproute2 build-essential
  patch xz-utils libelf1 util-linux $COMPILER_PKG"
missing=""
for p in $HOST_PKGS; do
  st=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  case "$st" in ii*) ;; *) missing="$missing $p" ;; esac
done
if [ -n "$missing" ]; then
  apt_update_once
  log "installing host packages:$missing"
  run_logged $SUDO env DEBIAN_FRONTEND=noninteractive \
    "$SCRIPTS_DIR/apt.sh" install -y --no-install-recommends $missing
fi
for t in qemu-system-x86_64 cpio depmod modprobe make gcc patch; do
  command -v "$t" >/dev/null || die "$t not found after installing packages"
done

# A step is current when its stamp file holds exactly the key of its inputs.
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }
sha() { sha256sum "$@" | awk '{ print $1 }' | sha256sum | cut -c1-16; }

# ---------------------------------------------------------------------------
# Kernel packages: download and extract into $KDIR/root.
# ---------------------------------------------------------------------------
DEBS="$KDIR/debs"
ROOT="$KDIR/root"
KEY_ROOT="$IMAGE_PKG=$KVER $HEADERS_PKG $COMMON_PKG $KBUILD_PKG=$KBUILD_VER $SOURCE_PKG=$SOURCE_VER v3"
VMLINUZ="$ROOT/boot/vmlinuz-$ABI"
# A stamp over files that are gone (a cache emptied by hand or by another
# tool) is not current: the step runs again rather than fail later.
if ! stamp_ok "$KDIR/.root.stamp" "$KEY_ROOT" || [ ! -f "$VMLINUZ" ] || [ ! -f "$ROOT/usr/src/linux-headers-$ABI/Makefile" ]; then
  rm -rf "$DEBS" "$ROOT" "$KDIR/src"
  mkdir -p "$DEBS" "$ROOT"
  set -- "$IMAGE_PKG=$KVER" "$HEADERS_PKG=$KVER" "$COMMON_PKG=$KVER" "$KBUILD_PKG=$KBUILD_VER" "$SOURCE_PKG=$SOURCE_VER"
  log "downloading $*"
  # The image and both headers at one version: the module's vermagic and
  # symbol CRCs come from the headers of the kernel we boot (checked below).
  if ! (cd "$DEBS" && apt-get download "$@" >"$KDIR/download.log" 2>&1); then
    die "apt-get download $* failed ($(grep -m1 '^E:' "$KDIR/download.log" || tail -n1 "$KDIR/download.log")): the archive changed since apt-get update; run it again (it updates the lists first), or pin VM_KERNEL_VERSION (scripts/README.md)"
  fi
  for d in "$DEBS"/linux-image-*.deb "$DEBS"/linux-headers-*.deb "$DEBS"/linux-kbuild-*.deb; do
    log "extracting $(basename "$d")"
    dpkg-deb -x "$d" "$ROOT"
  done
  # The arch headers' Makefile includes the common headers by absolute path;
  # point it at our extracted copy instead of /usr/src.
  sed -i "s#^include /usr/src/#include $ROOT/usr/src/#" "$ROOT/usr/src/linux-headers-$ABI/Makefile"
  # modules.dep is normally generated by the package's postinst; we need it to
  # resolve module dependencies below.
  log "depmod for the extracted kernel"
  run_logged depmod -b "$ROOT" "$ABI"
  echo "$KEY_ROOT" > "$KDIR/.root.stamp"
fi
[ -f "$VMLINUZ" ] || die "missing $VMLINUZ after extracting $IMAGE_PKG"

# Only the rxe directory of the kernel source is needed; extracting it takes
# one pass over the (xz) tarball, so keep the pristine copy.
RXE_ORIG="$KDIR/src/rxe-orig"
if ! stamp_ok "$KDIR/.src.stamp" "$KEY_ROOT" || [ ! -d "$RXE_ORIG" ]; then
  rm -rf "$KDIR/src"
  mkdir -p "$KDIR/src/tmp"
  log "extracting drivers/infiniband/sw/rxe from $SOURCE_PKG (one-time)"
  [ -f "$DEBS/${SOURCE_PKG}_${SOURCE_VER}_all.deb" ] ||
    (cd "$DEBS" && apt-get download "$SOURCE_PKG=$SOURCE_VER" >"$KDIR/download.log" 2>&1) ||
    die "apt-get download $SOURCE_PKG=$SOURCE_VER failed ($(grep -m1 '^E:' "$KDIR/download.log" || tail -n1 "$KDIR/download.log")): run it again, or pin VM_KERNEL_VERSION (scripts/README.md)"
  dpkg-deb --fsys-tarfile "$DEBS/${SOURCE_PKG}_${SOURCE_VER}_all.deb" \
    | tar -x -O "./usr/src/$SOURCE_PKG.tar.xz" \
    | tar -xJ -C "$KDIR/src/tmp" "$SOURCE_PKG/drivers/infiniband/sw/rxe"
  mv "$KDIR/src/tmp/$SOURCE_PKG/drivers/infiniband/sw/rxe" "$RXE_ORIG"
  rm -rf "$KDIR/src/tmp"
  echo "$KEY_ROOT" > "$KDIR/.src.stamp"
fi

# ---------------------------------------------------------------------------
# Patched rdma_rxe.
# ---------------------------------------------------------------------------
PATCHES=$(ls "$PATCH_DIR"/*.patch 2>/dev/null | sort)
[ -n "$PATCHES" ] || die "no patches in $PATCH_DIR"
KEY_RXE="$KEY_ROOT $(sha $PATCHES)"
# One slot per set of patches: checkouts (branches, worktrees) that differ in
# their patches share the cache without rebuilding each other's module, and
# the base initramfs that carries it, at every boot.
slot() { echo "$1" | sha256sum | cut -c1-16; }
RXE_KO="$KDIR/rxe-slots/$(slot "$KEY_RXE")/rdma_rxe.ko"
if [ ! -f "$RXE_KO" ]; then
  B="$KDIR/build/rxe-$(slot "$KEY_RXE")"
  rm -rf "$B"
  mkdir -p "$KDIR/build" "$(dirname "$RXE_KO")"
  cp -a "$RXE_ORIG" "$B"
  for p in $PATCHES; do
    log "applying $(basename "$p")"
    run_logged patch -d "$B" -p1 --no-backup-if-mismatch -i "$p"
  done
  log "building rdma_rxe.ko"
  run_logged make -C "$ROOT/usr/src/linux-headers-$ABI" M="$B" -j"$(nproc)" modules
  vermagic=$(modinfo -F vermagic "$B/rdma_rxe.ko")
  case "$vermagic" in "$ABI "*) ;; *) die "built rxe has vermagic '$vermagic', want $ABI" ;; esac
  cp "$B/rdma_rxe.ko" "$RXE_KO.tmp"
  mv "$RXE_KO.tmp" "$RXE_KO"
  rm -rf "$B"
fi

# ---------------------------------------------------------------------------
# RDMA userspace for the guest: verbs and rdma_cm tools, perftest and the rxe
# provider, so tests run real RoCE traffic between pods. Downloaded, never
# installed on the host; the key is the package versions apt offers.
# ---------------------------------------------------------------------------
RDMA_USER_PKGS="ibverbs-utils ibverbs-providers libibverbs1 librdmacm1
  rdmacm-utils perftest libibumad3 libpci3 libnl-3-200 libnl-route-3-200 libudev1"
RDMA_DEBS="$CACHE_ROOT/rdma-user"
rdma_user_key() {
  local p v key=""
  for p in $RDMA_USER_PKGS; do
    v=$(apt-cache policy "$p" | awk '/Candidate:/ { print $2 }')
    [ -n "$v" ] && [ "$v" != "(none)" ] || return 1
    key="$key $p=$v"
  done
  echo "${key# }"
}
KEY_RDMA=$(rdma_user_key || true)
if [ -z "$KEY_RDMA" ]; then
  apt_update_once
  KEY_RDMA=$(rdma_user_key) || die "apt offers no candidate for one of: $RDMA_USER_PKGS"
fi
if ! stamp_ok "$RDMA_DEBS/.stamp" "$KEY_RDMA"; then
  rm -rf "$RDMA_DEBS"
  mkdir -p "$RDMA_DEBS"
  log "downloading the RDMA userspace: $(echo $RDMA_USER_PKGS)"
  # Lists a few days old may name versions the mirror dropped: refresh once.
  if ! (cd "$RDMA_DEBS" && apt-get download $KEY_RDMA >/dev/null 2>&1); then
    apt_update_once
    KEY_RDMA=$(rdma_user_key) || die "apt offers no candidate for one of: $RDMA_USER_PKGS"
    (cd "$RDMA_DEBS" && run_logged apt-get download $KEY_RDMA)
  fi
  echo "$KEY_RDMA" > "$RDMA_DEBS/.stamp"
fi

# ---------------------------------------------------------------------------
# Base initramfs: everything except /init, the run config and the payload,
# which vm-run.sh appends per invocation as a second cpio archive.
# ---------------------------------------------------------------------------
# Modules the guest loads (plus their dependencies). Besides the RDMA stack
# and virtio NICs, a few link types that CNI plugins commonly create.
GUEST_MODULES="virtio_pci virtio_net crc32_generic configfs
  ib_core ib_uverbs ib_umad rdma_cm rdma_ucm rdma_rxe
  veth bridge macvlan ipvlan dummy 8021q"
# In the image but loaded only by a boot with a disk (vm-run.sh --disk),
# and by one with a watchdog (--watchdog).
DISK_MODULES="virtio_blk ext4"
WATCHDOG_MODULES="i6300esb"
pkgver() { dpkg-query -W -f='${Version}' "$1"; }
KEY_BASE="$KEY_RXE $(sha "$RXE_KO" "${BASH_SOURCE[0]}") \
busybox=$(pkgver busybox-static) iproute2=$(pkgver iproute2) kmod=$(pkgver kmod) \
libc=$(pkgver libc6) libgcc=$(pkgver libgcc-s1) $GUEST_MODULES $DISK_MODULES $WATCHDOG_MODULES $KEY_RDMA"
KEY_BASE=$(echo "$KEY_BASE" | tr -s ' \n' ' ')
BASE_CPIO="$KDIR/base-slots/$(slot "$KEY_BASE").cpio"
if [ ! -f "$BASE_CPIO" ]; then
  log "building base initramfs"
  S="$KDIR/initramfs-base"
  rm -rf "$S"
  mkdir -p "$S"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,opt/cni/bin,etc,proc,sys,dev,run,tmp,root,var/lib/cni,payload,lib/modules}
  ln -s ../run "$S/var/run"

  # busybox: one symlink per applet, except names we provide real binaries for
  # (programs that exec "ip"/"modprobe" through PATH get the real thing; busybox
  # sh itself still prefers its applets, hence full paths in guest scripts).
  cp /bin/busybox "$S/bin/busybox"
  for a in $(/bin/busybox --list); do
    case "$a" in
      busybox|ip|modprobe|insmod|rmmod|lsmod|depmod|modinfo) continue ;;
    esac
    ln -sf busybox "$S/bin/$a"
  done

  # iproute2 (ip, rdma) and kmod (a modprobe that understands modules.alias,
  # used by the kernel for on-demand loading) plus their shared libraries.
  install -m 0755 /bin/ip "$S/usr/sbin/ip"
  install -m 0755 /usr/bin/rdma "$S/usr/sbin/rdma"
  ln -s ../sbin/ip "$S/usr/bin/ip"
  ln -s ../sbin/rdma "$S/usr/bin/rdma"
  ln -s ../usr/sbin/ip "$S/sbin/ip"
  install -m 0755 /usr/bin/kmod "$S/usr/bin/kmod"
  for a in modprobe insmod rmmod lsmod depmod modinfo; do
    ln -s ../usr/bin/kmod "$S/sbin/$a"
  done
  for lib in $(ldd /bin/ip /usr/bin/rdma /usr/bin/kmod | awk '/=>/ { print $3 } /^\t\// { print $1 }' | sort -u); do
    mkdir -p "$S$(dirname "$lib")"
    cp -L "$lib" "$S$lib"
  done
  [ -d /etc/iproute2 ] && cp -a /etc/iproute2 "$S/etc/"

  # The RDMA userspace: the packages' files as they are (binaries, libraries,
  # /etc/libibverbs.d and the providers), without documentation; then any
  # host library they need that the packages do not bring (libm, ...).
  for d in "$RDMA_DEBS"/*.deb; do
    dpkg-deb -x "$d" "$S"
  done
  rm -rf "$S/usr/share/doc" "$S/usr/share/man" "$S/usr/share/lintian" "$S/usr/share/bug"
  rdma_libdirs=$(find "$S/usr/lib" "$S/lib" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' :)
  for lib in $(find "$S/usr/bin" "$S/usr/lib" -type f \( -perm -u+x -o -name '*.so*' \) -print0 \
      | xargs -0 env LD_LIBRARY_PATH="$rdma_libdirs" ldd 2>/dev/null \
      | awk '/=> \// { print $3 }' | sort -u); do
    case "$lib" in "$S"/*) continue ;; esac
    [ -e "$S$lib" ] && continue
    mkdir -p "$S$(dirname "$lib")"
    cp -L "$lib" "$S$lib"
  done
  # glibc dlopens libgcc_s for pthread_exit (rping's threads), so ldd
  # does not list it.
  gcc_s=$(dpkg -L libgcc-s1 | grep '/libgcc_s\.so\.1$' | head -n1)
  [ -n "$gcc_s" ] || die "libgcc_s.so.1 not found (package libgcc-s1)"
  mkdir -p "$S$(dirname "$gcc_s")"
  cp -L "$gcc_s" "$S$gcc_s"
  for t in ibv_devinfo ibv_rc_pingpong ib_write_bw rping; do
    [ -x "$S/usr/bin/$t" ] || die "RDMA userspace: $t missing from $RDMA_USER_PKGS"
  done

  # Kernel modules: the closure of GUEST_MODULES, with our rxe replacing the
  # stock one (stock rxe cannot change netns), then a real depmod.
  M="lib/modules/$ABI"
  mkdir -p "$S/$M"
  for f in modules.order modules.builtin modules.builtin.modinfo; do
    [ -f "$ROOT/$M/$f" ] && cp "$ROOT/$M/$f" "$S/$M/"
  done
  for m in $GUEST_MODULES $DISK_MODULES $WATCHDOG_MODULES; do
    modprobe -d "$ROOT" -S "$ABI" --show-depends "$m" \
      | awk '$1 == "insmod" { print $2 }'
  done | sort -u | while read -r ko; do
    rel=${ko#"$ROOT"/}
    mkdir -p "$S/$(dirname "$rel")"
    cp "$ko" "$S/$rel"
  done
  stock_rxe=$(find "$S/$M" -name 'rdma_rxe.ko*')
  [ -n "$stock_rxe" ] || die "stock rdma_rxe not found in module closure"
  rm -f $stock_rxe
  cp "$RXE_KO" "$S/$M/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"
  run_logged depmod -b "$S" "$ABI"
  echo "$GUEST_MODULES" | tr -s ' \n' '\n' | sed '/^$/d' > "$S/etc/vm-modules"

  mkdir -p "$(dirname "$BASE_CPIO")"
  (cd "$S" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$BASE_CPIO.tmp"
  mv "$BASE_CPIO.tmp" "$BASE_CPIO"
  log "base initramfs: $(du -h "$BASE_CPIO" | cut -f1)"
fi

# A slot no checkout has booted for two weeks goes.
touch "$RXE_KO" "$BASE_CPIO"
find "$KDIR/rxe-slots" "$KDIR/base-slots" -mindepth 1 -maxdepth 1 -mtime +14 -exec rm -rf {} + 2>/dev/null || true

log "ready: $VMLINUZ + $BASE_CPIO"
if [ "$PRINT_ENV" = 1 ]; then
  printf 'VM_ABI=%q\nVM_KVER=%q\nVM_CACHE_DIR=%q\nVM_KERNEL=%q\nVM_BASE_CPIO=%q\n' \
    "$ABI" "$KVER" "$KDIR" "$VMLINUZ" "$BASE_CPIO"
fi
