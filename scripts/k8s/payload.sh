#!/usr/bin/env bash
# The Kubernetes e2e payload (make e2e-k8s): the suite's payload
# (build-payload.sh) plus kubelet and the Kubernetes tests (e2e/k8s),
# in a directory of its own so that the other VM runs do not carry
# kubelet's 60 MB. The control plane stays on the host.
#
# It also renders the overlays of e2e/k8s/overlays as kubectl kustomize
# does (conf/cmd/kustomize; the manifests of conf/ as the tests apply them) into
# /payload/k8s-manifests/NAME.yaml, and packs the image `make image` wrote
# (IMAGE_LAYOUT, an OCI layout) as /payload/k8s-manifests/rdma-netns-image.tar
# for the test to import: nothing is pulled. With them helm (K8S_HELM), the
# chart conf/helm/rdma-netns and an earlier commit's image
# (K8S_UPGRADE_LAYOUT) for the upgrade tests, and a newer runc (K8S_RUNC)
# for user-namespaced pods, and Prometheus (below). The node's /opt/cni/bin has no
# rdma-netns: the DaemonSet's init container installs it.
#
# Multus's thick plugin likewise: its image (build/image, from the binaries
# build.sh built, at /usr/src/multus-cni/bin as Multus's manifest runs
# them) as /payload/k8s-manifests/multus-image.tar, and its manifest
# (deployments/multus-daemonset-thick.yml) through e2e/k8s/overlays/multus
# as /payload/k8s-manifests/multus.yaml.
#
# Usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR IMAGE_LAYOUT
set -euo pipefail
base=${1:?usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR}
out=${2:?usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR}
bins=${3:?usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR IMAGE_LAYOUT}
layout=${4:?usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR IMAGE_LAYOUT}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$top/scripts/versions.sh"
export CGO_ENABLED=0
rm -rf "$out"
mkdir -p "$(dirname "$out")"
cp -a "$base" "$out"
out=$(cd "$out" && pwd)
# The other suites' programs: every boot unpacks the payload into the
# guest's RAM, and kubelet is big enough already.
for f in e2e.test multus.test cri.test nri.test rdma-netns-bench rdma-netns-stress \
  rdma-netns-floor rdma-netns-cri rdma-netns-nri-demo rdma-cni-upstream rdma-netns-base; do
  rm -f "$out/bin/$f"
done
rm -f "$out/cni/rdma-netns"
cp "$bins/kubelet" "$out/bin/kubelet"
# The pods' cluster network (ptp, host-local), at CNI_PLUGINS_VERSION; and
# tuning and sbr, which the rails NADs chain after host-device on rails
# sharing a subnet (conf/nad-rails-shared-subnet.yaml: per-rail ARP sysctls
# and routing tables in the pod). The base payload copied above has them
# too; they are named here so the node's /opt/cni/bin holds them whatever
# the base's list becomes (go install's cache makes the repeat free).
GOBIN="$out/cni" go install \
  "github.com/containernetworking/plugins/plugins/main/ptp@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/meta/tuning@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/meta/sbr@$CNI_PLUGINS_VERSION"
mkdir -p "$out/k8s-manifests"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go -C "$top/conf" build -o "$tmp/kustomize" ./cmd/kustomize
for o in "$top"/e2e/k8s/overlays/*/; do
  [ "$(basename "$o")" = multus ] && continue
  "$tmp/kustomize" "$o" > "$out/k8s-manifests/$(basename "$o").yaml"
done
tar -C "$layout" -cf "$out/k8s-manifests/rdma-netns-image.tar" .
# The chart's tests (e2e/k8s/helm_test.go): the helm CLI (K8S_HELM, from
# build.sh), the chart as conf/ has it, and the image of an earlier commit
# to upgrade from (K8S_UPGRADE_LAYOUT, from image-at.sh).
cp "${K8S_HELM:?K8S_HELM: the helm binary build.sh built}" "$out/bin/helm"
cp -r "$top/conf/helm/rdma-netns" "$out/k8s-manifests/chart"
tar -C "${K8S_UPGRADE_LAYOUT:?K8S_UPGRADE_LAYOUT: the image layout image-at.sh built}" \
  -cf "$out/k8s-manifests/rdma-netns-image-upgrade-from.tar" .

# runc for the runtime handler of user-namespaced pods (K8S_RUNC, from
# build.sh; e2e/k8s/userns_test.go): installed beside Debian's runc, the
# node's, as /usr/local/bin/runc-userns, which the handler names.
cp "${K8S_RUNC:?K8S_RUNC: the runc binary build.sh built}" "$out/bin/runc-userns"

# The suite's Prometheus (e2e/k8s/prometheus_test.go): the server build.sh
# built (K8S_PROMETHEUS), which the test packs into an image and runs as a
# pod; the Grafana dashboard whose queries it evaluates; the
# prometheus-operator's ServiceMonitor CRD (K8S_SERVICEMONITOR_CRD, from
# build.sh) and the chart's rendered ServiceMonitor, which the API server
# must accept.
cp "${K8S_PROMETHEUS:?K8S_PROMETHEUS: the prometheus binary build.sh built}" "$out/bin/prometheus"
cp "$top/conf/grafana-dashboard.json" "$top/conf/exporter-servicemonitor.yaml" "$out/k8s-manifests/"
cp "${K8S_SERVICEMONITOR_CRD:?K8S_SERVICEMONITOR_CRD: the CRD build.sh generated}" "$out/k8s-manifests/servicemonitor-crd.yaml"

# The two-node tests' MPI job (e2e/k8s/mpi_test.go): Open MPI, UCX, mpi4py
# and sshd from Debian (scripts/k8s/mpi-image.sh, docs/mpi.md), imported
# by each node.
"$top/scripts/k8s/mpi-image.sh" "$out/k8s-manifests/rdma-mpi-image.tar"

# Multus thick: the overlay rendered next to Multus's manifest, and the image.
mkdir -p "$tmp/overlay" "$tmp/bin/linux_amd64"
cp "$top/e2e/k8s/overlays/multus/kustomization.yaml" "$bins/../multus-deployments/multus-daemonset-thick.yml" "$tmp/overlay/"
"$tmp/kustomize" "$tmp/overlay" > "$out/k8s-manifests/multus.yaml"
multus_bins=multus-daemon,multus-shim,install_multus,passthru
for b in ${multus_bins//,/ }; do cp "$bins/$b" "$tmp/bin/linux_amd64/"; done
# What Multus's own image (on Debian) has and its programs need of a root:
# /var/run -> ../run, for the daemon opens the pods' netns by the path
# containerd gives, /var/run/netns/cni-..., where its manifest mounts
# /run/netns; /etc/passwd, for the daemon checks it runs as root with
# os/user, which without one fails (and the daemon then panics).
echo 'root:x:0:0:root:/root:/sbin/nologin' > "$tmp/passwd"
go -C "$top/build/image" run . build -bin-dir "$tmp/bin" -bins "$multus_bins" -platforms linux/amd64 \
  -dir /usr/src/multus-cni/bin -symlinks /var/run=../run -files /etc/passwd="$tmp/passwd" \
  -tag rdma-netns.test/multus-cni:thick -out "$tmp/layout" >&2
tar -C "$tmp/layout" -cf "$out/k8s-manifests/multus-image.tar" .
printf '[payload] %s\n' "Kubernetes e2e test binary (e2e/k8s, stripped)" >&2
(cd "$top/e2e/k8s" && go test -c -tags e2e -ldflags '-s -w' -o "$out/bin/k8s.test" .)
