"""CuTe DSL body of L2_PREFETCH (mk/instructions/prefetch.py: arguments and faces). GPU path only:
imports cutlass at the top, hence the leading "_" (the opcode registry never imports it).

The megakernel's loader warp runs it: its 32 lanes issue `cp.async.bulk.prefetch.L2.global` over
the byte ranges of the instruction's weight rows, at most CHUNK bytes each, and go on at once (the
copy engine fetches asynchronously; nothing waits for it, no page is used, nothing is signalled).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.experimental.primitives as prims
from cutlass import BFloat16, Int32, Int64

from mk.ir import Op

OP_L2_PREFETCH = int(Op.L2_PREFETCH)
CHUNK = 16384               # bytes per bulk prefetch (a multiple of 16)


@cute.jit
def prefetch_bytes(addr: Int64, nbytes: Int32, first: Int32, step: Int32):
    """Bulk prefetches of the CHUNK-byte pieces at first, first + step, ... of [addr, addr +
    nbytes) (nbytes and addr multiples of 16)."""
    for off in range(first, nbytes, step):
        size = cutlass.min(nbytes - off, Int32(CHUNK))
        prims.cp_async_bulk_prefetch(
            cute.make_ptr(BFloat16, addr + Int64(off), cute.AddressSpace.gmem, assumed_align=16),
            size)


@cute.jit
def l2_prefetch(w: cute.Tensor, layer: Int32, row0: Int32, rows: Int32, k0: Int32, k1: Int32,
                lane: Int32):
    """Loader warp: weight rows [row0, row0 + rows) x K columns [k0, k1) of layer `layer` of w, the
    GEMM slot's (N, K, L) view of the [L, N, K] bf16 weights (K contiguous). One instruction covers
    at most 2 GiB (the planner's are ~512 KiB)."""
    K = w.shape[1]
    base = w.iterator.toint() + Int64(cute.crd2idx((row0, 0, layer), w.layout)) * 2
    if k1 - k0 == K:                    # (0 <= k0 < k1 <= K: whole rows)
        # one contiguous range, its CHUNK pieces dealt to the lanes in turn
        prefetch_bytes(base, rows * K * 2, lane * CHUNK, Int32(32 * CHUNK))
    else:
        # the same K columns of every row: lane i takes rows i, i + 32, ...
        for r in range(lane, rows, 32):
            prefetch_bytes(base + (Int64(r) * Int64(K) + Int64(k0)) * 2, (k1 - k0) * 2,
                           Int32(0), Int32(CHUNK))

