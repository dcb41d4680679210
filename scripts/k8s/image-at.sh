#!/usr/bin/env bash
# The DaemonSet's image as an earlier commit builds it, for the upgrade and
# rollback tests of make e2e-k8s: the commit's tree (git archive, so the
# checkout is not touched) built by its own `make image`, amd64 only, with
# VERSION set to the commit (the binaries print it, so the two builds
# differ). Cached by commit in ${XDG_CACHE_HOME:-~/.cache}/rdma-netns/
# k8s-images/<commit>/layout (an OCI layout), a second or so on a hit.
#
# Usage: image-at.sh COMMIT TAG
#   prints the layout's directory on stdout; logs go to stderr.
set -euo pipefail
commit=${1:?usage: image-at.sh COMMIT TAG}
tag=${2:?usage: image-at.sh COMMIT TAG}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log() { printf '[image-at] %s\n' "$*" >&2; }
full=$(git -C "$top" rev-parse --verify "$commit^{commit}") ||
  { log "commit $commit is not in this clone (a shallow clone? fetch it, or set K8S_UPGRADE_FROM)"; exit 1; }
short=$(git -C "$top" rev-parse --short "$full")
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/rdma-netns/k8s-images"
dir="$CACHE_ROOT/${full}_$(printf %s "$tag" | sha256sum | cut -c1-8)"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9
if [ ! -f "$dir/.done" ]; then
  t=$(date +%s)
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp/src"
  git -C "$top" archive "$full" | tar -x -C "$dir.tmp/src"
  make -C "$dir.tmp/src" image VERSION="$short" IMAGE="$tag" PLATFORMS=linux/amd64 \
    OUT="$dir.tmp/out" IMAGE_LAYOUT="$dir.tmp/layout" >&2
  rm -rf "$dir.tmp/src" "$dir.tmp/out"
  touch "$dir.tmp/.done"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  log "image of $short ($tag) built in $(( $(date +%s) - t ))s"
fi
echo "$dir/layout"
