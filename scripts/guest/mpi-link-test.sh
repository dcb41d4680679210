#!/bin/sh
# The MPI image (scripts/k8s/mpi-image.sh) between two test VMs joined by
# vm-run.sh --link (scripts/mpi-link.sh): run in both. The image's root
# filesystem, /payload/mpi-layer.tar, is unpacked at /mpi and every MPI
# program runs chrooted there as mpiuser (uid 1000) with every capability
# dropped, as a pod of that image would. Node 2 is the worker (the image's
# sshd on port 2222), node 1 the launcher: mpirun with rank 0 local and
# rank 1 on node 2 over ssh, as the MPI Operator launches, once per case
# of /payload/mpi-cases.sh (scripts/guest/mpi-cases.sh). Each case prints
#   @@MPI <case> rc=<mpirun status> wall=<s> <allreduce JSON or "none">
#   @@MPI-CNT <case> <node> <counter> <before> <growth>
# (the rxe packet counters of both nodes around the run) and a verdict
# against what the case expects:
#   @@MPI-VERDICT <case> PASS|FAIL (<expectation>)[: why]
# The exit status is 1 when a verdict is FAIL.
#
# Usage: mpi-link-test.sh [BYTES [ITERS [EXTRA]]]
#   EXTRA=1 also runs the RC cases (mpi-cases.sh).
set -eu
IP=/usr/sbin/ip
. /etc/vm.conf
[ -n "${VM_LINK:-}" ] || { echo "mpi-link-test.sh: this VM has no --link"; exit 1; }
ME=$VM_NODE
PEER=$((3 - ME))
BYTES=${1:-1048576}
ITERS=${2:-10}
EXTRA=${3:-0}
DEV=$(awk '$1 == "eth0" { print $2 }' /run/rdma-layout)
[ -n "$DEV" ] || { echo "mpi-link-test.sh: no RDMA device on eth0"; exit 1; }
NET=192.168.39
M=/mpi
DEADLINE=300
fail() { echo "mpi-link-test.sh: node $ME: $*"; exit 1; }
now() { cut -d' ' -f1 /proc/uptime | cut -d. -f1; }

# The image's root: the layer as the host took it from the OCI archive.
mkdir -p $M
tar -xf /payload/mpi-layer.tar -C $M || fail "unpack the image's layer"
rm -f /payload/mpi-layer.tar
for d in proc sys dev dev/pts dev/shm; do mount --bind /$d $M/$d || fail "bind /$d"; done
# The job's ssh key as a Kubernetes Secret mounts it (files of root, 0644).
S=$M/home/mpiuser/.ssh
cp /payload/ssh/id_rsa /payload/ssh/id_rsa.pub $S/
cp /payload/ssh/id_rsa.pub $S/authorized_keys
chown 0:0 $S/id_rsa $S/id_rsa.pub $S/authorized_keys
chmod 0644 $S/id_rsa $S/id_rsa.pub $S/authorized_keys
cp /payload/setpriv $M/run/setpriv
chmod 0755 $M/run/setpriv
# What a node gives an unprivileged RDMA pod: verbs device nodes uid 1000
# can open, no limit on locked memory (what the suite's RDMA pods check).
chmod 0666 /dev/infiniband/uverbs* /dev/infiniband/rdma_cm
ulimit -l unlimited

# as_user runs a command of the image as mpiuser, every capability gone
# (none effective, permitted, inheritable or in the bounding set), no new
# privileges: a pod with runAsUser 1000, drop ALL and
# allowPrivilegeEscalation false.
as_user() {
  chroot $M /run/setpriv --reuid=1000 --regid=1000 --init-groups --inh-caps=-all \
    --bounding-set=-all --no-new-privs \
    env -i HOME=/home/mpiuser USER=mpiuser LOGNAME=mpiuser SHELL=/bin/sh \
    PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin "$@"
}

