#!/bin/sh
# The story rdma-netns tells, as a user meets it on a node. Run by `make
# demo` on the one-node cluster of `make e2e-k8s` (docs/kubernetes.md),
# once k8s.test has brought the node up as the tests do: kubelet and
# containerd in the test VM, rdma-netns installed by conf/daemonset.yaml,
# Multus. KUBECONFIG is the cluster admin's; kubectl is the real one, and
# every kubectl exec goes API server -> kubelet -> containerd.
#
# Part 1, short: the plugin alone as the CNI spec runs it (cnitool,
# conf/rdma-net.conflist). Part 2: two NCCL workers (conf/pod-nccl.yaml on
# conf/nad-host-device.yaml, through the overlays of e2e/k8s/overlays) on
# two NICs, their devices, RDMA traffic between them, and the devices back
# on the node after kubectl delete.
set -e -o pipefail
IP=/usr/sbin/ip
RDMA=/usr/sbin/rdma
M=/payload/k8s-manifests
# Part 3's job, when the cluster has a second node: its workers' pods and
# mpirun's command line as e2e/k8s's TestTwoNodes makes them, written by
# k8s.test (prepareJobDemo). Node 1 is localhost; node 2 is named by the
# address its kubelet is reached at, and answers for its own netns on its
# management address (the rig's agent, standing in for ssh to a node).
JOB=/run/demo-job
NODE1=localhost
NODE2=127.0.0.2
NODE2_AGENT=http://10.99.0.2:7070/host
# The versions the payload was built with (build-payload.sh).
. /payload/versions.env

# Busybox date has no sub-second format; /proc/uptime has centiseconds.
now() { cut -d' ' -f1 /proc/uptime; }
T0=$(now)
step() {
  printf '\n== %s\n' "$*"
  T0=$(now)
}
took() { awk -v a="$T0" -v b="$(now)" 'BEGIN { printf "   (%.2f s)\n", b - a }'; }
indent() { sed 's/^/   /'; }
# run prints a command as one would type it (quoting the arguments that
# need it), then its output.
run() {
  printf '   $'
  for a in "$@"; do
    case "$a" in
      *[!A-Za-z0-9_./=:,@%+-]*) printf " '%s'" "$a" ;;
      *) printf ' %s' "$a" ;;
    esac
  done
  printf '\n'
  "$@" 2>&1 | indent
}
# The node's RDMA devices: `rdma dev show` lines read "IDX: NAME: ...".
host_devices() { $RDMA dev show | awk '{ sub(":", "", $2); printf "%s ", $2 }'; }
on_host() { case " $(host_devices) " in *" $1 "*) return 0 ;; esac; return 1; }

printf '\n######## Part 1: the plugin alone (cnitool add/del rdma-net)\n'
# cnitool reads its own directory: /etc/cni/net.d is the node's.
export CNI_PATH=/opt/cni/bin NETCONFPATH=/etc/cni/cnitool.d CNI_IFNAME=net1
mkdir -p "$NETCONFPATH"
cp /payload/rdma-net.conflist "$NETCONFPATH/"
step "cnitool add rdma-net: host-device moves eth1 into a netns, rdma-netns its RDMA device; then cnitool del"
$IP netns add demo-pod
cnitool add rdma-net /run/netns/demo-pod > /dev/null
$IP netns exec demo-pod $RDMA link show | sed 's/^/   in the netns: /'
echo "   on the host:  $(host_devices)"
cnitool del rdma-net /run/netns/demo-pod
$IP netns del demo-pod
$RDMA link show | grep -w eth1 | sed 's/^/   after del, on the host: /'
took
unset CNI_PATH NETCONFPATH CNI_IFNAME

printf '\n######## Part 2: Kubernetes (kubelet %s, containerd %s, Multus %s)\n' "$KUBERNETES_VERSION" "${CONTAINERD_VERSION#v}" "$MULTUS_VERSION"
step "The node, and rdma-netns installed by conf/daemonset.yaml"
run kubectl get nodes -o wide
run kubectl -n kube-system get pods -o wide
if [ -d "$JOB" ]; then
  echo "   Parts 1 and 2 are node $NODE1's: node $NODE2 waits cordoned for Part 3."
  run kubectl cordon "$NODE2"
fi
took

