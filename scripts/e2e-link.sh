#!/usr/bin/env bash
# Two test VMs at once, joined by an Ethernet link on this machine's
# loopback (vm-run.sh --node 1/2 --link, UDP ports PORT and PORT+1), each
# running
# /payload/link-test.sh (scripts/guest/link-test.sh): RDMA traffic between
# the two kernels host to host, then netns to netns through devices
# rdma-netns moved. Prints both phases' bandwidth and latency side by
# side. Used by `make e2e-link`.
#
# Usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR [GUEST_CMD]
#   PORT: node 1's end of the link on 127.0.0.1 (UDP); node 2's is PORT+1.
#         Two runs at once need two pairs.
#   OUT_DIR: receives node1.log and node2.log, each VM's console.
#   GUEST_CMD: what both VMs run instead of /payload/link-test.sh (the
#         MPI test, scripts/mpi-link.sh); the caller reads the consoles,
#         nothing is printed from them here.
#
# Exit status: 0 when both guests passed; otherwise the first failing
# VM's status (vm-run.sh's: 124 timeout, 125 VM failure).
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
payload=${1:?usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR}
port=${2:?usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR}
out=${3:?usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR}
cmd=${4:-/payload/link-test.sh}
mkdir -p "$out"
log() { printf '[e2e-link] %s\n' "$*" >&2; }

# Two NICs per VM: the link test uses eth0, and a second NIC on the same
# L2 segment keeps the ARP set-up of a multi-NIC host honest.
vm() {
  local node=$1 ports=$2
  # A session of its own, so that a failure can stop the whole VM by its
  # session ID: vm-run.sh's `timeout` puts QEMU in a process group of its
  # own, out of reach of a signal to vm-run.sh's group.
  setsid "$SCRIPTS_DIR/vm-run.sh" --node "$node" --nics 2 --timeout 900 \
    --link "127.0.0.1:$ports" --payload "$payload" \
    -- "$cmd" > "$out/node$node.log" 2>&1 &
}

pids=()
# stop_all returns once the VMs' processes are gone (SIGKILL after 10 s),
# so that no QEMU outlives the run and holds its ports.
stop_all() {
  local p i
  for p in "${pids[@]}"; do pkill -TERM -s "$p" || true; done
  for p in "${pids[@]}"; do
    for ((i = 0; i < 50; i++)); do
      pgrep -s "$p" > /dev/null || continue 2
      sleep 0.2
    done
    pkill -KILL -s "$p" || true
  done
}
trap stop_all EXIT

start=$(date +%s)
log "booting node 1 and node 2 on a link over 127.0.0.1:$port-$((port + 1)) (UDP); consoles in $out/node{1,2}.log"
vm 1 "$port:$((port + 1))"; pids+=("$!")
vm 2 "$((port + 1)):$port"; pids+=("$!")

# When one VM fails, its peer would only wait for it until its deadlines:
# stop it at once.
rc=0
for _ in 1 2; do
  wait -n && r=0 || r=$?
  if [ "$r" != 0 ] && [ "$rc" = 0 ]; then
    rc=$r
    log "a VM failed (status $r): stopping the other"
    stop_all
  fi
done
trap - EXIT
log "both VMs done in $(( $(date +%s) - start ))s"

if [ "$rc" != 0 ]; then
  for n in 1 2; do
    log "node $n, last lines of $out/node$n.log:"
    tail -n 40 "$out/node$n.log" >&2
  done
  exit "$rc"
fi
[ "$cmd" = /payload/link-test.sh ] || exit 0

grep -h '^@@LINK-TIME\|^@@LINK-MOVED' "$out/node1.log" "$out/node2.log" | sed 's/^@@LINK-[A-Z]* /  /' >&2
# @@LINK <phase> <tool> <from>-><to> <value>, one per client run.
cat "$out/node1.log" "$out/node2.log" | awk '
  $1 == "@@LINK" { v[$2, $3, $4] = $5 }
  END {
    printf "%-26s %14s %16s %11s\n", "", "host-to-host", "netns-to-netns", "netns/host"
    n = split("ib_write_bw 1->2,ib_write_bw 2->1,ib_send_lat 1->2,ib_send_lat 2->1", rows, ",")
    for (i = 1; i <= n; i++) {
      split(rows[i], f, " ")
      unit = f[1] == "ib_write_bw" ? "MB/s" : "us"
      h = v["host", f[1], f[2]]; p = v["pod", f[1], f[2]]
      if (h == "" || p == "") { print "missing result: " rows[i] > "/dev/stderr"; bad = 1; continue }
      printf "%-26s %14s %16s %11.2f\n", rows[i] " (" unit ")", h, p, (h > 0 ? p / h : 0)
    }
    exit bad
  }'
