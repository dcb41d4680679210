#!/usr/bin/env bash
# Boot the RDMA test VM (Debian kernel + patched soft-RoCE, busybox initramfs)
# under qemu TCG, run one shell command in it as root, and exit with that
# command's exit status. See scripts/README.md for the guest contract.
#
# Usage:
#   vm-run.sh [--netns-mode exclusive|shared] [--nics N] [--payload DIR]
#             [--timeout SECS] [--memory MB] [--cpus N] [--log FILE]
#             [--k8s-api PORT [--kubelet-port PORT]] [--disk FILE] [--no-rxe]
#             [--node N] [--link ADDR:PORT:PEER_PORT [--rails N]]
#             [--arp-defaults] [--pcie-roots N [--standin-gpus M]]
#             [--watchdog SECS] -- CMD [ARGS...]
#
# --k8s-api PORT adds a user-mode NIC on which the guest reaches exactly one
# address, 10.0.2.100:6443, forwarded to the host's 127.0.0.1:PORT (the e2e
# cluster's API server), and the host's 127.0.0.N:10250 (--kubelet-port;
# N the --node) reaches the guest's kubelet on the same port. Nothing else
# leaves the guest.
#
# --disk FILE attaches FILE (an ext4 image) as the node's disk: what a node
# keeps across a reboot (DISK_DIRS below) lives there, and booting again on
# the same FILE is a reboot of that node. --no-rxe creates no RDMA device:
# a node without RDMA hardware.
#
# --node N (1..200, default 1) tells VMs that run at once apart: it sets
# the NICs' MAC addresses (node 1 keeps QEMU's default ones) and VM_NODE in
# the guest. --link joins the VM's test NICs to an Ethernet link with one
# other VM on this machine: Ethernet frames as UDP datagrams from ADDR:PORT
# to ADDR:PEER_PORT (ADDR on the loopback, 127.0.0.0/8), the other VM
# started with the two ports swapped, in any order. Both VMs' NICs are then
# on one L2 segment, so the two need distinct --node (required with --link).
# The link's sockets have a receive buffer of LINK_RMEM bytes (environment;
# default 4 MiB, 0: the host's default), set on each socket alone
# (scripts/link-sockets.pl): nothing host-wide changes.
#
# --rails N (1..NICS-1, with --link) is the rail-optimized layout: test NIC
# k (ethk in the guest, k = 1..N) gets a segment of its own with NIC k of
# the peer, as one switch per rail gives, over UDP from ADDR:PORT+2k to
# ADDR:PEER_PORT+2k (the peer swaps them as it swaps PORT and PEER_PORT);
# eth0 and the NICs after ethN stay on the base link. VM_RAILS=N in the
# guest. --arp-defaults leaves arp_ignore/arp_announce at the kernel's 0/0
# (the guest's pods inherit them) where --link otherwise sets 1/2: for tests
# that must meet a real node's defaults. See scripts/README.md.
#
# --pcie-roots N (2..4) gives the guest N PCI root buses besides bus 0,
# each on a NUMA node of its own (node k; memory split evenly, CPUs dealt
# round-robin, a node without one holds memory only), as a multi-socket
# GPU server has: QEMU pxb expander bridges with bus_nr 16, 32, 48, 64.
# The test NICs eth1..ethNICS-1 sit on the roots in contiguous blocks in
# root order (at least one each); eth0 and --k8s-api's NIC stay on bus 0.
# --standin-gpus M (1..4) puts M stand-in GPUs (pci-testdev functions,
# which no guest driver binds) on each root, listed in the guest's
# /run/standin-gpus. VM_PCIE_ROOTS and VM_STANDIN_GPUS in the guest.
#
# --cpus N (1..4, default 2) is the guest's virtual CPUs. Two VMs at once
# on a machine of two cores take one each (vm-pair's callers): with two
# each, four emulated CPUs share two cores, and a guest CPU spinning for
# another that the host has descheduled (a lock, a TLB-flush IPI) burns
# the core the other needs.
#
# --watchdog SECS (5..2046, default 120; 0: none) gives the guest a
# watchdog (QEMU's i6300esb, in bus 0's slot 2) that a process of /init
# pets every SECS/4 s (its PID in the guest's /run/watchdog.pid). A guest
# that runs nothing for SECS s (hung: seen under TCG, a node of the
# two-node rig that answered nothing, not even ARP, and printed nothing)
# gets an NMI from QEMU and panics (unknown_nmi_panic): a prompt end, with
# the stuck CPU's backtrace, instead of its peer's and the test's timeouts.
#
# CMD and ARGS are joined with spaces and run by the guest's `sh -c` (like
# ssh does), so both `-- /payload/test.sh -v` and `-- 'a && b'` work.
#
# Exit status: the guest command's status; 124 if the timeout passed; 125 if
# the VM failed (guest setup failed, kernel panic, or no exit marker); 126
# if its CPUs locked up (a soft lockup) or it hung (its watchdog fired), the
# guest panicking either way, and it was not booted again (below).
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

