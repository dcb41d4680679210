#!/usr/bin/python3
"""MPI allreduce of a float64 vector, checked, timed: the cross-node job of
the two-node Kubernetes test (issue 37) and scripts/mpi-link.sh.

Every rank contributes the same pattern scaled by (rank + 1); after each
Allreduce(SUM) every element must equal the pattern scaled by
1 + 2 + ... + ranks. Rank 0 prints one line of JSON; the exit status is 1
when any rank saw a wrong element.

Only the standard library and mpi4py: array.array('d') is a buffer mpi4py
passes to MPI without a copy, and the fill, reset and check run in C
(array repetition, slice assignment, a bytes comparison), which matters under
an emulated CPU.
"""

import argparse
import json
import sys
import time
from array import array

from mpi4py import MPI

# The pattern's period: a prime, so a block shifted by any multiple of 8
# bytes below it breaks the comparison.
PERIOD = 251


def pattern(scale, n):
    base = array('d', [float(scale * (i + 1)) for i in range(PERIOD)])
    return (base * (n // PERIOD + 1))[:n]


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--bytes', type=int, default=4 << 20,
                   help='vector size per rank in bytes, a multiple of 8 (default 4 MiB)')
    p.add_argument('--iters', type=int, default=10, help='timed iterations (default 10)')
    p.add_argument('--warmup', type=int, default=1,
                   help='untimed iterations first, checked too (default 1): connection set-up')
    a = p.parse_args()
    if a.bytes <= 0 or a.bytes % 8 or a.iters <= 0 or a.warmup < 0:
        p.error('--bytes must be a positive multiple of 8, --iters positive, --warmup not negative')

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = a.bytes // 8
    send = pattern(rank + 1, n)
    # Compared as bytes: one memcmp, where comparing arrays makes a float
    # object of every element.
    want = pattern(size * (size + 1) // 2, n).tobytes()
    zeros = array('d', bytes(a.bytes))
    recv = array('d', zeros)

    ok = True
    for it in range(a.warmup + a.iters):
        if it == a.warmup:
            comm.Barrier()
            start = time.perf_counter()
        recv[:] = zeros
        comm.Allreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], op=MPI.SUM)
        ok = ok and recv.tobytes() == want
    seconds = time.perf_counter() - start
    # Slowest rank's time, and every rank's verdict.
    seconds = comm.allreduce(seconds, op=MPI.MAX)
    ok = comm.allreduce(ok, op=MPI.LAND)

    if rank == 0:
        iters = a.warmup + a.iters
        # A bandwidth-optimal allreduce (ring: reduce-scatter then
        # allgather) has each rank send 2 (p-1)/p of the vector per
        # iteration; with 2 ranks that is the vector itself, as is the
        # recursive doubling Open MPI may pick instead (one full exchange).
        sent = 2 * (size - 1) * a.bytes * iters // size
        algbw = a.bytes * a.iters / seconds / 1e9
        print(json.dumps({
            'ranks': size,
            'bytes_per_rank': a.bytes,
            'iterations': a.iters,
            'warmup': a.warmup,
            'seconds': round(seconds, 4),
            'algbw_GBps': round(algbw, 4),
            'busbw_GBps': round(algbw * 2 * (size - 1) / size, 4),
            'ok': ok,
            'est_bytes_sent_per_rank': sent,
            'mpi': MPI.Get_library_version().rstrip('\x00').splitlines()[0],
        }), flush=True)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
