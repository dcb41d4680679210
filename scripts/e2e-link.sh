#!/usr/bin/env bash
# Two test VMs at once, joined by an Ethernet link on this machine's
# loopback (vm-run.sh --node 1/2 --link, UDP ports PORT and PORT+1), each
# running
# /payload/link-test.sh (scripts/guest/link-test.sh): RDMA traffic between
# the two kernels host to host, then netns to netns through devices
# rdma-netns moved. Prints both phases' bandwidth and latency side by
# side. Used by `make e2e-link`.
#
# Usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR
#   PORT: node 1's end of the link on 127.0.0.1 (UDP); node 2's is PORT+1.
#         Two runs at once need two pairs.
#   OUT_DIR: receives node1.log and node2.log, each VM's console.
#
# Exit status: 0 when both guests passed; otherwise the first failing
# VM's status (vm-run.sh's: 124 timeout, 125 VM failure).
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
payload=${1:?usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR}
port=${2:?usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR}
out=${3:?usage: e2e-link.sh PAYLOAD_DIR PORT OUT_DIR}

# Two NICs per VM: the link test uses eth0, and a second NIC on the same
# L2 segment keeps the ARP set-up of a multi-NIC host honest.
args="--nics 2 --timeout 900 --payload $(printf %q "$payload") -- /payload/link-test.sh"
"$SCRIPTS_DIR/vm-pair.sh" "$out" "$port" "$args" "$args"

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
