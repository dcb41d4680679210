#!/usr/bin/env bash
# Which Debian kernel the test VM boots, and which packages build its rxe
# module: a set the archive holds today, asked of apt-cache (its lists as
# they are: vm-prepare.sh runs apt-get update first when they are stale).
#
# Prints shell assignments on stdout (for eval): IMAGE_PKG, KVER (the
# image's version), ABI, HEADERS_PKG, COMMON_PKG (both at KVER),
# COMPILER_PKG, KBUILD_PKG/KBUILD_VER, SOURCE_PKG/SOURCE_VER, and NOTE (what
# was chosen other than the image's own version, or empty). On failure,
# one line on stderr that says what was missing and what to do; exit 1.
#
# The rule (scripts/README.md, "Which kernel"): the image, its headers and
# the common headers are one upload of Debian's linux and must share a
# version. linux-kbuild-X.Y and linux-source-X.Y are not tied to the image's
# Debian revision: the archive drops their old revisions when a new one
# comes, while the signed image may stay behind (2026-11-28: image 6.1.192-2,
# kbuild only 6.1.192-3). So kbuild is taken at the image's version if
# offered, else at the newest offered version of the same upstream release
# at or above it (what the headers' own "Depends: linux-kbuild (>= KVER)"
# lets apt install); the source at the image's version if offered, else at
# the newest revision of the same upstream release (the rxe code is the
# kernel's). When linux-image-amd64's candidate has no such set, its older
# versions are tried, newest first (bookworm's main archive keeps a whole
# older set). VM_KERNEL_VERSION pins linux-image-amd64's version: only that
# one is tried.
#
# APT_CACHE names the apt-cache to ask (scripts/kernelset_test.go gives
# one that answers from recorded outputs).
set -euo pipefail

APT_CACHE=${APT_CACHE:-apt-cache}
META=linux-image-amd64

# versions PKG: every version the archive offers, one a line, as madison
# lists them; asked once a package (each apt-cache call costs 0.4 s here).
MEMO=$(mktemp -d)
trap 'rm -rf "$MEMO"' EXIT
versions() {
  local f="$MEMO/$1"
  [ -f "$f" ] || "$APT_CACHE" madison "$1" 2>/dev/null | awk -F'|' '{ gsub(/ /, "", $2); if ($2 != "") print $2 }' | sort -u > "$f"
  cat "$f"
}
offers() { versions "$1" | grep -xF "$2" >/dev/null; }
listed() { versions "$1" | paste -sd ' '; }
upstream() { echo "${1%-*}"; }
# newest [ge MIN] UPSTREAM PKG: PKG's newest version of that upstream release
# (at or above MIN when given).
newest() {
  local min="" v best=""
  if [ "$1" = ge ]; then min=$2; shift 2; fi
  for v in $(versions "$2"); do
    [ "$(upstream "$v")" = "$1" ] || continue
    [ -z "$min" ] || dpkg --compare-versions "$v" ge "$min" || continue
    [ -z "$best" ] || dpkg --compare-versions "$v" gt "$best" && best=$v
  done
  echo "$best"
}
depends() { "$APT_CACHE" depends "$1" 2>/dev/null | awk '$1 == "Depends:" { print $2 }'; }
candidate() { "$APT_CACHE" policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2; exit }'; }

