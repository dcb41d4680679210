#!/usr/bin/env bash
# The Kubernetes e2e payload (make e2e-k8s): the suite's payload
# (build-payload.sh) plus kubelet and the Kubernetes tests (e2e/k8s),
# in a directory of its own so that the other VM runs do not carry
# kubelet's 60 MB. The control plane stays on the host.
#
# Usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR
set -euo pipefail
base=${1:?usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR}
out=${2:?usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR}
bins=${3:?usage: payload.sh BASE_PAYLOAD OUTDIR K8S_BIN_DIR}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
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
cp "$bins/kubelet" "$out/bin/kubelet"
printf '[payload] %s\n' "Kubernetes e2e test binary (e2e/k8s, stripped)" >&2
(cd "$top/e2e/k8s" && go test -c -tags e2e -ldflags '-s -w' -o "$out/bin/k8s.test" .)
