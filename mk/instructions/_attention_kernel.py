"""CuTe DSL device bodies of ATTENTION (paged KV cache, GQA, split-KV; decode and prefill) and
ATTN_REDUCE, for the persistent megakernel (and the standalone harness in bench/attention.py, which
runs the same bodies with the same roles).

GPU path only: this module imports cutlass at the top, so its name starts with "_" and the opcode
registry never imports it. The torch faces (the semantics these bodies match) and the argument words
are attention.py's: A_SEQ, A_POS0, A_KV0, A_KV1, A_PAGE_OFF, A_MODE, A_QPK, A_HEAD_DIM, A_SLOT,
A_NEW0, and a pair's A_ROW0_B, A_POS0_B, A_PAGE_OFF_B, A_NEW0_B;
ATTN_REDUCE: A_SLOT0, A_NSPLIT, A_QPK, A_HEAD_DIM.

Roles (the megakernel's, after the GEMM wiring: 384 threads, two consumer warpgroups)
-------------------------------------------------------------------------------------
    loader (1 warp)      TMA of K and V blocks of the paged cache into pool pages
    consumers (2 WGs)    Q rows straight from global memory into registers (A operand of wgmma
                         from registers, "RS"), S = Q K^T (wgmma), online softmax in fp32 in
                         registers, P (bf16, registers) @ V (wgmma, V from its page as an MN-major
                         B operand), output into epilogue pages
    storer (2 warps)     frees K/V pages in ring order, stores the epilogue pages with exact masks
                         (bf16 ATTN_OUT rows, or fp32 ATTN_PARTIAL rows + ATTN_LSE), then (the
                         caller) fence + red.release of the signal counter

Work decomposition of one ATTENTION instruction (rows R of one sequence, KV heads
[col0, col0 + cols), keys [kv0, kv1)): query row m = i * qpk + h (token i, q head h of the KV head)
so all qpk q heads of a KV head share every K/V page (GQA: one load of the KV head serves them) and
an M tile of 128 query rows covers 128 / qpk consecutive tokens (tight causal bound per tile).
A *unit* = (KV head kh, M tile mt); warpgroup w owns the tile's rows [64w, 64w + 64).
Narrow units (wg_split, off by default: WG_SPLIT; its checks pass, racecheck reported 2 hazards
in session 6; at most NARROW_ROWS = 16 query rows, i.e. decode): both warpgroups hold the same
rows and split the key blocks (block b to warpgroup b % 2; in the "thread" hand-off the other WG
waits for the block's pages to be full and arrives on their done barriers too, every consumer
thread once as in a full unit; in the other modes the owning WG's 128 threads arrive for all
256, x 2), then WG1 writes its (m, l,
unnormalised O) into its own epilogue page (no query row of its own there), named barrier 3, and
WG0 merges; warps also skip the softmax of a row half that holds no query row. V tails of a narrow
unit are zeroed by the owning WG alone (named barriers BAR_ATTN_WG = 5, 6).
A MODE_PAIR instruction (mk.plan's attn_pair) holds two decode units of one row each, from two
sequences: warpgroup w runs unit w (its own Q row, keys and epilogue page w; second_unit reads
the second's words), their key blocks alternate in the ring (ring_block), and each page is read by
one warpgroup, as a narrow unit's.
Per unit, the KV range is [kv0, kend) with kend = min(kv1, pos0 + R, pos0 + last token of the tile
+ 1), walked in blocks of KB = 64 keys; a unit with no key (a split after every row of the tile)
runs no block and writes o = 0, lse = -inf (the face's convention).

Pages of one unit in ring order (page = pg % NP, phase = (pg // NP) & 1; every role walks the same
sequence):
    per block: K page, V page (64 keys x 128 dims bf16 = 16 KiB each: two SW128 sub-boxes of
               64 keys x 64 dims, 8 KiB apart; rows = keys, 128 B per row)
    then E epilogue pages: mode 0: 2 (bf16 64 rows x 128 per WG), mode 1: 4 (fp32 32 rows x 128)
               + 1 (LSE, 128 fp32)
Q never occupies a page: it is loaded into the wgmma A fragment once per unit (a page held for the
whole unit would block the ring: the storer frees pages in ring order).
Barrier arrivals (the GEMM family's protocol, bench/GEMM_NOTES.md): full[p] count 1 (loader
expect_tx + TMA bytes, or a plain grant for epilogue pages), done[p] (the consumers: K page once
S = QK^T retired, V page once P V retired, epilogue page once written), empty[p] (the storer,
after `done`, in ring order; after its stores for epilogue pages). done/empty init count = `share`
(the megakernel's page_share(handoff), the GEMM bodies' `share`): 256 = "thread" hand-off, every
consumer thread arrives on done and every storer thread (x 4) on empty (what compute-sanitizer
racecheck credits); 8 (the default) = one arrival per consumer warp after __syncwarp, the storer's
thread 0 arrives with 8 after a named barrier.

K/V loads: a block of 64 positions [kb0, kb0 + 64) spans 64 / PSB cache pages of PSB = min(page
size, 64) rows; each sub-box is a TMA box of PSB rows x 64 columns (x 2 halves of D) from cache row
layer * kv_layer_stride + table[p // ps] * ps + p % ps. Sub-boxes past the unit's key end are not
loaded (their page-table entries may not exist); the consumers zero the V rows past the key end
(stale smem or unwritten cache rows may hold NaN, and 0 * NaN = NaN in the PV product) and mask the
S columns (select, so NaN in stale K rows never leaks).

Numerics (the face): s = bf16(bf16(q . k) * D^-0.5) (the face's matmul and scale in the model
dtype), masked keys -inf, online softmax in fp32 (exp2 with log2(e) folded), P rounded to bf16
for the PV wgmma (fp32 accumulation), o = acc / l. mode 0: bf16(o) -> ATTN_OUT. mode 1: fp32 o ->
ATTN_PARTIAL[slot + i], lse = m + ln(l) (-inf, o = 0 where the row has no key) -> ATTN_LSE.
The face normalises before its bf16 PV product, the body after: equal up to bf16 rounding.

ATTN_REDUCE: pages of 64 (row, head) pairs x 128 dims bf16 (the mode-0 epilogue page layout):
the loader grants them, the consumers (256 threads: 64 rows x 4 column quarters) read the nsplit
partials and LSEs straight from global memory (L2-resident, written by this step's ATTENTION
instructions; visibility through the controller's acquire), combine them exactly like the face
(M = max lse, w = exp(lse - M), sum w o / sum w), write bf16 into the page; the storer stores.

Epilogue page layout (bf16 and fp32 alike): plain row-major rows of 256 B (bf16) / 512 B (fp32), so
every fragment store is the thread's base address + an immediate (a per-element swizzle cost ~45
registers of address math in the consumers and spilled 176 B at 216 registers). The fragment
writes are 8-way bank-conflicted (8 rows per warp at a 256/512 B pitch); a swizzle whose XOR term
is per-thread constant (row % 8 == lane // 4 for every row a thread holds) is the known fix.
"""

from __future__ import annotations

import math
import os

import cutlass
import cutlass.cute as cute
import cutlass.experimental.primitives as prims
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import LayoutEnum

from mk.instructions import _common as mc
from mk.instructions import _rows_kernel as rk
from mk.instructions._rows_kernel import bar_wait, free_page, grant_page, page_of, tma_box
from mk.instructions import attention as at
from mk.ir import Op

PAGE = rk.PAGE                  # 16 KiB
D = 128                         # head dim (Llama-70B); the only one compiled
KB = 64                         # keys per block (one K page, one V page)
HALF = 64                       # head-dim half = one SW128 atom column (128 B)
HALF_BYTES = KB * HALF * 2      # 8 KiB: one (64 keys x 64 dims) sub-box
MT = at.ATTN_TILE_ROWS          # query rows per M tile (two warpgroups x 64)
NUM_CONSUMER_WARPS = 8
CONSUMER_THREADS = 256
DONE_ARRIVALS = NUM_CONSUMER_WARPS
EMPTY_ARRIVALS = NUM_CONSUMER_WARPS
E_DIRECT = 2                    # epilogue pages per unit, mode 0 (bf16)
E_PARTIAL = 5                   # mode 1: 4 fp32 pages + 1 LSE page
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_INF = float("-inf")
BAR_ATTN = 3                    # named barrier of the 256 consumer threads (V-tail zeroing)
BAR_ATTN_WG = (5, 6)            # one consumer warpgroup alone (128 threads; narrow-unit V tails)
NARROW_ROWS = 16                # a unit of <= 16 query rows (decode) splits its key blocks
                                # between the two WGs; its rows are in warp 0 of each WG
MERGE_ML_OFF = NARROW_ROWS * D * 4   # (m, l) of the merge after the fp32 O rows (8 KiB)
# compile-time default of attn_consume's wg_split (the megakernel takes the default): off, since
# in the megakernel's all-opcode M1024-ps64 (20 B) and warp hand-off (8 B) variants it spills
WG_SPLIT = os.environ.get("MK_ATTN_WG_SPLIT", "0") == "1"
# How the storer copies an epilogue page to global memory (compile-time, MK_ATTN_STORE):
#   "loop" (default since session 8): 16-byte ld.shared / st.global in a loop that is not
#           unrolled (a small code footprint)
#   "unrolled" (the default until session 8): the same stores, the page's chunks unrolled
#   "bulk": one cp.async.bulk shared -> global per row, the page freed once the copies have read
#           it, the writes drained before the signal; proxy fences on both sides of the page
# Why (sessions 7-8, bench/E2E_NOTES.md): the journal put 12 us of the B=1 ATTENTION instruction's
# 46 us in the storer's two epilogue pages, 6.3 us of it in a page with no row to store: the
# unrolled code of a body that an SM runs once per layer is fetched cold (the weights stream
# through L2), not the stores. Session 8 (same runs, vs unrolled): "loop" 11.67 -> 10.87 ms at
# B=1 (-6.9%), -4.4% at B=64, -1.9% at B=256; "bulk" -7.1% / -4.6% / -1.2%. Both passed the
# attention harness GPU tests, the two-layer checks and racecheck; loop is the default as the
# simpler of two equals (generic stores only, no proxy fences).
# A MODE_PAIR instruction's second unit keeps warpgroup 1's warp 0 (rows 0-15). Moving it to
# warp 3, another SM sub-partition than the first unit's warp 0 (MK_ATTN_PAIR_WARP=3, session 15),
# was within a run's spread (B=256 -1.6%, B=1024 -0.5%), kept the m64n64 chain that the swapped
# one beat in session 32, and was removed in session 63.
STORE_MODE = os.environ.get("MK_ATTN_STORE", "loop")
if STORE_MODE not in ("unrolled", "loop", "bulk"):
    raise ValueError(f"MK_ATTN_STORE={STORE_MODE!r}: expected unrolled, loop or bulk")
BULK_STORE = STORE_MODE == "bulk"
THREAD_SHARE = CONSUMER_THREADS  # done/empty init count of the "thread" hand-off
# The swapped decode chain (default since session 32; bench/ATTENTION_NOTES.md sessions 30-32):
# in an instruction of at most SWAP_ROWS query rows (a decode token's qpk = 8 q heads, or a
# pair's) each active warpgroup runs S^T = K Q^T and O^T = V^T P^T (keys / head dims on wgmma's
# M, the unit's rows on N = 8) instead of S = Q K^T on m64n64 with 56 of its 64 rows padding and
# the softmax on warp 0 alone: 8x less tensor work and the softmax's exp2 on all four warps
# (session 31's probe: 426 ns a 64-key block against ~1100 in the step; session 32's step: B=1
# -2.1%, B=64 -4.1%, B=256 -1.5%). Its operands Q^T and P^T live in SWAP_SCRATCH bytes of shared
# memory per warpgroup beside the page pool (the caller's `scratch`): Q^T (8 x 128 bf16, the
# wgmma B layout) at 0, P^T (8 x 64 bf16) at SWAP_P_OFF, the four warps' column maxima / sums
# (4 x 8 fp32) at SWAP_RED_OFF. The pages, their waits and releases are the same as the other
# path's. Not with the experimental wg_split layout (its decode units keep the m64n64 chain).
SWAPPED = not WG_SPLIT
SWAP_ROWS = 8
SWAP_P_OFF = 2048
SWAP_P_BYTES = 1024                 # P^T of one 64-key block: 8 rows x 64 keys bf16
SWAP_RED_OFF = SWAP_P_OFF + SWAP_P_BYTES
SWAP_SCRATCH = 4096                 # 1024-aligned per warpgroup
# MK_ATTN_SWAP_SPLIT=1 (session 35; off; session 36: checks, racecheck and synccheck clean on
# the H200 with every unit split, timing in SWAP_SPLIT_MIN_BLOCKS's note): a lone
# decode unit's key blocks alternate between the two warpgroups, each running the swapped chain
# on its blocks with its own scratch, max, sums and O^T, merged at the end through warpgroup 1's
# epilogue page (no row of the unit is stored from it) as the m64n64 chain's wg_split merges
# (merge_factors). Why: in a decode step of fewer than ~132 sequences an ATTENTION instruction
# is one unit on one warpgroup while the other idles (B=64: 20.7 us an instruction, ~1.3 us per
# key block of chain latency; 22 us of the 115 us critical path per layer); half the blocks each
# should take it near 11. Session 31 built this as MK_ATTN_SWAPPED=split and session 32 removed
# it: racecheck's 100 RAW hazards there were RMSNORM's cross-warp partials (_rows_kernel.py,
# written by warpgroup 1's first thread, read after the norm's barrier:
# bench/results/racecheck_swapped_split_2026-12-04_s32.log), session 31's signature of
# warpgroups that sync their own named barriers unequally often. So here a warpgroup also syncs
# its barrier for each key block it does not own, as often as the owner does (swap_idle_barriers
# and the V tail's), and both execute the same barrier sequence whatever the block count; in a
# pair too (each warpgroup's unit, blocks of unequal counts: the stand-ins cover the other unit's
# blocks, attn_blocks' kend_o), which the default build's pairs do not.
SWAP_SPLIT_VALUE = os.environ.get("MK_ATTN_SWAP_SPLIT", "0")
if SWAP_SPLIT_VALUE not in ("0", "1"):
    raise ValueError(f"MK_ATTN_SWAP_SPLIT={SWAP_SPLIT_VALUE!r}: expected 0 or 1")
SWAP_SPLIT = SWAP_SPLIT_VALUE == "1" and SWAPPED
# A unit of fewer key blocks stays on warpgroup 0 (the other idles, as without SWAP_SPLIT): the
# merge and the halved chain cost more than they save on a short unit. Session 36's split of
# every unit (bench/results/swapsplittime_*_s36.json): 16 blocks (B=64) ATTENTION 20.40 -> 17.56
# us an instruction, 2 blocks (B=16's 128-key splits) 9.42 -> 9.71, 1 block (B=1's) 7.50 ->
# 8.06; a straight line through them crosses even near 3.3 blocks.
SWAP_SPLIT_MIN_BLOCKS = 4
# Leave-one-out profiling variants of ATTENTION (compile-time, read once at import; never set in
# production; like the GEMM bodies' MK_GEMM_EXPERIMENT): comma- (or +-) separated parts of the
# work to leave out, so that timing differences place the time of one instruction
# (bench/attention.py --experiments, bench/ATTENTION_NOTES.md "Leave-one-out experiments"). Every
# role still walks the same ring sequence and every page wait / arrive / free stays in place (each
# use of a page completes one phase of full / done / empty); only the work goes:
#   nomath   the consumers skip QK^T, the softmax, the V-tail zeroing and PV (they still load Q,
#            wait `full` of every K / V page, arrive `done`, write and hand over the epilogue pages)
#   noload   the loader issues no K / V TMA and loads no page-table entry: it grants each K / V
#            page with a plain arrive on `full` (rk.grant_page); the consumers compute on stale
#            shared memory
#   nostore  the storer skips the epilogue pages' global stores (it still waits `done` and frees)
# ATTN_REDUCE is untouched. Results are wrong (garbage, possibly NaN) under any part.
EXPERIMENT = frozenset(t for t in os.environ.get("MK_ATTN_EXPERIMENT", "").replace("+", ",")
                       .split(",") if t)
