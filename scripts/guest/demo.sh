#!/bin/sh
# The story rdma-netns tells, played in the test VM the way an operator would
# see it on a node: the pod gets the NIC *and* its RDMA device, and gives
# both back. Run by `make demo` (see scripts/vm-run.sh for the guest).
set -e
IP=/usr/sbin/ip
RDMA=/usr/sbin/rdma
export CNI_PATH=/opt/cni/bin NETCONFPATH=/etc/cni/net.d CNI_IFNAME=net1
POD=demo-pod
NS=/run/netns/$POD

# Busybox date has no sub-second format; /proc/uptime has centiseconds.
now() { cut -d' ' -f1 /proc/uptime; }
T0=$(now)
step() {
  T=$(now)
  printf '\n== %s\n' "$*"
  T0=$T
}
took() { awk -v a="$T0" -v b="$(now)" 'BEGIN { printf "   (%.2f s)\n", b - a }'; }
indent() { sed 's/^/   /'; }

mkdir -p "$NETCONFPATH"
cp /payload/rdma-net.conflist "$NETCONFPATH/"

step "The node: RDMA subsystem mode and devices (host netns)"
$RDMA system show | indent
$RDMA dev show | indent
$RDMA link show | grep -w eth1 | indent
took

step "A pod sandbox is created (netns $POD); it sees no RDMA device"
$IP netns add $POD
echo "   rdma dev in the pod: $($IP netns exec $POD $RDMA dev show | wc -l) devices"
took

step "The runtime runs the chain host-device + rdma-netns (cnitool add rdma-net)"
sed 's/^/   /' "$NETCONFPATH/rdma-net.conflist"
cnitool add rdma-net $NS > /tmp/result.json
echo "   result: $(tr -d ' \n' < /tmp/result.json | cut -c1-150)..."
took

step "Inside the pod: the NIC (net1) and its RDMA device, with net1 on its port"
$IP netns exec $POD $IP -br addr show net1 | indent
$IP netns exec $POD $RDMA dev show | indent
$IP netns exec $POD $RDMA link show | indent
took

step "On the host: the device is gone (no other pod can open it)"
$RDMA dev show | indent
took

step "The pod is deleted: cnitool del rdma-net"
cnitool del rdma-net $NS
echo "   rdma dev in the pod: $($IP netns exec $POD $RDMA dev show | wc -l) devices"
$IP netns del $POD
took

step "Back on the host: the RDMA device and its NIC"
$RDMA dev show | indent
$RDMA link show | grep -w eth1 | indent
took

printf '\nDone: the RDMA device followed its NIC into the pod and came back.\n'
