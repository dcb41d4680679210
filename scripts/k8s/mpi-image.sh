#!/usr/bin/env bash
# The MPI workload image of the two-node test (issue 37): an OCI image
# archive (for `ctr images import`) of rdma-netns.test/rdma-mpi:1, linux/amd64,
# from Debian bookworm's packages: Open MPI 4.1.4 (openmpi-bin) with UCX
# 1.13 (libucx0, ucx-utils), mpi4py, OpenSSH's client and server, the verbs
# providers (rxe's among them), ibverbs-utils and perftest, busybox as the
# shell and its tools, and /usr/local/bin/allreduce.py (scripts/k8s/mpi).
# What it holds and how it runs: docs/mpi.md.
#
# The packages are unpacked, never installed: no maintainer script runs, so
# what those scripts would do is done here (users, update-alternatives'
# links, ld.so.cache), and packages that only serve maintainer scripts
# (SKIP_PKGS) are left out. Documentation, manuals, locales, headers and
# the perl scripts are pruned.
# Before packing, every ELF file's libraries must resolve in the tree.
#
# Cached: the .debs under ~/.cache/rdma-netns/mpi/debs-<key> (key: the
# file names of the closure minus SKIP_PKGS, hence every version) and the
# archive under ~/.cache/rdma-netns/mpi/image-<key>.tar (key: the .debs
# and the files the image is built from), so a second run downloads and
# builds nothing and copies the archive to OUT. The same inputs give the same
# bytes (file times and owners fixed, gzip without a name or time).
#
# Open MPI and UCX must be versions.env's OPENMPI_VERSION and UCX_VERSION.
# Needs root (owners in the tree, a chroot to byte-compile Python), as the
# VM tests do, and apt's package lists for bookworm (apt-get update is run
# when a package or a download is missing).
#
# Usage: mpi-image.sh OUT_TAR
set -euo pipefail

out=${1:?usage: mpi-image.sh OUT_TAR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
files=$here/mpi
cache=${XDG_CACHE_HOME:-$HOME/.cache}/rdma-netns/mpi
REF=rdma-netns.test/rdma-mpi:1
PKGS="openmpi-bin libucx0 ucx-utils python3-mpi4py openssh-server openssh-client
  ibverbs-providers ibverbs-utils perftest busybox-static"
# In the closure only through maintainer scripts (adduser, debconf, ucf,
# update-rc.d, ...), for what busybox does as well (ps, tar), or for
# hwloc's plugins (libhwloc-plugins: topology from OpenCL, NVIDIA's X
# extension, libpciaccess, libxml2 with its 36 MB of ICU; hwloc's core
# reads the topology from sysfs and writes its XML itself, and skips a
# plugin it cannot find). A package whose library a program loads must not
# be here, which the ELF check below would show.
SKIP_PKGS="adduser debconf dpkg init-system-helpers lsb-base passwd perl perl-base
  perl-modules-5.36 libperl5.36 libgdbm6 libgdbm-compat4 libfile-find-rule-perl
  libnumber-compare-perl libtext-glob-perl procps libproc2-0 runit-helper sensible-utils
  sysvinit-utils tar ucf usrmerge libsemanage2 libsemanage-common libsepol2 libpam-runtime
  libpam-modules libpam-modules-bin libacl1
  libhwloc-plugins libxml2 libicu72 libx11-6 libx11-data libxcb1 libxau6 libxdmcp6 libxext6
  libxnvctrl0 ocl-icd-libopencl1 libpciaccess0"
. "$here/../versions.sh"

log() { printf '[mpi-image] %s\n' "$*" >&2; }
die() { printf '[mpi-image] ERROR: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root: the image's files get their owners here and Python is byte-compiled in a chroot"
for t in apt-get dpkg-deb tar gzip sha256sum ldconfig chroot; do
  command -v "$t" > /dev/null || die "$t not found (a Debian host has it)"
done
mkdir -p "$cache"
exec 9> "$cache/.lock"
flock 9

sha() { sha256sum | cut -c1-16; }

# closure prints the .deb file names of PKGS and everything they depend on
# (no recommends), as a machine with nothing installed would download them.
closure() {
  local empty
  empty=$(mktemp -d "$cache/.archives.XXXXXX")
  apt-get install -y --print-uris -o Debug::NoLocking=1 -o Dir::State::status=/dev/null \
    -o Dir::Cache::Archives="$empty" -o APT::Install-Recommends=false $PKGS 2> /dev/null |
    awk '/^'\''/ { print $2 }' | LC_ALL=C sort
  rm -rf "$empty"
}

# name=version arguments for apt-get download, from file names
# (NAME_VERSION_ARCH.deb, the epoch's colon as %3a).
download_args() {
  sed -e 's/%3a/:/g' -e 's/^\([^_]*\)_\([^_]*\)_.*/\1=\2/'
}

APT_UPDATED=0
apt_update() {
  [ "$APT_UPDATED" = 0 ] || return 1
  log "apt-get update"
  "$here/../apt.sh" update -qq > /dev/null || die "apt-get update failed"
  APT_UPDATED=1
}

# unpacked filters the closure down to the packages the image holds.
unpacked() {
  local f
  for f in $(closure); do
    case " $(echo $SKIP_PKGS) " in *" ${f%%_*} "*) ;; *) echo "$f" ;; esac
  done
}

