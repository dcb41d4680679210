#!/bin/sh
# The story rdma-netns tells, played in the test VM the way an operator would
# see it on a node: the pod gets the NIC *and* its RDMA device, two pods
# exchange real RDMA traffic through them, and give both back. Run by
# `make demo` (see scripts/vm-run.sh for the guest).
set -e -o pipefail
IP=/usr/sbin/ip
RDMA=/usr/sbin/rdma
export CNI_PATH=/opt/cni/bin NETCONFPATH=/etc/cni/net.d CNI_IFNAME=net1
POD=demo-pod
NS=/run/netns/$POD
POD_B=demo-pod-b
NS_B=/run/netns/$POD_B
# The RDMA device the test VM created for a NIC (scripts/README.md).
rdma_of() { awk -v n="$1" '$1 == n { print $2 }' /run/rdma-layout; }
DEV_A=$(rdma_of eth1)
DEV_B=$(rdma_of eth2)

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
# The second pod's network: the same chain with the next NIC and address.
sed -e 's/"rdma-net"/"rdma-net-b"/' -e 's/"eth1"/"eth2"/' -e 's#10.100.100.2/#10.100.100.3/#' \
  /payload/rdma-net.conflist > "$NETCONFPATH/rdma-net-b.conflist"

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

step "A second pod gets eth2 and its RDMA device the same way (cnitool add rdma-net-b)"
$IP netns add $POD_B
cnitool add rdma-net-b $NS_B > /dev/null
$IP netns exec $POD_B $IP -br addr show net1 | indent
$IP netns exec $POD_B $RDMA dev show | indent
took

# The verbs tools run through `ip netns exec`, which also gives them the
# pod's view of /sys: libibverbs finds exactly the pod's device, by name,
# as NCCL_IB_HCA would. GID 1 is the port's IPv4 RoCEv2 address.
step "RDMA traffic: ibv_rc_pingpong (RC send/receive, 100 x 4 KiB round trips) from $POD_B to $POD"
$IP netns exec $POD ibv_rc_pingpong -d $DEV_A -g 1 -n 100 > /tmp/pp-server.log 2>&1 &
SERVER=$!
sleep 1
$IP netns exec $POD_B ibv_rc_pingpong -d $DEV_B -g 1 -n 100 10.100.100.2 2>&1 | indent
wait $SERVER
took

step "RDMA writes: ib_write_bw (200 x 64 KiB RDMA WRITEs) from $POD_B into $POD's memory"
$IP netns exec $POD ib_write_bw -d $DEV_A -x 1 -F -n 200 > /tmp/bw-server.log 2>&1 &
SERVER=$!
sleep 1
$IP netns exec $POD_B ib_write_bw -d $DEV_B -x 1 -F -n 200 10.100.100.2 2>&1 \
  | sed -n '/#bytes/,$p' | grep -v '^-*$' | indent
wait $SERVER
took

# rping connects through rdma_cm, as MPI and UCX do (NCCL does not).
step "rdma_cm: rping (3 pings over a connection rdma_cm resolved and set up) from $POD_B to $POD"
$IP netns exec $POD rping -s -a 10.100.100.2 -C 3 > /tmp/rping-server.log 2>&1 &
SERVER=$!
sleep 1
$IP netns exec $POD_B rping -c -a 10.100.100.2 -C 3 -v 2>&1 | cut -c1-60 | indent
wait $SERVER
took

step "The pods are deleted, as kubelet does: processes gone, then cnitool del"
cnitool del rdma-net $NS
cnitool del rdma-net-b $NS_B
echo "   rdma dev in the pods: $($IP netns exec $POD $RDMA dev show | wc -l) and $($IP netns exec $POD_B $RDMA dev show | wc -l) devices"
$IP netns del $POD
$IP netns del $POD_B
took

step "Back on the host: the RDMA devices and their NICs (down, as host-device returns them); the host opens the device again"
$RDMA dev show | indent
$RDMA link show | grep -wE "eth1|eth2" | indent
ibv_devinfo -d $DEV_A | grep -E "hca_id|state:" | indent
took

printf '\nDone: each RDMA device followed its NIC into a pod, carried RDMA traffic\nbetween the pods, and came back.\n'

# The end: pods created over CRI by containerd whose containers ask for
# nothing (not root, no capability, device or volume); rdma-netns-nri gives
# them what verbs needs, and they exchange RDMA traffic
# (e2e/cri/cmd/rdma-netns-nri-demo).
printf '\n==== Unprivileged pods under containerd 2.2.1 with rdma-netns-nri\n'
rdma-netns-nri-demo
