"""CuTe DSL device body of SPLITK_REDUCE for mk.megakernel (the torch face: mk/instructions/splitk.py;
the split tiles themselves run through their opcode's GEMM slot, mk/instructions/_gemm_kernel.py:
SplitTile, store_partial).

GPU path only: this module imports cutlass at the top, so its name starts with "_" and the opcode
registry never imports it.

SPLITK_REDUCE finishes ONE output tile (rows [row0, row0+rows) x columns [col0, col0+cols), the same
words as its split tiles) of the GEMM opcode in its word ARG0+0:
    acc = sum_j SPLITK[j * stride + r, c] in float32, j = 0 .. nsplit-1 in order (deterministic)
    y   = bf16(acc)                                    (the unsplit F.linear output rounding)
    y   = bf16(acc * s), s = ROW_SCALE[row0 + r]       with the row scale (word ARG0+10, QKV_ROPE
                                                       and GATE_UP only: the RMSNORM folded into
                                                       the GEMM, PlanConfig.norm_fold; s float32,
                                                       rk.row_scale_at)
then exactly the unsplit opcode's epilogue, with the same functions the GEMM epilogues call
(_gemm_kernel.py: residual_add, silu_mul_bf16, rope_cos_sin / rope_lo / rope_hi, gemm_dest /
dest_row / row_addr):
    O_PROJ / DOWN  RESIDUAL   dst[r, c] = bf16(dst[r, c] + y)
    GATE_UP        SILU_MUL   dst[r, c] = bf16(silu(y_gate) * y_up), y_up from SPLITK column I + c
    QKV_ROPE       ROPE       q/k sections: RoPE of column c < 64 of a head with its partner c + 64
                              (one work item: both read once, one cos/sin), then Q store or the
                              K/V cache append (64-bit row x pitch: the 70B rank's cache passes
                              2^31 bytes); v: the bf16 rows.
Its words ARG0+3+i are the unsplit instruction's words ARG0+i (src, dst, epi / section, ...), so the
destination comes from the unsplit decoder (gk.gemm_dest).

Roles: elementwise, no operand pages. Both consumer warpgroups (256 threads) do the work straight
from global memory (the partials are L2-resident: written by the split tiles just before) to global
memory, 8 output columns per item: 2 x 16-byte float32 loads per split (and as many for the up
columns of GATE_UP), rk.SPLITS_IN_FLIGHT splits' loads issued together (rk.sum_splits), one
16-byte store (QKV_ROPE: 8 columns + their 8 partners per item). The loader grants one ring page
with no TMA and the consumers arrive `done` on it after their stores; the storer
(rk.store_handoff, shared with RMSNORM) waits on that `done`, frees the page and signals: the
page's barriers order the consumers' global stores before the storer's signal (the hand-off the
GEMM storer's stores get from its named barrier), with the ring's usual one-phase-per-use rule.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from mk import tiles
from mk.instructions import _common as mc
from mk.instructions import _gemm_kernel as gk
from mk.instructions import _rows_kernel as rk
from mk.instructions import matmul as mm
from mk.instructions import qkv as qk
from mk.instructions import splitk as sk
from mk.instructions._gather_kernel import gvec_bf16
from mk.instructions._rows_kernel import bar_wait, page_of
from mk.ir import ARG0, W_COL0, W_COLS, W_ROW0, W_ROWS, Op

OP_SPLITK_REDUCE = int(Op.SPLITK_REDUCE)
SPLITK_OPS = tuple(int(o) for o in sk.SPLITTABLE)
ROW_SCALED_OPS = tuple(int(o) for o in sk.ROW_SCALED)   # the reduces that may scale their rows
# SPLITK_REDUCE words relative to ARG0 (mk/instructions/splitk.py)
R_OP = sk.A_OP - ARG0           # the GEMM opcode it finishes
R_NSPLIT = sk.A_NSPLIT - ARG0   # nsplit
R_STRIDE = sk.A_STRIDE - ARG0   # SPLITK row stride between splits
R_EPI0 = sk.A_WORDS - ARG0      # word ARG0 + R_EPI0 + i = the unsplit instruction's word ARG0 + i
UNSPLIT_WORDS = sk.UNSPLIT_WORDS    # the unsplit words: R_EPI0 .. R_EPI0 + UNSPLIT_WORDS - 1
R_ROW_SCALE = sk.A_ROW_SCALE - ARG0  # nonzero: acc *= ROW_SCALE[row] (QKV_ROPE, GATE_UP)
R_ROW_PART_COL = sk.A_ROW_PART_COL - ARG0   # FROM_ROW_PART: the set's first column
FROM_ROW_PART = sk.FROM_ROW_PART    # the row scale word's value: from ROW_PART (norm_fold=4)
# the unsplit tile's K word among the reduce's copies of its words (R_EPI0 + i)
U_K, U_K_QKV = mm.A_K - ARG0, qk.A_K - ARG0
VEC = 8             # output columns per work item (one 16-byte bf16 store)


@cute.jit
def reduce_consume(epi: cutlass.Constexpr, ring: cute.Tensor, base: Int32, sk: cute.Tensor,
                   T: Int32, y: cute.Tensor, kv: cute.Tensor, meta: cute.Tensor,
                   inv_freq: cute.Tensor, yb: cutlass.Constexpr, up_col: Int32, pool: Int32,
                   full: cute.Pointer, done: cute.Pointer, pg: Int32, npages: cutlass.Constexpr,
                   ctid: Int32, timeout_ns: Int64, state: cute.Tensor, ticket: Int32,
                   share: cutlass.Constexpr, row_parts=None) -> Int32:
    """Both consumer warpgroups (ctid in [0, 256)): one SPLITK_REDUCE (see the module docstring)
    of a GEMM slot compiled with epilogue `epi`, whose destination tensor is y (Buf ids from yb;
    the K/V caches kv for QKV_ROPE's k/v sections). up_col: GATE_UP's SPLITK column of the up
    part (intermediate_local). T: the arena's token rows (where ROW_SCALE lies in sk,
    rk.row_scale_at). row_parts (the slots with GemmSlot.row_parts: (hidden size, eps, the
    consumers' named barrier)): a reduce whose row scale word is FROM_ROW_PART first computes
    its rows' scales from ROW_PART into its page (row_part_scales). Returns the new page count
    (one page)."""
    lane = ctid % 32
    page, ph = page_of(pg, npages)
    # the hand-off page: its previous use is complete (parity order of the ring)
    bar_wait(full + page, ph, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
    row0 = ring[base + W_ROW0]
    rows = ring[base + W_ROWS]
    col0 = ring[base + W_COL0]
    cols = ring[base + W_COLS]
    e0 = base + ARG0 + R_EPI0
    nsplit = ring[base + ARG0 + R_NSPLIT]
    stride = ring[base + ARG0 + R_STRIDE]
    ld = sk.shape[1]
    pb = gk.row_addr(sk.iterator.toint(), row0, ld, col0, 4)
    sec = Int32(0)
    pos_off = Int32(0)
    scaled = Int32(0)       # the row scale word: only the QKV_ROPE / GATE_UP reduces have one
    if cutlass.const_expr(epi != gk.EPI_RESIDUAL):
        scaled = ring[base + ARG0 + R_ROW_SCALE]
    if cutlass.const_expr(epi == gk.EPI_ROPE):
        sec = ring[e0 + gk.U_SECTION]
        pos_off = meta[mc.M_OFF_POS]
    ybase, yld, rowmap, radd, dcol0 = gk.gemm_dest(epi, y, kv, meta, ring, base, e0, yb, col0)
    scales = None
    if cutlass.const_expr(row_parts is not None and epi != gk.EPI_RESIDUAL):
        scales = cute.make_tensor(cute.make_ptr(Float32, pool + page * rk.PAGE,
                                                cute.AddressSpace.smem, assumed_align=16),
                                  cute.make_layout(ROW_PART_MAX_ROWS))
        if scaled == FROM_ROW_PART:
            row_part_scales(scales, ring, base, e0, epi, sk, T, row_parts, row0, rows, ctid)
    acc = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)
    other = cute.make_rmem_tensor(cute.make_layout(VEC), Float32)   # up part / RoPE partner
    out = cute.make_rmem_tensor(cute.make_layout(VEC), BFloat16)
    out_hi = cute.make_rmem_tensor(cute.make_layout(VEC), BFloat16)  # RoPE: the partner's output
    # RoPE items are 8 columns of a head's low half AND their rotate-half partners (c + 64): each
    # partial is read once and cos/sin serve both (the whole-head tiles start on a head)
    grp = 2 * VEC if epi == gk.EPI_ROPE else VEC
    cpr = cols // grp
    n = rows * cpr
    it = ctid
    while it < n:
        r = rk.udiv(it, cpr)
        ci = it - r * cpr
        c = ci * VEC
        if cutlass.const_expr(epi == gk.EPI_ROPE):
            c = (ci // 8) * 128 + (ci % 8) * VEC
        drow = row0 + r
        res = None
        if cutlass.const_expr(epi == gk.EPI_RESIDUAL):
            # the residual's load in flight with the first splits'
            res = gvec_bf16(gk.row_addr(ybase, drow, yld, dcol0 + c, 2)).load()
            rk.sum_splits([acc], pb, Int64(ld), stride, nsplit, r, [c], rk.SPLITS_IN_FLIGHT)
        else:
            # both sums of the item: GATE_UP's gate and up parts, QKV's rotate-half partners
            c2 = c + 64
            if cutlass.const_expr(epi == gk.EPI_SILU_MUL):
                c2 = c + up_col
            # the row scale (1 without it: x * 1 is x exactly), loaded with the splits' loads
            rs = Float32(1.0)
            if cutlass.const_expr(scales is None):
                if scaled != 0:
                    rs = rk.row_scale_at(sk, T, drow)[0]
            else:
                if scaled == FROM_ROW_PART:
                    rs = scales[r]
                elif scaled != 0:
                    rs = rk.row_scale_at(sk, T, drow)[0]
            rk.sum_splits([acc, other], pb, Int64(ld), stride, nsplit, r, [c, c2],
                          rk.SPLITS_IN_FLIGHT)
            for e in cutlass.range_constexpr(VEC):
                acc[e] = acc[e] * rs
                other[e] = other[e] * rs
        if cutlass.const_expr(epi == gk.EPI_SILU_MUL):
            for e in cutlass.range_constexpr(VEC):
                out[e] = gk.silu_mul_bf16(acc[e], other[e]).to(BFloat16)
        elif cutlass.const_expr(epi == gk.EPI_RESIDUAL):
            resf = res.to(Float32)
            for e in cutlass.range_constexpr(VEC):
                out[e] = gk.residual_add(resf[e], acc[e]).to(BFloat16)
        else:
            assert epi == gk.EPI_ROPE, f"SPLITK_REDUCE has no epilogue {epi}"
            for e in cutlass.range_constexpr(VEC):      # v section: y itself
                out[e] = acc[e].to(BFloat16)
                out_hi[e] = other[e].to(BFloat16)
            if sec != gk.SEC_V:
                pos = meta[pos_off + drow].to(Float32)
                for e in cutlass.range_constexpr(VEC):
                    cs, sn = gk.rope_cos_sin(pos, inv_freq[(c + e) % 64])
                    y_lo = gk.bf(acc[e])
                    y_hi = gk.bf(other[e])
                    out[e] = gk.rope_lo(y_lo, y_hi, cs, sn).to(BFloat16)
                    out_hi[e] = gk.rope_hi(y_lo, y_hi, cs, sn).to(BFloat16)
            drow = gk.dest_row(meta, rowmap, radd, drow)
            gvec_bf16(gk.row_addr(ybase, drow, yld, dcol0 + c + 64, 2)).store(out_hi.load())
        gvec_bf16(gk.row_addr(ybase, drow, yld, dcol0 + c, 2)).store(out.load())
        it = it + gk.CONSUMER_THREADS
    if cutlass.const_expr(scales is not None):
        if scaled == FROM_ROW_PART:
            if lane == 0:
                # the scales were generic writes; a later use of the page is a TMA write
                cute.arch.fence_proxy("async.shared", space="cta")
    if cutlass.const_expr(share != gk.CONSUMER_THREADS):
        cute.arch.sync_warp()
    gk.consumer_arrive(done + page, lane, share)
    return pg + 1


# rows of one SPLITK_REDUCE whose scales row_part_scales computes (a reduce is at most a tile's
# rows), two consumer threads a row
ROW_PART_MAX_ROWS = gk.CONSUMER_THREADS // 2
# 16-byte ROW_PART chunks a thread sums (half of a set of at most tiles.NORM_MAX_HIDDEN / 64)
ROW_PART_THREAD_CHUNKS = tiles.NORM_MAX_HIDDEN // mc.ROW_PART_COLS // 4 // 2


@cute.jit
def row_part_scales(scales: cute.Tensor, ring: cute.Tensor, base: Int32, e0: Int32,
                    epi: cutlass.Constexpr, splitk: cute.Tensor, T: Int32, row_parts, row0: Int32,
                    rows: Int32, ctid: Int32):
    """A FROM_ROW_PART reduce's row scales (PlanConfig.norm_fold=4): scales[r] = rsqrt(sum of
    ROW_PART[row0 + r, b:b + K / 64] / K + eps) for its rows r < rows (at most
    ROW_PART_MAX_ROWS, check_plan), b its ARG0+11 word, K the unsplit tile's K word: two threads
    a row, each the odd or even 16-byte chunks (every load issued first), a butterfly, then the
    consumers' named barrier before any item reads them. The unsplit tile's expression
    (gk.row_part_sumsq / gk.scale_own_rows), another summation order."""
    hidden, eps, bar_id = row_parts
    half = ctid % 2
    r = ctid // 2
    K = ring[e0 + (U_K_QKV if epi == gk.EPI_ROPE else U_K)]
    nchunk = K // (4 * mc.ROW_PART_COLS)
    ld = mc.row_part_ld(hidden)
    rowp = rk.row_part_addr(splitk, T, ld) + (Int64(row0 + rk.imin(r, rows - 1)) * Int64(ld)
                                           + Int64(ring[base + ARG0 + R_ROW_PART_COL])) * 4
    vals = []
    for u in cutlass.range_constexpr(ROW_PART_THREAD_CHUNKS):
        j = rk.imin(half + 2 * u, nchunk - 1)
        vals.append(cute.make_tensor(cute.make_ptr(Float32, rowp + Int64(j) * 16,
                                                   cute.AddressSpace.gmem, assumed_align=16),
                                     cute.make_layout(4)).load())
    acc = Float32(0.0)
    for u in cutlass.range_constexpr(ROW_PART_THREAD_CHUNKS):
        if half + 2 * u < nchunk:
            acc = acc + vals[u].reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=1)
    if half == 0:
        if r < rows:
            scales[r] = cute.math.rsqrt(acc * (Float32(1.0) / Float32(K)) + eps)
    cute.arch.barrier(barrier_id=bar_id, number_of_threads=gk.CONSUMER_THREADS)
