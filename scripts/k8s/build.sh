#!/usr/bin/env bash
# Build the single-node cluster the Kubernetes e2e tests run (e2e/k8s) from
# Go modules, at the versions versions.env names (or the environment:
# KUBERNETES_VERSION, ETCD_VERSION, MULTUS_VERSION, HELM_VERSION,
# RUNC_VERSION, PROMETHEUS_VERSION, PROMETHEUS_OPERATOR_VERSION):
# kube-apiserver, kube-controller-manager, kube-scheduler and kubelet
# (the module under scripts/k8s/kube* that requires k8s.io/kubernetes at
# KUBERNETES_VERSION; kubectl too with K8S_KUBECTL=1, for make demo), etcd (scripts/k8s/etcd),
# Multus's thick plugin (scripts/k8s/multus: multus-daemon, multus-shim,
# and install_multus and passthru, which the DaemonSet's init container
# runs and installs), the helm CLI (scripts/k8s/helm) the tests install
# the chart with, and runc (scripts/k8s/runc), the node's runtime handler
# for user-namespaced pods; the Prometheus server (scripts/k8s/prometheus,
# with Kubernetes service discovery alone) the tests scrape the exporter
# with; and the prometheus-operator's ServiceMonitor
# CRD (scripts/k8s/promop: controller-gen over the operator's API module
# at PROMETHEUS_OPERATOR_VERSION), which the tests check the chart's
# ServiceMonitor against. Static (CGO_ENABLED=0; runc needs cgo, and is
# linked statically) and stripped. A module that requires another version
# than versions.env names stops the build.
#
# Each component is cached on its own in
# ${XDG_CACHE_HOME:-~/.cache}/rdma-netns/k8s/<name>-<version>_<hash>, where
# <hash> covers its module's go.mod/go.sum and how it is built: two
# Kubernetes versions share one etcd and one Multus, and a new helm rebuilds
# nothing else. A cached component takes about a second. The set a run
# uses, k8s/set-<kube>_<etcd>_<multus>/, links them: bin/ (K8S_BIN_DIR) and
# multus-deployments/. A lock of its own (k8s/.lock) serialises builds
# without holding up the VM cache's lock for the ten minutes a cold
# Kubernetes build takes.
#
# Usage: build.sh [--print-env]
#   --print-env  print K8S_BIN_DIR=... on stdout (for eval); logs go to stderr.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/../versions.sh"
PRINT_ENV=0
[ "${1:-}" = --print-env ] && PRINT_ENV=1
log() { printf '[k8s-build] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
# apt_install PKG...: Debian's packages, updating the package lists and
# trying again when they lack one.
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo env DEBIAN_FRONTEND=noninteractive "$HERE/../apt.sh" install -y --no-install-recommends "$@" >&2 ||
    { $sudo "$HERE/../apt.sh" update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive "$HERE/../apt.sh" install -y --no-install-recommends "$@" >&2; }
}
# What make e2e-k8s needs on the host: socat (vm-run.sh --k8s-api forwards
# the guest's API server connections with it) and mkfs.ext4 (the node's
# disk, vm-run.sh --disk).
for need in socat:socat mkfs.ext4:e2fsprogs; do
  command -v "${need%%:*}" >/dev/null || PATH="$PATH:/sbin:/usr/sbin" command -v "${need%%:*}" >/dev/null && continue
  pkg=${need#*:}
  log "installing $pkg"
  apt_install "$pkg"
done
# runc (scripts/k8s/runc) is built with cgo, static, with seccomp: gcc,
# pkg-config and libseccomp's static library (libseccomp-dev).
if ! command -v gcc >/dev/null || ! command -v pkg-config >/dev/null || ! pkg-config --exists libseccomp; then
  log "installing gcc pkg-config libseccomp-dev (runc's build)"
  apt_install gcc libc6-dev pkg-config libseccomp-dev
fi
modversion() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }
# need DIR MODULE VERSION: the module in DIR requires MODULE at VERSION.
need() {
  local have
  have=$(modversion "$1" "$2")
  [ "$have" = "$3" ] || die "scripts/k8s/$(basename "$1")/go.mod requires $2 $have, versions.env says $3: make them agree (go get $2@$3 there, or edit versions.env)"
}
# The Kubernetes module: the one under scripts/k8s/kube* that requires
# KUBERNETES_VERSION (one per version the suite runs).
KUBE_MOD=
for m in "$HERE"/kube*/; do
  [ "$(modversion "$m" k8s.io/kubernetes)" = "$KUBERNETES_VERSION" ] && KUBE_MOD=${m%/}