$IP addr add "$NET.$ME/24" dev eth0
echo "@@MPI-INFO node $ME: $DEV on eth0, $NET.$ME, mtu $(cat /sys/class/net/eth0/mtu)"

if [ "$ME" = 2 ]; then
  # The worker: the image's sshd as mpiuser, port 2222. A second sshd on
  # 2223 runs where the device nodes are hidden (a tmpfs over
  # /dev/infiniband in a mount namespace of its own): a worker pod that
  # did not get its device, for the case that must fail.
  as_user /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config.mpi > /tmp/sshd.log 2>&1 &
  sed 's/^Port 2222/Port 2223/; s|^PidFile .*|PidFile /tmp/sshd-nodev.pid|' \
    $M/etc/ssh/sshd_config.mpi > $M/tmp/sshd_config.nodev
  unshare -m sh -c "mount -t tmpfs -o mode=0755 none $M/dev/infiniband && \
    exec chroot $M /run/setpriv --reuid=1000 --regid=1000 --init-groups --inh-caps=-all \
    --bounding-set=-all --no-new-privs /usr/sbin/sshd -D -e -f /tmp/sshd_config.nodev" \
    > /tmp/sshd-nodev.log 2>&1 &
  t=$(now)
  until [ -s $M/tmp/sshd.pid ]; do
    [ $(($(now) - t)) -lt 60 ] || fail "sshd did not start: $(cat /tmp/sshd.log)"
    sleep 0.5
  done
  until [ -s $M/tmp/sshd-nodev.pid ]; do
    [ $(($(now) - t)) -lt 60 ] || fail "the second sshd did not start: $(cat /tmp/sshd-nodev.log)"
    sleep 0.5
  done
  pid=$(cat $M/tmp/sshd.pid)
  echo "@@MPI-SSHD $(grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/$pid/status | tr -s '\t\n' ' ')"
  nodev=$(cat $M/tmp/sshd-nodev.pid)
  echo "@@MPI-INFO device nodes the sshd on 2222 sees: $(ls /proc/$pid/root/dev/infiniband | tr '\n' ' '); on 2223: $(ls /proc/$nodev/root/dev/infiniband | tr '\n' ' ')"
  # Until the launcher says it is done (it writes the file over ssh).
  t=$(now)
  until [ -e $M/tmp/launcher-done ]; do
    [ $(($(now) - t)) -lt 1200 ] || fail "no word from the launcher after 1200 s"
    sleep 1
  done
  echo "@@MPI-WORKER-LOG"
  cat /tmp/sshd.log
  exit 0
fi

# The launcher.
PEER_IP=$NET.$PEER
t=$(now)
until as_user ssh "$PEER_IP" true > /tmp/ssh.err 2>&1; do
  [ $(($(now) - t)) -lt $DEADLINE ] || fail "no ssh to mpiuser@$PEER_IP:2222 after ${DEADLINE}s: $(cat /tmp/ssh.err)"
  sleep 1
done
echo "@@MPI-INFO ssh to the worker after $(($(now) - t)) s"
echo "@@MPI-INFO $(as_user ucx_info -v | head -n 2 | tr '\n' ' ')"
echo "@@MPI-UCX-DEVICES-BEGIN"
as_user ucx_info -d 2>&1 || true
echo "@@MPI-UCX-DEVICES-END"
echo "@@MPI-INFO $(as_user ompi_info --version 2>&1 | head -n 1)"
echo "@@MPI-INFO $(as_user ibv_devinfo -d $DEV | grep -E 'transport|state|active_mtu|link_layer' | tr -s ' \t\n' ' ')"

P=/sys/class/infiniband/$DEV/ports/1
# rxe has no standard port counters (ports/1/counters), only these.
COUNTERS="hw_counters/sent_pkts hw_counters/rcvd_pkts"
# counters prints "name value" for both nodes' counters (node 2's over
# ssh, which is TCP on eth0 and moves no rxe counter).
read_counters() {
  for c in $COUNTERS; do echo "1 $c $(cat $P/$c 2>/dev/null || echo -)"; done
  as_user ssh "$PEER_IP" "for c in $COUNTERS; do echo \"2 \$c \$(cat $P/\$c 2>/dev/null || echo -)\"; done"
}

