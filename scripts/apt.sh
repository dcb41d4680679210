#!/bin/sh
# apt.sh ARGS...: apt-get ARGS under one lock for the project's scripts.
# make test runs several of them at once (the cluster's build in the
# background beside the unit tests' promtool.sh and the VMs'
# vm-prepare.sh), and apt-get gives up at once, instead of waiting, when
# another apt-get holds the package lists or dpkg's lock.
exec flock /run/lock/rdma-netns-apt.lock apt-get "$@"
