#!/usr/bin/env bash
# The MPI image between two kernels: builds rdma-netns.test/rdma-mpi:1
# (scripts/k8s/mpi-image.sh), boots two test VMs on one link
# (scripts/vm-pair.sh with scripts/guest/mpi-link-test.sh) and runs the
# allreduce from node 1 (launcher, rank 0) to node 2 (worker over ssh,
# rank 1) once per case of scripts/guest/mpi-cases.sh: UCX, Open MPI's
# openib BTL, TCP, RDMA asked of a worker without its device, Debian's
# defaults. Prints each case's result, both nodes' rxe packet counters and
# its verdict; docs/mpi.md says what they showed. Exit status: 0 when
# every verdict passed (vm-pair.sh's otherwise).
#
# Usage: mpi-link.sh [OUT_DIR]   (default _output/mpi-link)
#   MPI_LINK_PORT: node 1's UDP port on 127.0.0.1 (default 13837; node 2
#                  takes the next one).
#   MPI_BYTES, MPI_ITERS: the allreduce's vector per rank and iterations
#                  (default 1 MiB, 10).
#   MPI_EXTRA=1: also the RC cases (a minute each at UCX's 1 s timeout).
# Boots two VMs: on a shared machine, run it under the machine's VM lock.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(mkdir -p "${1:-$top/_output/mpi-link}" && cd "${1:-$top/_output/mpi-link}" && pwd)
port=${MPI_LINK_PORT:-13837}
log() { printf '[mpi-link] %s\n' "$*" >&2; }

start=$(date +%s)
"$top/scripts/k8s/mpi-image.sh" "$out/rdma-mpi.tar"
built=$(date +%s)

payload=$out/payload
rm -rf "$payload"
mkdir -p "$payload/ssh" "$out/oci"
# The image's one layer, as the archive holds it (index -> manifest ->
# layer): the guest unpacks it as the root of every MPI process.
rm -rf "$out/oci"/*
tar -xf "$out/rdma-mpi.tar" -C "$out/oci"
blob() { sed -n "s/.*\"$1\":\\[\\{0,1\\}{[^}]*\"digest\":\"sha256:\\([0-9a-f]*\\)\".*/\\1/p" "$2"; }
manifest=$(blob manifests "$out/oci/index.json")
layer=$(blob layers "$out/oci/blobs/sha256/$manifest")
[ -n "$layer" ] || { log "no layer in $out/rdma-mpi.tar"; exit 1; }
gzip -dc "$out/oci/blobs/sha256/$layer" > "$payload/mpi-layer.tar"
rm -rf "$out/oci"
# The job's key, as the MPI Operator makes one per job for its Secret.
ssh-keygen -q -t ed25519 -N '' -C mpi-link -f "$payload/ssh/id_rsa"
# util-linux's setpriv (busybox's cannot change user or bounding set),
# run in the image's root, which has its one library (libcap-ng).
cp "$(command -v setpriv)" "$payload/setpriv"
cp "$top/scripts/guest/mpi-link-test.sh" "$top/scripts/guest/mpi-cases.sh" "$payload/"

log "two VMs on 127.0.0.1:$port-$((port + 1)); consoles in $out/node{1,2}.log"
rc=0
args="--nics 2 --timeout 900 --payload $(printf %q "$payload") -- '/payload/mpi-link-test.sh ${MPI_BYTES:-1048576} ${MPI_ITERS:-10} ${MPI_EXTRA:-0}'"
"$top/scripts/vm-pair.sh" "$out" "$port" "$args" "$args" || rc=$?
rm -rf "$payload"
grep -ah '^@@MPI' "$out/node1.log" "$out/node2.log" | grep -v '^@@MPI-UCX' || true
log "image $((built - start)) s; whole run $(($(date +%s) - start)) s; status $rc"
exit "$rc"