assert EXPERIMENT <= {"nomath", "noload", "nostore"}, \
    f"unknown MK_ATTN_EXPERIMENT parts {set(EXPERIMENT)}"
NOMATH = "nomath" in EXPERIMENT
NOLOAD = "noload" in EXPERIMENT
NOSTORE = "nostore" in EXPERIMENT
# The consumers do not free K/V pages themselves (MK_ATTN_CONSUMER_FREE, removed 2026-11-29, like
# the GEMM bodies' MK_GEMM_CONSUMER_FREE): the storer waiting `done` of epilogue pages only can
# pass a parity wait on a stale phase while a page's previous K/V use is pending (deadlock on the
# H200). The storer frees K/V pages in ring order (attn_store); the sound design, a per-page
# done-parity mask in every family's storer, is in bench/ATTENTION_NOTES.md.
OP_ATTENTION = int(Op.ATTENTION)
# attn_consume takes the epilogue page count from the mode's low bit
assert at.MODE_PARTIAL & 1 and not at.MODE_DIRECT & 1 and not at.MODE_PAIR & 1
OP_ATTN_REDUCE = int(Op.ATTN_REDUCE)


def box_rows(page_size: int) -> int:
    """Rows of one K/V TMA sub-box: the cache page (at most one key block)."""
    assert page_size >= 8 and page_size & (page_size - 1) == 0, \
        "KV page size must be a power of two >= 8"
    return min(page_size, KB)


def handoff_of(share: int) -> str:
    """rk.release's hand-off mode for a done[p] init count (the GEMM bodies' convention)."""
    assert share in (THREAD_SHARE, DONE_ARRIVALS), f"done/empty share {share}: 256 or 8"
    return "thread" if share == THREAD_SHARE else "warp"


def epi_pages(mode: int) -> int:
    return E_PARTIAL if mode == at.MODE_PARTIAL else E_DIRECT


def unit_blocks_host(R: int, qpk: int, pos0: int, kv0: int, kv1: int, mt: int) -> int:
    """Host mirror of `unit_range` (tests, notes)."""
    kv_end = min(kv1, pos0 + R)
    i_hi = min(R - 1, (mt * MT + MT - 1) // qpk)
    kend = min(kv_end, pos0 + i_hi + 1)
    return max(0, -(-(kend - kv0) // KB))


def pages_per_instr(R: int, qpk: int, cols: int, pos0: int, kv0: int, kv1: int, mode: int,
                    pos0_b: int = 0) -> int:
    """Ring pages of one ATTENTION instruction (pos0_b: the second unit's position, MODE_PAIR)."""
    n = 0
    for _kh in range(cols):
        for mt in range(-(-R * qpk // MT)):
            n += 2 * unit_blocks_host(R, qpk, pos0, kv0, kv1, mt) + epi_pages(mode)
            if mode == at.MODE_PAIR:
                n += 2 * unit_blocks_host(1, qpk, pos0_b, kv0, pos0_b + 1, 0)
    return n


# ============================================================================ host-side builders
class AttnAtoms:
    """Host-side (inside a @cute.jit __call__) TMA atom and wgmma tilings.

    kv: (KVROWS, hkv * D, 2) bf16, columns contiguous; z = 0 the K cache, z = 1 the V cache (one
    descriptor for both, like the GEMM harness's kv tensor)."""

    def __init__(self, kv: cute.Tensor, page_size: int):
        self.psb = box_rows(page_size)
        self.page_size = page_size
        lay = LayoutEnum.ROW_MAJOR
        # TMA box: PSB keys x 64 dims, SW128 K-major (rows of 128 B); a (64, 64) sub-box of a page
        # is 64 / PSB such boxes stacked (the SW128 pattern repeats every 8 rows = 1024 B)
        self.box_layout = cute.slice_(sm90_utils.make_smem_layout_a(
            lay, (self.psb, HALF, HALF), BFloat16, 1), (None, None, 0))
        self.tma, self.gKV = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), kv, self.box_layout, (self.psb, HALF))
        # K half as the B operand of S = Q K^T: (N = 64 keys, K = 64 dims), K-major
        self.sK_layout = cute.slice_(sm90_utils.make_smem_layout_b(
            lay, (64, KB, HALF), BFloat16, 1), (None, None, 0))
        # V half as the B operand of O = P V: (N = 64 dims, K = 64 keys), MN-major: the same bytes
        # as the TMA'd (64 keys x 64 dims) K-major box
        self.sV_layout = cute.slice_(sm90_utils.make_smem_layout_b(
            LayoutEnum.COL_MAJOR, (64, HALF, KB), BFloat16, 1), (None, None, 0))
        assert cute.size_in_bytes(BFloat16, self.sK_layout) == HALF_BYTES
        assert cute.size_in_bytes(BFloat16, self.sV_layout) == HALF_BYTES
        RS = cute.nvgpu.warpgroup.OperandSource.RMEM
        K_, MN_ = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        self.mma_qk = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, K_, K_, Float32,
                                                        (1, 1, 1), (64, KB), a_source=RS)
        self.mma_pv = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, K_, MN_, Float32,
                                                        (1, 1, 1), (64, HALF), a_source=RS)
        if SWAPPED:
            # S^T = K Q^T: A = the K page (M = 64 keys, K = 128 dims, K-major: the page's two
            # SW128 sub-boxes of 64 dims, 8 KiB apart, are exactly this layout's), B = Q^T in the
            # scratch (N = 8 rows, K-major); O^T = V^T P^T: A = the V page read M-major (M = 128
            # dims in two m64 tiles, K = 64 keys: the same bytes), B = P^T (N = 8, K = 64 keys)
            self.mma_s = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, K_, K_, Float32,
                                                           (1, 1, 1), (64, SWAP_ROWS))
            self.mma_o = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, MN_, K_, Float32,
                                                           (1, 1, 1), (64, SWAP_ROWS))
            self.sKt_layout = cute.slice_(sm90_utils.make_smem_layout_a(
                lay, (KB, SWAP_ROWS, D), BFloat16, 1), (None, None, 0))
            self.sVt_layout = cute.slice_(sm90_utils.make_smem_layout_a(
                LayoutEnum.COL_MAJOR, (D, SWAP_ROWS, KB), BFloat16, 1), (None, None, 0))
            self.sQt_layout = cute.slice_(sm90_utils.make_smem_layout_b(
                lay, (KB, SWAP_ROWS, D), BFloat16, 1), (None, None, 0))
            self.sPt_layout = cute.slice_(sm90_utils.make_smem_layout_b(
                lay, (D, SWAP_ROWS, KB), BFloat16, 1), (None, None, 0))
            assert cute.size_in_bytes(BFloat16, self.sKt_layout) == PAGE
            assert cute.size_in_bytes(BFloat16, self.sVt_layout) == PAGE
            assert cute.size_in_bytes(BFloat16, self.sQt_layout) == SWAP_P_OFF
            assert cute.size_in_bytes(BFloat16, self.sPt_layout) == SWAP_P_BYTES

    def swap_ops(self) -> list:
        """The swapped chain's tilings for the kernel's parameters ([] unless SWAPPED): the
        caller appends its scratch address and passes them to attn_consume as `swap`."""
        if not SWAPPED:
            return []
        return [self.mma_s, self.mma_o, self.sKt_layout, self.sVt_layout, self.sQt_layout,
                self.sPt_layout]

    def prefetch(self):
        cute.nvgpu.cpasync.prefetch_descriptor(self.tma)


# ============================================================================ device helpers
@cute.jit
def swz_tensor(pool: Int32, page: Int32, off: cutlass.Constexpr, layout: cute.ComposedLayout):
    p = cute.make_ptr(BFloat16, pool + page * PAGE + off, cute.AddressSpace.smem, assumed_align=1024)
    p = cute.recast_ptr(p, layout.inner, dtype=BFloat16)
    return cute.make_tensor(p, layout.outer)


imin = rk.imin


