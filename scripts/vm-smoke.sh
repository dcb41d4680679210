#!/usr/bin/env bash
# Smoke test of the RDMA test VM: boots it twice through vm-run.sh (exclusive
# netns mode with the default NICs, then shared mode) and checks, with
# iproute2 and a tiny netlink probe only, everything the plugin's tests rely
# on: device layout in sysfs, moving rdma devices between netns, and devices
# coming back when a netns is deleted. Exits non-zero on any failed check.
set -euo pipefail

SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vm-smoke.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# Prepare first so that the probe's compiler is known to be installed.
"$SCRIPTS_DIR/vm-prepare.sh"

# The probe answers the question iproute2 cannot: which netns RDMA netlink
# uses when the socket and the calling thread are in different ones.
mkdir -p "$WORK/payload/bin"
gcc -static -O2 -Wall -o "$WORK/payload/bin/rdma-nl-probe" "$SCRIPTS_DIR/probes/rdma-nl-probe.c"

# Shared helpers for both guest scripts.
cat > "$WORK/payload/lib.sh" <<'EOF'
IP=/usr/sbin/ip
RDMA=/usr/sbin/rdma
FAILS=0
ok()   { echo "  ok   $*"; }
bad()  { echo "  FAIL $*"; FAILS=$((FAILS + 1)); }
# check DESCRIPTION COMMAND...: passes when COMMAND succeeds.
check() { local d=$1; shift; if "$@" >/tmp/check.out 2>&1; then ok "$d"; else bad "$d"; sed 's/^/       | /' /tmp/check.out; fi; }
# check_not DESCRIPTION COMMAND...: passes when COMMAND fails.
check_not() { local d=$1; shift; if "$@" >/tmp/check.out 2>&1; then bad "$d"; sed 's/^/       | /' /tmp/check.out; else ok "$d"; fi; }
# wait_for SECS COMMAND...: netns teardown is asynchronous (cleanup_net runs
# from a workqueue), so poll instead of checking once.
wait_for() { local t=$(($1 * 10)); shift; while [ $t -gt 0 ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; t=$((t - 1)); done; "$@"; }
in_ns() { local ns=$1; shift; $IP netns exec "$ns" "$@"; }
host_has_dev() { $RDMA dev show "$1"; }
ns_has_dev() { in_ns "$1" $RDMA dev show "$2"; }
finish() { echo "== $FAILS failed check(s)"; [ "$FAILS" -eq 0 ]; }
EOF

cat > "$WORK/payload/exclusive.sh" <<'EOF'
. /payload/lib.sh
. /etc/vm.conf

echo "== netns mode and devices"
check "rdma system reports exclusive" sh -c "$RDMA system | grep -q 'netns exclusive'"
ndev=$($RDMA dev | wc -l)
[ "$ndev" -eq "$VM_NICS" ] && ok "rdma dev lists $ndev devices for $VM_NICS NICs" || bad "rdma dev lists $ndev devices, want $VM_NICS"
nlay=$(wc -l < /run/rdma-layout)
[ "$nlay" -eq "$VM_NICS" ] && ok "/run/rdma-layout has $nlay lines" || bad "/run/rdma-layout has $nlay lines, want $VM_NICS"
cat /run/rdma-layout | sed 's/^/       | /'

echo "== sysfs layout"
while read -r nd dev layout pci pbus pname; do
  parent=$(readlink -f /sys/class/infiniband/$dev/device)
  case $layout in
    pf)    want=$pci ;;
    child) want=$pname
           [ "$(basename "$(dirname "$parent")")" = "$pci" ] \
             || bad "$dev: $pname is not a child of $pci ($parent)" ;;
  esac
  [ "$(basename "$parent")" = "$want" ] && ok "$dev ($layout) device -> $parent" \
    || bad "$dev ($layout) device -> $parent, want .../$want"
  [ "$($RDMA link show "$dev/1" | sed -n 's/.*netdev \([^ ]*\).*/\1/p')" = "$nd" ] \
    || bad "$dev: rdma link does not name netdev $nd"
done < /run/rdma-layout
check "last NIC is named like udev would (roce<path>)" sh -c "tail -n1 /run/rdma-layout | grep -q ' rocep0s[0-9]* pf '"

echo "== move a device and its netdev into a pod netns"
check "ip netns add pod1" $IP netns add pod1
check "eth1 moves to pod1" $IP link set eth1 netns pod1
check "rxe1 survives its netdev leaving (still in host)" host_has_dev rxe1
check "rdma dev set rxe1 netns pod1 (from host)" $RDMA dev set rxe1 netns pod1
check "pod1 sees rxe1" ns_has_dev pod1 rxe1
check_not "host no longer sees rxe1" host_has_dev rxe1
check "pod1 sysfs shows rxe1" in_ns pod1 test -e /sys/class/infiniband/rxe1
check_not "host sysfs no longer shows rxe1" test -e /sys/class/infiniband/rxe1
check "pod1 rdma link pairs rxe1 with eth1" sh -c "$IP netns exec pod1 $RDMA link show rxe1/1 | grep -q 'netdev eth1'"

