# The cases of mpi-link-test.sh (sourced by it): run NAME EXPECT MPIRUN-ARGS...
# What each showed is in docs/mpi.md.

# RDMA: UCX over the rxe device alone (no TCP transport, no other device),
# its UD transport, with UD's check of the destination GID off.
RDMA="--mca pml ucx -x UCX_NET_DEVICES=$DEV:1 -x UCX_TLS=ud_verbs,self -x UCX_UD_VERBS_ETH_DGID_CHECK=n"
run ucx-ud rdma $RDMA

# The same with UD's GID check on (UCX's default): the UD handshake never
# completes. Debug log for the GID UCX picks; transport timeout 10 s
# instead of 5 min to fail sooner.
FILTER='gid|GID|timeout error|Fatal'
run ucx-ud-dgid-check fail --mca pml ucx -x UCX_NET_DEVICES=$DEV:1 -x UCX_TLS=ud_verbs,self \
  -x UCX_UD_VERBS_TIMEOUT=10s -x UCX_LOG_LEVEL=debug
FILTER=

if [ "$EXTRA" = 1 ]; then
  # RC for the data (UD only for wire-up): with UCX's retransmission
  # timeout (1 s), then 20 ms; and UCX's own choice of transports.
  RC="--mca pml ucx -x UCX_NET_DEVICES=$DEV:1 -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_UD_VERBS_ETH_DGID_CHECK=n"
  run ucx-rc rdma $RC
  run ucx-rc-timeout-20ms rdma $RC -x UCX_RC_VERBS_TIMEOUT=20ms
  run ucx-any rdma --mca pml ucx -x UCX_NET_DEVICES=$DEV:1 -x UCX_UD_VERBS_ETH_DGID_CHECK=n
  echo "@@MPI-INFO rxe retransmissions of node 1: $(cd $P/hw_counters && grep . completer_retry_err duplicate_request | tr '\n' ' ')"
fi

# Open MPI's openib BTL: Debian's build has only the udcm connection
# scheme, which does not take RoCE ports.
run openib fail --mca pml ob1 --mca btl openib,self,vader --mca btl_openib_if_include $DEV:1 \
  --mca btl_openib_allow_ib 1 --mca btl_openib_warn_no_device_params_found 0

# RDMA asked of a worker that did not get its device (its sshd on 2223 runs
# where /dev/infiniband is empty): must fail, not fall back to TCP.
run ucx-ud-no-device fail $RDMA --mca plm_rsh_args "-p 2223"

# TCP for comparison, on the same netdev.
run tcp tcp --mca pml ob1 --mca btl tcp,self,vader --mca btl_tcp_if_include eth0

# No MCA parameter at all: Debian's /etc/openmpi/openmpi-mca-params.conf
# excludes pml ucx and btl openib, so the job runs over TCP.
run debian-defaults tcp
