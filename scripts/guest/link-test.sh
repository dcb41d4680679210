#!/bin/sh
# RDMA traffic between two test VMs joined by vm-run.sh --link (make
# e2e-link, scripts/e2e-link.sh): run in both, node 1 and node 2. Each
# uses the rxe device of its eth0, first from the host netns (host to
# host), then from a netns it was moved into by rdma-netns under cnitool
# (netns to netns), and each VM is once server and once client of
# ib_write_bw and of ib_send_lat in both phases. The client prints its
# figures as `@@LINK <phase> <tool> <from>-><to> <value>` lines for the
# host side to compare.
#
# ROUNDS (the first argument, default 1) repeats both phases, alternated
# (host, netns, host, netns, ...), for make bench's ratio: a slow moment
# of the emulated machine then falls on both phases alike.
#
# Both VMs run the same steps in the same order and wait on each other
# through the link, never on the clock: a client retries connecting until
# its server listens, up to DEADLINE seconds, and then tells the server
# whether the step must be run again (perftest's clock calibration
# sometimes fails under the emulated CPU and reports 0 MB/s).
set -eu
ROUNDS=${1:-1}
IP=/usr/sbin/ip
RDMA=/usr/sbin/rdma
. /etc/vm.conf
[ -n "${VM_LINK:-}" ] || { echo "link-test.sh: this VM has no --link"; exit 1; }
ME=$VM_NODE
PEER=$((3 - ME))
DEV=$(awk '$1 == "eth0" { print $2 }' /run/rdma-layout)
[ -n "$DEV" ] || { echo "link-test.sh: no RDMA device on eth0 in /run/rdma-layout"; exit 1; }
DEADLINE=300
# One subnet per phase: a client of one phase can never reach a server
# left from the other.
HOST_NET=192.168.37
POD_NET=192.168.38
POD=link-pod
# perftest's QP exchange port: one per step, so that a retrying client
# never reaches the server of another step.
PORT=18515
# The RoCEv2 GID of the port's IPv4 address (e2e/internal/rig.RoCEv2GID).
GID=1
BW_ARGS="-x $GID -F -s 65536 -n 200"
LAT_ARGS="-x $GID -F -s 2 -n 500"

now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
fail() { echo "link-test.sh: node $ME: $*"; exit 1; }
# in_phase runs a command where this phase's device is: the host netns,
# or the pod's netns (PHASE=pod).
in_phase() {
  if [ "$PHASE" = pod ]; then $IP netns exec "$POD" "$@"; else "$@"; fi
}
expired() { [ "$(awk -v a="$1" -v b="$(now)" -v d="$DEADLINE" 'BEGIN { print (b - a > d) }')" = 1 ]; }

# wait_peer waits until the peer answers ping on the link.
wait_peer() {
  t=$(now)
  until in_phase ping -c 1 -W 1 "$1" > /dev/null 2>&1; do
    expired "$t" && fail "$PHASE: no ping reply from $1 after ${DEADLINE}s"
  done
  echo "@@LINK-TIME $PHASE ping-reply $(since "$t") s"
}

# step SERVER TOOL ARGS: one perftest run, node SERVER serving; the other
# node is the client, reporting figures and telling the server (through
# the control port, PORT+100) whether to serve the step again.
step() {
  server=$1 tool=$2 args=$3
  PORT=$((PORT + 1))
  if [ "$server" = "$ME" ]; then
    serve "$tool" "$args"
  else
    run_client "$tool" "$args"
  fi
}

serve() {
  while :; do
    out=$(in_phase timeout "$DEADLINE" "$1" -d "$DEV" $2 -p "$PORT" 2>&1) ||
      fail "$PHASE $1 server on port $PORT: $out"
    verdict=$(in_phase timeout "$DEADLINE" nc -l -p $((PORT + 100)) < /dev/null) ||
      fail "$PHASE $1 server: no word from the client on port $((PORT + 100))"
    [ "$verdict" = again ] || break
    PORT=$((PORT + 1))
  done
}