HOSTS="-np 2 -H $NET.$ME:1,$PEER_IP:1 --mca oob_tcp_if_include eth0"
JOB="python3 /usr/local/bin/allreduce.py --bytes $BYTES --iters $ITERS"
# The RoCE MTU: the most a packet carries.
MTU=$(as_user ibv_devinfo -d $DEV | awk '$1 == "active_mtu:" { print $2 }')
[ -n "$MTU" ] || fail "no active_mtu in ibv_devinfo -d $DEV"
# At most this many rxe packets each way in a run that must not use RDMA:
# the nodes' own traffic on the port (none was seen in any run).
NOISE=10
failed=0

# run CASE EXPECT MPIRUN-ARGS...: one job, both nodes' counters around it,
# and a verdict on what it must show: EXPECT rdma (the allreduce passes
# and every node's rxe sent and received at least the bytes the job
# moved, in packets of the port's MTU), tcp (it passes and the rxe
# counters stay flat) or fail (mpirun fails). FILTER, when set, prints
# only the output lines matching it (for debug logs).
run() {
  name=$1 expect=$2; shift 2
  echo "@@MPI-CMD $name mpirun $HOSTS $* $JOB"
  read_counters > /tmp/before
  s=$(now)
  rc=0
  as_user timeout 240 mpirun $HOSTS "$@" $JOB > /tmp/out 2>&1 || rc=$?
  read_counters > /tmp/after
  if [ -n "${FILTER:-}" ]; then
    grep -E "$FILTER" /tmp/out | sed "s/^/[$name] /" | head -n 40
  else
    sed "s/^/[$name] /" /tmp/out | head -n 60
  fi
  json=$(grep '^{"ranks"' /tmp/out || echo none)
  echo "@@MPI $name rc=$rc wall=$(($(now) - s))s $json"
  paste -d' ' /tmp/before /tmp/after | awk -v n="$name" '{ print "@@MPI-CNT", n, $1, $2, $3, $6 - $3 }' > /tmp/cnt
  cat /tmp/cnt
  verdict $name $expect $rc "$json"
}

verdict() {
  name=$1 expect=$2 rc=$3 json=$4
  sent=$(echo "$json" | sed -n 's/.*"est_bytes_sent_per_rank": \([0-9]*\).*/\1/p')
  ok=$(echo "$json" | grep -c '"ok": true' || true)
  why=""
  case $expect in
    fail) [ "$rc" != 0 ] || why="mpirun passed; it must fail" ;;
    rdma|tcp)
      [ "$rc" = 0 ] && [ "$ok" = 1 ] || why="the allreduce failed (status $rc)"
      [ -n "$why" ] || why=$(awk -v e=$expect -v min=$((sent / MTU)) -v noise=$NOISE '
        e == "rdma" && $6 < min { printf "node %s %s grew by %d < %d packets; ", $3, $4, $6, min }
        e == "tcp" && $6 > noise { printf "node %s %s grew by %d packets; ", $3, $4, $6 }' /tmp/cnt) ;;
  esac
  if [ -z "$why" ]; then
    echo "@@MPI-VERDICT $name PASS ($expect)"
  else
    echo "@@MPI-VERDICT $name FAIL ($expect): $why"
    failed=1
  fi
}

. /payload/mpi-cases.sh

echo "@@MPI-INFO all rxe counters of node 1: $(cd $P/hw_counters && grep . * | tr '\n' ' ')"
echo "@@MPI-INFO all rxe counters of node 2: $(as_user ssh "$PEER_IP" "cd $P/hw_counters && grep . *" | tr '\n' ' ')"

as_user ssh "$PEER_IP" touch /tmp/launcher-done
echo "@@MPI-DONE failed=$failed"
exit $failed
