#!/usr/bin/env bash
# Two test VMs at once, node 1 and node 2, joined by an Ethernet link on
# this machine's loopback (vm-run.sh --node N --link, UDP ports PORT and
# PORT+1). Used by scripts/e2e-link.sh (two kernels, RDMA between them) and
# make e2e-k8s's two-node cluster.
#
# Usage: vm-pair.sh [--again STATUS] [--follow] [--rails N] [--arp-defaults]
#                   OUT_DIR PORT 'ARGS1' 'ARGS2' ['ARGS2_AGAIN']
#   ARGSn: vm-run.sh's options and `-- CMD` for node n, one shell word list
#          (evaluated: quote CMD inside it), without --node, --link, --rails
#          and --arp-defaults (this script gives them to both nodes).
#   --rails N: vm-run.sh --rails N on both nodes, every boot: NIC k (ethk,
#          k = 1..N) of node 1 and NIC k of node 2 on a link of their own,
#          UDP ports PORT+2k and PORT+2k+1; the pair then takes the ports
#          PORT..PORT+2N+1. ARGSn's --nics must exceed N.
#   --arp-defaults: vm-run.sh --arp-defaults on both nodes, every boot: the
#          nodes' (and so their pods') arp_ignore/arp_announce stay at the
#          kernel's 0/0, as on a real node.
#   --again STATUS, ARGS2_AGAIN: when node 2's VM exits with STATUS (its
#          guest command asked for a reboot), it boots again with
#          ARGS2_AGAIN (its --disk: the same node), as often as it asks.
#   --follow: node 1's console also on standard output as it runs (make
#          demo: the story is node 1's).
#   OUT_DIR: receives node1.log and node2.log, each VM's console.
#
# The link's UDP sockets get a 4 MiB receive buffer each, set on the
# socket (vm-run.sh, LINK_RMEM: the environment passes it on); nothing of
# the host changes, however this script ends.
#
# When node 1 ends, node 2 has 120 s to end on its own (its command sees
# the cluster or the peer go) before it is stopped. When either fails, the
# other is stopped at once: it would only wait for its peer until its
# deadlines. Exit status: 0 when both passed, else the first failure's
# (vm-run.sh's: 124 timeout, 125 VM failure).
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
again="" follow="" rails=0
# Options both nodes' vm-run.sh get, on every boot (node 2's reboots too).
both=()
while :; do
  case "${1:-}" in
    --again) again=${2:?--again STATUS}; shift 2 ;;
    --follow) follow=1; shift ;;
    --rails) rails=${2:?--rails N}; both+=(--rails "$rails"); shift 2 ;;
    --arp-defaults) both+=(--arp-defaults); shift ;;
    -*) echo "vm-pair.sh: unknown option $1 (vm-run.sh's go into ARGS1/ARGS2)" >&2; sed -n '7,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    *) break ;;
  esac
done
out=${1:?usage: vm-pair.sh [--again STATUS] [--follow] [--rails N] [--arp-defaults] OUT_DIR PORT ARGS1 ARGS2 [ARGS2_AGAIN]}
port=${2:?PORT}
[[ "$port" =~ ^[0-9]+$ ]] || { echo "vm-pair.sh: PORT must be a UDP port number, not $port" >&2; exit 2; }
[[ "$rails" =~ ^[0-9]+$ ]] || { echo "vm-pair.sh: --rails takes a number of rails, not $rails" >&2; exit 2; }
args1=${3:?ARGS1}
args2=${4:?ARGS2}
args2_again=${5:-$args2}
mkdir -p "$out"
log() { printf '[vm-pair] %s\n' "$*" >&2; }

# Both nodes boot the same kernel and initramfs: prepare them once, here,
# so that a failure is said once and no node boots, rather than each node
# preparing (and failing) in turn under the cache's lock.
prep=$("$SCRIPTS_DIR/vm-prepare.sh" --print-env) && eval "$prep" &&
  "$SCRIPTS_DIR/vm-prepare-cri.sh" "$VM_CACHE_DIR/initramfs-base" > /dev/null ||
  { log "preparing the test VM failed (the ERROR line above): no node booted"; exit 125; }