debs=$(unpacked)
if [ -z "$debs" ]; then
  apt_update
  debs=$(unpacked)
fi
[ -n "$debs" ] || die "apt cannot resolve $(echo $PKGS) (apt-get install --print-uris prints nothing; is this bookworm with its package lists?)"

# fetch downloads the closure into its key's directory unless it is there.
fetch() {
  key=$(echo "$debs" | sha)
  dir=$cache/debs-$key
  [ -f "$dir/.complete" ] && return 0
  rm -rf "$dir"
  mkdir -p "$dir"
  log "downloading $(echo "$debs" | wc -l) packages into $dir"
  (cd "$dir" && echo "$debs" | download_args | xargs apt-get download -q > /dev/null 2>&1) || return 1
  echo "$debs" > "$dir/.complete"
}
if ! fetch; then
  # Lists a few days old may name versions the mirror dropped.
  apt_update || die "apt-get download failed after apt-get update"
  debs=$(unpacked)
  fetch || die "apt-get download of the closure failed; see: cd $dir && apt-get download $(echo "$debs" | download_args | tr '\n' ' ')"
fi
# upstream_of NAME: the upstream version of NAME's .deb in the closure.
upstream_of() { echo "$debs" | sed -n "s/^$1_\([0-9.]*\)-.*/\1/p"; }
for want in "openmpi-bin ${OPENMPI_VERSION#v} OPENMPI_VERSION" "libucx0 ${UCX_VERSION#v} UCX_VERSION"; do
  set -- $want
  [ "$(upstream_of "$1")" = "$2" ] || die "apt offers $1 $(upstream_of "$1"), versions.env says $3=v$2: make them agree"
done