run_client() {
  peer=$NET.$PEER
  try=0
  while :; do
    t=$(now)
    while ! out=$(in_phase "$1" -d "$DEV" $2 -p "$PORT" "$peer" 2>&1); do
      case "$out" in *"Couldn't connect to"*) ;; *) fail "$PHASE $1 client: $out" ;; esac
      expired "$t" && fail "$PHASE $1: no server on $peer:$PORT after ${DEADLINE}s"
      sleep 0.2
    done
    verdict=done
    case "$out" in *"Correlation coefficient"*) try=$((try + 1)); [ $try -ge 3 ] || verdict=again ;; esac
    t=$(now)
    until echo "$verdict" | in_phase nc "$peer" $((PORT + 100)) > /dev/null 2>&1; do
      expired "$t" && fail "$PHASE $1: the server on $peer does not take the verdict on port $((PORT + 100))"
      sleep 0.2
    done
    [ "$verdict" = again ] || break
    PORT=$((PORT + 1))
  done
  echo "$out"
  case "$1" in
    # bytes iterations peak average msg-rate: the average MB/s.
    ib_write_bw) v=$(echo "$out" | awk 'NF == 5 && $1 == 65536 && $2 == 200 { print $4 }') ;;
    # bytes iterations t_min t_max t_typical ...: the typical latency, us.
    ib_send_lat) v=$(echo "$out" | awk 'NF >= 7 && $1 == 2 && $2 == 500 { print $5 }') ;;
  esac
  [ -n "$v" ] || fail "$PHASE $1: no result line in the client's output"
  echo "@@LINK $PHASE $1 $ME->$PEER $v"
}

# traffic runs each tool both ways: node 1 serves first, then node 2.
traffic() {
  wait_peer "$NET.$PEER"
  start=$(now)
  step 1 ib_write_bw "$BW_ARGS"
  step 2 ib_write_bw "$BW_ARGS"
  step 1 ib_send_lat "$LAT_ARGS"
  step 2 ib_send_lat "$LAT_ARGS"
  echo "@@LINK-TIME $PHASE traffic $(since "$start") s"
}

echo "@@LINK-TIME boot $(now) s (guest uptime when the test starts)"

# Netns to netns: host-device moves eth0 into the netns as net1 with the
# pod's address, rdma-netns moves its RDMA device (exclusive mode).
export CNI_PATH=/opt/cni/bin NETCONFPATH=/tmp/link-cni CNI_IFNAME=net1
mkdir -p "$NETCONFPATH"
cat > "$NETCONFPATH/link-net.conflist" <<EOF
{
  "cniVersion": "1.1.0",
  "name": "link-net",
  "plugins": [
    {"type": "host-device", "device": "eth0",
     "ipam": {"type": "static", "addresses": [{"address": "$POD_NET.$ME/24"}]}},
    {"type": "rdma-netns"}
  ]
}
EOF

round=0
while [ "$round" -lt "$ROUNDS" ]; do
  round=$((round + 1))
  # Host to host: the address on eth0 in the host netns (up again: a
  # device host-device gives back comes back down).
  PHASE=host NET=$HOST_NET
  $IP link set eth0 up
  $IP addr add "$NET.$ME/24" dev eth0
  traffic
  $IP addr del "$NET.$ME/24" dev eth0

  PHASE=pod NET=$POD_NET
  $IP netns add "$POD"
  cnitool add link-net "/run/netns/$POD" > /dev/null
  $RDMA dev show | grep -qw "$DEV" && fail "$DEV is still in the host netns after cnitool add"
  $IP netns exec "$POD" $RDMA dev show | grep -qw "$DEV" || fail "$DEV is not in the netns after cnitool add"
  echo "@@LINK-MOVED $DEV left the host netns for $POD (round $round)"
  traffic
  cnitool del link-net "/run/netns/$POD"
  $IP netns del "$POD"
  $RDMA dev show | grep -qw "$DEV" || fail "$DEV is not back in the host netns after cnitool del"
done
echo "@@LINK-DONE node $ME"