done
[ -n "$KUBE_MOD" ] || die "no module under scripts/k8s/kube* requires k8s.io/kubernetes $KUBERNETES_VERSION: add one as scripts/k8s/kube is made (its comment says how)"
need "$HERE/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
need "$HERE/multus" gopkg.in/k8snetworkplumbingwg/multus-cni.v4 "$MULTUS_VERSION"
need "$HERE/helm" helm.sh/helm/v3 "$HELM_VERSION"
need "$HERE/runc" github.com/opencontainers/runc "$RUNC_VERSION"
# Prometheus vX.Y.Z is its Go module's v0.X0Y.Z (v3.16.0: v0.316.0).
prom_module() {
  local maj min pat
  IFS=. read -r maj min pat <<<"${1#v}"
  printf 'v0.%d%02d.%s' "$maj" "$min" "$pat"
}
need "$HERE/prometheus" github.com/prometheus/prometheus "$(prom_module "$PROMETHEUS_VERSION")"
need "$HERE/promop" github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring "$PROMETHEUS_OPERATOR_VERSION"

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/rdma-netns/k8s"
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9

# component NAME VERSION MODULE_DIR RECIPE: sets DIR to the cache
# directory of a component, keyed by its version, its module's
# go.mod/go.sum and the recipe (how build_NAME builds it); built when
# missing.
component() {
  local name=$1 version=$2 mod=$3 recipe=$4 hash t
  hash=$( { printf '%s\n' "$recipe"; cat "$mod"/go.{mod,sum}; } | sha256sum | cut -c1-12)
  DIR="$CACHE_ROOT/$name-${version}_$hash"
  [ -f "$DIR/.done" ] && return
  t=$(date +%s)
  rm -rf "$DIR.tmp"
  mkdir -p "$DIR.tmp/bin"
  (
    cd "$mod"
    "build_$name" "$DIR.tmp"
  )
  touch "$DIR.tmp/.done"
  rm -rf "$DIR"
  mv "$DIR.tmp" "$DIR"
  log "$name $version built in $(( $(date +%s) - t ))s: $(du -sh "$DIR/bin" | cut -f1) in $DIR/bin"
}

