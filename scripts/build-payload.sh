#!/usr/bin/env bash
# Build everything the test VM runs into one payload directory (the layout
# scripts/vm-run.sh expects): cni/ holds CNI plugins for /opt/cni/bin, bin/
# holds test binaries for /usr/local/bin, the rest lands in /payload.
#
# host-device, static, loopback, tuning, sbr and cnitool are built from
# their own modules at the versions versions.env names (CNI_PLUGINS_VERSION,
# CNI_VERSION), which go.mod requires too (versions_test.go), so the VM runs exactly the
# code we depend on. The Multus tests come from their own module,
# e2e/multus; the CRI tests from e2e/cri, with containerd built from its Go
# module (CONTAINERD_VERSION) and conf/containerd as /payload/containerd.
#
# Usage: build-payload.sh OUTDIR [extra guest scripts...]
set -euo pipefail
out=${1:?usage: build-payload.sh OUTDIR}
shift
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$top/scripts/versions.sh"
cd "$top"
export CGO_ENABLED=0
mkdir -p "$out/cni" "$out/bin"
out=$(cd "$out" && pwd)
log() { printf '[payload] %s\n' "$*" >&2; }

plugins=$CNI_PLUGINS_VERSION
cni=$CNI_VERSION

log "rdma-netns"
go build -trimpath -o "$out/cni/rdma-netns" .
# go install caches by version: after the first run these take a second.
# tuning and sbr: the rails NADs chain them after host-device on rails
# that share a subnet (conf/nad-rails-shared-subnet.yaml: tuning sets the
# rail's arp_ignore/arp_announce in the pod, sbr gives it a routing table),
# so /opt/cni/bin must hold them for those chains to run.
log "host-device, static, loopback, tuning, sbr $plugins; cnitool $cni"
GOBIN="$out/cni" go install \
  "github.com/containernetworking/plugins/plugins/main/host-device@$plugins" \
  "github.com/containernetworking/plugins/plugins/ipam/static@$plugins" \
  "github.com/containernetworking/plugins/plugins/main/loopback@$plugins" \
  "github.com/containernetworking/plugins/plugins/meta/tuning@$plugins" \
  "github.com/containernetworking/plugins/plugins/meta/sbr@$plugins"
GOBIN="$out/bin" go install "github.com/containernetworking/cni/cnitool@$cni"
log "e2e test binary"
go test -c -tags e2e -o "$out/bin/e2e.test" ./e2e
log "Multus e2e test binary (Multus and client-go, stripped)"
(cd e2e/multus && go test -c -tags e2e -ldflags '-s -w' -o "$out/bin/multus.test" .)
log "containerd $CONTAINERD_VERSION (static, stripped), CRI tests and tools (e2e/cri)"
# Static and stripped: the three binaries go into every boot's initramfs
# (about 80 MB, unpacked in the guest's RAM).
GOBIN="$out/bin" go install -trimpath -ldflags '-s -w' -tags "no_btrfs no_devmapper no_zfs" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
(cd e2e/cri && go test -c -tags e2e -ldflags '-s -w' -o "$out/bin/cri.test" . &&
  go test -c -tags e2e -ldflags '-s -w' -o "$out/bin/nri.test" ./nri &&
  go build -trimpath -ldflags '-s -w' -o "$out/bin/rdma-netns-pause" ./cmd/pause &&
  go build -trimpath -ldflags '-s -w' -o "$out/bin/rdma-netns-cri" ./cmd/rdma-netns-cri)
rm -rf "$out/containerd"
cp -r conf/containerd "$out/containerd"
log "bench and stress programs"
go build -trimpath -o "$out/bin/rdma-netns-bench" ./e2e/bench
go build -trimpath -o "$out/bin/rdma-netns-stress" ./e2e/stress
log "exporter"
go build -trimpath -o "$out/bin/rdma-netns-exporter" ./cmd/rdma-netns-exporter
log "NRI plugin"
go build -trimpath -o "$out/bin/rdma-netns-nri" ./cmd/rdma-netns-nri
go build -trimpath -o "$out/bin/rdma-netns-floor" ./e2e/bench/floor
# The plugin rdma-netns replaces, as `make bench`'s anchor: upstream
# rdma-cni built from the Go module proxy in its own module (its go.mod and
# go.sum), never vendored here. Only when asked: it is not a test dependency.
if [ -n "${PAYLOAD_UPSTREAM:-}" ]; then
  log "upstream rdma-cni $PAYLOAD_UPSTREAM"
  dir=$(cd / && GOWORK=off go mod download -json "github.com/k8snetworkplumbingwg/rdma-cni@$PAYLOAD_UPSTREAM" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { log "cannot download rdma-cni $PAYLOAD_UPSTREAM"; exit 1; }
  (cd "$dir" && go build -trimpath -o "$out/bin/rdma-cni-upstream" ./cmd/rdma)
fi
for f in "$@"; do
  cp "$f" "$out/"
done
# The versions this payload was built with (the environment may have named
# others than the file), as /payload/versions.env for the tests that check
# what runs (e2e/k8s's TestNodeVersions) and demo.sh.
sed -n 's/^\([A-Z][A-Z0-9_]*\)=.*/\1/p' versions.env | while read -r k; do
  printf '%s=%s\n' "$k" "${!k}"
done > "$out/versions.env"