echo "== move it back: only from inside the pod, target named under /run/netns"
check_not "target as pid ('netns 1') is rejected" in_ns pod1 $RDMA dev set rxe1 netns 1
check_not "target as path is rejected" in_ns pod1 $RDMA dev set rxe1 netns /proc/1/ns/net
check "ip netns attach host 1 (name the host netns)" $IP netns attach host 1
check_not "from the host netns the pod's device cannot be named" $RDMA dev set rxe1 netns host
check "from pod1: rdma dev set rxe1 netns host" in_ns pod1 $RDMA dev set rxe1 netns host
check "host sees rxe1 again" host_has_dev rxe1
check_not "pod1 no longer sees rxe1" ns_has_dev pod1 rxe1

echo "== netlink: socket netns vs calling thread netns (rdma-nl-probe)"
# probe DESCRIPTION EXPECTED-LINE SOCK_NS THREAD_NS DEV TARGET_NS
probe() {
  local d=$1 want=$2 out; shift 2
  out=$(rdma-nl-probe "$@" 2>&1)
  if echo "$out" | grep -qx "$want"; then ok "$d"; else bad "$d (want '$want')"; fi
  echo "$out" | sed "s/^/       | rdma-nl-probe $* -> /"
}
# ib_core looks the device up in the socket's netns but moves it only if the
# calling thread is in the device's current netns: both must match.
probe "socket+thread in host: move rxe1 into pod1" "set-netns: ok" host host rxe1 pod1
probe "socket opened in pod1, thread in host: moving rxe1 out fails" \
  "set-netns: error ENODEV" pod1 host rxe1 host
probe "socket opened in host, thread in pod1: rxe1 is not even visible" \
  "set-netns: device rxe1 not visible to the socket" host pod1 rxe1 host
probe "socket+thread in pod1: move rxe1 to host" "set-netns: ok" pod1 pod1 rxe1 host
probe "socket in host, thread in pod1: moving rxe1 into pod1 fails" \
  "set-netns: error ENODEV" host pod1 rxe1 pod1
probe "socket+thread in host: move rxe1 into pod1 again" "set-netns: ok" host host rxe1 pod1

echo "== deleting a netns returns its devices and netdevs to the host"
check "ip netns add pod2" $IP netns add pod2
check "eth3 moves to pod2" $IP link set eth3 netns pod2
check "rxe3 moves to pod2" $RDMA dev set rxe3 netns pod2
check "pod2 sees rxe3" ns_has_dev pod2 rxe3
check "ip netns del pod1 (holds rxe1 + eth1)" $IP netns del pod1
check "ip netns del pod2 (holds rxe3 + eth3)" $IP netns del pod2
for pair in rxe1:eth1 rxe3:eth3; do
  d=${pair%:*}; n=${pair#*:}
  check "$d is back in the host" wait_for 10 host_has_dev $d
  check "$n is back in the host" wait_for 10 $IP link show $n
  check "$d is paired with $n again" wait_for 10 sh -c "$RDMA link show $d/1 | grep -q 'netdev $n'"
  check "sysfs shows $d in the host" test -e /sys/class/infiniband/$d
done
ndev=$($RDMA dev | wc -l)
[ "$ndev" -eq "$VM_NICS" ] && ok "all $ndev devices in the host" || bad "$ndev devices in the host, want $VM_NICS"
finish
EOF

cat > "$WORK/payload/shared.sh" <<'EOF'
. /payload/lib.sh
echo "== shared mode"
check "rdma system reports shared" sh -c "$RDMA system | grep -q 'netns shared'"
check "ip netns add pod1" $IP netns add pod1
check "pod1 sees rxe0 without any move" ns_has_dev pod1 rxe0
check "host still sees rxe0" host_has_dev rxe0
check_not "moving a device is refused in shared mode" $RDMA dev set rxe0 netns pod1
finish
EOF

t0=$(date +%s)
"$SCRIPTS_DIR/vm-run.sh" --payload "$WORK/payload" --timeout 600 -- sh /payload/exclusive.sh
t1=$(date +%s)
"$SCRIPTS_DIR/vm-run.sh" --netns-mode shared --nics 2 --payload "$WORK/payload" --timeout 600 -- sh /payload/shared.sh
t2=$(date +%s)
echo "vm-smoke: all checks passed (exclusive boot $((t1 - t0))s, shared boot $((t2 - t1))s)"