# The components print the version they were stamped with
# (k8s.io/component-base/version); unstamped they say v0.0.0-master.
minor=${KUBERNETES_VERSION#v*.}; minor=${minor%%.*}
major=${KUBERNETES_VERSION#v}; major=${major%%.*}
pkg=k8s.io/component-base/version
KUBE_LDFLAGS="-s -w -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
KUBE_CMDS="kubelet kube-apiserver kube-controller-manager kube-scheduler"
# One go build for all of them: the five links (each single-threaded) then
# run beside each other and beside the compiles; one at a time they took
# 42 s against 22 s on warm caches (2 cores).
build_kube() {
  local cmd pkgs=()
  for cmd in $KUBE_CMDS; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  go build -trimpath -ldflags "$KUBE_LDFLAGS" -o "$1/bin/" "${pkgs[@]}"
}
# kubectl, a component of its own that only make demo asks for
# (K8S_KUBECTL=1): the suites render their overlays with conf/cmd/kustomize,
# and kubectl's 194 packages of its own are a share of the cold build the
# first boot waits for.
build_kubectl() {
  go build -trimpath -ldflags "$KUBE_LDFLAGS" -o "$1/bin/kubectl" k8s.io/kubernetes/cmd/kubectl
}
build_etcd() {
  go build -trimpath -ldflags "-s -w" -o "$1/bin/etcd" go.etcd.io/etcd/server/v3
}
# The names Multus's images give them (hack/build-go.sh): its manifest
# runs /usr/src/multus-cni/bin/NAME. Stamped as its release is
# (pkg/multus.version), so the daemon's log names its version.
MULTUS_CMDS="multus-daemon multus-shim install_multus passthru-cni=passthru"
MULTUS_LDFLAGS="-s -w -X gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus.version=$MULTUS_VERSION"
build_multus() {
  local cmd mdir pkgs=()
  # One go build, as for Kubernetes; it names each binary after its
  # package, which the loop after renames where the images do.
  for cmd in $MULTUS_CMDS; do pkgs+=("gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/${cmd%=*}"); done
  go build -trimpath -ldflags "$MULTUS_LDFLAGS" -o "$1/bin/" "${pkgs[@]}"
  for cmd in $MULTUS_CMDS; do
    [ "${cmd%=*}" = "${cmd#*=}" ] || mv "$1/bin/${cmd%=*}" "$1/bin/${cmd#*=}"
  done
  # Multus's manifests (the thick DaemonSet, the NAD CRD) as released with it.
  mdir=$(go list -m -f '{{.Dir}}' gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
  cp -r "$mdir/deployments" "$1/multus-deployments"
  chmod -R u+w "$1/multus-deployments"
}
# helm stamps its version through helm.sh/helm/v3/internal/version.
HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
build_helm() {
  go build -trimpath -ldflags "$HELM_LDFLAGS" -o "$1/bin/helm" helm.sh/helm/v3/cmd/helm
}

# runc as its Makefile builds it statically (`make static`: seccomp, static
# PIE, netgo and osusergo, so that it needs no library of the guest's), but
# without libpathrs, a Rust library Debian does not package: runc then
# uses its Go implementation of the same safe path resolution. It stamps
# its version from its VERSION file.
RUNC_TAGS="seccomp urfave_cli_no_docs netgo osusergo"
RUNC_LDFLAGS="-s -w -linkmode external -extldflags -static-pie"
build_runc() {
  CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "$RUNC_TAGS" -ldflags "$RUNC_LDFLAGS" -o "$1/bin/runc" github.com/opencontainers/runc
}

# Prometheus as its release is built (promu: static, stamped through
# prometheus/common/version), with one service discovery, Kubernetes'
# (its plugins' build tags): the suite needs no other, and each costs
# build time. Its web UI's assets are not embedded (builtinassets): the
# tests use its HTTP API.
PROM_TAGS="remove_all_sd enable_kubernetes_sd"
PROM_LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v} -X github.com/prometheus/common/version.Branch=HEAD"
build_prometheus() {
  go build -trimpath -tags "$PROM_TAGS" -ldflags "$PROM_LDFLAGS" -o "$1/bin/prometheus" github.com/prometheus/prometheus/cmd/prometheus
}

# The operator's CRDs as its release generates them (make generate-crds:
# controller-gen crd:crdVersions=v1 over pkg/apis/monitoring), here from
# its API module; the suite installs the ServiceMonitor's.
PROMOP_GEN="crd:crdVersions=v1 paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
build_promop() {
  go build -o "$1/bin/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen
  # shellcheck disable=SC2086 # PROMOP_GEN is words
  "$1/bin/controller-gen" $PROMOP_GEN output:crd:dir="$1/crds"
  rm "$1/bin/controller-gen"
  [ -s "$1/crds/monitoring.coreos.com_servicemonitors.yaml" ] || die "controller-gen wrote no ServiceMonitor CRD in $1/crds"
}

# comp NAME: component NAME at its version, with its module and recipe.
comp() {
  case $1 in
    kube) component kube "$KUBERNETES_VERSION" "$KUBE_MOD" "$KUBE_LDFLAGS $KUBE_CMDS" ;;
    kubectl) component kubectl "$KUBERNETES_VERSION" "$KUBE_MOD" "$KUBE_LDFLAGS kubectl" ;;
    etcd) component etcd "$ETCD_VERSION" "$HERE/etcd" "-s -w" ;;
    multus) component multus "$MULTUS_VERSION" "$HERE/multus" "$MULTUS_LDFLAGS $MULTUS_CMDS" ;;
    helm) component helm "$HELM_VERSION" "$HERE/helm" "$HELM_LDFLAGS" ;;
    runc) component runc "$RUNC_VERSION" "$HERE/runc" "$RUNC_TAGS $RUNC_LDFLAGS" ;;
    prometheus) component prometheus "$PROMETHEUS_VERSION" "$HERE/prometheus" "$PROM_TAGS $PROM_LDFLAGS" ;;
    promop) component promop "$PROMETHEUS_OPERATOR_VERSION" "$HERE/promop" "$PROMOP_GEN" ;;
  esac
}
# Two lanes: Kubernetes, and the others one after another beside it. One
# at a time, a core sat idle through each small build's module loading and
# link (those are single-threaded), and the cluster's build is what
# make test's first boot waits for. Each lane is a subshell (its DIR is
# lost): the calls after the wait only name the directories.
OTHERS="etcd multus helm runc prometheus promop${K8S_KUBECTL:+ kubectl}"
( comp kube ) &
kube_lane=$!
# shellcheck disable=SC2086 # OTHERS is words
( for c in $OTHERS; do comp "$c"; done ) &
other_lane=$!
kube_rc=0 other_rc=0
wait "$kube_lane" || kube_rc=$?
wait "$other_lane" || other_rc=$?
[ "$kube_rc" = 0 ] || die "Kubernetes $KUBERNETES_VERSION did not build (above)"
[ "$other_rc" = 0 ] || die "a component did not build (above)"
# Sets kube, etcd, ... to each one's directory.
for c in kube $OTHERS; do comp "$c"; printf -v "$c" %s "$DIR"; done
# The set a run uses: links, remade each time (cheap).
SET="$CACHE_ROOT/set-$(basename "$kube")_$(basename "$etcd")_$(basename "$multus")"
rm -rf "$SET.tmp"
mkdir -p "$SET.tmp/bin"
ln -s "$kube"/bin/* "$etcd"/bin/* "$multus"/bin/* "$SET.tmp/bin/"
ln -s "$multus/multus-deployments" "$SET.tmp/multus-deployments"
rm -rf "$SET"
mv "$SET.tmp" "$SET"
# Older versions' builds are left to the user (rm -rf the k8s directory),
# as vm-prepare.sh leaves older kernels.
if [ "$PRINT_ENV" = 1 ]; then
  printf 'K8S_BIN_DIR=%q\n' "$SET/bin"
  printf 'K8S_MULTUS_DEPLOYMENTS=%q\n' "$SET/multus-deployments"
  printf 'K8S_VERSION=%q\n' "$KUBERNETES_VERSION"
  printf 'K8S_HELM=%q\n' "$helm/bin/helm"
  printf 'K8S_RUNC=%q\n' "$runc/bin/runc"
  printf 'K8S_PROMETHEUS=%q\n' "$prometheus/bin/prometheus"
  printf 'K8S_SERVICEMONITOR_CRD=%q\n' "$promop/crds/monitoring.coreos.com_servicemonitors.yaml"
  [ -z "${K8S_KUBECTL:-}" ] || printf 'K8S_KUBECTL_BIN=%q\n' "$kubectl/bin/kubectl"
else
  log "$SET/bin"
fi