image_key=$( (echo "$debs" "$SKIP_PKGS"; cat "${BASH_SOURCE[0]}" "$files"/*) | sha)
cached=$cache/image-$image_key.tar
if [ ! -f "$cached" ]; then
  start=$(date +%s)
  work=$(mktemp -d "$cache/.build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  R=$work/root
  # bookworm's merged /usr: /bin, /sbin, /lib, /lib64 are links into /usr,
  # kept as links while the packages are unpacked over them.
  mkdir -p "$R"/usr/{bin,sbin,lib,lib64,local/bin} "$R"/{etc,tmp,run,proc,sys,dev,home,root,var/tmp}
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$R/$d"; done
  n=0
  for f in $debs; do
    dpkg-deb --fsys-tarfile "$dir/$f" | tar -x --keep-directory-symlink -C "$R"
    n=$((n + 1))
  done
  log "unpacked $n packages (left out of the closure: $(echo $SKIP_PKGS | wc -w))"
  before=$(du -sm "$R" | cut -f1)
  rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bug,bash-completion,zsh,menu,pixmaps,gdb,apport} \
    "$R"/usr/lib/x86_64-linux-gnu/openmpi/include \
    "$R"/usr/lib/python3.11/{ensurepip,idlelib,lib2to3,pydoc_data,tkinter,turtledemo} \
    "$R"/etc/init.d "$R"/etc/systemd "$R"/usr/lib/systemd "$R"/etc/rc?.d "$R"/etc/runit "$R"/usr/share/runit
  # A pure runtime: no program of the image runs perl (checked here).
  perl=$(grep -rlI '^#!.*perl' "$R"/usr/bin "$R"/usr/sbin 2> /dev/null || true)
  [ -z "$perl" ] || rm -f $perl
  log "pruned $((before - $(du -sm "$R" | cut -f1))) MB (docs, manuals, locales, headers); removed perl scripts: $(echo ${perl:-none} | sed "s|$R||g")"

  # What the maintainer scripts would have done.
  # update-alternatives (openmpi-bin, mpi-default-bin): the generic names.
  for b in mpirun mpiexec; do
    [ -e "$R/usr/bin/$b.openmpi" ] || die "openmpi-bin has no /usr/bin/$b.openmpi"
    ln -s "$b.openmpi" "$R/usr/bin/$b"
  done
  # busybox: its applets as links, wherever no package put a real program.
  for a in $("$R/usr/bin/busybox" --list-full); do
    case $a in linuxrc) continue ;; esac
    [ -e "$R/$a" ] || [ -L "$R/$a" ] || ln -s /usr/bin/busybox "$R/$a"
  done
  # libpsm-infinipath1's alternative (Open MPI's psm MTL loads it).
  ln -s ../libpsm1/libpsm_infinipath.so.1.16 "$R/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
  # Users: root; mpiuser (1000), who runs the job and the workers' sshd;
  # sshd, the privilege separation user of an sshd run as root (an sshd
  # run as mpiuser needs none; the name is where sshd expects it).
  cat > "$R/etc/passwd" << 'EOF'
root:x:0:0:root:/root:/bin/sh
sshd:x:100:65534::/run/sshd:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
mpiuser:x:1000:1000:MPI job:/home/mpiuser:/bin/sh
EOF
  cat > "$R/etc/group" << 'EOF'
root:x:0:
nogroup:x:65534:
mpiuser:x:1000:
EOF
  # Passwords are never used (public keys only); '*' in /etc/shadow,
  # which only root reads: sshd running as mpiuser cannot read it and
  # then takes the account as not locked.
  printf 'root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\nmpiuser:*:19000:0:99999:7:::\n' > "$R/etc/shadow"
  chmod 0600 "$R/etc/shadow"
  printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' > "$R/etc/nsswitch.conf"
  mkdir -p "$R/home/mpiuser/.ssh" "$R/run/sshd"
  chown -R 1000:1000 "$R/home/mpiuser"
  chmod 0700 "$R/home/mpiuser/.ssh"
  chmod 1777 "$R/tmp" "$R/var/tmp"
  chmod 0755 "$R/run/sshd"
  install -m 0644 "$files/sshd_config" "$R/etc/ssh/sshd_config.mpi"
  install -m 0644 "$files/ssh_config" "$R/etc/ssh/ssh_config"
  install -m 0755 "$files/allreduce.py" "$R/usr/local/bin/allreduce.py"
  # ld.so.cache (libc-bin's job): Open MPI's and UCX's libraries and
  # plugins sit in directories that ld.so.conf.d names.
  echo 'include /etc/ld.so.conf.d/*.conf' > "$R/etc/ld.so.conf"
  ldconfig -r "$R"
  # Python's byte code for what allreduce.py imports: mpiuser cannot write
  # __pycache__ under /usr, and compiling at every start is slow under an
  # emulated CPU.
  chroot "$R" /usr/bin/python3 -c 'import argparse, array, json, sys, time, mpi4py'

  # Every ELF file's libraries resolve in the tree (what the left-out
  # packages and the pruning must not break): ld.so's --list, run in the
  # tree, names a missing one ("=> not found", or "error while loading
  # shared libraries" when the file itself needs it).
  missing=$(cd "$R" && find usr -type f \( -perm -u+x -o -name '*.so*' \) -printf '/%p\n' |
    while read -r f; do
      # Dynamic ELF files only: ld.so --list crashes on a static one,
      # for which --verify exits 1 (0 for programs, 2 for libraries).
      [ "$(head -c4 "$R$f" | od -An -c | tr -d ' ')" = 177ELF ] || continue
      rc=0; chroot "$R" /lib64/ld-linux-x86-64.so.2 --verify "$f" > /dev/null 2>&1 || rc=$?
      [ "$rc" != 1 ] || continue
      chroot "$R" /lib64/ld-linux-x86-64.so.2 --list "$f" 2>&1 |
        sed -n -e "s|^[[:space:]]*\(.* => not found\)|$f: \1|p" -e "s|.*error while loading shared libraries: |$f: |p"
    done)
  [ -z "$missing" ] || die "libraries missing in the image:
$missing"

  log "root filesystem: $(du -sm "$R" | cut -f1) MB"
  # One layer, its files dated 0 and sorted, owners by number.
  tar --sort=name --mtime=@0 --numeric-owner --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$R" -cf "$work/layer.tar" .
  diff_id=$(sha256sum < "$work/layer.tar" | cut -d' ' -f1)
  gzip -n -6 "$work/layer.tar"
  L=$work/layout
  mkdir -p "$L/blobs/sha256"
  blob() { # FILE MEDIATYPE: moves FILE into the layout, prints its descriptor
    local d s
    d=$(sha256sum < "$1" | cut -d' ' -f1) s=$(stat -c %s "$1")
    mv "$1" "$L/blobs/sha256/$d"
    printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$d" "$s"
  }
  layer=$(blob "$work/layer.tar.gz" application/vnd.oci.image.layer.v1.tar+gzip)
  printf '%s' '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z",'\
'"config":{"User":"1000:1000","WorkingDir":"/home/mpiuser","Env":["PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin","HOME=/home/mpiuser"],"Cmd":["/bin/sh"]},'\
'"rootfs":{"type":"layers","diff_ids":["sha256:'"$diff_id"'"]},'\
'"history":[{"created":"1970-01-01T00:00:00Z","created_by":"scripts/k8s/mpi-image.sh"}]}' > "$work/config"
  config=$(blob "$work/config" application/vnd.oci.image.config.v1+json)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
    "$config" "$layer" > "$work/manifest"
  manifest=$(blob "$work/manifest" application/vnd.oci.image.manifest.v1+json)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
    "${manifest%\}},\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$REF\",\"org.opencontainers.image.ref.name\":\"$REF\"}}" \
    > "$L/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$L/oci-layout"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$L" -cf "$work/image.tar" oci-layout index.json blobs
  mv "$work/image.tar" "$cached"
  # Archives of other inputs: the last three are kept.
  ls -t "$cache"/image-*.tar | tail -n +4 | xargs -r rm -f
  log "built $cached in $(($(date +%s) - start)) s"
fi
mkdir -p "$(dirname "$out")"
cp "$cached" "$out.tmp"
mv "$out.tmp" "$out"
log "$REF: $out ($(($(stat -c %s "$out") / 1048576)) MB compressed)"