# vm N LINK ARGS: boots node N in a session of its own, so that a failure
# can stop the whole VM by its session ID (vm-run.sh's `timeout` puts QEMU
# in a process group of its own, out of reach of a signal to its group).
vm() {
  local node=$1 link=$2 args=$3
  eval "set -- $args"
  setsid "$SCRIPTS_DIR/vm-run.sh" --node "$node" --link "127.0.0.1:$link" ${both[@]+"${both[@]}"} "$@" >> "$out/node$node.log" 2>&1 &
}

declare -A pid=()
# stop N... returns once those VMs' processes are gone (SIGKILL after
# 10 s), so that no QEMU outlives the run and holds its ports.
stop() {
  local n p i
  for n in "$@"; do p=${pid[$n]:-}; [ -z "$p" ] || pkill -TERM -s "$p" || true; done
  for n in "$@"; do
    p=${pid[$n]:-}; [ -n "$p" ] || continue
    for ((i = 0; i < 50; i++)); do
      pgrep -s "$p" > /dev/null || continue 2
      sleep 0.2
    done
    pkill -KILL -s "$p" || true
  done
}
trap 'stop 1 2' EXIT

link1="$port:$((port + 1))" link2="$((port + 1)):$port"
start=$(date +%s)
: > "$out/node1.log"; : > "$out/node2.log"
log "booting node 1 and node 2 on a link over 127.0.0.1:$port-$((port + 1 + 2 * rails)) (UDP$([ "$rails" = 0 ] || echo ", $rails rails of their own")$([[ " ${both[*]-} " != *" --arp-defaults "* ]] || echo ", ARP at the kernel's defaults")); consoles in $out/node{1,2}.log"
vm 1 "$link1" "$args1"; pid[1]=$!
vm 2 "$link2" "$args2"; pid[2]=$!
# tail ends after node 1's VM (--pid), having printed what is left.
tail_pid=""
if [ -n "$follow" ]; then tail -n +1 -f --pid="${pid[1]}" "$out/node1.log" & tail_pid=$!; fi

rc=0 rc1="" boots2=1
while [ -z "$rc1" ] || [ -n "${pid[2]:-}" ]; do
  done_pid=""
  wait -n -p done_pid "${pid[1]:-}" ${pid[2]:+"${pid[2]}"} && r=0 || r=$?
  if [ "$done_pid" = "${pid[1]:-x}" ]; then
    rc1=$r; unset 'pid[1]'
    [ "$r" = 0 ] || { [ "$rc" != 0 ] || rc=$r; log "node 1 failed (status $r): stopping node 2"; stop 2; unset 'pid[2]'; break; }
    # Node 1 passed: node 2 ends on its own, or is stopped.
    if [ -n "${pid[2]:-}" ]; then
      for ((i = 0; i < 120; i++)); do kill -0 "${pid[2]}" 2>/dev/null || break; sleep 1; done
      if kill -0 "${pid[2]}" 2>/dev/null; then log "node 2 still running 120 s after node 1 ended: stopping it"; stop 2; fi
      wait "${pid[2]}" && r=0 || r=$?
      unset 'pid[2]'
      [ "$r" = 0 ] || [ "$rc" != 0 ] || { rc=$r; log "node 2 ended with status $r"; }
    fi
    break
  fi
  unset 'pid[2]'
  if [ -n "$again" ] && [ "$r" = "$again" ]; then
    boots2=$((boots2 + 1))
    log "node 2 asked for a reboot (status $r): boot $boots2 of node 2"
    vm 2 "$link2" "$args2_again"; pid[2]=$!
    continue
  fi
  if [ "$r" != 0 ]; then
    [ "$rc" != 0 ] || rc=$r
    log "node 2 failed (status $r): stopping node 1"
    stop 1; unset 'pid[1]'
    break
  fi
done
trap - EXIT
[ -z "$tail_pid" ] || wait "$tail_pid" || true
log "both VMs done in $(( $(date +%s) - start ))s"
if [ "$rc" != 0 ]; then
  for n in $([ -n "$follow" ] && echo 2 || echo 1 2); do
    log "node $n, last lines of $out/node$n.log:"
    tail -n 40 "$out/node$n.log" >&2
  done
fi
exit "$rc"
