#!/bin/sh
# The story rdma-netns tells, played in the test VM the way an operator would
# see it on a node. First the plugin alone, as the CNI spec runs it
# (cnitool, conf/rdma-net.conflist): the pod gets the NIC *and* its RDMA
# device, and gives both back. Then the way users run it: containerd makes
# two pods over CRI (conf/containerd), their containers open their devices
# and exchange RDMA traffic, and the devices come back when the pods stop
# (rdma-netns-cri demo, e2e/cri). Run by `make demo` (see scripts/vm-run.sh
# for the guest).
set -e -o pipefail
IP=/usr/sbin/ip
RDMA=/usr/sbin/rdma
# cnitool reads its own directory: /etc/cni/net.d is containerd's (part 2).
export CNI_PATH=/opt/cni/bin NETCONFPATH=/etc/cni/cnitool.d CNI_IFNAME=net1
POD=demo-pod
NS=/run/netns/$POD

# Busybox date has no sub-second format; /proc/uptime has centiseconds.
now() { cut -d' ' -f1 /proc/uptime; }
T0=$(now)
step() {
  printf '\n== %s\n' "$*"
  T0=$(now)
}
took() { awk -v a="$T0" -v b="$(now)" 'BEGIN { printf "   (%.2f s)\n", b - a }'; }
indent() { sed 's/^/   /'; }

mkdir -p "$NETCONFPATH"
cp /payload/rdma-net.conflist "$NETCONFPATH/"

printf '\n######## Part 1: the plugin alone (cnitool add/del rdma-net)\n'

step "The node: RDMA subsystem mode and devices (host netns)"
$RDMA system show | indent
$RDMA dev show | cut -d' ' -f1-2 | tr '\n' ' ' | indent
echo
took

step "cnitool add rdma-net: host-device moves eth1 into the pod, rdma-netns its RDMA device"
$IP netns add $POD
cnitool add rdma-net $NS > /tmp/result.json
$IP netns exec $POD $IP -br addr show net1 | indent
$IP netns exec $POD $RDMA link show | indent
echo "   on the host: $($RDMA dev show | cut -d' ' -f2 | tr '\n' ' ')"
took

step "cnitool del rdma-net: the device and the NIC come back"
cnitool del rdma-net $NS
$IP netns del $POD
$RDMA link show | grep -w eth1 | indent
took

printf '\n######## Part 2: pods made by containerd over CRI (conf/containerd)\n'
rdma-netns-cri demo

# Part 3: the pods' containers ask for nothing (not root, no capability,
# device or volume); rdma-netns-nri gives them what verbs needs
# (e2e/cri/cmd/rdma-netns-nri-demo).
printf '\n######## Part 3: unprivileged pods, with the NRI plugin rdma-netns-nri (docs/nri.md)\n'
rdma-netns-nri-demo