@cute.jit
def unit_range(R: Int32, qpk: Int32, pos0: Int32, kv0: Int32, kv1: Int32, mt: Int32):
    """(kend, nblk) of M tile mt: keys [kv0, kend) in nblk blocks of KB."""
    kv_end = imin(kv1, pos0 + R)
    i_hi = imin(R - 1, (mt * MT + (MT - 1)) // qpk)
    kend = imin(kv_end, pos0 + i_hi + 1)
    nblk = Int32(0)
    if kend > kv0:
        nblk = (kend - kv0 + (KB - 1)) // KB
    return kend, nblk


@cute.jit
def second_unit(pair, mode: Int32, qpk: Int32, kv0: Int32, nblk: Int32):
    """The second decode unit of a MODE_PAIR instruction (pair: its (row0, pos0, page_off, new0)
    words, or None where the caller never runs pairs, e.g. the harness): (paired, kend, nblk of
    the second unit, walk) with walk = 2 nmin + tail for ring_block (nmin: the smaller of the
    two block counts, tail: the unit with more blocks); (False, 0, 0, 0) for a single unit. Its
    keys are [kv0, pos0 + 1)."""
    paired = cutlass.Boolean(False)
    kend_b = Int32(0)
    nblk_b = Int32(0)
    walk = Int32(0)
    if cutlass.const_expr(pair is not None):
        if mode == at.MODE_PAIR:
            paired = cutlass.Boolean(True)
            kend_b, nblk_b = unit_range(Int32(1), qpk, pair[1], kv0, pair[1] + 1, Int32(0))
            walk = 2 * imin(nblk, nblk_b)
            if nblk_b > nblk:
                walk = walk + 1
    return paired, kend_b, nblk_b, walk


@cute.jit
def ring_block(j: Int32, walk: Int32):
    """Key block j of an instruction's ring walk: (unit, block index in that unit). A pair's two
    units alternate block by block while both have blocks (A0 B0 A1 B1 ..), then the longer
    one's (unit `tail`) follow; walk = 2 nmin + tail (one register in the consumers' block
    loop); a single unit (walk = 0): (0, j). Every role walks the same sequence."""
    u = walk & 1
    b = j - (walk >> 1)
    if j < (walk & -2):
        u = j & 1
        b = j >> 1
    return u, b


# ============================================================================ page waits
SPIN_POLLS = 64     # plain try_wait polls before the bounded wait (rk.bar_wait)


@cute.jit
def page_wait(bar: cute.Pointer, phase: Int32, timeout_ns: Int64, state: cute.Tensor,
              kind: cutlass.Constexpr, ticket: Int32):
    """rk.bar_wait for the K/V page hot loops: first SPIN_POLLS plain mbarrier try_waits (each
    suspends in hardware up to a system time limit), only then the bounded loop, whose every
    iteration also reads the abort word in L2 (gpu scope): with every waiting warp of every CTA
    polling that one word, a wake-up was delayed by the L2 round trips of the polls. A hang still
    ends in rk.bar_wait's timeout record."""
    n = Int32(0)
    while n < SPIN_POLLS:
        if cute.arch.mbarrier_try_wait(bar, phase):
            n = Int32(SPIN_POLLS + 1)
        else:
            n = n + 1
    if n == SPIN_POLLS:
        bar_wait(bar, phase, timeout_ns, state, kind, ticket)


# The ATTENTION loader takes its K/V page-table entries 32 at a time (one warp-wide load,
# shuffled out per sub-box) instead of loading each block's entries before its TMA: with one
# dependent L2 round trip per 64-key block, the single loader warp could not keep ahead of the
# consumers (decode ran at ~2.4 us per block whatever the consumers did, and page 64 was no
# faster than page 16; bench/ATTENTION_NOTES.md). GPU-checked in session 4 with four other
# switches (bench/results/switches_2026-11-29.log), which together took decode B=1 15.29 -> 13.94
# ms; the per-block loads (MK_ATTN_TABLE_PREFETCH=0 until session 63) were never timed alone.


# ============================================================================ loader (1 warp)
@cute.jit
def valid_subboxes(kend: Int32, kb0: Int32, psb: cutlass.Constexpr) -> Int32:
    """Sub-boxes (of psb keys) of the block at kb0 that hold a key < kend, at most KB // psb."""
    nval = (kend - kb0 + (psb - 1)) // psb
    if nval > KB // psb:
        nval = Int32(KB // psb)
    return nval


@cute.jit
def load_kv_block(tma: cute.CopyAtom, gKV: cute.Tensor, box_layout: cute.ComposedLayout,
                  psb: cutlass.Constexpr, crows: cute.Tensor, nval: Int32, kc: Int32, pool: Int32,
                  full: cute.Pointer, empty: cute.Pointer, pg: Int32, npages: cutlass.Constexpr,
                  timeout_ns: Int64, state: cute.Tensor, ticket: Int32, wclk=None,
                  policy=None) -> Int32:
    """One key block's K page, then V page: wait for the page to be free, TMA its nval sub-boxes
    (cache rows crows[s], both 64-column halves of the head at column kc). Returns pg + 2.
    wclk: the journal variant's clock of the loader's waits for free pages; policy: the loads'
    L2 policy (kv_policy)."""
    nsub = KB // psb
    for z in cutlass.range_constexpr(2):        # K page, then V page
        page, ph = page_of(pg, npages)
        t0 = rk.wait_clock_start(wclk)
        bar_wait(empty + page, ph ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)
        rk.wait_clock_add(wclk, t0)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(full + page, nval * (2 * psb * HALF * 2))
        for s in cutlass.range_constexpr(nsub):
            if s < nval:
                for hf in cutlass.range_constexpr(2):
                    tma_box(tma, gKV, box_layout, psb, pool, page,
                            Int32(hf * HALF_BYTES + s * psb * HALF * 2), crows[s],
                            kc + hf * HALF, Int32(z), full + page, policy)
        pg = pg + 1
    return pg


@cute.jit
def load_kv_ring(tma: cute.CopyAtom, gKV: cute.Tensor, box_layout: cute.ComposedLayout,
                 page_size: cutlass.Constexpr, meta: cute.Tensor, lrow: Int32, kc: Int32,
                 kv0: Int32, kend_a: Int32, page_off_a: Int32, kend_b: Int32, page_off_b: Int32,
                 walk: Int32, j_first: Int32, j_end: Int32, pool: Int32,
                 full: cute.Pointer, empty: cute.Pointer, pg: Int32, npages: cutlass.Constexpr,
                 timeout_ns: Int64, state: cute.Tensor, ticket: Int32, wclk=None,
                 policy=None, two: cutlass.Constexpr = True) -> Int32:
    """attn_load's ring blocks j_first .. j_end - 1 (ring_block: unit a's, or a pair's a and b
    alternating; two=False: a body that never runs pairs, unit a's alone): each unit's
    page-table entries 32 per warp-wide load (lane i holds entry 32c + i of the
    sequence's table), handed to each sub-box by a shuffle. A few words past a sequence's table
    may be read (clamped to the metadata buffer) and are never used: sub-boxes past the key end
    issue no TMA."""
    psb = min(page_size, KB)
    nsub = KB // psb
    lane = cute.arch.lane_idx()
    last_word = meta.shape[0] - 1
    crows = cute.make_rmem_tensor(cute.make_layout(nsub), Int32)
    table_a = Int32(0)
    chunk_a = Int32(-1)
    table_b = Int32(0)
    chunk_b = Int32(-1)
    for j in range(j_first, j_end):
        u = Int32(0)
        b = j
        kend = kend_a
        if cutlass.const_expr(two):
            u, b = ring_block(j, walk)
            if u == 1:
                kend = kend_b
        kb0 = kv0 + b * KB
        nval = valid_subboxes(kend, kb0, psb)
        for s in cutlass.range_constexpr(nsub):
            pi = (kb0 + s * psb) // page_size
            table = table_a
            if u == 0:
                if pi // 32 != chunk_a:                  # warp-uniform
                    chunk_a = pi // 32
                    table_a = meta[imin(page_off_a + chunk_a * 32 + lane, last_word)]
                table = table_a
            elif cutlass.const_expr(two):
                if pi // 32 != chunk_b:
                    chunk_b = pi // 32
                    table_b = meta[imin(page_off_b + chunk_b * 32 + lane, last_word)]
                table = table_b
            ent = cute.arch.shuffle_sync(table, pi % 32)
            crows[s] = lrow + ent * page_size + (kb0 + s * psb) % page_size
        pg = load_kv_block(tma, gKV, box_layout, psb, crows, nval, kc, pool, full, empty, pg,
                           npages, timeout_ns, state, ticket, wclk, policy)
    return pg


@cute.jit
def kv_policy(R: Int32):
    """The L2 policy of a unit's K/V loads under MK_L2_HINTS "kv" (else None, no hint): evict
    first for decode (R == 1: each key read once per step), the default for prefill units."""
    if cutlass.const_expr("kv" not in rk.L2_HINTS):
        return None
    policy = Int64(rk.L2_EVICT_NORMAL)
    if R == 1:
        policy = Int64(rk.L2_EVICT_FIRST)
    return policy


@cute.jit
def attn_load(tma: cute.CopyAtom, gKV: cute.Tensor, box_layout: cute.ComposedLayout,
              page_size: cutlass.Constexpr, meta: cute.Tensor, layer: Int32, R: Int32,
              col0: Int32, cols: Int32, pos0: Int32, kv0: Int32, kv1: Int32, page_off: Int32,
              mode: Int32, qpk: Int32, pool: Int32, full: cute.Pointer, empty: cute.Pointer,
              pg: Int32, npages: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
              ticket: Int32, ready=None, new0=None, journal=None,
              wait_word: cutlass.Constexpr = -1, pair=None) -> Int32:
    """Loader warp of ATTENTION: per unit, K and V pages of every key block, then the epilogue
    page grants (a MODE_PAIR instruction: the two units' blocks in ring_block order, then the
    grants). Returns the new page count. wait_word >= 0 (the megakernel's journal variant):
    the loader's time waiting for free K/V pages, summed, into that word of row `ticket`.
    pair: the second unit's words (second_unit), or None (a body that never runs pairs).

    ready: (mbarrier, phase) of the instruction's dependencies (the megakernel's early loads),
    with new0 (the instruction's A_NEW0: the sequence's first position written by this step;
    not pos0, since a later segment of a sequence attends to this step's rows of the earlier
    ones): the first unit's key blocks that end at or before new0 hold K/V written by earlier
    steps, so up to half a ring of them is loaded before that wait (not under NOLOAD: the wait
    comes first)."""
    early = ready is not None and not NOLOAD      # compile-time
    if cutlass.const_expr(ready is None):
        # K/V rows were written by generic-proxy stores (QKV_ROPE storers of other CTAs, acquired
        # by the controller): order them before this warp's async-proxy reads
        cute.arch.fence_proxy("async.global")
    elif cutlass.const_expr(not early):
        bar_wait(ready[0], ready[1], timeout_ns, state, rk.ERR_INSTR_READY, ticket)
        cute.arch.fence_proxy("async.global")
    waited = None
    if cutlass.const_expr(early):
        waited = Int32(0)
    wclk = rk.make_wait_clock(wait_word)
    policy = kv_policy(R)
    lstride = meta[mc.M_KV_LAYER_STRIDE]
    lrow = layer * lstride
    n_mt = (R * qpk + (MT - 1)) // MT
    ne = Int32(E_DIRECT)
    if mode == at.MODE_PARTIAL:
        ne = Int32(E_PARTIAL)
    for kh in range(cols):
        kc = (col0 + kh) * D
        for mt in range(n_mt):
            kend, nblk = unit_range(R, qpk, pos0, kv0, kv1, mt)
            paired, kend_b, nblk_b, walk = second_unit(pair, mode, qpk, kv0, nblk)
            page_off_b = page_off
            if cutlass.const_expr(pair is not None):
                page_off_b = pair[2]
            nring = nblk + nblk_b
            if cutlass.const_expr(NOLOAD):
                # experiment: no page-table load, no TMA; each K / V page granted like an
                # epilogue page (the same empty wait, one plain arrive on full)
                for b in range(2 * nring):
                    pg = grant_page(pg, npages, full, empty, timeout_ns, state, ticket)
            else:
                j_first = Int32(0)
                if cutlass.const_expr(early):
                    if waited == 0:
                        # blocks of keys before new0: earlier steps' K/V, no dependency (a
                        # pair's: as many of each unit's, alternating, in the same pages)
                        npre = (new0 - kv0) // KB
                        if new0 < kv0:
                            npre = Int32(0)
                        npre = imin(imin(npre, nblk), Int32(npages // 2))
                        j_pre = npre
                        if cutlass.const_expr(pair is not None):
                            if paired:
                                npre_b = (pair[3] - kv0) // KB
                                if pair[3] < kv0:
                                    npre_b = Int32(0)
                                npre = imin(imin(npre, imin(npre_b, nblk_b)), Int32(npages // 4))
                                j_pre = 2 * npre
                        pg = load_kv_ring(tma, gKV, box_layout, page_size, meta, lrow, kc, kv0,
                                          kend, page_off, kend_b, page_off_b, walk,
                                          Int32(0), j_pre, pool, full, empty, pg, npages,
                                          timeout_ns, state, ticket, wclk, policy,
                                          pair is not None)
                        bar_wait(ready[0], ready[1], timeout_ns, state, rk.ERR_INSTR_READY,
                                 ticket)
                        # the rows of this step's new tokens (QKV_ROPE storers of other CTAs,
                        # acquired by the controller) before the async-proxy reads below
                        cute.arch.fence_proxy("async.global")
                        waited = Int32(1)
                        j_first = j_pre
                pg = load_kv_ring(tma, gKV, box_layout, page_size, meta, lrow, kc, kv0, kend,
                                  page_off, kend_b, page_off_b, walk, j_first, nring, pool,
                                  full, empty, pg, npages, timeout_ns, state, ticket, wclk,
                                  policy, pair is not None)
            for e in range(ne):
                pg = grant_page(pg, npages, full, empty, timeout_ns, state, ticket)
    if cutlass.const_expr(early):
        if waited == 0:             # no unit (never planned): the wait still pairs with iready
            bar_wait(ready[0], ready[1], timeout_ns, state, rk.ERR_INSTR_READY, ticket)
    rk.wait_clock_write(wclk, journal, ticket, wait_word, cute.arch.lane_idx() == 0)
    return pg


@cute.jit
def reduce_load(R: Int32, cols: Int32, qpk: Int32, pool: Int32, full: cute.Pointer,
                empty: cute.Pointer, pg: Int32, npages: cutlass.Constexpr, timeout_ns: Int64,
                state: cute.Tensor, ticket: Int32) -> Int32:
    """Loader warp of ATTN_REDUCE: grant one output page per 64 (row, head) pairs."""
    npg = (R * cols * qpk + 63) // 64
    for c in range(npg):
        pg = grant_page(pg, npages, full, empty, timeout_ns, state, ticket)
    return pg


# ============================================================================ consumers (2 WGs)
@cute.jit
def acc_to_frgA_layout(acc_layout: cute.Layout) -> cute.Layout:
    """sm90 bf16 back-to-back GEMM: the C fragment ((2, 2, N/8), 1, 1) of S (64 x N) read as the
    A fragment ((2, 2, 2), 1, N/16) of P (64 x K = N): values (column pair, row +8, column +8) of
    each 16-column block."""
    l = cute.logical_divide(acc_layout, ((None, None, 2), None, None))
    return cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1], (l.shape[0][2][1], l.shape[2])),
        stride=((l.stride[0][0], l.stride[0][1], l.stride[0][2][0]), l.stride[1],
                (l.stride[0][2][1], l.stride[2])))


@cute.jit
def quad_max(x: Float32) -> Float32:
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))


@cute.jit
def quad_sum(x: Float32) -> Float32:
    x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
    return x + cute.arch.shuffle_sync_bfly(x, offset=2)


@dsl_user_op
def bf_pair(a: Float32, b: Float32, *, loc=None, ip=None):
    """(a, b) rounded to bf16 and widened back to float32: one packed round to nearest even
    (cvt.rn.bf16x2.f32, F2FP) and two integer ops, where x.to(BFloat16).to(Float32) costs a
    scalar conversion (F2F) each on the pipe that also runs exp2 (the DSL's 2-element
    .to(BFloat16) stays scalar in the PTX)."""
    return rk.unpack_bf16x2(rk.pack_bf16x2(a, b, loc=loc, ip=ip), loc=loc, ip=ip)


@cute.jit
def rescale_row(m_old: Float32, block_max: Float32, l_sum: Float32):
    """The online softmax's row update for one key block: the new max m (over the quad), the
    exp2 offset m * log2(e) (0 while the row has seen no key, so exp2 never sees -inf - -inf),
    the rescale factor exp(m_old - m) and the rescaled partial sum. Returns (m, ms, alpha, l)."""
    return rescale_to(m_old, cute.arch.fmax(m_old, quad_max(block_max)), l_sum)


@cute.jit
def rescale_to(m_old: Float32, mn: Float32, l_sum: Float32):
    """rescale_row's update once the new max mn is known (the swapped chain's comes from all
    four warps)."""
    mu = mn
    if mn == Float32(NEG_INF):
        mu = Float32(0.0)
    al = cute.math.exp2((m_old - mu) * Float32(LOG2E), fastmath=True)
    return mn, mu * Float32(LOG2E), al, l_sum * al


@cute.jit
def online_softmax(accS: cute.Tensor, tScS: cute.Tensor, kb0: Int32, lim0: Int32, lim1: Int32,
                   mr0: Float32, mr1: Float32, ls0: Float32, ls1: Float32, accO0: cute.Tensor,
                   accO1: cute.Tensor, rP: cute.Tensor, scale: Float32,
                   both_halves: cutlass.Constexpr):
    """One key block of the online softmax (fp32, the face's roundings of the scores) on the S
    fragment: fragment element i is in row half (i // 2) % 2 (row r0 or r0 + 8 of the thread).
    P (bf16) -> rP, O rescaled by exp(m_old - m_new). both_halves False: the thread's second row
    half holds no query row (a warp-uniform fact): its scores are not computed, P = 0 there, its
    (m, l) and O rows are left alone (half the exp / max / rescale work of a decode warp).
    Returns the new (m0, m1, l0, l1) (l: this thread's partial row sums)."""
    nsv = cute.size(accS)
    bm0 = Float32(NEG_INF)
    bm1 = Float32(NEG_INF)
    # fragment elements 2v and 2v + 1 share a row: each of their two roundings to bf16 is one
    # packed conversion (bf_pair): 64 scalar conversions a thread, on the pipe that also runs
    # exp2, were most of a key block's softmax in the step (bench/ATTENTION_NOTES.md session 12);
    # the same roundings, bitwise
    for v in cutlass.range_constexpr(nsv // 2):
        if cutlass.const_expr(v % 2 == 0 or both_halves):
            q0, q1 = bf_pair(accS[2 * v], accS[2 * v + 1])
            s0, s1 = bf_pair(q0 * scale, q1 * scale)
            for k in cutlass.range_constexpr(2):
                _r, c = tScS[2 * v + k]
                s = s0 if k == 0 else s1
                if cutlass.const_expr(v % 2 == 0):
                    if kb0 + c >= lim0:
                        s = Float32(NEG_INF)
                    bm0 = cute.arch.fmax(bm0, s)
                else:
                    if kb0 + c >= lim1:
                        s = Float32(NEG_INF)
                    bm1 = cute.arch.fmax(bm1, s)
                accS[2 * v + k] = s
    mn0, ms0, al0, ls0 = rescale_row(mr0, bm0, ls0)
    al1 = Float32(1.0)
    ms1 = Float32(0.0)
    mn1 = mr1
    if cutlass.const_expr(both_halves):
        mn1, ms1, al1, ls1 = rescale_row(mr1, bm1, ls1)
    for i in cutlass.range_constexpr(nsv):
        if cutlass.const_expr((i // 2) % 2 == 0):
            p = cute.math.exp2(accS[i] * Float32(LOG2E) - ms0, fastmath=True)
            ls0 = ls0 + p
            accS[i] = p
        elif cutlass.const_expr(both_halves):
            p = cute.math.exp2(accS[i] * Float32(LOG2E) - ms1, fastmath=True)
            ls1 = ls1 + p
            accS[i] = p
        else:
            accS[i] = Float32(0.0)
    finish_softmax(accS, accO0, accO1, rP, al0, al1, both_halves)
    return mn0, mn1, ls0, ls1


@cute.jit
def finish_softmax(accS: cute.Tensor, accO0: cute.Tensor, accO1: cute.Tensor, rP: cute.Tensor,
                   al0: Float32, al1: Float32, both_halves: cutlass.Constexpr = True):
    """The end of online_softmax: the O rows times their factors (the second row half only with both_halves), P (bf16) -> rP."""
    for i in cutlass.range_constexpr(cute.size(accO0)):
        if cutlass.const_expr((i // 2) % 2 == 0):
            accO0[i] = accO0[i] * al0
            accO1[i] = accO1[i] * al0
        elif cutlass.const_expr(both_halves):
            accO0[i] = accO0[i] * al1
            accO1[i] = accO1[i] * al1
    rP.store(accS.load().to(BFloat16))


@cute.jit
def zero_v_tail(pool: Int32, pv: Int32, nkeys: Int32, tid: Int32, nthreads: cutlass.Constexpr):
    """V rows [nkeys, KB) of page pv <- 0 by nthreads threads (tid in [0, nthreads)): unloaded
    (stale) or unwritten cache rows may hold NaN and 0 * NaN would poison the PV product. The
    caller fences (async proxy) and syncs its threads before the wgmma reads the page."""
    zrow = nkeys + tid // 16                     # 16 chunks of 16 B per key row
    ch = tid % 16
    while zrow < KB:
        hf = ch // 8
        zoff = (pool + pv * PAGE + hf * HALF_BYTES + zrow * 128 + (((ch % 8) ^ (zrow % 8)) * 16))
        zt = cute.make_tensor(cute.make_ptr(Int32, zoff, cute.AddressSpace.smem, assumed_align=16),
                              cute.make_layout(4))
        zt.fill(0)
        zrow = zrow + nthreads // 16


@cute.jit
def wg_barrier(wg: Int32):
    """Named barrier of one consumer warpgroup (128 threads)."""
    if wg == 0:
        cute.arch.barrier(barrier_id=BAR_ATTN_WG[0], number_of_threads=128)
    else:
        cute.arch.barrier(barrier_id=BAR_ATTN_WG[1], number_of_threads=128)


# Q fragment loads issued all at once: every thread's 32 loads of 4 bytes without a branch (rows
# past the last query row read row mtot - 1 and are zeroed after), instead of one load behind
# each row test, whose use before the next test made the loads run one L2 round trip after
# another (the suspect of the ~30 us an ATTENTION instruction costs beside its key blocks,
# bench/ATTENTION_NOTES.md session 5). GPU-checked in session 4 with four other switches
# (bench/results/switches_2026-11-29.log), which together took decode B=1 15.29 -> 13.94 ms; the
# per-row loads everywhere (MK_ATTN_Q_HOIST=0 until session 63) were never timed alone. Not with
# wg_split (the harness's split variants spill 12-16 B with both; neither is in the megakernel):
# it keeps the per-row loads.


@cute.jit
def load_q_hoisted(tSrQ: cute.Tensor, tQcQ: cute.Tensor, q_base: Int64, ldq: Int32, row0: Int32,
                   mw: Int32, mtot: Int32, qpk: Int32, head0: Int32):
    """The Q A-fragment of query rows mw + r (see attn_consume), all loads first (rows outside
    [0, mtot) are zero)."""
    n = cute.size(tSrQ) // 2
    raw = cute.make_rmem_tensor(cute.make_layout(n), Int32)     # 2 bf16 per load, as 32 bits
    for v in cutlass.range_constexpr(n):
        r, c = tQcQ[2 * v]
        m = imin(mw + r, mtot - 1)
        it = m // qpk
        h = m - it * qpk
        addr = q_base + Int64((row0 + it) * ldq + (head0 + h) * D + c) * 2
        raw[v] = cute.make_tensor(cute.make_ptr(Int32, addr, cute.AddressSpace.gmem,
                                                assumed_align=4), cute.make_layout(1)).load()[0]
    for v in cutlass.range_constexpr(n):
        r, _c = tQcQ[2 * v]
        # reinterpret the 32 bits as two bf16 (a register tensor viewed as BFloat16)
        pair = cute.make_rmem_tensor(cute.make_layout(1), Int32)
        pair[0] = raw[v]
        q = cute.make_tensor(cute.recast_ptr(pair.iterator, dtype=BFloat16), cute.make_layout(2))
        q0 = q[0]
        q1 = q[1]
        if mw + r >= mtot:
            q0 = BFloat16(0.0)
            q1 = BFloat16(0.0)
        tSrQ[2 * v] = q0
        tSrQ[2 * v + 1] = q1


@cute.jit
def load_q_rows(tSrQ: cute.Tensor, tQcQ: cute.Tensor, q_base: Int64, ldq: Int32, row0: Int32,
                mw: Int32, mtot: Int32, qpk: Int32, head0: Int32, wg_split: cutlass.Constexpr):
    """Q rows mw + r -> the A fragment (registers), zero past the last row: all loads first, or
    (wg_split) one behind each row test."""
    if cutlass.const_expr(not wg_split):
        load_q_hoisted(tSrQ, tQcQ, q_base, ldq, row0, mw, mtot, qpk, head0)
    else:
        for v in cutlass.range_constexpr(cute.size(tSrQ) // 2):
            r, c = tQcQ[2 * v]
            m = mw + r
            q0 = Float32(0.0)
            q1 = Float32(0.0)
            if m < mtot:
                it = m // qpk
                h = m - it * qpk
                addr = q_base + Int64((row0 + it) * ldq + (head0 + h) * D + c) * 2
                qv = cute.make_tensor(cute.make_ptr(BFloat16, addr, cute.AddressSpace.gmem,
                                                    assumed_align=4), cute.make_layout(2)).load()
                q0 = qv[0].to(Float32)
                q1 = qv[1].to(Float32)
            tSrQ[2 * v] = q0.to(BFloat16)
            tSrQ[2 * v + 1] = q1.to(BFloat16)


@cute.jit
def bulk_writer_fence():
    """STORE_MODE "bulk": a consumer's generic writes of an epilogue page, ordered before the
    storer's async-proxy bulk copies of it (the fence before the page's `done`)."""
    if cutlass.const_expr(BULK_STORE):
        cute.arch.fence_proxy("async.shared", space="cta")


@cute.jit
def release_kv_page(page: Int32, done: cute.Pointer, narrow, share: cutlass.Constexpr,
                    wtid: Int32, ctid: Int32, hm: cutlass.Constexpr):
    """The consumers' hand-off of a K or V page their wgmmas have retired: `done` (the storer
    frees it, in ring order). A narrow unit's page is read by one warpgroup, whose 128 threads
    arrive for both; otherwise all 256 arrive."""
    if narrow:
        rk.release(done + page, share, 128, wtid, BAR_ATTN, hm)
    else:
        rk.release(done + page, share, CONSUMER_THREADS, ctid, BAR_ATTN, hm)


@cute.jit
def qk_issue(mma_qk: cute.TiledMma, thr_qk, accS: cute.Tensor, tSrQ: cute.Tensor, pool: Int32,
             pk: Int32, sK_layout: cute.ComposedLayout):
    """S += Q K^T of the K page pk (64 keys, both head-dim halves) into accS (zeroed by the
    caller: attn_blocks says why): the wgmmas issued and committed as one group, not waited
    for."""
    cute.nvgpu.warpgroup.fence()
    for hf in cutlass.range_constexpr(2):
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(
            swz_tensor(pool, pk, hf * HALF_BYTES, sK_layout)))
        for kb in cutlass.range_constexpr(HALF // 16):
            cute.gemm(mma_qk, accS, tSrQ[(None, None, hf * (HALF // 16) + kb)],
                      tSrK[(None, None, kb)], accS)
    cute.nvgpu.warpgroup.commit_group()


@cute.jit
def pv_issue(mma_pv: cute.TiledMma, thr_pv, accO0: cute.Tensor, accO1: cute.Tensor,
             tOrP: cute.Tensor, pool: Int32, pv: Int32, sV_layout: cute.ComposedLayout):
    """O += P V of the V page pv (P from registers): issued and committed as one group, not
    waited for."""
    cute.nvgpu.warpgroup.fence()
    tOrV0 = thr_pv.make_fragment_B(thr_pv.partition_B(swz_tensor(pool, pv, 0, sV_layout)))
    tOrV1 = thr_pv.make_fragment_B(thr_pv.partition_B(swz_tensor(pool, pv, HALF_BYTES,
                                                                  sV_layout)))
    for kb in cutlass.range_constexpr(KB // 16):
        cute.gemm(mma_pv, accO0, tOrP[(None, None, kb)], tOrV0[(None, None, kb)], accO0)
    for kb in cutlass.range_constexpr(KB // 16):
        cute.gemm(mma_pv, accO1, tOrP[(None, None, kb)], tOrV1[(None, None, kb)], accO1)
    cute.nvgpu.warpgroup.commit_group()


@cute.jit
def frag_rows_store(accO0: cute.Tensor, accO1: cute.Tensor, tb: Int32,
                    dtype: cutlass.Constexpr, inv0: Float32, inv1: Float32):
    """The m64n64 fragments times their rows' 1 / l as dtype (bf16 or fp32) rows of 128 columns
    from byte address tb (this thread's row r0, column c0): pair v of chain j at row + 8 (v % 2),
    column + 8 (v // 2) + 64 j."""
    eb = dtype.width // 8
    for j in cutlass.range_constexpr(2):
        acc = accO0 if j == 0 else accO1
        for v in cutlass.range_constexpr(cute.size(accO0) // 2):
            iv = inv0 if v % 2 == 0 else inv1
            d = cute.make_tensor(cute.make_ptr(
                dtype, tb + ((v % 2) * 8 * D * eb + ((v // 2) * 8 + j * HALF) * eb),
                cute.AddressSpace.smem, assumed_align=2 * eb), cute.make_layout(2))
            if cutlass.const_expr(dtype == Float32):
                d[0] = acc[2 * v] * iv
                d[1] = acc[2 * v + 1] * iv
            else:
                d[0] = (acc[2 * v] * iv).to(dtype)
                d[1] = (acc[2 * v + 1] * iv).to(dtype)


@cute.jit
def frag_writes(accO0: cute.Tensor, accO1: cute.Tensor, r0: Int32, c0: Int32, inv0: Float32,
                inv1: Float32, lse0: Float32, lse1: Float32, pool: Int32, ep0: Int32,
                npages: cutlass.Constexpr, mode: Int32, wg: Int32, lane: Int32):
    """O / l of the warpgroup's 64 rows (the m64n64 fragments; pair v of a chain: row r0 + 8
    (v % 2), column c0 + 8 (v // 2) (+ 64 chain)) into its epilogue pages: bf16 rows of 256 B
    (direct, pairs) or fp32 rows of 512 B + the LSE page (MODE_PARTIAL)."""
    if mode != at.MODE_PARTIAL:       # direct, or a pair: page w is unit w's
        pgw = ep0 + wg
        if pgw >= npages:
            pgw = pgw - npages
        frag_rows_store(accO0, accO1, pool + pgw * PAGE + r0 * 256 + c0 * 2, BFloat16, inv0,
                        inv1)
    else:
        pgw = ep0 + wg * 2 + r0 // 32
        if pgw >= npages:
            pgw = pgw - npages
        frag_rows_store(accO0, accO1, pool + pgw * PAGE + (r0 % 32) * 512 + c0 * 4, Float32,
                        inv0, inv1)
        # LSE page (epilogue page 4): the quad's lane 0 writes its two rows
        if lane % 4 == 0:
            pgl = ep0 + 4
            if pgl >= npages:
                pgl = pgl - npages
            lb = pool + pgl * PAGE + (wg * 64 + r0) * 4
            for hh in cutlass.range_constexpr(2):
                lp = cute.make_tensor(cute.make_ptr(Float32, lb + hh * 8 * 4,
                                                    cute.AddressSpace.smem, assumed_align=4),
                                      cute.make_layout(1))
                lp[0] = lse0 if hh == 0 else lse1


# ---------------------------------------------------------------- the swapped decode chain
# (SWAPPED; the module constants' comment says why). `sw`: swap_bundle's arguments, from which
# each helper builds the part it uses at its point of use (one bundle carried through the loops
# kept its addresses live: spills); the chain's per-block state is the other path's scalars:
# each thread holds two of the unit's rows (wgmma columns 2 (lane % 4), + 1), so (mr0, mr1, ls0,
# ls1) are their running maxima and this thread's share of their sums.
def attn_mma_init(mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, swap=None):
    """The attention tiled MMAs accumulate (the swapped chain's too): set once where the
    consumers start, before their instruction loop. Not in attn_consume: it is traced once per
    chain inside the caller's branches, and a field set in one trace's branch does not dominate
    the other's uses."""
    mma_qk.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
    mma_pv.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
    if swap is not None:
        swap[0].set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        swap[1].set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)


@cute.jit
def swapped_rows(R: Int32, qpk: Int32):
    """An ATTENTION instruction the swapped chain runs (attn_consume's swap): at most SWAP_ROWS
    query rows (a decode token's q heads of one KV head, or a pair's)."""
    return R * qpk <= SWAP_ROWS


@cute.jit
def swap_bundle(swap, wg: Int32, wtid: Int32, accS: cute.Tensor, accO0: cute.Tensor):
    """(mma_s, mma_o, thr_s, thr_o, sKt_layout, sVt_layout, tSrQt, tOrPt, tScSt, tOcOt, accSt,
    accOt, sQt, sPt, red, scratch address) of warpgroup wg; S^T and O^T accumulate in the first
    elements of the other path's accS / accO0 registers (never live together); the tiled MMAs
    accumulate (attn_mma_init)."""
    mma_s, mma_o, sKt_layout, sVt_layout, sQt_layout, sPt_layout, scratch = swap
    # opaque: derived afresh at each use (hoisted out of the instruction loop, the Q^T / P^T
    # descriptors and addresses stayed live across every body: the megakernel spilled 112 B)
    scr = rk.opaque(scratch + wg * SWAP_SCRATCH)
    sQt = cute.make_tensor(cute.recast_ptr(cute.make_ptr(BFloat16, scr, cute.AddressSpace.smem,
                                                         assumed_align=1024),
                                           sQt_layout.inner, dtype=BFloat16), sQt_layout.outer)
    sPt = cute.make_tensor(cute.recast_ptr(cute.make_ptr(BFloat16, scr + SWAP_P_OFF,
                                                         cute.AddressSpace.smem,
                                                         assumed_align=1024),
                                           sPt_layout.inner, dtype=BFloat16), sPt_layout.outer)
    red = cute.make_tensor(cute.make_ptr(Float32, scr + SWAP_RED_OFF, cute.AddressSpace.smem,
                                         assumed_align=16),
                           cute.make_layout((4, SWAP_ROWS), stride=(SWAP_ROWS, 1)))
    thr_s = mma_s.get_slice(wtid)
    thr_o = mma_o.get_slice(wtid)
    tSrQt = thr_s.make_fragment_B(thr_s.partition_B(sQt))
    tOrPt = thr_o.make_fragment_B(thr_o.partition_B(sPt))
    tScSt = thr_s.partition_C(cute.make_identity_tensor((KB, SWAP_ROWS)))
    tOcOt = thr_o.partition_C(cute.make_identity_tensor((D, SWAP_ROWS)))
    accSt = cute.make_tensor(accS.iterator, cute.make_layout(thr_s.partition_shape_C((KB, SWAP_ROWS))))
    accOt = cute.make_tensor(accO0.iterator, cute.make_layout(thr_o.partition_shape_C((D, SWAP_ROWS))))
    return (mma_s, mma_o, thr_s, thr_o, sKt_layout, sVt_layout, tSrQt, tOrPt, tScSt, tOcOt, accSt,
            accOt, sQt, sPt, red, scr)


@cute.jit
def swap_idle_barriers(wg: Int32, n: cutlass.Constexpr):
    """An inactive warpgroup's stand-ins for the swapped chain's n warpgroup barriers at this
    point (Q^T 1, a key block 2, the sums 2), so that both warpgroups execute the same sequence
    of named-barrier syncs. Without them racecheck reported RAW hazards on RMSNORM's cross-warp
    partials (written by warpgroup 0, read by warpgroup 1 after the 256-thread barrier 1) in
    every swapped run, where warpgroup 0 alone had synced on barrier 5 dozens of times; with
    them 0 hazards (session 32, bench/results/swaprace_2026-12-04_s32.log)."""
    for _ in cutlass.range_constexpr(n):
        wg_barrier(wg)


@cute.jit
def swap_load_q(sw, q_base: Int64, ldq: Int32, row0: Int32, mw: Int32, mtot: Int32, qpk: Int32,
                head0: Int32, wtid: Int32, wg: Int32):
    """Q^T of the warpgroup's rows mw .. mw + 7 (zero past the last row) into its scratch: thread
    wtid loads row wtid // 16's 16 bytes of dims 8 (wtid % 16) .. + 8; then the async-proxy fence
    and the warpgroup's barrier before the first wgmma reads them."""
    sw = swap_bundle(*sw)
    n = wtid // 16
    ch = wtid % 16
    m = mw + n
    qv = cute.make_rmem_tensor(cute.make_layout(8), BFloat16)
    qv.fill(0.0)
    if m < mtot:
        it = m // qpk
        h = m - it * qpk
        addr = q_base + Int64((row0 + it) * ldq + (head0 + h) * D + ch * 8) * 2
        qv.store(cute.make_tensor(cute.make_ptr(BFloat16, addr, cute.AddressSpace.gmem,
                                                assumed_align=16), cute.make_layout(8)).load())
    # one 16-byte store at sQt_layout's address of (n, 8 ch): S<3,4,3> o ((8,1),(64,2)):
    # ((64,0),(1,512)), i.e. row n at 128 n, dim half at 1 KiB, 16-byte chunk XOR row (element
    # by element through the layout, 8 swizzled addresses stayed live across the kernel: spills)
    off = (ch // 8) * 1024 + n * 128 + ((ch % 8) ^ n) * 16
    cute.make_tensor(cute.make_ptr(BFloat16, sw[15] + off, cute.AddressSpace.smem,
                                   assumed_align=16), cute.make_layout(8)).store(qv.load())
    cute.arch.fence_proxy("async.shared", space="cta")
    wg_barrier(wg)


@cute.jit
def swap_limits(sw, kend: Int32, pos0: Int32, mw: Int32, qpk: Int32):
    """The causal key limits of this thread's two rows (columns) in the swapped chain."""
    sw = swap_bundle(*sw)
    _k, n0 = sw[8][0]
    return (imin(kend, pos0 + (mw + n0) // qpk + 1), imin(kend, pos0 + (mw + n0 + 1) // qpk + 1))


@cute.jit
def page_chain_issue(mma: cute.TiledMma, thr, a_layout: cute.ComposedLayout, pool: Int32,
                     page: Int32, tB: cute.Tensor, acc: cute.Tensor):
    """acc += A B with A the pool page `page` (a_layout) and B the scratch operand tB, over the
    whole K extent: issued and committed as one group, not waited for."""
    cute.nvgpu.warpgroup.fence()
    tA = thr.make_fragment_A(thr.partition_A(swz_tensor(pool, page, 0, a_layout)))
    for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        cute.gemm(mma, acc, tA[(None, None, kb)], tB[(None, None, kb)], acc)
    cute.nvgpu.warpgroup.commit_group()


@cute.jit
def st_issue(sw, pool: Int32, pk: Int32):
    """S^T += K Q^T of the K page pk (64 keys x 8 rows, K = 128 dims; S^T zeroed by the caller,
    as qk_issue's S)."""
    b = swap_bundle(*sw)
    page_chain_issue(b[0], b[2], b[4], pool, pk, b[6], b[10])


@cute.jit
def ot_issue(sw, pool: Int32, pv: Int32):
    """O^T += V^T P^T of the V page pv (128 dims in two m64 tiles x 8 rows, K = 64 keys; P^T
    from the scratch)."""
    b = swap_bundle(*sw)
    page_chain_issue(b[1], b[3], b[5], pool, pv, b[7], b[11])


@cute.jit
def column_max(x: Float32) -> Float32:
    """Max over the 8 lanes of a wgmma column (lane bits 2..4)."""
    for off in cutlass.range_constexpr(3):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=4 << off))
    return x


@cute.jit
def column_sum(x: Float32) -> Float32:
    for off in cutlass.range_constexpr(3):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=4 << off)
    return x


@cute.jit
def swap_exchange(red: cute.Tensor, x0: Float32, x1: Float32, wq: Int32, lane: Int32, wg: Int32,
                  is_max: cutlass.Constexpr):
    """The four warps' column values (max or sum) of this thread's two columns, through the
    scratch and the warpgroup's barrier: every thread gets the warpgroup's result."""
    if lane < 4:
        red[wq, 2 * lane] = x0
        red[wq, 2 * lane + 1] = x1
    wg_barrier(wg)
    c = 2 * (lane % 4)
    if cutlass.const_expr(is_max):
        x0 = cute.arch.fmax(cute.arch.fmax(red[0, c], red[1, c]), cute.arch.fmax(red[2, c], red[3, c]))
        x1 = cute.arch.fmax(cute.arch.fmax(red[0, c + 1], red[1, c + 1]),
                            cute.arch.fmax(red[2, c + 1], red[3, c + 1]))
    else:
        x0 = red[0, c] + red[1, c] + red[2, c] + red[3, c]
        x1 = red[0, c + 1] + red[1, c + 1] + red[2, c + 1] + red[3, c + 1]
    return x0, x1


@cute.jit
def swapped_softmax(sw, kb0: Int32, lim0: Int32, lim1: Int32, mr0: Float32, mr1: Float32,
                    ls0: Float32, ls1: Float32, scale: Float32, wq: Int32, lane: Int32, wg: Int32):
    """One key block of the online softmax on S^T (the face's roundings, as online_softmax): the
    columns' maxima over the 64 keys (this thread's two keys, the column's lanes, the four warps
    through the scratch), O^T's columns rescaled, P^T (bf16) into the scratch, then the fence and
    the barrier before O^T's wgmma reads it. The maxima's exchange is safe to overwrite: every
    thread read the previous block's before its P^T barrier. Returns the new (m0, m1, l0, l1)."""
    sw = swap_bundle(*sw)
    tScSt, accSt, accOt, red = sw[8], sw[10], sw[11], sw[14]
    bm0 = Float32(NEG_INF)
    bm1 = Float32(NEG_INF)
    for v in cutlass.range_constexpr(2):            # elements 2v, 2v + 1: one key, two columns
        q0, q1 = bf_pair(accSt[2 * v], accSt[2 * v + 1])
        s0, s1 = bf_pair(q0 * scale, q1 * scale)
        key, _n = tScSt[2 * v]
        if kb0 + key >= lim0:
            s0 = Float32(NEG_INF)
        if kb0 + key >= lim1:
            s1 = Float32(NEG_INF)
        bm0 = cute.arch.fmax(bm0, s0)
        bm1 = cute.arch.fmax(bm1, s1)
        accSt[2 * v] = s0
        accSt[2 * v + 1] = s1
    bm0, bm1 = swap_exchange(red, column_max(bm0), column_max(bm1), wq, lane, wg, True)
    mr0, ms0, al0, ls0 = rescale_to(mr0, cute.arch.fmax(mr0, bm0), ls0)
    mr1, ms1, al1, ls1 = rescale_to(mr1, cute.arch.fmax(mr1, bm1), ls1)
    for e in cutlass.range_constexpr(cute.size(accOt)):
        accOt[e] = accOt[e] * (al0 if e % 2 == 0 else al1)
    # P^T [row n, key] (sPt_layout: S<3,4,3> o ((8,1),(64,1)):((64,0),(1,0)), row n at 128 n, the
    # 16-byte chunk key / 8 XOR n): this thread's keys k0 = 16 wq + lane / 4 and k0 + 8 in rows
    # n0 = 2 (lane % 4) (even) and n0 + 1; chunk (2 wq) ^ n0 is even, so the four addresses are
    # one base + 0 / 16 (row n0) and + 144 / 128 (row n0 + 1)
    n0 = 2 * (lane % 4)
    pbase = sw[15] + SWAP_P_OFF + n0 * 128 + ((2 * wq) ^ n0) * 16 + (lane // 4) * 2
    for e in cutlass.range_constexpr(cute.size(accSt)):
        p = cute.math.exp2(accSt[e] * Float32(LOG2E) - (ms0 if e % 2 == 0 else ms1),
                           fastmath=True)
        if cutlass.const_expr(e % 2 == 0):
            ls0 = ls0 + p
        else:
            ls1 = ls1 + p
        pd = cute.make_tensor(cute.make_ptr(BFloat16, pbase + (0, 144, 16, 128)[e],
                                            cute.AddressSpace.smem, assumed_align=2),
                              cute.make_layout(1))
        pd[0] = p.to(BFloat16)
    cute.arch.fence_proxy("async.shared", space="cta")
    wg_barrier(wg)
    return mr0, mr1, ls0, ls1


@cute.jit
def swap_row_sums(sw, ls0: Float32, ls1: Float32, wq: Int32, lane: Int32, wg: Int32):
    """The two rows' sums over every key of the unit (the column's lanes, the four warps), then a
    second barrier: every thread's reads before the next unit's writes of the scratch."""
    sw = swap_bundle(*sw)
    t0, t1 = swap_exchange(sw[14], column_sum(ls0), column_sum(ls1), wq, lane, wg, False)
    wg_barrier(wg)
    return t0, t1


@cute.jit
def swap_rows_store(sw, page_base: Int32, dtype: cutlass.Constexpr, inv0: Float32, inv1: Float32):
    """O^T times its columns' 1 / l as dtype (bf16 or fp32) rows of 128 columns from page_base:
    element e of this thread at (row n, column dim) of tOcOt."""
    tOcOt, accOt = sw[9], sw[11]
    eb = dtype.width // 8
    for e in cutlass.range_constexpr(cute.size(accOt)):
        dim, n = tOcOt[e]
        d = cute.make_tensor(cute.make_ptr(dtype, page_base + (n * D + dim) * eb,
                                           cute.AddressSpace.smem, assumed_align=eb),
                             cute.make_layout(1))
        if cutlass.const_expr(dtype == Float32):
            d[0] = accOt[e] * (inv0 if e % 2 == 0 else inv1)
        else:
            d[0] = (accOt[e] * (inv0 if e % 2 == 0 else inv1)).to(dtype)


@cute.jit
def swap_writes(sw, inv0: Float32, inv1: Float32, lse0: Float32, lse1: Float32, pool: Int32,
                ep0: Int32, npages: cutlass.Constexpr, mode: Int32, wg: Int32, wq: Int32,
                lane: Int32):
    """O^T / l into the warpgroup's epilogue page rows (the unit's row n = column n, as the
    other path's rows): bf16 rows of 256 B (direct, pairs) or fp32 rows of 512 B + the LSE page
    (MODE_PARTIAL); rows past the unit's last are garbage the storer never stores."""
    sw = swap_bundle(*sw)
    if mode != at.MODE_PARTIAL:
        pgw = ep0 + wg
        if pgw >= npages:
            pgw = pgw - npages
        swap_rows_store(sw, pool + pgw * PAGE, BFloat16, inv0, inv1)
    else:
        pgw = ep0 + wg * 2
        if pgw >= npages:
            pgw = pgw - npages
        swap_rows_store(sw, pool + pgw * PAGE, Float32, inv0, inv1)
        if wq == 0:
            if lane < 4:
                pgl = ep0 + 4
                if pgl >= npages:
                    pgl = pgl - npages
                lp = cute.make_tensor(cute.make_ptr(Float32, pool + pgl * PAGE
                                                    + (wg * 64 + 2 * lane) * 4,
                                                    cute.AddressSpace.smem, assumed_align=8),
                                      cute.make_layout(2))
                lp[0] = lse0
                lp[1] = lse1


@cute.jit
def v_tail_zero(pool: Int32, pv: Int32, nkeys: Int32, narrow, wg: Int32, wtid: Int32,
                ctid: Int32):
    """V rows past the key end of a block with nkeys < KB keys -> 0 by every thread that reads
    the page (a narrow unit's: its warpgroup's), then fence and sync them before the PV wgmma."""
    if narrow:
        zero_v_tail(pool, pv, nkeys, wtid, 128)
        cute.arch.fence_proxy("async.shared", space="cta")
        wg_barrier(wg)
    else:
        zero_v_tail(pool, pv, nkeys, ctid, CONSUMER_THREADS)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=BAR_ATTN, number_of_threads=CONSUMER_THREADS)


@cute.jit
def retire_wgmmas(mclk):
    """Wait for every wgmma this warpgroup issued (the journal variant's clock: mma_word)."""
    t0 = rk.wait_clock_start(mclk)
    cute.nvgpu.warpgroup.wait_group(0)
    rk.wait_clock_add(mclk, t0)


@cute.jit
def attn_blocks(mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, thr_qk, thr_pv,
                sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, tSrQ: cute.Tensor,
                tScS: cute.Tensor, accS: cute.Tensor, accO0: cute.Tensor, accO1: cute.Tensor,
                rP: cute.Tensor, tOrP: cute.Tensor, pool: Int32, full: cute.Pointer,
                done: cute.Pointer, pg: Int32, npages: cutlass.Constexpr, nring: Int32, kv0: Int32,
                kend: Int32, lim0: Int32, lim1: Int32, mr0: Float32, mr1: Float32, ls0: Float32,
                ls1: Float32, scale: Float32, narrow, active, warp_rows, both_halves, wg: Int32,
                wtid: Int32, ctid: Int32, timeout_ns: Int64, state: cute.Tensor, ticket: Int32,
                share: cutlass.Constexpr, wclk=None, mclk=None, sclk=None, paired=None,
                walk: Int32 = 0, wg_split: cutlass.Constexpr = False, sw=None, kend_o=None):
    """A unit's key blocks one after the other (ring block j: K page pg + 2j, V page pg + 2j +
    1): S = Q K^T, the online softmax, O += P V, each waited for before the next. An inactive
    warpgroup (no query row) only waits for the pages and arrives `done`, a warp without query
    rows skips the softmax (warp_rows, both_halves: see attn_consume); a narrow unit's blocks
    alternate between the warpgroups; a pair's (paired: a Boolean, or None where pairs never
    run; narrow is then set too: each page is read by one warpgroup) ring blocks are warpgroup
    u's for unit u (ring_block with walk), kv0 / kend / lim of this warpgroup's unit; wg_split:
    narrow units of one unit may occur too (attn_consume's). Returns the rows' (m0, m1, l0, l1)
    and the page count after. wclk / mclk / sclk (the journal variant's clocks, else None): time
    waiting for full K/V pages, for the wgmmas (QK^T, then P V) to retire, and in the online
    softmax. sw (None: the m64n64 chain): swap_bundle's arguments, the swapped chain (S^T,
    swapped_softmax, O^T) on the same pages; the caller traces one loop per chain so that
    neither carries the other's registers. kend_o (SWAP_SPLIT's swapped chain, else None): the
    key end of the unit whose blocks this warpgroup does not own (a pair's other unit; a split
    unit's own), for the stand-ins of the owner's V-tail sync."""
    hm = handoff_of(share)
    # "thread" hand-off: a narrow unit's pages get every consumer thread's `done` arrival, as a
    # full unit's do (the other warpgroup's once the page is full, so never into the previous
    # use's phase): each thread's earlier shared-memory accesses then precede the page's next use
    # through its own arrival (racecheck reported RMSNORM's scratch reads against the next writes
    # of a page when only the reading warpgroup arrived; session 6)
    one_wg_done = narrow
    if cutlass.const_expr(hm == "thread"):
        one_wg_done = cutlass.Boolean(False)
    for j in range(nring):
        b = j
        if cutlass.const_expr(paired is not None):
            u, b = ring_block(j, walk)
        kb0 = kv0 + b * KB
        pk, phk = page_of(pg, npages)
        pv, phv = page_of(pg + 1, npages)
        mine = cutlass.Boolean(True)
        if narrow:
            if cutlass.const_expr(paired is None):
                mine = j % 2 == wg
            elif cutlass.const_expr(not wg_split):
                mine = u == wg                    # only a pair is narrow here
            else:
                mine = j % 2 == wg
                if paired:
                    mine = u == wg
        if not mine:
            if cutlass.const_expr(hm == "thread"):
                page_wait(full + pk, phk, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
                release_kv_page(pk, done, one_wg_done, share, wtid, ctid, hm)
                page_wait(full + pv, phv, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
                release_kv_page(pv, done, one_wg_done, share, wtid, ctid, hm)
            if cutlass.const_expr(sw is not None and SWAP_SPLIT and not NOMATH):
                # the owner's barrier syncs of this block (the softmax's two, the V tail's), so
                # both warpgroups sync theirs equally often at every ring block (SWAP_SPLIT says
                # why): a split unit's block, or a pair's other unit's, whose tail test is
                # against that unit's key end (kend_o). Session 37's stand-ins in a pair tested
                # this warpgroup's own kend: with the 131 / 201-key pair warpgroup 0 synced 20
                # times, warpgroup 1 18 (racecheck: 16 hazard instances on RMSNORM's partials,
                # bench/results/pairrace_swapsplit_racecheck_ff4c9e8_2026-12-04_s37.log); 7ece6c6
                # dropped them in a pair, which leaves the default build's 10 against 12 there
                # (session 38: 4 instances; the default build's run in session 37: 0). Now 19 /
                # 19 (tests/test_attention_compile.py's barrier model).
                swap_idle_barriers(wg, 2)
                if kend_o - kb0 < KB:
                    wg_barrier(wg)
        else:
            t0 = rk.wait_clock_start(wclk)
            page_wait(full + pk, phk, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
            rk.wait_clock_add(wclk, t0)
            if cutlass.const_expr(not NOMATH):
                # S (S^T: its first elements) zeroed on every path, not only behind `active`: the
                # softmax reads it behind warp_rows, which the compiler cannot tell implies
                # `active`, so S was a value carried from one instruction to the next, its 32
                # registers (S^T's 4) live across the whole persistent loop (the all-opcode
                # variants spilled the loop's count and ticket; session 34)
                accS.fill(0.0)
                if active:
                    if cutlass.const_expr(sw is None):
                        qk_issue(mma_qk, thr_qk, accS, tSrQ, pool, pk, sK_layout)
                    else:
                        st_issue(sw, pool, pk)
                    retire_wgmmas(mclk)
            # K page read (S retired): hand it to the storer (a narrow unit's page outside the
            # "thread" hand-off: this WG's threads arrive for both)
            release_kv_page(pk, done, one_wg_done, share, wtid, ctid, hm)
            if cutlass.const_expr(not NOMATH):
                if warp_rows:                     # implies active
                    t0 = rk.wait_clock_start(sclk)
                    if cutlass.const_expr(sw is None):
                        if both_halves:
                            mr0, mr1, ls0, ls1 = online_softmax(accS, tScS, kb0, lim0, lim1, mr0,
                                                                mr1, ls0, ls1, accO0, accO1, rP,
                                                                scale, True)
                        else:
                            mr0, mr1, ls0, ls1 = online_softmax(accS, tScS, kb0, lim0, lim1, mr0,
                                                                mr1, ls0, ls1, accO0, accO1, rP,
                                                                scale, False)
                    else:
                        mr0, mr1, ls0, ls1 = swapped_softmax(sw, kb0, lim0, lim1, mr0, mr1, ls0,
                                                             ls1, scale, wtid // 32, wtid % 32, wg)
                    rk.wait_clock_add(sclk, t0)
                else:
                    if cutlass.const_expr(sw is not None):
                        swap_idle_barriers(wg, 2)
                    else:
                        # P = 0 (no query row): written for each block, as the softmax writes
                        # it, so that P is never carried across blocks or instructions (filled
                        # once per unit before the loop, it was live across the persistent
                        # loop: accS's fill above says why); an opaque 0, or the compiler
                        # zeroes P ahead of the branch, live beside S through the softmax
                        rP.fill(Float32(rk.opaque(Int32(0))))
            t0 = rk.wait_clock_start(wclk)
            page_wait(full + pv, phv, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
            rk.wait_clock_add(wclk, t0)
            if cutlass.const_expr(not NOMATH):
                nkeys = kend - kb0
                if nkeys < KB:
                    v_tail_zero(pool, pv, nkeys, narrow, wg, wtid, ctid)
                if active:
                    if cutlass.const_expr(sw is None):
                        pv_issue(mma_pv, thr_pv, accO0, accO1, tOrP, pool, pv, sV_layout)
                    else:
                        ot_issue(sw, pool, pv)
                    retire_wgmmas(mclk)
            release_kv_page(pv, done, one_wg_done, share, wtid, ctid, hm)
        pg = pg + 2
    return mr0, mr1, ls0, ls1, pg


@cute.jit
def attn_consume(mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, sK_layout: cute.ComposedLayout,
                 sV_layout: cute.ComposedLayout, q_base: Int64, ldq: Int32, row0: Int32, R: Int32,
                 col0: Int32, cols: Int32, pos0: Int32, kv0: Int32, kv1: Int32, mode: Int32,
                 qpk: Int32, pool: Int32, full: cute.Pointer, empty: cute.Pointer,
                 done: cute.Pointer, pg: Int32, npages: cutlass.Constexpr, ctid: Int32,
                 timeout_ns: Int64, state: cute.Tensor, ticket: Int32,
                 share: cutlass.Constexpr = DONE_ARRIVALS,
                 wg_split: cutlass.Constexpr = WG_SPLIT, journal=None,
                 wait_word: cutlass.Constexpr = -1, mma_word: cutlass.Constexpr = -1,
                 softmax_word: cutlass.Constexpr = -1, pair=None, swap=None) -> Int32:
    """Both consumer warpgroups (ctid in [0, 256)). q_base: byte address of Q[0, 0] (bf16, row
    pitch ldq elements). share: done[p]'s init count (see the module docstring). wg_split
    (compile time): a unit of at most NARROW_ROWS query rows (decode) is split by key blocks
    between the two warpgroups (block b to warpgroup b % 2, each arriving for both on its pages'
    done barriers) and the two (m, l, O) are merged through warpgroup 1's epilogue page; warps
    skip the softmax of row halves that hold no query row. Returns the new page count.
    wait_word >= 0 (the megakernel's journal variant): consumer thread 0's time waiting for full
    K/V pages, summed, into that word of row `ticket`; mma_word / softmax_word likewise its time
    waiting for the key blocks' wgmmas to retire / in their online softmax (where a decode
    instruction's consumer time goes, bench/ATTENTION_NOTES.md session 11).
    pair (the megakernel: the second unit's words, see second_unit; None: never a pair): in a
    MODE_PAIR instruction warpgroup w runs unit w (its own Q row, keys and epilogue page w).
    swap (SWAPPED: AttnAtoms.swap_ops() + the scratch's shared-memory address; None: the m64n64
    chain): every active warpgroup runs the swapped chain, for an instruction of at most
    SWAP_ROWS query rows (R * qpk, the caller's test: swapped_rows); the caller traces this
    function once per chain, so that neither's registers are live in the other's code (one trace
    with a branch per unit spilled 112 B in the megakernel's M64 variant)."""
    hm = handoff_of(share)
    wclk = rk.make_wait_clock(wait_word)
    mclk = rk.make_wait_clock(mma_word)
    sclk = rk.make_wait_clock(softmax_word)
    wg = ctid // 128
    wtid = ctid % 128
    lane = ctid % 32
    wq = wtid // 32                             # warp of the warpgroup: rows [16 wq, 16 wq + 16)
    thr_qk = mma_qk.get_slice(wtid)
    thr_pv = mma_pv.get_slice(wtid)
    tScS = thr_qk.partition_C(cute.make_identity_tensor((64, KB)))
    tQcQ = thr_qk.partition_A(cute.make_identity_tensor((64, D)))
    tOcO = thr_pv.partition_C(cute.make_identity_tensor((64, HALF)))
    tSrQ = thr_qk.make_fragment_A(thr_qk.partition_shape_A((64, D)))
    accS = cute.make_rmem_tensor(thr_qk.partition_shape_C((64, KB)), Float32)
    accO0 = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, HALF)), Float32)
    accO1 = cute.make_rmem_tensor(thr_pv.partition_shape_C((64, HALF)), Float32)
    rP = cute.make_rmem_tensor(accS.layout, BFloat16)
    tOrP = cute.make_tensor(rP.iterator, acc_to_frgA_layout(rP.layout))
    scale = Float32(D ** -0.5)
    mtot = R * qpk
    n_mt = (mtot + (MT - 1)) // MT
    # E_PARTIAL epilogue pages for MODE_PARTIAL (1), E_DIRECT for direct and pairs (0, 2):
    # arithmetic, not a branch on the mode (with the branch the harness's wg_split variant
    # spilled 12 bytes)
    ne = Int32(E_DIRECT) + (mode & 1) * (E_PARTIAL - E_DIRECT)
    sw = None
    # a lone decode unit's key blocks over both warpgroups: the m64n64 chain's wg_split, or the
    # swapped chain's SWAP_SPLIT
    split_units = wg_split or (swap is not None and SWAP_SPLIT)
    if cutlass.const_expr(swap is not None):
        assert not wg_split, "the swapped chain: no wg_split"
        # swap_bundle's arguments: each use builds its part (one bundle built here and carried
        # through the loops kept its values live across the other path: 12 B of spills)
        sw = (swap, wg, wtid, accS, accO0)
    for kh in range(cols):
        head0 = (col0 + kh) * qpk                 # first q head of this KV head
        for mt in range(n_mt):
            kend, nblk = unit_range(R, qpk, pos0, kv0, kv1, mt)
            paired, kend_b, nblk_b, walk = second_unit(pair, mode, qpk, kv0, nblk)
            narrow = cutlass.Boolean(False)       # the unit's blocks split between the WGs
            if cutlass.const_expr(split_units):
                # (the swapped trace runs instructions of <= SWAP_ROWS rows: narrow units)
                narrow = mtot - mt * MT <= NARROW_ROWS
                if cutlass.const_expr(swap is not None):
                    if nblk < SWAP_SPLIT_MIN_BLOCKS:
                        narrow = cutlass.Boolean(False)
                if cutlass.const_expr(pair is not None):
                    if paired:
                        narrow = cutlass.Boolean(False)
            mw = mt * MT + wg * 64                # first query row of this warpgroup
            if narrow:
                mw = mt * MT                      # both WGs hold the unit's rows
            # this warpgroup's unit: the instruction's, or in a pair warpgroup 1's the second
            row0_w = row0
            pos0_w = pos0
            kend_w = kend
            solo = narrow                         # each K / V page read by one warpgroup
            if cutlass.const_expr(pair is not None):
                if paired:
                    mw = Int32(0)
                    solo = cutlass.Boolean(True)
                    if wg == 1:
                        row0_w = pair[0]
                        pos0_w = pair[1]
                        kend_w = kend_b
            active = mw < mtot                    # warp-uniform (decode, no split: WG1 idles)
            # a warp's rows are [16 wq, 16 wq + 16) of its warpgroup's 64, r0 and r0 + 8 of each
            # thread: a decode token's 8 q heads are warp 0's first row half, so the other warps
            # skip the softmax (their P is 0, their O rows 0, never stored) and warp 0 does
            # half of it; the wgmmas are the warpgroup's whatever its rows
            warp_rows = mw + wq * 16 < mtot
            both_halves = mw + wq * 16 + 8 < mtot
            if cutlass.const_expr(sw is not None):
                warp_rows = active                # the swapped chain runs on all four warps
            # ---- Q rows -> A fragment (registers), zero past the last row; or Q^T into the
            #      scratch (swapped)
            if cutlass.const_expr(sw is None):
                load_q_rows(tSrQ, tQcQ, q_base, ldq, row0_w, mw, mtot, qpk, head0, wg_split)
            else:
                if active:
                    swap_load_q(sw, q_base, ldq, row0_w, mw, mtot, qpk, head0, wtid, wg)
                else:
                    swap_idle_barriers(wg, 1)
            # ---- per-row causal limits (each thread holds 2 rows: fragment element i is in row
            #      half (i // 2) % 2); scalars, so the dynamic loops carry them
            r_a, _ca = tScS[0]
            r_b, _cb = tScS[2]
            lim0 = imin(kend_w, pos0_w + (mw + r_a) // qpk + 1)
            lim1 = imin(kend_w, pos0_w + (mw + r_b) // qpk + 1)
            if cutlass.const_expr(sw is not None):
                lim0, lim1 = swap_limits(sw, kend_w, pos0_w, mw, qpk)
            mr0 = Float32(NEG_INF)
            mr1 = Float32(NEG_INF)
            ls0 = Float32(0.0)
            ls1 = Float32(0.0)
            accO0.fill(0.0)
            accO1.fill(0.0)
            if cutlass.const_expr(NOMATH):
                # experiment: keep the Q loads alive (the math that reads them is left out), so
                # that nomath removes only the per-block work
                qs = Float32(0.0)
                for v in cutlass.range_constexpr(cute.size(tSrQ)):
                    qs = qs + tSrQ[v].to(Float32)
                accO0[0] = qs
            pflag = None
            if cutlass.const_expr(pair is not None):
                pflag = paired
            kend_o = None                         # the other warpgroup's unit's key end
            if cutlass.const_expr(sw is not None and SWAP_SPLIT):
                kend_o = kend_w                   # a split unit: its own (both hold it)
                if cutlass.const_expr(pair is not None):
                    if paired:
                        kend_o = kend_b
                        if wg == 1:
                            kend_o = kend
            blocks = (mma_qk, mma_pv, thr_qk, thr_pv, sK_layout, sV_layout, tSrQ, tScS, accS,
                      accO0, accO1, rP, tOrP, pool, full, done, pg, npages, nblk + nblk_b, kv0,
                      kend_w, lim0, lim1, mr0, mr1, ls0, ls1, scale, solo, active, warp_rows,
                      both_halves, wg, wtid, ctid, timeout_ns, state, ticket, share, wclk, mclk,
                      sclk, pflag, walk, split_units)
            mr0, mr1, ls0, ls1, pg = attn_blocks(*blocks, sw, kend_o)
            # ---- epilogue: o = acc / l (0 where no key), lse = m + ln l (-inf where no key)
            lt0 = quad_sum(ls0)
            lt1 = quad_sum(ls1)
            if cutlass.const_expr(sw is not None):
                if active:
                    lt0, lt1 = swap_row_sums(sw, ls0, ls1, wq, lane, wg)
                else:
                    swap_idle_barriers(wg, 2)
            for e in range(ne):
                pe, phe = page_of(pg + e, npages)
                bar_wait(full + pe, phe, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
                # the storer's reads of the page's previous use (complete: the loader waited on
                # it before the grant): a direct storer-read -> consumer-write edge for racecheck
                bar_wait(empty + pe, phe ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)
            ep0 = pg % npages
            # fragment pair v of a chain: row r0 + 8 (v % 2), column c0 + 8 (v // 2) (+ 64 chain)
            r0, c0 = tOcO[0]
            writes = cutlass.Boolean(True)        # this WG writes its rows into the pages
            if cutlass.const_expr(split_units):
                if narrow:
                    # merge: WG1's (m, l, unnormalised O) of its blocks -> its own epilogue page
                    # (its rows hold no query row: the storer stores nothing from it), read by WG0
                    # (the same coordinates per wtid)
                    mb = pool + merge_page(ep0, mode, npages) * PAGE
                    if wg == 1:
                        writes = False
                        merge_half(sw, mb, wtid, wq, r0, c0, accO0, accO1, mr0, mr1, lt0, lt1,
                                   True)
                    cute.arch.barrier(barrier_id=BAR_ATTN, number_of_threads=CONSUMER_THREADS)
                    if wg == 0:
                        mr0, mr1, lt0, lt1 = merge_half(sw, mb, wtid, wq, r0, c0, accO0, accO1,
                                                        mr0, mr1, lt0, lt1, False)
            inv0 = Float32(0.0)
            inv1 = Float32(0.0)
            lse0 = Float32(NEG_INF)
            lse1 = Float32(NEG_INF)
            if lt0 > Float32(0.0):
                inv0 = Float32(1.0) / lt0
                lse0 = mr0 + cute.math.log2(lt0, fastmath=True) * Float32(LN2)
            if lt1 > Float32(0.0):
                inv1 = Float32(1.0) / lt1
                lse1 = mr1 + cute.math.log2(lt1, fastmath=True) * Float32(LN2)
            if writes:
                if cutlass.const_expr(sw is None):
                    frag_writes(accO0, accO1, r0, c0, inv0, inv1, lse0, lse1, pool, ep0, npages,
                                mode, wg, lane)
                else:
                    if active:
                        swap_writes(sw, inv0, inv1, lse0, lse1, pool, ep0, npages, mode, wg, wq,
                                    lane)
            bulk_writer_fence()
            if cutlass.const_expr(hm == "warp"):
                cute.arch.sync_warp()
            for e in range(ne):
                pe, _ = page_of(pg + e, npages)
                rk.release(done + pe, share, CONSUMER_THREADS, ctid, BAR_ATTN, hm, sync=False)
            pg = pg + ne
    rk.wait_clock_write(wclk, journal, ticket, wait_word, ctid == 0)
    rk.wait_clock_write(mclk, journal, ticket, mma_word, ctid == 0)
    rk.wait_clock_write(sclk, journal, ticket, softmax_word, ctid == 0)
    return pg


@cute.jit
def merge_factors(mb: Int32, wtid: Int32, mr0: Float32, mr1: Float32, lt0: Float32, lt1: Float32,
                  write: cutlass.Constexpr):
    """The (m, l) half of a narrow unit's merge through page base mb: write=True (warpgroup 1)
    stores this thread's two rows' (m, l) at MERGE_ML_OFF + wtid * 16; write=False (warpgroup 0)
    reads them and folds them into its own: m = max, a = exp(m_own - m), l = a_0 l_0 + a_1 l_1 (a
    row without keys on one side has m = -inf there: a = 0). Returns (own factor of row 0, of
    row 1, the other's factor of row 0, of row 1, m0, m1, l0, l1)."""
    ml = cute.make_tensor(cute.make_ptr(Float32, mb + MERGE_ML_OFF + wtid * 16,
                                        cute.AddressSpace.smem, assumed_align=16),
                          cute.make_layout(4))
    a00 = Float32(1.0)
    a01 = Float32(1.0)
    a10 = Float32(0.0)
    a11 = Float32(0.0)
    if cutlass.const_expr(write):
        ml[0] = mr0
        ml[1] = mr1
        ml[2] = lt0
        ml[3] = lt1
    else:
        m1a = ml[0]
        m1b = ml[1]
        ma = cute.arch.fmax(mr0, m1a)
        mb_ = cute.arch.fmax(mr1, m1b)
        ua = ma
        if ma == Float32(NEG_INF):
            ua = Float32(0.0)
        ub = mb_
        if mb_ == Float32(NEG_INF):
            ub = Float32(0.0)
        a00 = cute.math.exp2((mr0 - ua) * Float32(LOG2E), fastmath=True)
        a10 = cute.math.exp2((m1a - ua) * Float32(LOG2E), fastmath=True)
        a01 = cute.math.exp2((mr1 - ub) * Float32(LOG2E), fastmath=True)
        a11 = cute.math.exp2((m1b - ub) * Float32(LOG2E), fastmath=True)
        lt0 = a00 * lt0 + a10 * ml[2]
        lt1 = a01 * lt1 + a11 * ml[3]
        mr0 = ma
        mr1 = mb_
    return a00, a01, a10, a11, mr0, mr1, lt0, lt1


@cute.jit
def merge_io(mb: Int32, wtid: Int32, r0: Int32, c0: Int32, accO0: cute.Tensor, accO1: cute.Tensor,
             mr0: Float32, mr1: Float32, lt0: Float32, lt1: Float32, write: cutlass.Constexpr):
    """The (m, l, O) merge of a narrow unit through page base mb (warp 0 of each WG): write=True
    (WG1) stores this thread's unnormalised O fragment (fp32 row r at r * 512, NARROW_ROWS rows)
    and its rows' (m, l) (merge_factors); write=False (WG0) reads them and folds them into its
    own: o = a_0 o_0 + a_1 o_1. Returns the merged (m0, m1, l0, l1)."""
    nov = cute.size(accO0)
    tb = mb + r0 * 512 + c0 * 4
    a00, a01, a10, a11, mr0, mr1, lt0, lt1 = merge_factors(mb, wtid, mr0, mr1, lt0, lt1, write)
    for j in cutlass.range_constexpr(2):
        acc = accO0 if j == 0 else accO1
        for v in cutlass.range_constexpr(nov // 2):
            d = cute.make_tensor(cute.make_ptr(
                Float32, tb + ((v % 2) * 8 * 512 + ((v // 2) * 8 + j * HALF) * 4),
                cute.AddressSpace.smem, assumed_align=8), cute.make_layout(2))
            if cutlass.const_expr(write):
                d[0] = acc[2 * v]
                d[1] = acc[2 * v + 1]
            else:
                own = a00 if v % 2 == 0 else a01
                oth = a10 if v % 2 == 0 else a11
                acc[2 * v] = acc[2 * v] * own + d[0] * oth
                acc[2 * v + 1] = acc[2 * v + 1] * own + d[1] * oth
    return mr0, mr1, lt0, lt1


@cute.jit
def swap_merge(sw, mb: Int32, wtid: Int32, mr0: Float32, mr1: Float32, lt0: Float32,
               lt1: Float32, write: cutlass.Constexpr):
    """merge_io for the swapped chain (SWAP_SPLIT): this thread's 8 O^T floats at mb + 32 wtid
    (both warpgroups' thread wtid hold the same (dim, column) elements), its columns' (m, l)
    through merge_factors (column 2 (lane % 4) + e % 2 of element e). Returns the merged
    (m0, m1, l0, l1)."""
    sw = swap_bundle(*sw)
    accOt = sw[11]
    a00, a01, a10, a11, mr0, mr1, lt0, lt1 = merge_factors(mb, wtid, mr0, mr1, lt0, lt1, write)
    d = cute.make_tensor(cute.make_ptr(Float32, mb + wtid * 32, cute.AddressSpace.smem,
                                       assumed_align=16), cute.make_layout(8))
    for e in cutlass.range_constexpr(cute.size(accOt)):
        if cutlass.const_expr(write):
            d[e] = accOt[e]
        else:
            accOt[e] = (accOt[e] * (a00 if e % 2 == 0 else a01)
                        + d[e] * (a10 if e % 2 == 0 else a11))
    return mr0, mr1, lt0, lt1


@cute.jit
def merge_half(sw, mb: Int32, wtid: Int32, wq: Int32, r0: Int32, c0: Int32, accO0: cute.Tensor,
               accO1: cute.Tensor, mr0: Float32, mr1: Float32, lt0: Float32, lt1: Float32,
               write: cutlass.Constexpr):
    """One warpgroup's half of a narrow unit's merge through page base mb (write=True: warpgroup
    1's, False: warpgroup 0's): the m64n64 chain's (sw None: merge_io, warp 0 holds the unit's
    rows) or the swapped chain's (swap_merge, every thread). Returns the merged (m0, m1, l0, l1)
    (write=True: the inputs)."""
    if cutlass.const_expr(sw is None):
        if wq == 0:
            mr0, mr1, lt0, lt1 = merge_io(mb, wtid, r0, c0, accO0, accO1, mr0, mr1, lt0, lt1,
                                          write)
    else:
        mr0, mr1, lt0, lt1 = swap_merge(sw, mb, wtid, mr0, mr1, lt0, lt1, write)
    return mr0, mr1, lt0, lt1


@cute.jit
def merge_page(ep0: Int32, mode: Int32, npages: cutlass.Constexpr) -> Int32:
    """The page a narrow unit's merge goes through: warpgroup 1's first epilogue page (bf16
    rows: ep0 + 1; float32 rows, MODE_PARTIAL: ep0 + 2), which holds no row of the unit (at
    most NARROW_ROWS rows, all in warpgroup 0's page), so the storer stores nothing from it."""
    mpg = ep0 + 1
    if mode == at.MODE_PARTIAL:
        mpg = ep0 + 2
    if mpg >= npages:
        mpg = mpg - npages
    return mpg


# ATTN_REDUCE's loads two splits ahead: the LSE maximum and the weighted sum each take two splits
# per iteration with every load issued before its use (the plain loops wait for each split's
# loads before the next split's: ~2 x nsplit dependent L2 round trips per row). Same float32
# operations in the same order. GPU-checked in session 4 with four other switches
# (bench/results/switches_2026-11-29.log), which together took decode B=1 15.29 -> 13.94 ms; the
# plain loops (MK_ATTN_REDUCE_LOADS_FIRST=0 until session 63) were never timed alone.

# ATTN_REDUCE of a page of at most WIDE_ROWS (token, head) rows (a decode token's q heads of one KV
# head: 8 at qpk 8) on every consumer thread: a warp per row, 4 columns a lane, WIDE_SPLITS splits
# per iteration with all their loads issued first. The 64-row mapping (4 threads a row) leaves
# 224 of the 256 threads idle on such a page, and each of its threads walks the splits two at a
# time in each of its two passes: nsplit dependent round trips (16 at the 16 splits of a spread
# 1024-key decode; here 2 x ceil(nsplit / 8)). The same float32 operations in the same order per
# output element (bitwise-equal results). Compile-time, on by default since session 10: B=1
# -3.0%, B=16 -0.7% (bench/results/rwide_g*_2026-11-30_s9.json); the two-layer checks with KV
# splits of 64 keys and spread splits and racecheck (0 hazards) passed with it
# (rwide_2026-11-30_s10.log). MK_ATTN_REDUCE_WIDE=0 builds the 64-row mapping for every page.
REDUCE_WIDE = os.environ.get("MK_ATTN_REDUCE_WIDE", "1") == "1"
WIDE_ROWS = CONSUMER_THREADS // 32
WIDE_SPLITS = 8


@cute.jit
def partial_add(acc: cute.Tensor, w: Float32, pv: list):
    """acc[4 len(pv)] += w * pv (loaded vectors of 4 float32 of one ATTN_PARTIAL row)."""
    for q in cutlass.range_constexpr(len(pv)):
        for u in cutlass.range_constexpr(4):
            acc[q * 4 + u] = acc[q * 4 + u] + w * pv[q][u]


@cute.jit
def partial_loads(part: cute.Tensor, srow: Int32, ldp: Int32, col: Int32,
                  nvec: cutlass.Constexpr = 8) -> list:
    """The nvec 16-byte vectors (4 nvec float32) of ATTN_PARTIAL row srow from column col."""
    out = []
    for q in cutlass.range_constexpr(nvec):
        off = Int64(srow) * Int64(ldp) + Int64(col + q * 4)
        out.append(cute.make_tensor(cute.make_ptr(Float32, (part.iterator + off).toint(),
                                                  cute.AddressSpace.gmem, assumed_align=16),
                                    cute.make_layout(4)).load())
    return out


@cute.jit
def reduce_row_loads_first(part: cute.Tensor, lse_t: cute.Tensor, acc: cute.Tensor, slot0: Int32,
                           R: Int32, it: Int32, h: Int32, cq: Int32, nsplit: Int32, ldp: Int32):
    """One output row of ATTN_REDUCE (see reduce_consume): returns (max lse, sum of weights) and
    accumulates sum_j w_j o_j into acc, two splits per iteration, loads first."""
    mx = Float32(NEG_INF)
    j = Int32(0)
    while j + 1 < nsplit:
        l0 = lse_t[slot0 + j * R + it, h]
        l1 = lse_t[slot0 + (j + 1) * R + it, h]
        mx = cute.arch.fmax(cute.arch.fmax(mx, l0), l1)
        j = j + 2
    if j < nsplit:
        mx = cute.arch.fmax(mx, lse_t[slot0 + j * R + it, h])
    den = Float32(0.0)
    col = h * D + cq
    j = Int32(0)
    while j + 1 < nsplit:
        s0 = slot0 + j * R + it
        s1 = s0 + R
        l0 = lse_t[s0, h]
        l1 = lse_t[s1, h]
        p0 = partial_loads(part, s0, ldp, col)
        p1 = partial_loads(part, s1, ldp, col)
        w0 = cute.math.exp2((l0 - mx) * Float32(LOG2E), fastmath=True)
        w1 = cute.math.exp2((l1 - mx) * Float32(LOG2E), fastmath=True)
        den = den + w0
        partial_add(acc, w0, p0)
        den = den + w1
        partial_add(acc, w1, p1)
        j = j + 2
    if j < nsplit:
        s0 = slot0 + j * R + it
        w0 = cute.math.exp2((lse_t[s0, h] - mx) * Float32(LOG2E), fastmath=True)
        den = den + w0
        partial_add(acc, w0, partial_loads(part, s0, ldp, col))
    return mx, den


@cute.jit
def combine_row(part: cute.Tensor, lse_t: cute.Tensor, it: Int32, h: Int32, slot0: Int32, R: Int32,
                nsplit: Int32, lane: Int32, acc: cute.Tensor) -> Float32:
    """One (token it, q head h) row of ATTN_REDUCE on one warp, lane l on columns 4 l .. 4 l + 3:
    acc[4] = sum_j w_j o_j, returns 1 / sum_j w_j (w_j = exp(lse_j - max lse)); WIDE_SPLITS
    splits per iteration with all their loads issued first. Splits past nsplit - 1 in an
    iteration re-read the last split (in bounds, never accumulated). (All 16 splits' loads
    issued at once, one round trip instead of four, was no faster in the step: session 30.)"""
    splits = WIDE_SPLITS
    col = h * D + lane * 4
    ldp = part.shape[1]
    mx = Float32(NEG_INF)
    j = Int32(0)
    while j < nsplit:
        ls = []
        for u in cutlass.range_constexpr(splits):
            ls.append(lse_t[slot0 + imin(j + u, nsplit - 1) * R + it, h])
        for u in cutlass.range_constexpr(splits):
            mx = cute.arch.fmax(mx, ls[u])
        j = j + splits
    acc.fill(0.0)
    den = Float32(0.0)
    j = Int32(0)
    while j < nsplit:
        ls = []
        ps = []
        for u in cutlass.range_constexpr(splits):
            srow = slot0 + imin(j + u, nsplit - 1) * R + it
            ls.append(lse_t[srow, h])
            ps.append(partial_loads(part, srow, ldp, col, 1))
        for u in cutlass.range_constexpr(splits):
            if j + u < nsplit:
                w = cute.math.exp2((ls[u] - mx) * Float32(LOG2E), fastmath=True)
                den = den + w
                partial_add(acc, w, ps[u])
        j = j + splits
    return Float32(1.0) / den


@cute.jit
def reduce_rows_wide(part: cute.Tensor, lse_t: cute.Tensor, m0: Int32, mtot: Int32, nh: Int32,
                     h0: Int32, slot0: Int32, R: Int32, nsplit: Int32, page_base: Int32,
                     ctid: Int32):
    """REDUCE_WIDE: the rows m0 + r (r < WIDE_ROWS, m < mtot) of ATTN_REDUCE into the page at
    byte address page_base, warp r on row r (combine_row)."""
    r = ctid // 32
    lane = ctid % 32
    m = m0 + r
    if m < mtot:
        it = m // nh
        h = h0 + m - it * nh
        acc = cute.make_rmem_tensor(cute.make_layout(4), Float32)
        inv = combine_row(part, lse_t, it, h, slot0, R, nsplit, lane, acc)
        d = cute.make_tensor(cute.make_ptr(BFloat16, page_base + r * 256 + lane * 8,
                                           cute.AddressSpace.smem, assumed_align=8),
                             cute.make_layout(4))
        for e in cutlass.range_constexpr(4):
            d[e] = (acc[e] * inv).to(BFloat16)


@cute.jit
def reduce_consume(part: cute.Tensor, lse_t: cute.Tensor, row0: Int32, R: Int32, col0: Int32,
                   cols: Int32, slot0: Int32, nsplit: Int32, qpk: Int32, pool: Int32,
                   full: cute.Pointer, done: cute.Pointer, pg: Int32, npages: cutlass.Constexpr,
                   ctid: Int32, timeout_ns: Int64, state: cute.Tensor, ticket: Int32,
                   share: cutlass.Constexpr = DONE_ARRIVALS, empty=None) -> Int32:
    """Consumers of ATTN_REDUCE: page c holds (row, head) pairs m = 64c + r (token m // nh, head
    h0 + m % nh) x D; thread ctid owns row r = ctid // 4, columns (ctid % 4) * 32 + [0, 32).
    part: ATTN_PARTIAL (P, hq*D) fp32; lse_t: ATTN_LSE (P, hq) fp32. share: done[p]'s init count.
    empty (optional): the empty[p] barriers, waited on (complete already) before writing a page:
    the storer-read -> consumer-write edge racecheck needs (as attn_consume does)."""
    hm = handoff_of(share)
    nh = cols * qpk
    h0 = col0 * qpk
    mtot = R * nh
    npg = (mtot + 63) // 64
    r = ctid // 4
    cq = (ctid % 4) * 32
    ldp = part.shape[1]
    ldl = lse_t.shape[1]
    for c in range(npg):
        page, ph = page_of(pg, npages)
        bar_wait(full + page, ph, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
        if cutlass.const_expr(empty is not None):
            bar_wait(empty + page, ph ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)
        m = c * 64 + r
        wide = cutlass.Boolean(False)
        if cutlass.const_expr(REDUCE_WIDE):
            wide = mtot - c * 64 <= WIDE_ROWS
        if wide:
            reduce_rows_wide(part, lse_t, c * 64, mtot, nh, h0, slot0, R, nsplit,
                             pool + page * PAGE, ctid)
        elif m < mtot:
            it = m // nh
            h = h0 + m - it * nh
            acc = cute.make_rmem_tensor(cute.make_layout(32), Float32)
            acc.fill(0.0)
            mx, den = reduce_row_loads_first(part, lse_t, acc, slot0, R, it, h, cq, nsplit, ldp)
            inv = Float32(1.0) / den
            for q in cutlass.range_constexpr(4):          # 4 chunks of 8 bf16 (16 B)
                a = pool + page * PAGE + r * 256 + (cq + q * 8) * 2
                d = cute.make_tensor(cute.make_ptr(BFloat16, a, cute.AddressSpace.smem,
                                                   assumed_align=16), cute.make_layout(8))
                for u in cutlass.range_constexpr(8):
                    d[u] = (acc[q * 8 + u] * inv).to(BFloat16)
        bulk_writer_fence()
        rk.release(done + page, share, CONSUMER_THREADS, ctid, BAR_ATTN, hm)
        pg = pg + 1
    return pg


# ============================================================================ storer (2 warps)
@cute.jit
def store_rows_page(pool: Int32, page: Int32, ob: cutlass.Constexpr, rows_in_page: cutlass.Constexpr,
                    mbase: Int32, mtot: Int32, div: Int32, head0: Int32, row0: Int32,
                    base: Int64, ld: Int32, sid: Int32, nthreads: cutlass.Constexpr):
    """Store one epilogue page: page row r = query row m = mbase + r (< mtot) -> destination row
    row0 + m // div, columns (head0 + m % div) * D + [0, D) (element size ob bytes).
    STORE_MODE (above): "bulk" = one bulk copy (async proxy) per row, the page's reads complete
    on return; "loop" = the chunks in a loop that is not unrolled."""
    rb = D * ob                     # bytes per page row
    cpr = rb // 16                  # 16-byte chunks per row
    if cutlass.const_expr(BULK_STORE):
        # the consumers' generic writes of the page (ordered before its `done`) -> the copies'
        # async-proxy reads (the consumers fence too, before they release `done`)
        cute.arch.fence_proxy("async.shared", space="cta")
        for it in cutlass.range_constexpr((rows_in_page + nthreads - 1) // nthreads):
            r = it * nthreads + sid
            m = mbase + r
            if r < rows_in_page and m < mtot:
                i, h = row_head(m, div, head0)
                prims.cp_async_bulk_global_shared_cta(
                    cute.make_ptr(Int32, dest_addr(base, ld, ob, row0, i, h),
                                  cute.AddressSpace.gmem, assumed_align=16),
                    cute.make_ptr(Int32, pool + page * PAGE + r * rb, cute.AddressSpace.smem,
                                  assumed_align=16),
                    rb)
        cute.arch.cp_async_bulk_commit_group()
        # the page may be handed back once the copies have read it (bulk_store_drain: written)
        cute.arch.cp_async_bulk_wait_group(0, read=True)
    if cutlass.const_expr(STORE_MODE == "loop"):
        # only the chunks of the rows that hold query rows: a decode unit (qpk rows per token)
        # fills 8 of an fp32 page's 32 rows and none of the unit's other three pages, and each
        # empty iteration still cost an smem address, a division and a branch per thread
        valid = mtot - mbase
        if valid > rows_in_page:
            valid = Int32(rows_in_page)
        q0 = Int32(0)
        if valid < 0:
            valid = Int32(0)
        for it in cutlass.range((valid * cpr + (nthreads - 1)) // nthreads, unroll=1):
            store_chunk(pool, page, ob, q0 + it * nthreads + sid, mbase, mtot, div, head0, row0,
                        base, ld)
    for it in cutlass.range_constexpr(rows_in_page * cpr // nthreads
                                      if STORE_MODE == "unrolled" else 0):
        q = it * nthreads + sid
        store_chunk(pool, page, ob, q, mbase, mtot, div, head0, row0, base, ld)


@cute.jit
def store_chunk(pool: Int32, page: Int32, ob: cutlass.Constexpr, q: Int32, mbase: Int32,
                mtot: Int32, div: Int32, head0: Int32, row0: Int32, base: Int64, ld: Int32):
    """16-byte chunk q of an epilogue page (store_rows_page's "unrolled" and "loop" modes)."""
    rb = D * ob
    cpr = rb // 16
    r = q // cpr
    ch = q % cpr
    m = mbase + r
    if m < mtot:
        i, h = row_head(m, div, head0)
        sp = cute.make_ptr(Int32, pool + page * PAGE + r * rb + ch * 16,
                           cute.AddressSpace.smem, assumed_align=16)
        v = cute.make_tensor(sp, cute.make_layout(4)).load()
        gp = cute.make_ptr(Int32, dest_addr(base, ld, ob, row0, i, h) + ch * 16,
                           cute.AddressSpace.gmem, assumed_align=16)
        cute.make_tensor(gp, cute.make_layout(4)).store(v)


@cute.jit
def row_head(m: Int32, div: Int32, head0: Int32):
    """Query row m of a unit: its token (m // div) and head (head0 + m % div)."""
    i = rk.udiv(m, div)
    return i, head0 + m - i * div


@cute.jit
def dest_addr(base: Int64, ld: Int32, ob: cutlass.Constexpr, row0: Int32, i: Int32,
              h: Int32) -> Int64:
    """Byte address of head h of destination row row0 + i (row pitch ld elements of ob bytes)."""
    return base + (Int64(row0 + i) * Int64(ld) + Int64(h * D)) * ob


@cute.jit
def bulk_store_drain():
    """BULK_STORE: the storer thread's bulk copies written (before the instruction's signal, whose
    release is generic-proxy: the proxy fence orders the async-proxy writes before it)."""
    if cutlass.const_expr(BULK_STORE):
        cute.arch.cp_async_bulk_wait_group(0)
        cute.arch.fence_proxy("async.global")


@cute.jit
def attn_store(out_base: Int64, ldo: Int32, part_base: Int64, ldp: Int32, lse_base: Int64,
               ldl: Int32, row0: Int32, R: Int32, col0: Int32, cols: Int32, pos0: Int32, kv0: Int32,
               kv1: Int32, mode: Int32, qpk: Int32, slot: Int32, pool: Int32, empty: cute.Pointer,
               done: cute.Pointer, dpar: cute.Tensor, pg: Int32, npages: cutlass.Constexpr,
               sid: Int32, bar_id: cutlass.Constexpr, nthreads: cutlass.Constexpr,
               timeout_ns: Int64, state: cute.Tensor, ticket: Int32,
               share: cutlass.Constexpr = EMPTY_ARRIVALS, journal: cute.Tensor = None,
               stamps: cutlass.Constexpr = (), wait_word: cutlass.Constexpr = -1,
               pair=None) -> Int32:
    """Storer warps of ATTENTION: free the K/V pages in ring order once the consumers are done
    with them, store the epilogue pages (mode 0: bf16 rows of ATTN_OUT at row0 + i; mode 1: fp32
    rows of ATTN_PARTIAL and ATTN_LSE at slot + i; a pair (pair: see second_unit): page 1 holds
    the second unit's rows, for its ATTN_OUT row). Byte addresses of the buffers' (0, 0).
    share: empty[p]'s init count (see free_page); dpar: the storer's done parity bits
    (rk.wait_done). journal / stamps (the megakernel's journal variant only): STORE_STAMPS
    words of row `ticket` that get the times of the first unit's storer steps (where the
    storer's tail goes); wait_word >= 0: storer thread 0's time waiting for the consumers'
    `done` of K/V pages, summed, into that word."""
    wclk = rk.make_wait_clock(wait_word)
    mtot = R * qpk
    n_mt = (mtot + (MT - 1)) // MT
    for kh in range(cols):
        head0 = (col0 + kh) * qpk
        for mt in range(n_mt):
            kend, nblk = unit_range(R, qpk, pos0, kv0, kv1, mt)
            paired, kend_b, nblk_b, walk = second_unit(pair, mode, qpk, kv0, nblk)
            nkv = 2 * (nblk + nblk_b)
            for j in range(nkv):
                page, _ = page_of(pg + j, npages)
                t0 = rk.wait_clock_start(wclk)
                rk.wait_done(done, page, dpar, timeout_ns, state, ticket)
                rk.wait_clock_add(wclk, t0)
                rk.free_waited_page(page, empty, sid, nthreads, share)
            pg = pg + nkv
            m0 = mt * MT
            first = sid == 0 and kh == 0 and mt == 0
            if cutlass.const_expr(len(stamps) > 0):
                rk.journal_stamp(journal, ticket, stamps[0], first)          # K/V pages freed
            if mode != at.MODE_PARTIAL:
                for w in cutlass.range_constexpr(E_DIRECT):
                    mbase = m0 + w * 64
                    row0_w = row0
                    if cutlass.const_expr(w == 1 and pair is not None):
                        if paired:
                            mbase = Int32(0)
                            row0_w = pair[0]
                    page, _ = page_of(pg + w, npages)
                    rk.wait_done(done, page, dpar, timeout_ns, state, ticket)
                    if cutlass.const_expr(len(stamps) > 0):
                        # epilogue page w done; page 0 stored; page 0 freed
                        rk.journal_stamp(journal, ticket, stamps[1 + 3 * w], first)
                    if cutlass.const_expr(not NOSTORE):
                        store_rows_page(pool, page, 2, 64, mbase, mtot, qpk, head0, row0_w,
                                        out_base, ldo, sid, nthreads)
                    if cutlass.const_expr(len(stamps) > 0 and w == 0):
                        rk.journal_stamp(journal, ticket, stamps[2], first)
                    free_page(page, empty, sid, bar_id, nthreads, share)
                    if cutlass.const_expr(len(stamps) > 0 and w == 0):
                        rk.journal_stamp(journal, ticket, stamps[3], first)
                pg = pg + E_DIRECT
            else:
                for w in cutlass.range_constexpr(4):
                    page, _ = page_of(pg + w, npages)
                    rk.wait_done(done, page, dpar, timeout_ns, state, ticket)
                    if cutlass.const_expr(not NOSTORE):
                        store_rows_page(pool, page, 4, 32, m0 + w * 32, mtot, qpk, head0, slot,
                                        part_base, ldp, sid, nthreads)
                    free_page(page, empty, sid, bar_id, nthreads, share)
                page, _ = page_of(pg + 4, npages)
                rk.wait_done(done, page, dpar, timeout_ns, state, ticket)
                for u in cutlass.range_constexpr(0 if NOSTORE else MT // nthreads):
                    r = u * nthreads + sid
                    m = m0 + r
                    if m < mtot:
                        i = m // qpk
                        h = head0 + m - i * qpk
                        v = cute.make_tensor(cute.make_ptr(Float32, pool + page * PAGE + r * 4,
                                                           cute.AddressSpace.smem, assumed_align=4),
                                             cute.make_layout(1))[0]
                        g = cute.make_tensor(cute.make_ptr(Float32, lse_base + (Int64(slot + i) * Int64(ldl) + Int64(h)) * 4,
                                                           cute.AddressSpace.gmem, assumed_align=4),
                                             cute.make_layout(1))
                        g[0] = v
                free_page(page, empty, sid, bar_id, nthreads, share)
                pg = pg + E_PARTIAL
    bulk_store_drain()
    rk.wait_clock_write(wclk, journal, ticket, wait_word, sid == 0)
    return pg


@cute.jit
def reduce_store(out_base: Int64, ldo: Int32, row0: Int32, R: Int32, col0: Int32, cols: Int32,
                 qpk: Int32, pool: Int32, empty: cute.Pointer, done: cute.Pointer,
                 dpar: cute.Tensor, pg: Int32, npages: cutlass.Constexpr, sid: Int32,
                 bar_id: cutlass.Constexpr, nthreads: cutlass.Constexpr, timeout_ns: Int64,
                 state: cute.Tensor, ticket: Int32, share: cutlass.Constexpr = EMPTY_ARRIVALS) -> Int32:
    """Storer warps of ATTN_REDUCE: store each output page (bf16 rows), then free it."""
    nh = cols * qpk
    mtot = R * nh
    npg = (mtot + 63) // 64
    for c in range(npg):
        page, _ = page_of(pg, npages)
        rk.wait_done(done, page, dpar, timeout_ns, state, ticket)
        store_rows_page(pool, page, 2, 64, c * 64, mtot, nh, col0 * qpk, row0, out_base, ldo,
                        sid, nthreads)
        free_page(page, empty, sid, bar_id, nthreads, share)
        pg = pg + 1
    bulk_store_drain()
    return pg


# ============================================================================ descriptions
def describe(page_size: int = 16) -> dict:
    return dict(head_dim=D, key_block=KB, m_tile=MT, box_rows=box_rows(page_size),
                tma_boxes_per_kv_page=2 * (KB // box_rows(page_size)),
                epilogue_pages={"direct": E_DIRECT, "partial": E_PARTIAL},
                acc_regs=dict(S=64 * KB // 128, O=64 * D // 128, Q=64 * D // 2 // 128,
                              P=64 * KB // 2 // 128))