step "Two NCCL workers on two NICs: conf/nad-host-device.yaml (eth1, and again on eth2) and conf/pod-nccl.yaml"
run kubectl apply -f $M/nad-host-device.yaml -f $M/nad-host-device-eth2.yaml
run kubectl apply -f $M/pod-nccl.yaml -f $M/pod-nccl-eth2.yaml
run kubectl wait --for=condition=Ready pod/nccl-worker-0 pod/nccl-worker-1 --timeout=180s
run kubectl get pods -o wide
took

status() { kubectl get pod "$1" -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}'; }
# net1's address, from the network-status annotation.
net1_ip() { status "$1" | tr -d ' \n' | sed 's/},{/}\n{/g' | grep '"interface":"net1"' | sed -n 's/.*"ips":\["\([^"]*\)".*/\1/p'; }
step "The network-status annotation Multus wrote through the API server"
printf '   $ kubectl get pod nccl-worker-0 -o jsonpath=%s\n' "'{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}'"
status nccl-worker-0 | indent
echo
took

step "Each worker sees only its own RDMA device; the node sees neither"
run kubectl exec nccl-worker-0 -- ibv_devices
run kubectl exec nccl-worker-1 -- ibv_devices
echo "   What the NRI plugin gave nccl-worker-0's container, which asked for none of it:"
run kubectl exec nccl-worker-0 -- sh -c 'ls /dev/infiniband; ulimit -l; df -h /dev/shm; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status'
echo "   on the node: RDMA devices $(host_devices)"
took

dev0=$(kubectl exec nccl-worker-0 -- ibv_devices | awk 'NR > 2 { print $1 }')
dev1=$(kubectl exec nccl-worker-1 -- ibv_devices | awk 'NR > 2 { print $1 }')
ip0=$(net1_ip nccl-worker-0)
[ -n "$dev0" ] && [ -n "$dev1" ] && [ -n "$ip0" ] || { echo "demo: no device or address ($dev0 $dev1 $ip0)" >&2; exit 1; }

# serve starts a verbs tool's server side in nccl-worker-0 through kubectl
# exec, in the background, and waits until it listens on TCP 18515 (where
# both tools exchange queue pair numbers).
serve() {
  kubectl exec nccl-worker-0 -- "$@" > /tmp/server.log 2>&1 &
  SERVER=$!
  i=0
  until kubectl exec nccl-worker-0 -- cat /proc/net/tcp /proc/net/tcp6 > /tmp/tcp && grep -q ':4853 0*:0000 0A' /tmp/tcp; do
    i=$((i + 1))
    [ $i -lt 60 ] || { cat /tmp/server.log >&2; echo "demo: $1 server never listened" >&2; exit 1; }
    sleep 0.5
  done
}

step "ibv_rc_pingpong (RC send/receive, 100 x 4 KiB round trips): nccl-worker-1 ($dev1) -> nccl-worker-0 ($dev0, $ip0)"
serve ibv_rc_pingpong -d "$dev0" -g 1 -s 4096 -n 100
printf '   $ kubectl exec nccl-worker-1 -- ibv_rc_pingpong -d %s -g 1 -s 4096 -n 100 %s\n' "$dev1" "$ip0"
kubectl exec nccl-worker-1 -- ibv_rc_pingpong -d "$dev1" -g 1 -s 4096 -n 100 "$ip0" 2>&1 | indent
wait $SERVER
took

step "ib_write_bw (200 RDMA WRITEs of 64 KiB into the other pod's memory): nccl-worker-1 -> nccl-worker-0"
# perftest calibrates its clock at start, which the emulated CPU sometimes
# spoils ("Correlation coefficient r^2"): such a run is tried again.
for try in 1 2 3; do
  serve ib_write_bw -d "$dev0" -x 1 -F -s 65536 -n 200
  kubectl exec nccl-worker-1 -- ib_write_bw -d "$dev1" -x 1 -F -s 65536 -n 200 "$ip0" > /tmp/client.log 2>&1
  wait $SERVER
  grep -q 'Correlation coefficient' /tmp/client.log || break
done
printf '   $ kubectl exec nccl-worker-1 -- ib_write_bw -d %s -x 1 -F -s 65536 -n 200 %s\n' "$dev1" "$ip0"
grep -E '#bytes|^ *65536 ' /tmp/client.log | indent
took