NETNS_MODE=exclusive
NICS=9            # 8 pods at once plus a spare
PAYLOAD=""
TIMEOUT=1200
MEMORY=2048
CPUS=2
LOG_OUT=""
K8S_API=""
KUBELET_PORT=10250
DISK=""
RXE=1
NODE=1
NODE_SET=0
LINK=""
RAILS=0
ARP_DEFAULTS=0
PCIE_ROOTS=0
STANDIN_GPUS=0
WATCHDOG=120
# What a node keeps across a reboot and the guest keeps on --disk: the
# runtime's and kubelet's state, the CNI and NRI plugins and their
# configuration, the CNI state (IPAM, rdma-netns's records) and the logs.
# /run, /tmp and every network namespace start empty on each boot.
DISK_DIRS="/var/lib/kubelet /var/lib/containerd /var/lib/cni /var/log /opt/cni/bin /opt/nri /etc/cni /etc/nri"

usage() { sed -n '2,65p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
log() { printf '[vm-run] %s\n' "$*" >&2; }
die() { printf '[vm-run] ERROR: %s\n' "$*" >&2; exit 125; }

while [ $# -gt 0 ]; do
  case "$1" in
    --netns-mode) NETNS_MODE=${2:?}; shift 2 ;;
    --nics) NICS=${2:?}; shift 2 ;;
    --payload) PAYLOAD=${2:?}; shift 2 ;;
    --timeout) TIMEOUT=${2:?}; shift 2 ;;
    --memory) MEMORY=${2:?}; shift 2 ;;
    --cpus) CPUS=${2:?}; shift 2 ;;
    --log) LOG_OUT=${2:?}; shift 2 ;;
    --k8s-api) K8S_API=${2:?}; shift 2 ;;
    --kubelet-port) KUBELET_PORT=${2:?}; shift 2 ;;
    --disk) DISK=${2:?}; shift 2 ;;
    --no-rxe) RXE=0; shift ;;
    --node) NODE=${2:?}; NODE_SET=1; shift 2 ;;
    --link) LINK=${2:?}; shift 2 ;;
    --rails) RAILS=${2:?}; shift 2 ;;
    --arp-defaults) ARP_DEFAULTS=1; shift ;;
    --pcie-roots) PCIE_ROOTS=${2:?}; shift 2 ;;
    --standin-gpus) STANDIN_GPUS=${2:?}; shift 2 ;;
    --watchdog) WATCHDOG=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "vm-run.sh: unknown option $1" >&2; usage ;;
  esac
done
[ $# -gt 0 ] || { echo "vm-run.sh: missing -- CMD" >&2; usage; }
case "$NETNS_MODE" in exclusive|shared) ;; *) die "--netns-mode must be exclusive or shared" ;; esac
# PCI slots 3..30 are free on the i440fx machine for NICs (see NIC
# addresses below; 31 is the --k8s-api NIC's, 2 the disk's and the watchdog's).
[[ "$NICS" =~ ^[0-9]+$ ]] && [ "$NICS" -ge 1 ] && [ "$NICS" -le 28 ] || die "--nics must be 1..28"
[[ "$WATCHDOG" =~ ^[0-9]+$ ]] && { [ "$WATCHDOG" = 0 ] || { [ "$WATCHDOG" -ge 5 ] && [ "$WATCHDOG" -le 2046 ]; }; } ||
  die "--watchdog must be 0 (none) or 5..2046 seconds"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ "$CPUS" =~ ^[1-4]$ ]] || die "--cpus must be 1..4"
[ -z "$PAYLOAD" ] || [ -d "$PAYLOAD" ] || die "--payload $PAYLOAD is not a directory"
if [ -n "$K8S_API" ]; then
  [[ "$K8S_API" =~ ^[0-9]+$ ]] && [[ "$KUBELET_PORT" =~ ^[0-9]+$ ]] || die "--k8s-api and --kubelet-port take port numbers"
  command -v socat >/dev/null || die "--k8s-api needs socat on the host (apt-get install socat; scripts/k8s/build.sh installs it)"
fi
[ -z "$DISK" ] || [ -f "$DISK" ] || die "--disk $DISK is not a file (make one: truncate -s 4G FILE && mkfs.ext4 -q FILE)"
[[ "$NODE" =~ ^[0-9]+$ ]] && [ "$NODE" -ge 1 ] && [ "$NODE" -le 200 ] || die "--node must be 1..200"
if [ -n "$LINK" ]; then
  # Loopback only: the link must never reach another machine.
  [[ "$LINK" =~ ^(127\.[0-9]+\.[0-9]+\.[0-9]+):([0-9]+):([0-9]+)$ ]] ||
    die "--link takes ADDR:PORT:PEER_PORT with ADDR in 127.0.0.0/8, not $LINK"
  LINK_ADDR=${BASH_REMATCH[1]} LINK_PORT=${BASH_REMATCH[2]} LINK_PEER_PORT=${BASH_REMATCH[3]}
  # Two VMs with the same --node would have the same MACs on one link.
  [ "$NODE_SET" = 1 ] || die "--link needs --node: each VM on a link needs its own (1 and 2)"
  LINK_RMEM=${LINK_RMEM:-4194304}
  [[ "$LINK_RMEM" =~ ^[0-9]+$ ]] || die "LINK_RMEM must be a number of bytes (0: the host's default), not $LINK_RMEM"
