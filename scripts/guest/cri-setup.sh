#!/bin/sh
# What a node running containerd has and the test VM's initramfs lacks, and
# conf/containerd's files installed where a node has them. Run once per boot
# by e2e/cri/cririg.Setup (idempotent). See scripts/README.md.
set -eu
conf=${1:-/payload/containerd}

# runc and containerd's CRI need cgroup v2 mounted (cgroupfs driver).
mkdir -p /sys/fs/cgroup
grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts || mount -t cgroup2 cgroup2 /sys/fs/cgroup
# containerd copies these two into every sandbox.
[ -s /etc/hosts ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' > /etc/hosts
[ -e /etc/resolv.conf ] || : > /etc/resolv.conf
# containerd's root on a tmpfs of its own (the native snapshotter copies
# image layers there), so that what it stores is easy to measure and drop.
mkdir -p /var/lib/containerd
grep -q ' /var/lib/containerd ' /proc/mounts || mount -t tmpfs -o mode=0711 tmpfs /var/lib/containerd

# conf/containerd as a node has it: the drop-in with the runtime handlers,
# the default network in /etc/cni/net.d, one directory per handler.
mkdir -p /etc/containerd/conf.d
cp "$conf/rdma-netns.toml" /etc/containerd/conf.d/rdma-netns.toml
for d in "$conf"/*.d; do
  dst=/etc/cni/$(basename "$d")
  mkdir -p "$dst"
  cp "$d"/*.conflist "$dst/"
done