step "kubectl delete: the devices are back on the node"
# --grace-period=1: the workers' `sleep infinity`, their PID 1, ignores
# SIGTERM, and the default 30 s would only be waited out.
run kubectl delete pod nccl-worker-0 nccl-worker-1 --grace-period=1
i=0
until on_host "$dev0" && on_host "$dev1"; do
  i=$((i + 1))
  [ $i -lt 300 ] || { echo "demo: $dev0 and $dev1 not back on the node" >&2; exit 1; }
  sleep 0.1
done
echo "   on the node: RDMA devices $(host_devices)"
$RDMA link show | grep -wE "$dev0|$dev1" | indent
took

[ -d "$JOB" ] || exit 0

printf '\n######## Part 3: one job, two nodes (Open MPI and UCX from Debian, RDMA across the link)\n'
step "Two nodes whose eth1 share one Ethernet link; each has its own rxe1 on it"
run kubectl uncordon "$NODE2"
run kubectl get nodes -o wide
echo "   node $NODE1's RDMA devices: $(host_devices)"
echo "   node $NODE2's netns (its agent): $(wget -qO- "$NODE2_AGENT")"
took

step "The job's network: conf/nad-renamed.yaml, host-device eth1 then rdma-netns naming the device rdma_net1 in every pod"
run kubectl apply -f $M/nad-renamed.yaml
took

step "Two MPI workers, one per node: sshd as mpiuser, the job's key from Secret mpi-job-ssh (the MPI Operator's layout), no capabilities"
run kubectl apply -f $JOB/workers.json
run kubectl wait --for=condition=Ready pod/span-worker-0 pod/span-worker-1 --timeout=180s
run kubectl get pods -o wide span-worker-0 span-worker-1
for p in span-worker-0 span-worker-1; do
  # sshd listens on 2222 (08AE), the image's sshd_config.mpi.
  i=0
  until kubectl exec $p -- cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q ':08AE 0*:0000 0A'; do
    i=$((i + 1))
    [ $i -lt 60 ] || { echo "demo: $p's sshd never listened" >&2; exit 1; }
    sleep 1
  done
done
run kubectl exec span-worker-0 -- ibv_devices
run kubectl exec span-worker-1 -- ibv_devices
echo "   node $NODE1's RDMA devices: $(host_devices)"
echo "   node $NODE2's netns (its agent): $(wget -qO- "$NODE2_AGENT")"
took

# counters prints each pod's device counters and keeps them in C_<pod>.
hw=/sys/class/infiniband/rdma_net1/ports/1/hw_counters
counters() {
  for p in span-worker-0 span-worker-1; do
    c=$(kubectl exec $p -- cat $hw/sent_pkts $hw/rcvd_pkts | tr '\n' ' ')
    eval "C_${p#span-worker-}_$1=\"$c\""
    echo "   $p rdma_net1: sent_pkts rcvd_pkts = $c"
  done
}
step "mpirun in worker 0 (the launcher as a worker, as the MPI Operator runs it): an allreduce of 1 MiB x 5 over RDMA (UCX on rdma_net1)"
echo "   RoCE packet counters of both pods' devices before:"
counters before
set --
while IFS= read -r a; do set -- "$@" "$a"; done < $JOB/mpirun.args
run kubectl exec span-worker-0 -- "$@"
echo "   after:"
counters after
for i in 0 1; do
  eval "b=\$C_${i}_before a=\$C_${i}_after"
  echo "$b $a" | awk -v p="span-worker-$i" '{ printf "   %s moved %d RoCE packets out and %d in during the job\n", p, $3 - $1, $4 - $2 }'
done
took

step "kubectl delete: each device home on its own node, each NIC too"
run kubectl delete pod span-worker-0 span-worker-1 --grace-period=1
i=0
until on_host rxe1 && wget -qO- "$NODE2_AGENT" | grep -q '"rxe1"'; do
  i=$((i + 1))
  [ $i -lt 600 ] || { echo "demo: rxe1 not back on both nodes" >&2; exit 1; }
  sleep 0.1
done
echo "   node $NODE1's RDMA devices: $(host_devices)"
echo "   node $NODE2's netns (its agent): $(wget -qO- "$NODE2_AGENT")"
took
