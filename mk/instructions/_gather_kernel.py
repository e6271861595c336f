"""CuTe DSL device bodies of EMBED and LM_NORM for mk.megakernel: row gathers driven by the step
metadata (the torch faces: mk/instructions/embed.py, mk/instructions/lm.py).

GPU path only: this module imports cutlass at the top, so its name starts with "_" and the opcode
registry never imports it.

Both bodies go straight from global memory to global memory with 16-byte vector loads and stores.
By default (GATHER_ROLE "storer") they run in the megakernel's storer warps (64 threads) alone and
use no shared-memory page: the loader and the consumer warpgroups only pass the instruction slot
on, and the storer's signal (after its named barrier, in the megakernel) is ordered after every
store of the instruction, as for the other families. With MK_GATHER_ROLE=consumers both consumer
warpgroups run EMBED's body here and LM_NORM through RMSNORM's own (see GATHER_ROLE). The rows
they read were written by
other CTAs' generic stores (EMBED: none; LM_NORM: HIDDEN by the last layer's DOWN tiles), made
visible by the controller's ld.acquire of the instruction's counters.

EMBED (TP 1, STORE epilogue): HIDDEN[row, c] = table[tokens[row], c] for the tile's rows x columns;
a token id outside [0, V) stores zeros (check_plan cannot see the metadata; the face raises).
Vectors are spread over the role's threads, `unroll` loads in flight per thread before their
stores.

LM_NORM: LAST_NORMED[row0 + s] = rmsnorm(HIDDEN[last_rows[s]]) * final_norm, with the rows
family's numerics (mk/instructions/_rows_kernel.py rows_consume, RMSNORM): fp32 sum of squares,
rs = rsqrt(ss / H + eps), y = bf16(bf16(x * rs) * w). In the storer (lm_norm_store): one warp per
sequence row, two passes over the row (the statistic, then the scaled store; the second pass
reads L2-resident data).
"""

from __future__ import annotations

import os

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from mk.instructions import _common as mc
from mk.instructions import _rows_kernel as rk
from mk.instructions._rows_kernel import imin, udiv, warp_allreduce_sum
from mk.ir import Op

OP_EMBED = int(Op.EMBED)
OP_LM_NORM = int(Op.LM_NORM)
VEC = 8                 # bf16 elements per 16-byte vector
UNROLL = 4              # vectors in flight per thread (EMBED) or lane (LM_NORM), storer role
UNROLL_CONSUMERS = 8    # the same, consumer role (216 registers a thread instead of 72)
# MK_GATHER_ROLE (compile-time): the warps that run EMBED / LM_NORM.
#   storer     (default) the storer's 64 threads, UNROLL vectors a thread (or lane) in flight
#   consumers  both consumer warpgroups on RMSNORM's protocol (the loader grants one page without
#              data, the consumers run the body and arrive on its `done` after their stores, the
#              storer waits for it, frees it and signals): EMBED's body here with
#              UNROLL_CONSUMERS vectors a thread in flight, LM_NORM through RMSNORM's body
#              (mk/instructions/_rows_kernel.py rmsnorm_consume, its `gather`: the rows' sources
#              from the metadata, row groups over 256 threads, one pass over a row)
# Why (session 48's journal of B=4096, bench/results/shares_3474b9c_2026-12-05_s48_h100.json):
# an EMBED tile (128 rows x 256 columns, the DOWN grid) took 82 us and an LM_NORM of 32 rows 280 us,
# 4 KiB in flight an SM (latency-bound: ~16 and ~256 L2 round trips); their instructions are
# ~0.75 ms of the step's 133 ms critical path. The consumers keep 8x the bytes in flight; EMBED's
# rows are bitwise the same, LM_NORM's within the rows family's numerics (its statistic summed
# in RMSNORM's order, not lm_norm_store's).
# Compile: session 48's build, with lm_norm_store on the consumers too, spilled 16 bytes in the
# class above 1024 tokens; through RMSNORM's body (session 49) every class compiles with 0
# spills and the consumers carry one norm body instead of two.
GATHER_ROLE = os.environ.get("MK_GATHER_ROLE", "storer")
if GATHER_ROLE not in ("storer", "consumers"):
    raise ValueError(f"MK_GATHER_ROLE={GATHER_ROLE!r}: storer (default) or consumers")


@cute.jit
def gvec(addr: Int64):
    """16 bytes (4 x int32) of global memory at byte address addr."""
    return cute.make_tensor(cute.make_ptr(Int32, addr, cute.AddressSpace.gmem, assumed_align=16),
                            cute.make_layout(4))


@cute.jit
def gvec_bf16(addr: Int64):
    """8 bf16 (16 bytes) of global memory at byte address addr."""
    return cute.make_tensor(cute.make_ptr(BFloat16, addr, cute.AddressSpace.gmem,
                                          assumed_align=16), cute.make_layout(VEC))