# try META_VERSION: sets the globals and returns 0 when the archive holds a
# whole set for that version of linux-image-amd64, else says why in WHY.
WHY=""
try() {
  local mv=$1
  IMAGE_PKG=$(depends "$META=$mv" | grep -E '^linux-image-[0-9]' | head -n1 || true)
  [ -n "$IMAGE_PKG" ] || { WHY="$META $mv names no linux-image-* package"; return 1; }
  ABI=${IMAGE_PKG#linux-image-}
  KVER=$mv
  offers "$IMAGE_PKG" "$KVER" || { WHY="$IMAGE_PKG is not offered at $KVER"; return 1; }
  HEADERS_PKG="linux-headers-$ABI"
  offers "$HEADERS_PKG" "$KVER" || { WHY="$HEADERS_PKG is not offered at $KVER"; return 1; }
  local deps; deps=$(depends "$HEADERS_PKG=$KVER")
  COMMON_PKG=$(echo "$deps" | grep -E '^linux-headers-.*-common$' | head -n1 || true)
  KBUILD_PKG=$(echo "$deps" | grep -E '^linux-kbuild-' | head -n1 || true)
  COMPILER_PKG=$(echo "$deps" | grep -E '^linux-compiler-' | head -n1 || true)
  [ -n "$COMMON_PKG" ] && [ -n "$KBUILD_PKG" ] || { WHY="$HEADERS_PKG $KVER names no -common or linux-kbuild-* dependency"; return 1; }
  offers "$COMMON_PKG" "$KVER" || { WHY="$COMMON_PKG is not offered at $KVER"; return 1; }
  local up; up=$(upstream "$KVER")
  KBUILD_VER=$KVER
  offers "$KBUILD_PKG" "$KVER" || KBUILD_VER=$(newest ge "$KVER" "$up" "$KBUILD_PKG")
  [ -n "$KBUILD_VER" ] || { WHY="$KBUILD_PKG has no $up-* version at or above $KVER (offered: $(listed "$KBUILD_PKG"))"; return 1; }
  SOURCE_PKG="linux-source-$(echo "$ABI" | cut -d. -f1-2)"
  SOURCE_VER=$KVER
  offers "$SOURCE_PKG" "$KVER" || SOURCE_VER=$(newest "$up" "$SOURCE_PKG")
  [ -n "$SOURCE_VER" ] || { WHY="$SOURCE_PKG has no $up-* version (offered: $(listed "$SOURCE_PKG"))"; return 1; }
  NOTE=""
  [ "$KBUILD_VER" = "$KVER" ] || NOTE="$KBUILD_PKG at $KBUILD_VER (the archive no longer has $KVER)"
  [ "$SOURCE_VER" = "$KVER" ] || NOTE="${NOTE:+$NOTE; }$SOURCE_PKG at $SOURCE_VER (the archive no longer has $KVER)"
  return 0
}

if [ -n "${VM_KERNEL_VERSION:-}" ]; then
  metas=$VM_KERNEL_VERSION
  offers "$META" "$metas" || { echo "VM_KERNEL_VERSION=$metas: $META is not offered at that version (offered: $(listed "$META")); unset it or name one of those" >&2; exit 1; }
else
  cand=$(candidate "$META")
  [ -n "$cand" ] && [ "$cand" != "(none)" ] || { echo "apt-cache offers no $META: run apt-get update (the lists may be missing), then retry" >&2; exit 1; }
  # The candidate first (apt's pins count), then the others newest first.
  metas="$cand $(versions "$META" | grep -vxF "$cand" | sort -r -V || true)"
fi
tried=""
for mv in $metas; do
  if try "$mv"; then
    [ -z "$tried" ] || NOTE="${NOTE:+$NOTE; }$META $mv, the newest whose set the archive holds (${tried%; })"
    printf 'IMAGE_PKG=%q\nKVER=%q\nABI=%q\nHEADERS_PKG=%q\nCOMMON_PKG=%q\nCOMPILER_PKG=%q\n' \
      "$IMAGE_PKG" "$KVER" "$ABI" "$HEADERS_PKG" "$COMMON_PKG" "$COMPILER_PKG"
    printf 'KBUILD_PKG=%q\nKBUILD_VER=%q\nSOURCE_PKG=%q\nSOURCE_VER=%q\nNOTE=%q\n' \
      "$KBUILD_PKG" "$KBUILD_VER" "$SOURCE_PKG" "$SOURCE_VER" "$NOTE"
    exit 0
  fi
  tried="$tried$META $mv: $WHY; "
done
echo "no kernel whose whole set the archive holds (${tried%; }): run apt-get update and retry, retry later (the archive is mid-update), or pin VM_KERNEL_VERSION to a version apt-cache madison $META lists" >&2
exit 1
