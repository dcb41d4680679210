#!/usr/bin/env bash
# Two test VMs at once, joined by an Ethernet link on this machine's
# loopback (vm-run.sh --node 1/2 --link, UDP ports PORT and PORT+1), each
# running
# /payload/link-test.sh (scripts/guest/link-test.sh): RDMA traffic between
# the two kernels host to host, then netns to netns through devices
# rdma-netns moved. Prints both phases' bandwidth and latency side by
# side. Used by `make e2e-link`.
#
# Usage: [ROUNDS=N] e2e-link.sh PAYLOAD_DIR PORT OUT_DIR
#   ROUNDS: both phases N times, alternated (make bench: the ratio of the
#           medians); default 1.
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
rounds=${ROUNDS:-1}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "e2e-link.sh: ROUNDS must be a positive number, not $rounds" >&2; exit 2; }
args="--nics 2 --timeout $((600 + 300 * rounds)) --payload $(printf %q "$payload") -- /payload/link-test.sh $rounds"
"$SCRIPTS_DIR/vm-pair.sh" "$out" "$port" "$args" "$args"

grep -h '^@@LINK-TIME\|^@@LINK-MOVED' "$out/node1.log" "$out/node2.log" | sed 's/^@@LINK-[A-Z]* /  /' >&2
# @@LINK <phase> <tool> <from>-><to> <value>, one per client run and round;
# with ROUNDS > 1 each cell is the median of its rounds.
cat "$out/node1.log" "$out/node2.log" | awk -v rounds="$rounds" '
  function median(key,   n, a, i, j, t) {
    n = split(v[key], a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    if (n == 0) return ""
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  $1 == "@@LINK" { v[$2, $3, $4] = v[$2, $3, $4] " " $5; c[$2, $3, $4]++ }
  END {
    if (rounds > 1) printf "medians of %d alternated rounds\n", rounds
    printf "%-26s %14s %16s %11s\n", "", "host-to-host", "netns-to-netns", "netns/host"
    n = split("ib_write_bw 1->2,ib_write_bw 2->1,ib_send_lat 1->2,ib_send_lat 2->1", rows, ",")
    for (i = 1; i <= n; i++) {
      split(rows[i], f, " ")
      unit = f[1] == "ib_write_bw" ? "MB/s" : "us"
      hk = "host" SUBSEP f[1] SUBSEP f[2]; pk = "pod" SUBSEP f[1] SUBSEP f[2]
      if (c[hk] != rounds || c[pk] != rounds) { print "missing results: " rows[i] ": " c[hk] + 0 " and " c[pk] + 0 " of " rounds > "/dev/stderr"; bad = 1; continue }
      h = median(hk); p = median(pk)
      printf "%-26s %14.2f %16.2f %11.2f\n", rows[i] " (" unit ")", h, p, (h > 0 ? p / h : 0)
    }
    exit bad
  }'