fi
# --rails: NIC k (1..N) on a segment of its own; eth0 keeps the base link
# (the nodes' management addresses), so at least one NIC is left to it.
if [ "$RAILS" != 0 ]; then
  [ -n "$LINK" ] || die "--rails needs --link: a rail is a link of its own to the peer VM"
  [[ "$RAILS" =~ ^[0-9]+$ ]] && [ "$RAILS" -ge 1 ] && [ "$RAILS" -lt "$NICS" ] ||
    die "--rails must be 1..$((NICS - 1)) with --nics $NICS (eth0 stays on the base link): raise --nics or lower --rails"
  # Rail k's ports are PORT+2k (local) and PEER_PORT+2k (the peer's): with
  # the peer's PORT and PEER_PORT swapped, its rail k is the same pair the
  # other way. The two VMs' sockets must all differ, which holds when
  # PEER_PORT - PORT is odd (vm-pair.sh: PORT+1) or larger than 2N.
  declare -A seen=()
  for ((k = 0; k <= RAILS; k++)); do
    for p in $((LINK_PORT + 2 * k)) $((LINK_PEER_PORT + 2 * k)); do
      [ "$p" -le 65535 ] || die "--rails $RAILS needs UDP ports up to $p from --link $LINK: take a lower PORT"
      [ -z "${seen[$p]:-}" ] || die "--rails $RAILS with --link $LINK: UDP port $p would serve two sockets (rail k uses PORT+2k here, PEER_PORT+2k on the peer): take PEER_PORT = PORT+1, as vm-pair.sh does"
      seen[$p]=1
    done
  done
  unset seen
fi
# --pcie-roots: each root carries a block of the test NICs (eth1..), so a
# root never lacks a NIC for its GPUs. --rails composes with it: a rail is
# a hub (the NIC's netdev), a root is the NIC's PCI bus, and the blocks keep
# NIC k as ethk, so rail k stays on ethk.
if [ "$PCIE_ROOTS" != 0 ]; then
  [[ "$PCIE_ROOTS" =~ ^[2-4]$ ]] || die "--pcie-roots must be 2..4 (0: bus 0 only), not $PCIE_ROOTS"
  [ "$((NICS - 1))" -ge "$PCIE_ROOTS" ] ||
    die "--pcie-roots $PCIE_ROOTS needs at least one test NIC per root besides eth0 (bus 0): --nics $((PCIE_ROOTS + 1)) or more"
fi
if [ "$STANDIN_GPUS" != 0 ]; then
  [ "$PCIE_ROOTS" != 0 ] || die "--standin-gpus needs --pcie-roots: the stand-in GPUs sit behind the roots"
  [[ "$STANDIN_GPUS" =~ ^[1-4]$ ]] || die "--standin-gpus must be 1..4 per root, not $STANDIN_GPUS"
fi
# The link's local ports must be free: link-sockets.pl's bind would fail
# too, but only after the initramfs is packed, and into the console. All
# UDP sockets (-a), not the unconnected ones of -l: a running VM's link
# socket is connected (ESTAB).
if [ -n "$LINK" ] && command -v ss >/dev/null; then
  for ((k = 0; k <= RAILS; k++)); do
    p=$((LINK_PORT + 2 * k))
    if ss -Hnua "sport = :$p" | awk -v a="$LINK_ADDR:$p" -v p=":$p" '$4 == a || $4 == "0.0.0.0" p || $4 == "*" p || $4 == "[::]" p { f = 1 } END { exit !f }'; then
      what="--link $LINK"; [ "$k" = 0 ] || what+=", rail $k"
      die "UDP port $LINK_ADDR:$p ($what) is in use (see ss -uanp 'sport = :$p'; another VM pair?): stop its user or take another PORT"
    fi
  done
fi
# The user-mode NIC's PCI slot: after the last test NIC's (3 + 28 - 1).
HOSTNET_PCI=0000:00:1f.0

# A failed prepare has said why (one ERROR line): stop here, as a VM failure.
prep=$("$SCRIPTS_DIR/vm-prepare.sh" --print-env) || exit 125
eval "$prep"
prep=$("$SCRIPTS_DIR/vm-prepare-cri.sh" "$VM_CACHE_DIR/initramfs-base" --print-env) || exit 125
eval "$prep"

# A run killed by SIGKILL (a CI timeout, kill -9 of its group) cannot run its
# EXIT trap, and each leaves ~1.5 GiB here: two of them filled a CI machine's
# disk. So every run writes its owner (PID and that process's start time, so a
# reused PID is not taken for it) and sweeps the directories of dead owners.
proc_start() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null; }
for d in "${TMPDIR:-/tmp}"/vm-run.??????; do
  [ -d "$d" ] || continue
  if [ -f "$d/owner" ]; then
    read -r opid ostart < "$d/owner" || true
    [ -n "$opid" ] && [ "$(proc_start "$opid")" = "$ostart" ] && continue
  elif [ -z "$(find "$d" -maxdepth 0 -mmin +720)" ]; then
    continue # no owner file: a run of an older vm-run.sh, swept only when 12 hours old
  fi
  echo "[vm-run] removing $d, left by a run that was killed" >&2
  rm -rf "$d"
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vm-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "$$ $(proc_start $$)" > "$WORK/owner"
STAGE="$WORK/stage"
mkdir -p "$STAGE/etc" "$STAGE/opt/cni/bin" "$STAGE/usr/local/bin" "$STAGE/payload"

