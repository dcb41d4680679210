#!/usr/bin/env bash
# Prepare the container runtime's part of the test VM: Debian's runc and
# libseccomp (containerd starts pods with it in the CRI tests, e2e/cri),
# downloaded as .debs (never installed on the host), extracted and packed as
# cri.cpio, which vm-run.sh appends after vm-prepare.sh's base.cpio.
# containerd itself is a Go program: build-payload.sh builds it.
#
# A script of its own rather than a step of vm-prepare.sh: base.cpio's key
# includes vm-prepare.sh's contents, and the base is shared by every
# checkout on the machine, so runc stays out of it.
#
# Idempotent (stamped by the package versions apt offers and this script).
#
# Usage: vm-prepare-cri.sh BASE_ROOT [--print-env]
#   BASE_ROOT    the base initramfs tree (vm-prepare.sh's VM_CACHE_DIR/initramfs-base),
#                to check that runc needs no library the base lacks;
#   --print-env  print VM_CRI_CPIO=... on stdout (for eval).
set -euo pipefail

BASE_ROOT=${1:?usage: vm-prepare-cri.sh BASE_ROOT [--print-env]}
PRINT_ENV=0
[ "${2:-}" = --print-env ] && PRINT_ENV=1
SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/rdma-netns"
PKGS="runc libseccomp2"
DIR="$CACHE_ROOT/cri-user"
CPIO="$DIR/cri.cpio"

log() { printf '[vm-prepare-cri] %s\n' "$*" >&2; }
die() { printf '[vm-prepare-cri] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9

key_of() {
  local p v key=""
  for p in $PKGS; do
    v=$(apt-cache policy "$p" | awk '/Candidate:/ { print $2 }')
    [ -n "$v" ] && [ "$v" != "(none)" ] || return 1
    key="$key $p=$v"
  done
  echo "${key# }"
}
KEY=$(key_of || true)
if [ -z "$KEY" ]; then
  log "apt-get update"
  "$SCRIPTS_DIR/apt.sh" update >/dev/null 2>&1 || die "apt-get update failed"
  KEY=$(key_of) || die "apt offers no candidate for one of: $PKGS"
fi
KEY="$KEY $(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"

if [ "$(cat "$DIR/.stamp" 2>/dev/null)" != "$KEY" ] || [ ! -f "$CPIO" ]; then
  rm -rf "$DIR"
  mkdir -p "$DIR/debs" "$DIR/root"
  log "downloading $PKGS"
  versions=${KEY% *}
  if ! (cd "$DIR/debs" && apt-get download $versions >/dev/null 2>&1); then
    # Lists a few days old may name versions the mirror dropped.
    "$SCRIPTS_DIR/apt.sh" update >/dev/null 2>&1 || die "apt-get update failed"
    versions=$(key_of) || die "apt offers no candidate for one of: $PKGS"
    (cd "$DIR/debs" && apt-get download $versions >/dev/null) || die "apt-get download $versions failed"
    KEY="$versions ${KEY##* }"
  fi
  for d in "$DIR"/debs/*.deb; do
    dpkg-deb -x "$d" "$DIR/root"
  done
  rm -rf "$DIR/root/usr/share"
  [ -x "$DIR/root/usr/sbin/runc" ] || die "runc missing from $PKGS"
  echo "$KEY" > "$DIR/.stamp"
fi

# Every library runc links besides libseccomp must be in the base already.
missing=$(LD_LIBRARY_PATH="$DIR/root/lib/x86_64-linux-gnu:$DIR/root/usr/lib/x86_64-linux-gnu" \
    ldd "$DIR/root/usr/sbin/runc" | awk '/=> \// { print $3 }' | while read -r lib; do
      case "$lib" in "$DIR/root"/*) continue ;; esac
      [ -e "$BASE_ROOT$lib" ] || echo "$lib"
    done)
[ -z "$missing" ] || die "runc needs libraries the base initramfs lacks: $missing"

if [ ! -f "$CPIO" ]; then
  (cd "$DIR/root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$CPIO.tmp"
  mv "$CPIO.tmp" "$CPIO"
  log "runc initramfs part: $(du -h "$CPIO" | cut -f1)"
fi
[ "$PRINT_ENV" = 0 ] || printf 'VM_CRI_CPIO=%q\n' "$CPIO"
