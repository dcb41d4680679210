#!/usr/bin/env bash
# promtool from Debian bookworm's prometheus package, unpacked (not
# installed: its maintainer scripts would start a server on the host) into
# ${XDG_CACHE_HOME:-~/.cache}/rdma-netns/promtool-<version>/promtool, for
# make unit's exporter test (`promtool check metrics`). The package comes
# through apt (apt-get download; apt-get update first when the lists do not
# have it), and its upstream version must be versions.env's
# PROMTOOL_VERSION. Debian's promtool links libc alone.
#
# Usage: promtool.sh    prints the path of promtool
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/versions.sh"
log() { printf '[promtool] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

want=${PROMTOOL_VERSION#v}
dir="${XDG_CACHE_HOME:-$HOME/.cache}/rdma-netns/promtool-$want"
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ ! -f "$dir/.done" ]; then
  command -v apt-get >/dev/null || die "apt-get not found: make unit takes promtool $want from Debian bookworm's prometheus package; elsewhere set PROMTOOL to a promtool $want"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  if ! (cd "$tmp" && apt-get download prometheus >&2); then
    log "apt-get download prometheus failed: updating the package lists"
    $SUDO "$HERE/apt.sh" update >&2
    (cd "$tmp" && apt-get download prometheus >&2) || die "apt-get download prometheus failed: is a Debian bookworm source in /etc/apt/sources.list(.d)?"
  fi
  deb=$(ls "$tmp"/prometheus_*.deb)
  have=$(dpkg-deb -f "$deb" Version)
  [ "${have%%+*}" = "$want" ] || die "apt offers prometheus $have, versions.env says PROMTOOL_VERSION=$PROMTOOL_VERSION: make them agree"
  dpkg-deb -x "$deb" "$tmp/x"
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$tmp/x/usr/bin/promtool" "$dir/"
  echo "$have" > "$dir/deb-version"
  touch "$dir/.done"
  log "promtool of prometheus $have unpacked in $dir"
fi
echo "$dir/promtool"