# --- payload: cni/ -> /opt/cni/bin, bin/ -> /usr/local/bin, rest -> /payload
if [ -n "$PAYLOAD" ]; then
  for e in "$PAYLOAD"/* "$PAYLOAD"/.[!.]*; do
    [ -e "$e" ] || continue
    case "$(basename "$e")" in
      cni) cp -a "$e"/. "$STAGE/opt/cni/bin/" ;;
      bin) cp -a "$e"/. "$STAGE/usr/local/bin/" ;;
      *) cp -a "$e" "$STAGE/payload/" ;;
    esac
  done
fi

# --- run configuration, read by /init
{
  printf 'VM_NETNS_MODE=%s\n' "$NETNS_MODE"
  printf 'VM_NICS=%s\n' "$NICS"
  printf 'VM_KERNEL_ABI=%s\n' "$VM_ABI"
  [ -z "$K8S_API" ] || printf 'VM_HOSTNET_PCI=%s\n' "$HOSTNET_PCI"
  [ -z "$DISK" ] || printf 'VM_DISK_DIRS="%s"\n' "$DISK_DIRS"
  printf 'VM_RXE=%s\n' "$RXE"
  printf 'VM_NODE=%s\n' "$NODE"
  printf 'VM_TIMEOUT=%s\n' "$TIMEOUT"
  [ -z "$LINK" ] || printf 'VM_LINK=%s\n' "$LINK"
  [ "$RAILS" = 0 ] || printf 'VM_RAILS=%s\n' "$RAILS"
  [ "$ARP_DEFAULTS" = 0 ] || printf 'VM_ARP_DEFAULTS=1\n'
  [ "$PCIE_ROOTS" = 0 ] || printf 'VM_PCIE_ROOTS=%s\n' "$PCIE_ROOTS"
  [ "$STANDIN_GPUS" = 0 ] || printf 'VM_STANDIN_GPUS=%s\n' "$STANDIN_GPUS"
  printf 'VM_WATCHDOG=%s\n' "$WATCHDOG"
} > "$STAGE/etc/vm.conf"
printf '%s\n' "$*" > "$STAGE/etc/vm-cmd"
# A node with a disk boots as a real one: exclusive mode from ib_core's
# module parameter when the module loads (/init checks it), not from a
# command run after the fact.
if [ -n "$DISK" ] && [ "$NETNS_MODE" = exclusive ]; then
  mkdir -p "$STAGE/etc/modprobe.d"
  echo 'options ib_core netns_mode=0' > "$STAGE/etc/modprobe.d/ib_core.conf"
fi

# --- guest /init (kept here rather than in the cached base so that editing it
# needs no cache rebuild). Busybox sh prefers its own applets over PATH, so the
# iproute2 and kmod tools are called by full path.
cat > "$STAGE/init" <<'INIT'
#!/bin/sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin:/usr/local/bin:/opt/cni/bin
export HOME=/root TERM=dumb
IP=/usr/sbin/ip
RDMA=/usr/sbin/rdma
MODPROBE=/sbin/modprobe

# off ends the VM: the disk synced, then a reset, which ends QEMU
# (-no-reboot), as a power cut would. Not the kernel's orderly power-off:
# that breaks every virtio device under whatever still sends, and this
# kernel's virtio-net then loops for ever in start_xmit when the broken TX
# queue had completions it had not reaped (a soft lockup in the sender;
# seen when node 2 "rebooted" under an RDMA job: the VM never went off).
# poweroff -f stays as the fallback for an /init that fails before /proc.
off() {
  sync
  echo b > /proc/sysrq-trigger 2> /dev/null
  /bin/busybox poweroff -f
  sleep 60
}

# PID 1 must never exit (that panics the kernel and hides the reason): report
# and end the VM instead.
fail() {
  echo "@@VM-SETUP-FAILED: $*"
  echo "@@VM-EXIT=125"
  off
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /run/netns /var/lib/cni
hostname rdma-vm
. /etc/vm.conf

# The node's disk (--disk): each of VM_DISK_DIRS is bind-mounted from it.
# A fresh disk is first seeded with what the image has there, as a node's
# installer leaves it; later boots find what the last one left.
if [ -n "${VM_DISK_DIRS:-}" ]; then
  for m in virtio_pci virtio_blk ext4; do $MODPROBE "$m" || fail "modprobe $m"; done
  i=0
  while [ ! -b /dev/vda ]; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "no /dev/vda (--disk)"
    sleep 0.1
  done
  mkdir -p /mnt/disk
  mount -t ext4 /dev/vda /mnt/disk || fail "mount the disk /dev/vda"
  for d in $VM_DISK_DIRS; do
    mkdir -p "$d"
    if [ ! -d "/mnt/disk$d" ]; then
      mkdir -p "/mnt/disk$d"
      cp -a "$d/." "/mnt/disk$d/" || fail "seed $d on the disk"
    fi
    mount -o bind "/mnt/disk$d" "$d" || fail "bind-mount $d from the disk"
  done
fi

# crc32_generic is listed before rdma_rxe: rxe asks the crypto API for crc32
# at link-add time and fails if no implementation is registered.
for m in $(cat /etc/vm-modules); do
  $MODPROBE "$m" || fail "modprobe $m"
done
[ -d /sys/kernel/config ] && mount -t configfs configfs /sys/kernel/config

# --watchdog: petted every VM_WATCHDOG/4 s by a process of its own, which
# only a guest that runs nothing at all fails to schedule. The fd stays
# open: closed without the magic character the timer runs on, so that
# killing the process (the rig's check, make e2e) makes the watchdog fire.
if [ "${VM_WATCHDOG:-0}" != 0 ]; then
  $MODPROBE i6300esb heartbeat="$VM_WATCHDOG" || fail "modprobe i6300esb (--watchdog)"
  [ -c /dev/watchdog ] || fail "no /dev/watchdog after loading i6300esb (--watchdog)"
  ( exec 3> /dev/watchdog || exit 1
    while :; do printf 1 >&3; sleep $((VM_WATCHDOG / 4)); done ) &
  echo $! > /run/watchdog.pid
fi

# The netns mode can only change while no network namespace but init_net
# exists, so this comes before anything that could create one.
if [ -s /etc/modprobe.d/ib_core.conf ]; then
  $RDMA system show | grep -q "netns $VM_NETNS_MODE" || fail "ib_core's netns_mode did not make the mode $VM_NETNS_MODE: $($RDMA system show)"
else
  $RDMA system set netns "$VM_NETNS_MODE" || fail "rdma system set netns $VM_NETNS_MODE"
fi

$IP link set lo up

# --link: the NICs share one L2 segment with the peer VM's (and with each
# other, through the hub; with --rails, eth0 and the NICs after the rails
# only, each rail being a segment of its own). By default Linux answers
# ARP for any of its addresses on every NIC, so the peer could learn
# another NIC's MAC for an address and its RoCE packets would reach the
# wrong rxe device. Answer
# only on the NIC holding the address, and announce from it, as multi-NIC
# RoCE hosts on one subnet are configured. --arp-defaults (VM_ARP_DEFAULTS)
# keeps the kernel's 0/0: a new netns copies IPv4's all/default settings
# from this one, so the pods would otherwise never meet the defaults a real
# node's pods get.
if [ -n "${VM_LINK:-}" ] && [ "${VM_ARP_DEFAULTS:-0}" != 1 ]; then
  echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore || fail "arp_ignore"
  echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce || fail "arp_announce"
fi

# Virtio NICs in PCI order. Rename them eth0..ethN-1 in that order so that
# ethN always pairs with rxeN, whatever order the driver probed them in.
# The user-mode NIC to the host (vm-run.sh --k8s-api) is no test NIC, but
# the kernel names NICs in its probe order, not PCI order (with more PCI
# roots it probes bus 0, slot 0x1f too, before the others' NICs: eth1):
# it becomes hostnet0 first, or renaming a test NIC to its name fails.
i=0
while :; do
  pcis=""
  hostnet=""
  for d in /sys/class/net/*; do
    [ "$(basename "$(readlink "$d/device/subsystem" 2>/dev/null)")" = virtio ] || continue
    if [ "$(basename "$(readlink -f "$d/device/..")")" = "${VM_HOSTNET_PCI:-none}" ]; then
      hostnet=$(basename "$d"); continue
    fi
    pcis="$pcis $(basename "$(readlink -f "$d/device/..")") $(basename "$d")"
  done
  n=$(echo $pcis | wc -w); n=$((n / 2))
  [ "$n" -ge "$VM_NICS" ] && { [ -z "${VM_HOSTNET_PCI:-}" ] || [ -n "$hostnet" ]; } && break
  i=$((i + 1)); [ $i -lt 100 ] || fail "expected $VM_NICS virtio NICs${VM_HOSTNET_PCI:+ and one at $VM_HOSTNET_PCI}, found $n${hostnet:+ and $hostnet}"
  sleep 0.1
done
if [ -n "$hostnet" ] && [ "$hostnet" != hostnet0 ]; then
  $IP link set "$hostnet" name hostnet0 || fail "rename $hostnet (at $VM_HOSTNET_PCI) to hostnet0"
fi
set -- $(echo $pcis | xargs -n2 | sort | awk '{ print $2 }')
k=0; for nd in "$@"; do $IP link set "$nd" name "vmtmp$k" || fail "rename $nd"; k=$((k + 1)); done
k=0; for nd in "$@"; do $IP link set "vmtmp$k" name "eth$k" || fail "rename vmtmp$k"; k=$((k + 1)); done

# One rxe device per NIC, with the sysfs layouts real hardware has (see
# scripts/README.md). The rxe "parent" parameter is read at link-add time.
PARAM=/sys/module/rdma_rxe/parameters/parent
: > /run/rdma-layout
k=0
while [ $k -lt "$VM_NICS" ]; do
  nd=eth$k
  $IP link set "$nd" up || fail "link up $nd"
  # --no-rxe: a node without RDMA hardware.
  if [ "$VM_RXE" = 0 ]; then k=$((k + 1)); continue; fi
  pci=$(basename "$(readlink -f /sys/class/net/$nd/device/..)")
  pbus=$(basename "$(readlink /sys/class/net/$nd/device/subsystem)")
  pname=$(basename "$(readlink /sys/class/net/$nd/device)")
  if [ $k -eq $((VM_NICS - 1)) ]; then
    # Named as udev's rdma rename (NAME_FALLBACK/path) would: roce + path.
    dom=$(echo "$pci" | cut -d: -f1); bus=$(echo "$pci" | cut -d: -f2)
    slot=$(echo "$pci" | cut -d: -f3 | cut -d. -f1); fn=$(echo "$pci" | cut -d. -f2)
    name=roce
    [ "$dom" != 0000 ] && name="${name}P$((0x$dom))"
    name="${name}p$((0x$bus))s$((0x$slot))"
    [ "$fn" != 0 ] && name="${name}f$fn"
    layout=pf; level=2
  elif [ $((k % 2)) -eq 0 ]; then
    name=rxe$k; layout=pf; level=2
  else
    name=rxe$k; layout=child; level=1
  fi
  echo $level > $PARAM || fail "set rxe parent parameter"
  $RDMA link add "$name" type rxe netdev "$nd" || fail "rdma link add $name netdev $nd"
  got=$(basename "$(readlink /sys/class/infiniband/$name/device 2>/dev/null)")
  if [ $layout = pf ]; then want=$pci; else want=$pname; fi
  [ "$got" = "$want" ] || fail "$name: sysfs parent is '$got', want '$want'"
  echo "$nd $name $layout $pci $pbus $pname" >> /run/rdma-layout
  k=$((k + 1))
done
# Back to stock behaviour for devices the tests create themselves.
echo 0 > $PARAM

# --standin-gpus: the pci-testdev functions (1b36:0005) stand for GPUs, one
# line each: PCI address, PCI root (sysfs), NUMA node.
if [ -n "${VM_STANDIN_GPUS:-}" ]; then
  : > /run/standin-gpus
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor"):$(cat "$d/device")" = 0x1b36:0x0005 ] || continue
    root=$(readlink -f "$d" | cut -d/ -f4)
    echo "$(basename "$d") $root $(cat "$d/numa_node")" >> /run/standin-gpus
  done
  n=$(wc -l < /run/standin-gpus)
  [ "$n" -eq $((VM_PCIE_ROOTS * VM_STANDIN_GPUS)) ] ||
    fail "expected $((VM_PCIE_ROOTS * VM_STANDIN_GPUS)) stand-in GPUs, found $n: $(cat /run/standin-gpus)"
fi

# The user-mode NIC (--k8s-api): hostnet0 (renamed above) with QEMU's
# default guest address; 10.0.2.100 (the API server) is on its link. No
# default route: with restrict=on nothing else answers anyway.
if [ -n "${VM_HOSTNET_PCI:-}" ]; then
  $IP addr add 10.0.2.15/24 dev hostnet0 || fail "address hostnet0"
  $IP link set hostnet0 up || fail "link up hostnet0"
fi

# One line before the command: a run that then prints nothing until the
# timeout hung in the command, not in the kernel or this script.
echo "[vm-init] up $(cut -d' ' -f1 /proc/uptime)s after the kernel started; running the command"
cd /payload
sh -c "$(cat /etc/vm-cmd)" </dev/null
rc=$?
cd /
# Leading newline: the command's last line may lack one.
printf '\n@@VM-EXIT=%s\n' "$rc"
off
INIT
chmod 0755 "$STAGE/init"

# Cpio archives appended to the cached base one (runc's, then this run's):
# the kernel unpacks concatenated archives in order, later files overriding
# earlier ones.
(cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$WORK/run.cpio"
cat "$VM_BASE_CPIO" "$VM_CRI_CPIO" "$WORK/run.cpio" > "$WORK/initrd"

# MAC addresses: QEMU's default ones (52:54:00:12:34:56, then one up per
# NIC) for node 1, the fifth byte one up per further --node, so that VMs on
# one --link never share one.
mac() { printf '52:54:00:12:%02x:%02x' $((0x33 + NODE)) $((0x56 + $1)); }

# NIC i's place: slot 3+i on bus 0, or with --pcie-roots (i >= 1) slot
# 1, 2, ... of its root's bus, the roots taking eth1.. in contiguous blocks
# (the first NICS-1 mod N roots one more), so that /init's naming in PCI
# order gives eth1.. in root order.
nic_addr() {
  local i=$1 per extra r j n
  if [ "$PCIE_ROOTS" = 0 ] || [ "$i" = 0 ]; then
    printf '%saddr=0x%x' "$BUS0" $((3 + i)); return
  fi
  per=$(((NICS - 1) / PCIE_ROOTS)) extra=$(((NICS - 1) % PCIE_ROOTS)) j=$((i - 1))
  for ((r = 0; r < PCIE_ROOTS; r++)); do
    n=$((per + (r < extra ? 1 : 0)))
    [ "$j" -lt "$n" ] && break
    j=$((j - n))
  done
  printf 'bus=pxb%d,addr=0x%x' "$r" $((1 + j))
}

# --pcie-roots: root k is pxb k at slot 4+k of bus 0 (eth0 keeps slot 3),
# bus_nr 16(k+1), on NUMA node k. QEMU rejects a pxb whose numa_node has no
# -numa node. A pxb (not pxb-pcie: this is i440fx) puts a PCI bridge on its
# root bus, and bus=pxbk means that bridge's secondary bus: the guest sees
# pci0000:10/0000:10:00.0/0000:11:SS.0. The stand-in GPUs take the slots
# from 0x1c, clear of the NICs' (at most 27 per root). Memory is split
# evenly (the last node takes the remainder); CPUs go round-robin, and a
# node left without one holds memory only, which QEMU 7.2 accepts.
pcie_roots() {
  local k c g size cpus
  size=$((MEMORY / PCIE_ROOTS))
  for ((k = 0; k < PCIE_ROOTS; k++)); do
    [ "$k" != $((PCIE_ROOTS - 1)) ] || size=$((MEMORY - size * k))
    cpus=""
    for ((c = k; c < CPUS; c += PCIE_ROOTS)); do cpus+=",cpus=$c"; done
    NUMA_ARGS+=(-object "memory-backend-ram,size=${size}M,id=mem$k"
                -numa "node,nodeid=$k$cpus,memdev=mem$k")
    NIC_ARGS+=(-device "pxb,id=pxb$k,bus=pci.0,addr=$(printf '0x%x' $((4 + k))),bus_nr=$((16 * (k + 1))),numa_node=$k")
    for ((g = 0; g < STANDIN_GPUS; g++)); do
      NIC_ARGS+=(-device "pci-testdev,id=gpu$k.$g,bus=pxb$k,addr=$(printf '0x%x' $((0x1c + g)))")
    done
  done
}

# NICs at fixed PCI slots starting at 3 (slots 0-1 are the i440fx host/ISA
# bridges; 2 holds the disk and the watchdog), so names derived from PCI
# addresses are stable: with 9 NICs the last one is 0000:00:0b.0 ->
# rocep0s11. All NICs sit on one qemu hub; without --link it has no
# backend and no traffic leaves the VM. With --rails N, NIC k (1..N) sits
# on hub k instead, alone with its rail's link below. romfile= skips the
# iPXE option ROM we never boot from.
NIC_ARGS=()
NUMA_ARGS=()
# With pxbs, a device given no bus lands on a pxb's root bus, which takes
# bridges only (QEMU: "Only PCI/PCIe bridges can be plugged into pxb"):
# bus 0's devices then name it.
BUS0=""
[ "$PCIE_ROOTS" = 0 ] || BUS0="bus=pci.0,"
[ "$PCIE_ROOTS" = 0 ] || pcie_roots
for ((i = 0; i < NICS; i++)); do
  hub=0
  [ "$i" -lt 1 ] || [ "$i" -gt "$RAILS" ] || hub=$i
  NIC_ARGS+=(-netdev "hubport,hubid=$hub,id=n$i"
             -device "virtio-net-pci,netdev=n$i,mac=$(mac "$i"),$(nic_addr "$i"),romfile=")
done

# --link: the hub's one port to the outside, a UDP socket to the peer VM's
# on the loopback. Not QEMU's stream netdev (TCP): through it ib_send_lat
# took 23-25 ms a round trip against 0.4-1.8 ms over UDP (scripts/README.md),
# and its client connects once, at start, so the VMs had to start in order.
# Frames sent before the peer is up are lost, as on a cable.
# --rails: hub k's port to the outside is a socket of its own (ports
# PORT+2k and PEER_PORT+2k, checked above), so each rail is a segment of
# its own between the two VMs, as a rail-optimized fabric's switch per rail.
#
# link-sockets.pl opens each socket (bound to its port, connected to the
# peer's) on fd 10+k and execs QEMU, which takes it as local.type=fd: a
# socket QEMU opened itself would take the host's default receive buffer,
# 208 KiB (about 90 of the VMs' frames, by the kernel's accounting). An
# emulated guest that falls behind for a moment overflows that, the link
# drops frames, and RoCE's go-back-N resends a window per drop: with four
# rails' streams at once the host counted 2,758 such drops
# (UdpRcvbufErrors) and one rail's writer sent 23 % more packets than its
# stream (2026-11-28). A RoCE fabric is run lossless (PFC); a deeper buffer
# brings the link closer to one. Before the peer's socket exists a frame
# is refused (ICMP port unreachable): QEMU drops it and reads the error
# away, and the link carries frames once the peer is up.
LINK_WRAP=()  # link-sockets.pl and its sockets, before qemu's command
LAYOUT=""   # for the boot line
if [ -n "$LINK" ]; then
  LAYOUT=", link $LINK"
  if [ "$RAILS" != 0 ]; then
    base=eth0
    [ "$NICS" -le $((RAILS + 1)) ] || base+=",eth$((RAILS + 1))"
    [ "$NICS" -le $((RAILS + 2)) ] || base+="-eth$((NICS - 1))"
    LAYOUT+=" ($base)"
  fi
  for ((k = 0; k <= RAILS; k++)); do
    id="link"; [ "$k" = 0 ] || id="rail$k"
    lp=$((LINK_PORT + 2 * k)) rp=$((LINK_PEER_PORT + 2 * k))
    LINK_WRAP+=("$((10 + k)):$LINK_ADDR:$lp:$rp")
    NIC_ARGS+=(-netdev "dgram,id=$id,local.type=fd,local.str=$((10 + k))"
               -netdev "hubport,hubid=$k,id=${id}port,netdev=$id")
    [ "$k" = 0 ] || LAYOUT+=", rail $k (eth$k) $lp:$rp"
  done
  LINK_WRAP=("$SCRIPTS_DIR/link-sockets.pl" --rmem "$LINK_RMEM" "${LINK_WRAP[@]}" --)
fi
[ "$ARP_DEFAULTS" = 0 ] || LAYOUT+=", ARP at the kernel's defaults"
if [ "$PCIE_ROOTS" != 0 ]; then
  LAYOUT+=", $PCIE_ROOTS PCI roots on NUMA nodes 0-$((PCIE_ROOTS - 1))"
  [ "$STANDIN_GPUS" = 0 ] || LAYOUT+=" ($STANDIN_GPUS stand-in GPUs each)"
fi

# --k8s-api: QEMU user-mode networking restricted to explicit forwards;
# each node's kubelet port from an address of its own (the cluster names
# node N by it), so that two nodes' forwards never collide.
# guestfwd's cmd: form starts one socat per guest connection (a tcp: target
# would be one connection that dies after the first request).
if [ -n "$K8S_API" ]; then
  printf '#!/bin/sh\nexec socat - TCP:127.0.0.1:%s\n' "$K8S_API" > "$WORK/apiserver-fwd"
  chmod 0755 "$WORK/apiserver-fwd"
  NIC_ARGS+=(-netdev "user,id=hostnet,restrict=on,guestfwd=tcp:10.0.2.100:6443-cmd:$WORK/apiserver-fwd,hostfwd=tcp:127.0.0.$NODE:$KUBELET_PORT-:$KUBELET_PORT"
             -device "virtio-net-pci,netdev=hostnet,mac=$(mac "$NICS"),${BUS0}addr=0x1f,romfile=")
fi

# --watchdog: the i6300esb in slot 2 (function 1 beside --disk's disk);
# when it fires QEMU injects an NMI, which the guest's kernel, knowing no
# source for it, panics on.
WATCHDOG_ARGS=()
if [ "$WATCHDOG" != 0 ]; then
  WATCHDOG_ARGS=(-device "i6300esb,${BUS0}addr=0x2$([ -z "$DISK" ] || echo .1)" -action watchdog=inject-nmi)
fi

# --disk: a virtio disk in the free PCI slot 2 (the guest's /dev/vda).
if [ -n "$DISK" ]; then
  NIC_ARGS+=(-drive "file=$DISK,format=raw,if=none,id=disk0"
             -device "virtio-blk-pci,drive=disk0,${BUS0}addr=0x2,multifunction=on")
fi

LOG="$WORK/console.log"
log "booting $VM_ABI ($VM_KVER) under TCG: node $NODE, $CPUS CPUs, $NICS NICs$([ "$RXE" = 1 ] || echo ' (no rxe)'), netns $NETNS_MODE${DISK:+, disk $DISK}$LAYOUT, timeout ${TIMEOUT}s"
start=$(date +%s)
# TCG, not KVM: KVM guests hang on this kind of host. panic=-1 plus -no-reboot
# turns a guest panic into a prompt qemu exit instead of a hang until timeout;
# oops=panic does the same for oopses, softlockup_panic=1 for a guest whose
# CPUs lock up (seen under TCG: both vCPUs stuck in ksoftirqd and a task for
# good, some seconds after boot, once in many boots, never in this project's
# code), unknown_nmi_panic=1 for one whose watchdog fired (--watchdog).
# \r is stripped from the serial console.
boot() {
  timeout -k 10 "$TIMEOUT" ${LINK_WRAP[@]+"${LINK_WRAP[@]}"} qemu-system-x86_64 \
    -accel tcg -machine pc -smp "$CPUS" -m "$MEMORY" ${NUMA_ARGS[@]+"${NUMA_ARGS[@]}"} \
    -nodefaults -no-user-config -display none -monitor none -serial stdio -no-reboot \
    -kernel "$VM_KERNEL" -initrd "$WORK/initrd" \
    -append "console=ttyS0 loglevel=3 panic=-1 oops=panic softlockup_panic=1 unknown_nmi_panic=1 mitigations=off" \
    "${NIC_ARGS[@]}" ${WATCHDOG_ARGS[@]+"${WATCHDOG_ARGS[@]}"} </dev/null 2>&1 | sed -u -e 's/\r$//' -e '/hub 0 is not connected to host network/d' | tee "$LOG"
  return "${PIPESTATUS[0]}"
}
set +e
boot
qemu_rc=$?
# A VM that locked up or hung is booted again, once, when nothing of its
# run is kept (no --disk) and nothing outside it saw it (no --k8s-api: a
# control plane would keep what the first run made there): the command
# starts over on a fresh guest, and the log says so. Otherwise the run
# ends with status 126, which make e2e-k8s's stages without a disk and its
# two-node stage retry with a control plane of their own.
locked_up() { grep -aq 'Kernel panic' "$LOG" && grep -aq 'soft lockup\|softlockup' "$LOG"; }
hung() { grep -aq 'Kernel panic - not syncing: NMI' "$LOG"; }
stuck() {
  if locked_up; then echo "its CPUs locked up (soft lockup)"
  elif hung; then echo "it hung (ran nothing for ${WATCHDOG}s: its watchdog fired)"
  else return 1; fi
}
if [ -z "$DISK" ] && [ -z "$K8S_API" ] && why=$(stuck); then
  log "the guest stopped: $why, after $(( $(date +%s) - start ))s; its console above: booting it again, once"
  start=$(date +%s)
  boot
  qemu_rc=$?
fi
set -e
[ -z "$LOG_OUT" ] || cp "$LOG" "$LOG_OUT"
elapsed=$(( $(date +%s) - start ))

marker=$(grep -a -o '^@@VM-EXIT=[0-9]*' "$LOG" | tail -n1 || true)
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
  log "timeout: no exit after ${TIMEOUT}s"
  exit 124
fi
if why=$(stuck); then
  log "the guest stopped: $why, after ${elapsed}s; its kernel panicked"
  exit 126
fi
if grep -aq 'Kernel panic' "$LOG"; then
  log "guest kernel panicked (after ${elapsed}s)"
  exit 125
fi
if [ -z "$marker" ]; then
  log "no exit marker from the guest (qemu exit status $qemu_rc, after ${elapsed}s)"
  exit 125
fi
rc=${marker#@@VM-EXIT=}
log "guest command exited $rc (VM ran ${elapsed}s)"
exit "$rc"
