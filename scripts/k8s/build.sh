#!/usr/bin/env bash
# Build the single-node cluster the Kubernetes e2e tests run (e2e/k8s) from
# Go modules, cached like the kernel and containerd: kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kubectl
# (KUBE_VERSION, module scripts/k8s/kube), etcd (ETCD_VERSION,
# scripts/k8s/etcd), Multus's thick plugin (MULTUS_VERSION,
# scripts/k8s/multus: multus-daemon, multus-shim, and install_multus and
# passthru, which the DaemonSet's init container runs and installs), and
# the helm CLI (HELM_VERSION, scripts/k8s/helm) the tests install the chart
# with. Static (CGO_ENABLED=0) and stripped.
#
# The binaries land in ${XDG_CACHE_HOME:-~/.cache}/rdma-netns/k8s/<key>/bin,
# where <key> names the versions and hashes this script and the three
# modules' go.mod/go.sum: editing any of them builds afresh, anything else
# reuses the cache (about a second). A lock of its own (k8s/.lock) serialises
# builds without holding up the VM cache's lock for the ten minutes a cold
# build takes.
#
# Usage: build.sh [--print-env]
#   --print-env  print K8S_BIN_DIR=... on stdout (for eval); logs go to stderr.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PRINT_ENV=0
[ "${1:-}" = --print-env ] && PRINT_ENV=1
log() { printf '[k8s-build] %s\n' "$*" >&2; }

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
# What make e2e-k8s needs on the host: socat (vm-run.sh --k8s-api forwards
# the guest's API server connections with it) and mkfs.ext4 (the node's
# disk, vm-run.sh --disk).
for need in socat:socat mkfs.ext4:e2fsprogs; do
  command -v "${need%%:*}" >/dev/null || PATH="$PATH:/sbin:/usr/sbin" command -v "${need%%:*}" >/dev/null && continue
  pkg=${need#*:}
  log "installing $pkg"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$pkg" >&2 ||
    { $SUDO apt-get update >&2 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$pkg" >&2; }
done
modversion() { (cd "$HERE/$1" && go list -m -f '{{.Version}}' "$2"); }
KUBE_VERSION=$(modversion kube k8s.io/kubernetes)
ETCD_VERSION=$(modversion etcd go.etcd.io/etcd/server/v3)
MULTUS_VERSION=$(modversion multus gopkg.in/k8snetworkplumbingwg/multus-cni.v4)

hash=$(cat "${BASH_SOURCE[0]}" "$HERE"/{kube,etcd,multus}/go.{mod,sum} | sha256sum | cut -c1-12)
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/rdma-netns/k8s"
DIR="$CACHE_ROOT/kube-${KUBE_VERSION}_etcd-${ETCD_VERSION}_multus-${MULTUS_VERSION}_$hash"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9

if [ ! -f "$DIR/.done" ]; then
  start=$(date +%s)
  rm -rf "$DIR.tmp"
  mkdir -p "$DIR.tmp/bin"
  out="$DIR.tmp/bin"
  # The components print the version they were stamped with
  # (k8s.io/component-base/version); unstamped they say v0.0.0-master.
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  major=${KUBE_VERSION#v}; major=${major%%.*}
  pkg=k8s.io/component-base/version
  kldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  for cmd in kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    t=$(date +%s)
    (cd "$HERE/kube" && go build -trimpath -ldflags "$kldflags" -o "$out/$cmd" "k8s.io/kubernetes/cmd/$cmd")
    log "$cmd $KUBE_VERSION built in $(( $(date +%s) - t ))s"
  done
  t=$(date +%s)
  (cd "$HERE/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
  log "etcd $ETCD_VERSION built in $(( $(date +%s) - t ))s"
  t=$(date +%s)
  # The names Multus's images give them (hack/build-go.sh): its manifest
  # runs /usr/src/multus-cni/bin/NAME.
  for cmd in multus-daemon multus-shim install_multus passthru-cni=passthru; do
    (cd "$HERE/multus" && go build -trimpath -ldflags "-s -w" -o "$out/${cmd#*=}" "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/${cmd%=*}")
  done
  log "multus $MULTUS_VERSION (daemon, shim, install_multus, passthru) built in $(( $(date +%s) - t ))s"
  # Multus's manifests (the thick DaemonSet, the NAD CRD) as released with it.
  mdir=$(cd "$HERE/multus" && go list -m -f '{{.Dir}}' gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
  cp -r "$mdir/deployments" "$DIR.tmp/multus-deployments"
  chmod -R u+w "$DIR.tmp/multus-deployments"
  touch "$DIR.tmp/.done"
  rm -rf "$DIR"
  mv "$DIR.tmp" "$DIR"
  log "built in $(( $(date +%s) - start ))s: $(du -sh "$DIR/bin" | cut -f1) in $DIR/bin"
fi
# helm has a key of its own (its version and a hash of its module's
# go.mod/go.sum), so a new helm does not rebuild the cluster.
HELM_VERSION=$(modversion helm helm.sh/helm/v3)
hhash=$(cat "$HERE"/helm/go.{mod,sum} | sha256sum | cut -c1-12)
HELM_DIR="$CACHE_ROOT/helm-${HELM_VERSION}_$hhash"
if [ ! -f "$HELM_DIR/.done" ]; then
  t=$(date +%s)
  rm -rf "$HELM_DIR.tmp"
  mkdir -p "$HELM_DIR.tmp/bin"
  # helm stamps its version through helm.sh/helm/v3/internal/version.
  (cd "$HERE/helm" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    -o "$HELM_DIR.tmp/bin/helm" helm.sh/helm/v3/cmd/helm)
  touch "$HELM_DIR.tmp/.done"
  rm -rf "$HELM_DIR"
  mv "$HELM_DIR.tmp" "$HELM_DIR"
  log "helm $HELM_VERSION built in $(( $(date +%s) - t ))s: $(du -sh "$HELM_DIR/bin/helm" | cut -f1)"
fi
# Older keys' builds are left to the user (rm -rf the k8s directory), as
# vm-prepare.sh leaves older kernels.
if [ "$PRINT_ENV" = 1 ]; then
  printf 'K8S_BIN_DIR=%q\n' "$DIR/bin"
  printf 'K8S_MULTUS_DEPLOYMENTS=%q\n' "$DIR/multus-deployments"
  printf 'K8S_VERSION=%q\n' "$KUBE_VERSION"
  printf 'K8S_HELM=%q\n' "$HELM_DIR/bin/helm"
else
  log "$DIR/bin"
fi