@cute.jit
def embed_store(table: cute.Tensor, meta: cute.Tensor, dst_base: Int64, ld: Int32, row0: Int32,
                rows: Int32, col0: Int32, cols: Int32, sid: Int32,
                nthreads: cutlass.Constexpr, unroll: cutlass.Constexpr = UNROLL, parts=None):
    """EMBED tile (rows x cols, cols % 8 == 0): dst_base is the byte address of the destination
    buffer's [0, 0] (bf16, row pitch ld elements); table: [V, Ht] bf16, compact. sid: the
    thread's index among the role's nthreads.
    parts (PlanConfig.norm_fold=4's variants): (ROW_PART's address, its row length, the tile's
    A_ROW_PART word): where the word is > 0, each row's sums of squares over each 64 columns go
    to ROW_PART[row0 + r, word - 1 + (col0 + c) / 64] (col0 and cols multiples of 64,
    check_plan: a group's 8 vectors are 8 consecutive threads' of one warp, summed by a
    butterfly over them)."""
    V = table.shape[0]
    ldt = table.shape[1]
    tbase = table.iterator.toint()
    off_tok = meta[mc.M_OFF_TOKENS] + row0
    cpr = cols // VEC                      # vectors per row
    nv = rows * cpr
    i0 = Int32(0)
    while i0 < nv:
        vals = cute.make_rmem_tensor(cute.make_layout((4, unroll)), Int32)
        for u in cutlass.range_constexpr(unroll):
            vi = i0 + u * nthreads + sid
            for k in cutlass.range_constexpr(4):
                vals[k, u] = Int32(0)
            if vi < nv:
                r = udiv(vi, cpr)
                c = col0 + (vi - r * cpr) * VEC
                tok = meta[off_tok + r]
                if tok >= 0:
                    if tok < V:
                        v = gvec(tbase + (Int64(tok) * Int64(ldt) + Int64(c)) * 2).load()
                        for k in cutlass.range_constexpr(4):
                            vals[k, u] = v[k]
        for u in cutlass.range_constexpr(unroll):
            vi = i0 + u * nthreads + sid
            if cutlass.const_expr(parts is not None):
                # (every lane: the butterfly takes the whole warp; a lane past the tile adds 0)
                sq = Float32(0.0)
                for k in cutlass.range_constexpr(4):
                    lo, hi = rk.unpack_bf16x2(vals[k, u])
                    sq = sq + lo * lo + hi * hi
                for off in cutlass.range_constexpr(3):
                    sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=1 << off)
                if vi < nv:
                    if parts[2] > 0:
                        if sid % 8 == 0:
                            r = udiv(vi, cpr)
                            col = parts[2] - 1 + (col0 + (vi - r * cpr) * VEC) // 64
                            cute.make_tensor(cute.make_ptr(
                                Float32, parts[0] + (Int64(row0 + r) * Int64(parts[1])
                                                     + Int64(col)) * 4,
                                cute.AddressSpace.gmem, assumed_align=4), cute.make_layout(1))[0] = sq
            if vi < nv:
                r = udiv(vi, cpr)
                c = col0 + (vi - r * cpr) * VEC
                d = gvec(dst_base + (Int64(row0 + r) * Int64(ld) + Int64(c)) * 2)
                for k in cutlass.range_constexpr(4):
                    d[k] = vals[k, u]
        i0 = i0 + unroll * nthreads


@cute.jit
def lm_norm_store(meta: cute.Tensor, src_base: Int64, ld_src: Int32, n_src_rows: Int32,
                  last_off: Int32, out: cute.Tensor, normw: cute.Tensor, wrow: Int32, eps: Float32,
                  row0: Int32, rows: Int32, width: Int32, sid: Int32,
                  nthreads: cutlass.Constexpr, unroll: cutlass.Constexpr = UNROLL):
    """LM_NORM: out[row0 + s, :width] = rmsnorm(src[meta[last_off + s], :width]) * normw[wrow]
    for s < rows (width % 8 == 0). src_base: byte address of the source buffer's [0, 0] (bf16,
    row pitch ld_src); out: LAST_NORMED [S, H] bf16, compact. A source row outside the buffer
    (bad metadata) leaves its output row unwritten."""
    warp = sid // 32
    lane = sid % 32
    nwarps = nthreads // 32
    ldo = out.shape[1]
    obase = out.iterator.toint()
    wbase = normw.iterator.toint() + Int64(wrow) * Int64(normw.shape[1]) * 2
    fcols = Float32(width)
    s = warp
    while s < rows:
        srow = meta[last_off + s]
        if srow >= 0:
            if srow < n_src_rows:
                xb = src_base + Int64(srow) * Int64(ld_src) * 2
                ob = obase + Int64(row0 + s) * Int64(ldo) * 2
                # `unroll` vectors of the row in flight per lane and pass (one L2 round trip each
                # was 17.6 us at B=1, session 7); a vector past the row is loaded from its last
                # vector instead and not used, and the sum keeps the one-at-a-time order
                ss = Float32(0.0)
                c = lane * VEC
                while c < width:
                    xs = []
                    for u in cutlass.range_constexpr(unroll):
                        xs.append(gvec_bf16(xb + Int64(imin(c + u * 32 * VEC, width - VEC)) * 2
                                            ).load())
                    for u in cutlass.range_constexpr(unroll):
                        if c + u * 32 * VEC < width:
                            x = xs[u].to(Float32)
                            ss = ss + (x * x).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                    c = c + unroll * 32 * VEC
                ss = warp_allreduce_sum(ss)
                rs = cute.math.rsqrt(ss / fcols + eps)
                c = lane * VEC
                while c < width:
                    xs = []
                    ws = []
                    for u in cutlass.range_constexpr(unroll):
                        cu = Int64(imin(c + u * 32 * VEC, width - VEC)) * 2
                        xs.append(gvec_bf16(xb + cu).load())
                        ws.append(gvec_bf16(wbase + cu).load())
                    for u in cutlass.range_constexpr(unroll):
                        cu = c + u * 32 * VEC
                        if cu < width:
                            y = (xs[u].to(Float32) * rs).to(BFloat16).to(Float32) * \
                                ws[u].to(Float32)
                            gvec_bf16(ob + Int64(cu) * 2).store(y.to(BFloat16))
                    c = c + unroll * 32 * VEC
        s = s + nwarps
