"""CuTe DSL device bodies of the GEMM-tile family (O_PROJ, GATE_UP, DOWN, LM_HEAD; QKV_ROPE's GEMM
core) and their host-side atom/layout builders, for the persistent megakernel (mk/megakernel.py
compiles them in beside the rows family, one variant per M class of the tile table).

GPU path only: this module imports cutlass at the top, so its name starts with "_" and the opcode
registry never imports it. The torch faces (the semantics these bodies must match) stay in
matmul.py / qkv.py; the argument words are theirs (A_SRC, A_DST, A_EPI, A_SLOT_STRIDE, A_K).

Tile shapes (TileConfig, TILE_TABLE, choose_tile; the table itself lives in mk/tiles.py)
-----------------------------------------------------------------------------------------
A tile is BM token rows x BN output columns of x @ W^T, K-step BK = 64 (one 128-byte swizzle atom
of bf16). Every shared-memory operand box is exactly one 16 KiB page of the megakernel's pool:
    A page   BM x 64 bf16 (BM = 128: the whole page; BM = 64: half of it), SW128 K-major
    B page   128 weight rows x 64 bf16, SW128 K-major (112 rows for the gate/up tiles of 112 /
             56 output columns, gu_m128n112 / gu_m64n112 / gu_m128n56: wgmma N = 112, or 56 per
             warpgroup in N mode; a 14 KiB load; 64 rows for m64n64: m64n32 per warpgroup, an
             8 KiB load)
so no operand needs two *contiguous* pages, and the pool can be used in plain ring order by every
role. A stage (one K-step) is 1 A page + NB B pages. Two consumer warpgroups (256 threads) share
each stage; how they split the tile is the config's `wg` mode:
    "M"     BM = 128: warpgroup w owns rows [64w, 64w+64) and every B page (one accumulator of
            64 x 128 per B page: wgmma m64n128k16, two chains for NB = 2)
    "N"     BM = 64:  warpgroup w owns columns [64w, 64w+64) of every B page (m64n64k16; half
            the page's rows, wn, on 112- / 64-row pages)
    "PAGE"  BM = 64, NB = 2: warpgroup w owns B page w (m64n128k16)
GATE_UP loads the gate rows [c0, c0+BNo) and the up rows [I + c0, I + c0 + BNo) of the stacked
gate_up weight (one TMA descriptor, two coordinates): NB = 2 pages of 128 rows (gate page, up page:
each thread holds gate and up of the same (row, column) in its two chains), or, for gu_m128n64
(NB = 1, "M"), one page of 64 gate rows then 64 up rows (two 64-row boxes; the thread's element
of column c + 64, the up partner of gate column c, is element PARTNER_64 after it, as in RoPE;
for 112-row pages 56 + 56 rows, partner 28: TileConfig.partner).
Either way SiLU(gate) * up is fused in registers (the interleaving the issue asks for, done by
the loader instead of by a weight shuffle).

Pages of one instruction, in ring order (every role walks the same sequence, so each computes the
same page numbers from a running page count pg: page = pg % NP, phase = (pg // NP) & 1):
    kt stages of (1 + NB) pages, then E epilogue pages (output staging).
Barrier arrivals per page (counts are the megakernel's init counts); every use of a page completes
exactly one phase of each of its three barriers, and every waiter walks the pages in ring order (a
parity wait cannot tell phase u from u - 2):
    full[p]   count 1: loader arrive_and_expect_tx + TMA bytes (operand pages, and epilogue pages
              holding the residual tile for RESIDUAL), or a plain arrive (epilogue page granted;
              under ONE_FULL a stage's B pages, whose bytes count on its A page's `full`, and
              whose phase consumer thread 0 then observes: b_phases_seen)
    done[p]   count DONE_ARRIVALS = 8: every consumer warp, once its part of the output is in
              the epilogue page, or (operand pages the storer frees, OPERAND_FREE) once the
              wgmmas reading the page retired (wait_group(1))
    empty[p]  count EMPTY_ARRIVALS = 8: the storer (arrive_count=8) after waiting `done`: at once
              for operand pages, after its stores for epilogue pages; or (OPERAND_FREE
              "consumer": every operand stage but the last) the consumers once the wgmmas
              reading the page retired. Every use of a page completes exactly one phase of full
              and of empty, walked in ring order by their waiters, and done[p] completes one
              only for the uses the storer waits on, whose parity it counts (rk.wait_done): no
              waiter can be two phases behind (parity waits are then unambiguous).
Epilogue pages hold the output tile as boxes of BM rows x 128 bytes (64 bf16 or 32 fp32 columns),
SW128-swizzled like the A operand (byte offset r*128 + ((chunk ^ (r & 7)) << 4)), 128 / BM boxes
per page; for RESIDUAL the loader TMA-loads the destination's residual tile into them (issued as
soon as the pages are free, i.e. during the tail of the mainloop), the consumers add in place,
and the storer writes 16-byte vectors with exact row/column masks (a TMA store would clobber rows
past the tile's last token) and frees the page.

Mainloop of the consumers (both warpgroups, per K-step): wait full on the stage's pages, wgmma
fence, 4 k-blocks x NCH wgmma chains, commit, wait_group(1) (so the tensor cores always have the
next K-step queued), then free the *previous* stage's pages (OPERAND_FREE: `empty` at once, or
`done` to the storer, which frees them in ring order). wait_group(0) after the last step.

Split-K (compiled in only for Megakernel(splitk=...): `split` = a SplitTile, else None and the
code is the unsplit one): a tile whose A_NSPLIT word is >= 2 loads K columns [k0, k0 + K) (A_K0,
the K word = the slice width), has no epilogue pages in any role, and its consumers store the
float32 accumulators to SPLITK[j * stride + row, c] (store_partial; GATE_UP: up part at I + c)
before their last stage's `done`, which the storer's page walk turns into the ordering of those
stores before its signal. SPLITK_REDUCE (mk/instructions/_splitk_kernel.py) then runs the
epilogue math of this module (residual_add, silu_mul_bf16, rope_cos_sin / rope_lo / rope_hi,
gemm_dest / dest_row / row_addr) on the summed partials.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.experimental.primitives as prims
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass.tensor_utils import LayoutEnum

from mk import tiles
from mk.instructions import _common as mc
from mk.instructions import _rows_kernel as rk
from mk.instructions._rows_kernel import bar_wait, page_of, tma_box  # noqa: F401  (shared with attention)
from mk.instructions.matmul import A_DST as A_DST_WORD
from mk.instructions.matmul import Epi
from mk.instructions.qkv import A_DST as _QKV_DST
from mk.instructions.qkv import A_SEC_COL0 as A_SEC_COL0_WORD
from mk.instructions.qkv import A_SECTION as A_SECTION_WORD
from mk.ir import ARG0, W_COL0, W_COLS, W_LAYER, Op

PAGE = rk.PAGE                 # 16 KiB
BK = tiles.BK                  # K per stage (one SW128 atom of bf16)
B_ROWS = tiles.B_ROWS          # weight rows per B page
NUM_CONSUMER_WARPS = 8         # two consumer warpgroups
CONSUMER_THREADS = 256
EMPTY_ARRIVALS = NUM_CONSUMER_WARPS
DONE_ARRIVALS = NUM_CONSUMER_WARPS
# the named barrier of both consumer warpgroups (mk.megakernel.BAR_CONSUMER)
BAR_CONSUMERS = 1
# In an m64n128 accumulator fragment, element i = e + 2h + 4j holds column 8j + 2(lane%4) + e of
# row 16w + lane/4 + 8h: for j < 8 (i < 32) the element of column c + 64 is i + PARTNER_64 (RoPE's
# rotate-half partner; the up column of a one-page gate/up tile's gate column)
PARTNER_64 = 32

# epilogue kinds (compile-time: one body per opcode's epilogue)
EPI_STORE = int(Epi.STORE)          # bf16 store (QKV q section, EMBED-like)
EPI_RESIDUAL = int(Epi.RESIDUAL)    # dst += y (O_PROJ / DOWN at TP 1)
EPI_SILU_MUL = int(Epi.SILU_MUL)    # GATE_UP
EPI_STORE_F32 = 16                  # LM_HEAD: float32 logits
EPI_ROPE = 17                       # QKV_ROPE: RoPE on q/k sections, K/V rows to the paged cache
SEC_Q, SEC_K, SEC_V = 0, 1, 2       # qkv.py sections
# argument words the epilogues read, relative to ARG0 (matmul.py and qkv.py agree on them)
U_DST = A_DST_WORD - ARG0
U_SECTION = A_SECTION_WORD - ARG0
U_SEC_COL0 = A_SEC_COL0_WORD - ARG0
assert U_DST == _QKV_DST - ARG0 == 1 and (U_SECTION, U_SEC_COL0) == (2, 3)
# split-K words (mk/instructions/_common.py; the same positions in every GEMM-like opcode)
A_NSPLIT = mc.A_NSPLIT
A_SPLIT_J = mc.A_SPLIT_J
A_K0 = mc.A_K0
A_SPLIT_ROW = mc.A_SPLIT_ROW
A_EPI_WAIT, A_EPI_TARGET = mc.A_EPI_WAIT, mc.A_EPI_TARGET
# the epilogues of the opcodes whose unsplit tiles may scale their rows (PlanConfig.norm_fold=2:
# QKV_ROPE, GATE_UP; mk/instructions/_common.py A_EPI_WAIT)
ROW_SCALED_EPIS = (EPI_ROPE, EPI_SILU_MUL)

# Profiling variants (compile-time, read once at import; never set in production): comma-separated
# parts of the tile's work to leave out, so that timing differences place the per-tile time
# (bench/gemm_profile.py): "nostore" = the storer skips its global stores (it still waits and
# frees every page), "noepi" = the consumers skip the epilogue math and smem writes (they still
# wait for and hand over the epilogue pages), "nob1" = the loader grants every stage's second B
# page without loading it (the wgmmas read what it held before): a two-B-page tile (m128n256,
# gu_m128) then pulls 32 KB per K step instead of 48, what a 2-CTA cluster multicasting its
# weight tile would pull per SM (bench/GEMM_NOTES.md session 22), "earlyfree" = the consumers
# free a stage's pages as soon as the next stage's wgmmas are issued, before the stage's own
# retire (the loader may overwrite pages the tensor cores still read: one more stage in flight,
# what a deeper ring would give). Results are wrong under each.
# (One wgmma.fence before the K loop instead of one per K step, as CUTLASS's DSL example has it,
# makes ptxas serialize the wgmmas here: C7519, compile-checked in session 23.)
EXPERIMENT = frozenset(t for t in os.environ.get("MK_GEMM_EXPERIMENT", "").split(",") if t)
assert EXPERIMENT <= {"nostore", "noepi", "nob1", "earlyfree"}, \
    f"unknown MK_GEMM_EXPERIMENT parts {set(EXPERIMENT)}"
# RESIDUAL epilogue: issue all of a chain's residual smem loads before its first store. The compiler
# keeps each load behind the previous pair's store (it cannot prove the addresses apart), so the
# one-pass loop pays one full LDS latency per element pair (64 per thread per 128 x 256 tile).
# GPU-verified on the H200 (poisoned-output checks O_PROJ M 64/200/4096, DOWN M 256) and 1-3%
# faster (bench/results/gemm_profile_jobs_2026-11-29.json); MK_GEMM_EPI_BATCH=0 restores the
# one-pass loop.
EPI_BATCH = os.environ.get("MK_GEMM_EPI_BATCH", "1") == "1"
# Who frees a GEMM's operand pages (MK_GEMM_OPERAND_FREE):
#   "storer"    the consumers arrive `done` once a stage's wgmmas retired, the storer walks every
#               page and frees it (`empty`): the page recycle goes consumer -> storer -> loader,
#               and while the storer stores a tile's epilogue, the next tile's operand pages wait
#               for it (bench/GEMM_NOTES.md, "Where the time goes", session 3)
#   "consumer"  the consumers arrive `empty` themselves (consumer -> loader) for every stage but
#               the last, whose pages still go through `done` and the storer's walk (so its wait
#               orders a split tile's partial stores before the signal); the storer skips the
#               other operand pages. Sound because done[p] then completes phases only for the
#               uses the storer waits on, whose parity it counts per page (rk.wait_done); the
#               first attempt (MK_GEMM_CONSUMER_FREE, removed 2026-11-29) waited with the ring
#               generation's parity and passed on a stale phase. The default since session 22
#               (GPU-checked, racecheck clean; as fast as "storer": bench/GEMM_NOTES.md)
OPERAND_FREE = os.environ.get("MK_GEMM_OPERAND_FREE", "consumer")
assert OPERAND_FREE in ("storer", "consumer"), f"MK_GEMM_OPERAND_FREE={OPERAND_FREE!r}"
# One wgmma chain of N = 256 over both B pages of an "M" tile (m128n256, gu_m128) instead of two
# chains of N = 128, one per page (MK_GEMM_WIDE=0: the two chains). The A operand is then read
# from shared memory once per k-block instead of once per chain, and each warpgroup issues half
# the wgmmas. It needs the stage's two B pages adjacent in the pool: a stage whose B pages would
# wrap around the ring's end puts its A page last instead (stage_a_offset).
# The default since session 23 (bench/gemm.py, median us, cold L2: O_PROJ / DOWN / GATE_UP at
# M=4096 -2.1 / -1.4 / -0.9%, O_PROJ / DOWN at 1024 -1.4 / -1.8%; its poisoned checks, the
# two-layer checks of the 1024 class, racecheck and memcheck clean:
# bench/results/wide_*_2026-12-01_s23*).
WIDE = os.environ.get("MK_GEMM_WIDE", "1") == "1"
# One `full` barrier per GEMM stage, its A page's (MK_GEMM_STAGE_FULL=page: one per page, as
# before session 23): the loader arms it with the whole stage's bytes and the B pages' TMAs
# complete on it; each B page's own `full` gets a plain arrival, so every page use still
# completes one phase of each barrier (the page protocol of tests/test_page_protocol.py), and
# the consumers wait on one barrier per K step instead of 1 + NB. Found against CUTLASS's own
# CuTe DSL persistent GEMM (bench/cutlass_peer.py), whose 128 x 256 cooperative tile (one
# barrier per stage) ran within 1-3% of cuBLAS where mk's ran 10-12% slower: bench/gemm_profile.py
# GATE_UP M=4096 700.1 -> 663.7 us (-5.2%), DOWN 4096 -2.1%, O_PROJ / DOWN 1024 -2.0 / -1.9%
# (bench/results/onefull_*_2026-12-01_s23*; every tile mode's poisoned check, the two-layer
# checks and racecheck clean).
STAGE_FULL = os.environ.get("MK_GEMM_STAGE_FULL", "stage")
if STAGE_FULL not in ("stage", "page"):
    raise ValueError(f"MK_GEMM_STAGE_FULL={STAGE_FULL!r}: expected stage or page")
ONE_FULL = STAGE_FULL == "stage"
# The storer's epilogue copy keeps STORE_UNROLL 16-byte smem loads per thread in flight before its
# global stores (16 lost in session 24: O_PROJ +13%, DOWN +4.5%; the switch MK_GEMM_STORE_UNROLL
# removed in session 28).
STORE_UNROLL = 4
# The consumers' K loop walks the ring with a cursor (MK_GEMM_PAGE_CURSOR, default 1: the stage's
# (page, parity) slots carried from one K step to the next, each advanced by rk.ring_add, and the
# previous stage's pages kept for its release) instead of page_of(ring count) per page, a
# division by NPAGES each (8 a K step with the release and b_phases_seen), and marks the stage's
# pages warp-uniform (MK_GEMM_UNIFORM_PAGES, default 1: a shuffle each, and the mainloop's
# fragments sliced at the warpgroup's first thread) so that ptxas builds the wgmma descriptors
# in uniform registers. Session 67's warp-stall sampling of DOWN at M = 1024
# (bench/results/gemmsrc_9a6a830_2026-12-07_s67_h100.log) put ~8% of the kernel's samples on
# the divisions' IMAD.HI / SHF / IMAD lines between the HGMMAs and 1-2% on the descriptors' R2UR
# moves, mostly `dispatch` stalls, where cuBLAS's loop steps its stage in uniform registers.
# The lean DOWN M1024 loop: 131 SASS instructions, no IMAD.HI, 2 R2UR, against 148 with 6
# IMAD.HI and 16 R2UR (tests/test_gemm_compile.py). Both together, session 68 on an H100
# (bench/results/cursor_*_6f94fec_2026-12-07_s68_h100*; every GEMM GPU test, the two-layer
# checks and racecheck clean): DOWN 1024 101.9 -> 91.7 us (-10%), 4096 -9%, O_PROJ -6 / -7%,
# GATE_UP -12 / -10% (M = 1024 / 4096). "0" restores the old loop (each switch alone compiles,
# but only the pair ran on a GPU).
PAGE_CURSOR = os.environ.get("MK_GEMM_PAGE_CURSOR", "1") == "1"
UNIFORM_PAGES = os.environ.get("MK_GEMM_UNIFORM_PAGES", "1") == "1"
# K-step trace (journal variant only; MK_GEMM_KTRACE=N, 0 = off): the first N K steps of every
# GEMM tile leave KT_WORDS SM-clock stamps (clock64, cycles) each in the tile's journal row, from
# word KT_BASE on (mk.megakernel sizes the row): consumer thread 0 before and after its wait for
# the stage's operands and after the previous stage's wgmmas retired, consumer thread 128 (the
# second warpgroup) after its wait, the loader before its first free-page wait of the stage and
# after the stage's last TMA was issued. Why: the mainloop runs ~11% more cycles per K step than
# cuBLAS's (bench/GEMM_NOTES.md sessions 21-23) and the consumers wait for operands a quarter of
# every tile, yet neither a deeper ring nor fewer bytes helped; per K step these stamps say
# whether the loads were issued late (loader waiting for pages, or slow) or were in flight too
# long (the TMA round trip), and where the tensor pipe went idle. mk.trace.gemm_ktrace reads them.
KTRACE = int(os.environ.get("MK_GEMM_KTRACE", "0"))
if not 0 <= KTRACE <= 256:
    raise ValueError(f"MK_GEMM_KTRACE={KTRACE}: expected 0 .. 256 K steps")
KT_BASE = 32
KT_C_WAIT, KT_C_FULL, KT_C_RET, KT_C1_FULL, KT_L_START, KT_L_ISSUE = range(6)
KT_WORDS = 6


def ktrace_words() -> int:
    """Journal words a row needs beyond the journal's own for the K-step trace."""
    return KT_WORDS * KTRACE


@cute.jit
def kt_stamp(journal, ticket: Int32, k: Int32, word: cutlass.Constexpr, me):
    """K-step trace (KTRACE): thread `me` writes the SM clock into word `word` of K step k of
    row `ticket` (journal None, or KTRACE 0: nothing compiled in)."""
    if cutlass.const_expr(KTRACE > 0 and journal is not None):
        if me:
            if k < KTRACE:
                if ticket < journal.shape[0]:
                    journal[ticket, KT_BASE + k * KT_WORDS + word] = cute.arch.clock64()
# (A RESIDUAL tile's epilogue pages granted R stages before its end, MK_GEMM_EPI_EARLY, session
# 24: correct, lost (O_PROJ +7.2% / +5.0% at M = 1024 / 4096 with R = 1); removed in session 28,
# bench/GEMM_NOTES.md session 24. The epilogue pages follow the tile's last stage in its window.)


# A full RESIDUAL tile (O_PROJ, DOWN) leaves its staging pages through TMA stores: one storer
# thread issues the pages' TMA stores (cp.async.bulk.tensor, one 16 KB box per page of 128 rows)
# and frees each page once the engine has read it (cp.async.bulk.wait_group.read); partial tiles
# (rows or columns past the matrix: a decode batch's last row tile), the other epilogues and
# QKV_ROPE keep the storer warps' copy (64 threads, a 16-byte LDS + STG pair per chunk). Its
# consumers write it into the pages by stmatrix (stsm_epilogue: per four accumulator pairs, 16
# columns x the warp's 16 rows, one stmatrix.x4 after one ldmatrix.x4 of the residual, one row
# address per lane: a quarter of the shared-memory instructions of the pair stores). Session 24
# (bench/GEMM_NOTES.md) found the per-tile cost set by how long the storer holds the epilogue
# pages, which the next tile's third and fourth stages load into. The consumers fence their
# staging writes to the async proxy before the hand-off; the storer waits for the stores' writes
# before the instruction's signal. Session 25 (gemm_profile, tmastore_2026-12-02_s25): O_PROJ
# -2.6% / -3.3% at M = 1024 / 4096, DOWN -2.0% / -2.1% against the copy and pair stores. Removed
# in session 63, lost: the same for GATE_UP's SILU_MUL tiles (MK_GEMM_TMA_STORE=1 /
# MK_GEMM_STSM=1, +0.7% / +1.4% at M = 1024 / 4096 in session 25), the copy and pair stores for
# RESIDUAL tiles (=0, the build until session 24), and LM_HEAD's float32 tiles through TMA
# stores (MK_GEMM_TMA_STORE_F32=1, session 26: +0.8% / -0.3% on its m128n256 tile).


# (A full RESIDUAL tile's residual added by its TMA store, cp.reduce.async.bulk.tensor .add onto
# the destination, MK_GEMM_RESIDUAL_REDUCE, session 26: correct, lost (O_PROJ +18%, DOWN +5.2% at
# M = 1024); removed in session 28, bench/GEMM_NOTES.md session 26.)


# (A RESIDUAL tile's residual prefetched into L2 by the loader some K steps before its end,
# MK_GEMM_RESIDUAL_L2, built in session 27, lost on the H200 in session 28: O_PROJ +16% / +17%
# at M = 1024 / 4096, DOWN +6%, the B=1024 step +1.8%; bench/results/rl2_*_2026-12-02_s28.
# Removed; bench/GEMM_NOTES.md session 28.)


# A 128 x 256 tile's epilogue handed to the storer chain by chain: the
# consumers wait for the pages of one output chain (128 columns: two bf16 pages, four float32
# ones), stage it and hand those pages over (`done`) before the next chain's, so the storer's TMA
# stores of the first half go out while the second is staged; the storer frees a chain's pages
# once the engine has read them, before it waits for the next chain's, instead of all pages after
# the last store. Session 24 found the per-tile cost in how long the storer holds the epilogue
# pages, which the next tile's fourth stage loads into (bench/GEMM_NOTES.md); a RESIDUAL tile's
# first chain also starts when its own residual pages have landed. Tiles of one output chain
# (m128n128, m64n128, the gate/up tiles) and QKV_ROPE are unchanged. The page protocol with it:
# tests/test_page_protocol.py (chain_pages). Built in session 27; default since session 28
# (H200, bench/results/chain_*_2026-12-02_s28): O_PROJ -2.5% / -1.8% at M = 1024 / 4096,
# LM_HEAD -0.8% / -0.5%, DOWN +0.4% / +0.3% (noise), the B=1024 step 45.02 -> 44.91 ms (its
# DOWN instructions 53.5 -> 51.3 us, O_PROJ 20.9 -> 20.0); poisoned checks, the two-layer checks
# and racecheck (0 hazards) pass. The whole-tile hand-over it beat (MK_GEMM_CHAIN_HANDOFF=0)
# was removed in session 63.


def chain_pages(cfg, epi: int) -> int:
    """Epilogue pages that each output chain of tile cfg fills where the consumers hand them
    over chain by chain, else 0 (trace time)."""
    # "M" mode: both warpgroups write every column of chain ch, [ch * wn, (ch + 1) * wn)
    if epi == EPI_ROPE or cfg.gate_up or cfg.wg != "M" or cfg.chains() < 2 \
            or "noepi" in EXPERIMENT:
        return 0
    bpp = 128 // cfg.bm
    ob = out_bytes_of(epi)
    if cfg.wn * ob % 128 or (cfg.wn * ob // 128) % bpp:
        return 0
    cp = cfg.wn * ob // 128 // bpp
    return cp if cp * cfg.chains() == cfg.epi_pages(ob) else 0


def tma_stores(epi: int, cfg) -> bool:
    """Whether full tiles of epilogue `epi` on tile `cfg` leave through TMA stores (trace time):
    RESIDUAL outputs whose tile width is whole 128-byte boxes."""
    return epi == EPI_RESIDUAL and cfg.bn * out_bytes_of(epi) % 128 == 0


@cute.jit
def whole_tile(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, rows: Int32, cols: Int32) -> Int32:
    """1 where a tile of rows x cols leaves through TMA stores (all its rows and its boxes'
    columns in the matrix), else 0: the storer's test (store_epilogue)."""
    ob = out_bytes_of(epi)
    whole = Int32(0)
    if rows == cfg.bm:
        if cols == cfg.epi_boxes(ob) * (128 // ob):
            whole = Int32(1)
    return whole


@dataclass(frozen=True)
class TileConfig(tiles.TileShape):
    """One tile shape (fields and bn: mk.tiles.TileShape; see the module docstring)."""

    @property
    def stage_pages(self) -> int:
        return 1 + self.nb

    def chains(self) -> int:
        """wgmma accumulators per consumer thread."""
        return 1 if self.wg == "PAGE" else self.nb

    @property
    def half_gate_up(self) -> bool:
        """GATE_UP with one B page per stage: b_rows / 2 gate rows, then as many up rows."""
        return self.gate_up and self.nb == 1

    @property
    def partner(self) -> int:
        """One-page gate/up: the fragment offset of gate column c's up column c + b_rows / 2
        (PARTNER_64 for 128-row pages; 28 for 112: 7 groups of 8 columns x 4 elements)."""
        return self.b_rows // 4

    @property
    def b_bytes(self) -> int:
        """Bytes of one B page's TMA load (b_rows x BK bf16; the page is 16 KiB or less)."""
        return self.b_rows * BK * 2

    @property
    def wide(self) -> bool:
        """One wgmma chain of N = 2 x 128 over both (adjacent) B pages (WIDE)."""
        return WIDE and self.wg == "M" and self.nb == 2 and self.b_rows == B_ROWS

    def mainloop_wn(self) -> int:
        """wgmma N of the mainloop's chains."""
        return 2 * self.wn if self.wide else self.wn

    def atom_layout(self):
        return {"M": (2, 1, 1), "N": (1, 2, 1), "PAGE": (1, 1, 1)}[self.wg]

    def epi_boxes(self, out_bytes: int) -> int:
        """128-byte column boxes of the output tile (the last one partly used when bn x
        out_bytes is no multiple of 128: the storer masks columns past the tile)."""
        return -(-self.bn * out_bytes // 128)

    def epi_pages(self, out_bytes: int) -> int:
        bpp = 128 // self.bm
        return -(-self.epi_boxes(out_bytes) // bpp)

    def acc_regs(self) -> int:
        """fp32 accumulator registers per consumer thread."""
        return self.chains() * 64 * self.wn // 128

    def check(self, out_bytes: int = 2, npages: int = 13):
        assert self.bm in (64, 128) and self.nb in (1, 2) and self.wn in (32, 56, 64, 112, 128)
        assert self.b_rows == B_ROWS or (self.b_rows == 112 and self.gate_up
                                         and self.wg in ("M", "N")) or (
            self.b_rows == 64 and not self.gate_up and self.wg in ("M", "N") and self.nb == 1), \
            "112-row B pages only for gate/up tiles in M or N mode, 64-row ones for m64n64 / m128n64"
        if self.wg == "M":
            assert self.bm == 128 and self.wn == self.b_rows
        elif self.wg == "N":
            assert self.bm == 64 and self.wn == self.b_rows // 2
        else:
            assert self.wg == "PAGE" and self.bm == 64 and self.nb == 2 and self.wn == 128
            assert not self.gate_up, "PAGE mode puts gate and up in different warpgroups"
        if self.gate_up:
            assert self.nb == 2 or (self.wg == "M" and self.wn == self.b_rows), \
                "a one-page gate/up tile needs the page's rows in one wgmma chain"
        e = self.epi_pages(out_bytes)
        # deadlock-freedom of the ring: two stages in flight in the consumers, E staging pages
        assert 2 * self.stage_pages <= npages and e + self.stage_pages <= npages, (self, e)
        return self

    def stages_in_pool(self, npages: int = 13) -> int:
        return npages // self.stage_pages


# name -> config, derived from the shared table (mk/tiles.py: TILE_SHAPES, TILE_TABLE, M_CLASSES,
# also used by the planner for its default tile widths)
TILES = {name: TileConfig(**dataclasses.asdict(shape)) for name, shape in tiles.TILE_SHAPES.items()}
TILE_TABLE = tiles.TILE_TABLE
M_CLASSES = tiles.M_CLASSES


def choose_tile(op, m: int) -> TileConfig:
    return TILES[tiles.tile_name(op, m)]


def epi_of(op) -> int:
    """The epilogue a body of opcode `op` is compiled with (the TP-1 epilogues)."""
    op = Op(op)
    if op in (Op.O_PROJ, Op.DOWN):
        return EPI_RESIDUAL
    if op == Op.GATE_UP:
        return EPI_SILU_MUL
    if op == Op.LM_HEAD:
        return EPI_STORE_F32
    if op == Op.QKV_ROPE:
        return EPI_ROPE
    return EPI_STORE


def out_bytes_of(epi: int) -> int:
    return 4 if epi == EPI_STORE_F32 else 2


def pages_per_instr(cfg: TileConfig, epi: int, kt: int) -> int:
    return kt * cfg.stage_pages + cfg.epi_pages(out_bytes_of(epi))


# ============================================================================ host-side builders
class GemmAtoms:
    """Host-side (inside the @cute.jit __call__) TMA atoms, smem layouts and the tiled MMA of one
    tile config. x: activations (T, K, NBX) K-contiguous; w: weights (N, K, L) K-contiguous;
    y: destination (T, N, NBY) N-contiguous (bf16; its residual TMA load, with `residual`, and
    with `store` its TMA store (tma_stores), both over the epilogue box)."""

    def __init__(self, cfg: TileConfig, x: cute.Tensor, w: cute.Tensor, y=None, residual=False,
                 store=False):
        self.cfg = cfg
        lay = LayoutEnum.ROW_MAJOR   # K-major A and B
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            BFloat16, BFloat16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
            Float32, cfg.atom_layout(), tiler_mn=(64, cfg.wn))
        self.sA_layout = cute.slice_(sm90_utils.make_smem_layout_a(
            lay, (cfg.bm, B_ROWS, BK), BFloat16, 1), (None, None, 0))
        self.sB_layout = cute.slice_(sm90_utils.make_smem_layout_b(
            lay, (cfg.bm, cfg.b_rows, BK), BFloat16, 1), (None, None, 0))
        # the mainloop's wgmma and B operand: the same, or (wide) N = 256 over both B pages,
        # which are adjacent in the pool (the SW128 K-major layout of 256 rows is two of 128
        # back to back); tiled_mma stays the fragment map of the epilogues (a chain's columns)
        self.mainloop_mma, self.sB_mainloop_layout = self.tiled_mma, self.sB_layout
        if cfg.wide:
            self.mainloop_mma = sm90_utils.make_trivial_tiled_mma(
                BFloat16, BFloat16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
                Float32, cfg.atom_layout(), tiler_mn=(64, cfg.mainloop_wn()))
            self.sB_mainloop_layout = cute.slice_(sm90_utils.make_smem_layout_b(
                lay, (cfg.bm, cfg.nb * cfg.b_rows, BK), BFloat16, 1), (None, None, 0))
            assert cute.size_in_bytes(BFloat16, self.sB_mainloop_layout) == cfg.nb * PAGE
        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        self.tma_a, self.gA = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, x, self.sA_layout,
                                                                     (cfg.bm, BK))
        # the loader's B box: the whole page, or (one-page gate/up) half of its rows, twice per
        # page; the SW128 K-major layout of 128 (112) rows is two 64 (56)-row ones back to back
        # (56 rows = 7 swizzle atoms of 1024 bytes: the second box starts on an atom)
        self.b_box_rows = cfg.b_rows // 2 if cfg.half_gate_up else cfg.b_rows
        self.sB_load_layout = self.sB_layout
        if cfg.half_gate_up:
            # the SW128 atom tiled to the box directly: slicing the stage mode off
            # make_smem_layout_b's layout aborts in the DSL for 56 rows (an odd count of 8-row
            # atoms; 4.8.1); for 64 rows this is the same layout
            atom = sm90_utils.make_smem_layout_atom(
                sm90_utils.get_smem_layout_atom(lay, BFloat16, BK), BFloat16)
            self.sB_load_layout = cute.tile_to_shape(atom, (self.b_box_rows, BK), order=(0, 1))
        self.tma_b, self.gB = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, w, self.sB_load_layout, (self.b_box_rows, BK))
        self.a_bytes = cute.size_in_bytes(BFloat16, self.sA_layout)
        assert self.a_bytes == cfg.bm * BK * 2 and self.a_bytes <= PAGE
        assert cute.size_in_bytes(BFloat16, self.sB_layout) == cfg.b_bytes <= PAGE
        # the epilogue box (BM rows x 64 bf16 columns, SW128) has the A page's layout
        self.tma_r, self.gR = None, None
        if residual:
            self.tma_r, self.gR = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, y, self.sA_layout,
                                                                         (cfg.bm, BK))
        # the TMA store's box: the epilogue box of bf16 (the A page's layout)
        self.tma_s, self.gS, self.sY_layout = None, None, self.sA_layout
        if store:
            box_cols = BK
            s2g = cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp()
            self.tma_s, self.gS = cute.nvgpu.cpasync.make_tiled_tma_atom(
                s2g, y, self.sY_layout, (cfg.bm, box_cols))

    def prefetch(self):
        cute.nvgpu.cpasync.prefetch_descriptor(self.tma_a)
        cute.nvgpu.cpasync.prefetch_descriptor(self.tma_b)
        if self.tma_r is not None:
            cute.nvgpu.cpasync.prefetch_descriptor(self.tma_r)


def mainloop_mma_of(cfg: TileConfig, ops: tuple):
    """The mainloop's tiled MMA in the megakernel's per-slot operand tuple: [12] where the tile
    is wide (only then is it a kernel parameter of its own), else the chain's [6]."""
    return ops[12] if cfg.wide else ops[6]


def tma_store_of(cfg: TileConfig, epi: int, ops: tuple):
    """The TMA store atom, its view of y and its box's smem layout in the megakernel's per-slot
    operand tuple (its last three entries, there only where tma_stores(epi, cfg): no kernel
    parameter otherwise)."""
    assert tma_stores(epi, cfg), (epi, cfg.name)
    return ops[-3], ops[-2], ops[-1]


# ============================================================================ device helpers
@cute.jit
def page_tensor(pool: Int32, page: Int32, layout: cute.ComposedLayout):
    """smem tensor over page `page` (runtime) with a swizzled K-major layout."""
    p = cute.make_ptr(BFloat16, pool + page * PAGE, cute.AddressSpace.smem, assumed_align=1024)
    p = cute.recast_ptr(p, layout.inner, dtype=BFloat16)
    return cute.make_tensor(p, layout.outer)


# ============================================================================ stage layout
def stage_a_offset(cfg, stage_pg, npages: int):
    """Ring offset of a stage's A page (its B pages follow it, or, at offset 2, precede it):
    0, except for a wide tile (TileConfig.wide) whose B pages would otherwise wrap around the
    ring's end (pages npages - 1 and 0), which one wgmma cannot span: its A page goes last.
    Every role derives the stage's pages from this, so they agree on them; the pages are still
    used, waited on and freed in the same ring positions."""
    if not cfg.wide:
        return 0
    return _wrap_a_offset(stage_pg, npages)


@cute.jit
def _wrap_a_offset(stage_pg: Int32, npages: cutlass.Constexpr) -> Int32:
    page, _ = page_of(stage_pg, npages)
    return _wrap_a_offset_at(page, npages)


def stage_a_offset_at(cfg, stage_page: Int32, npages: int):
    """stage_a_offset from the stage's first page (the K loop's cursor) instead of its count."""
    if not cfg.wide:
        return 0
    return _wrap_a_offset_at(stage_page, npages)


@cute.jit
def _wrap_a_offset_at(stage_page: Int32, npages: cutlass.Constexpr) -> Int32:
    off = Int32(0)
    if stage_page == npages - 2:
        off = Int32(2)
    return off


def stage_b_offset(a_off):
    """Ring offset of a stage's first B page, given its A page's (stage_a_offset)."""
    return 1 - a_off // 2


# ============================================================================ loader (1 warp)
@cute.jit
def gemm_load(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, tma_a: cute.CopyAtom,
              gA: cute.Tensor, tma_b: cute.CopyAtom, gB: cute.Tensor, tma_r, gR,
              sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
              xb: Int32, yb: Int32, layer: Int32, row0: Int32, col0: Int32, up_row0: Int32,
              kt: Int32, pool: Int32, full: cute.Pointer, empty: cute.Pointer, pg: Int32,
              npages: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
              ticket: Int32, split=None, ready=None, rows=None, cols=None,
              ktrace=None, twin=None) -> Int32:
    """Loader warp: kt stages (A page + NB B pages each), then the E epilogue pages (residual tile
    via TMA for RESIDUAL, else a plain grant). Returns the new page count.

    up_row0: first weight row of the second B page for gate_up configs (I + col0; one-page
    gate/up: of the page's second half); otherwise the second page is weight rows col0 + 128.
    sB_layout: the loader's B box (GemmAtoms.sB_load_layout; the consumers' is sB_layout).
    split: a SplitTile when the variant runs split-K tiles (None: not compiled in). A split tile's
    K loop starts at its k0 word, and it has no epilogue pages (its partial goes from the
    consumers' registers to the SPLITK workspace).
    ready: (mbarrier, phase) of the instruction's dependencies (the megakernel's controller hands
    the instruction over before its waits are met): the weight (B) pages of the first stages are
    loaded before that wait, since weights depend on no instruction, and the activation (A)
    pages of those stages after it.
    rows / cols: the tile's (where the store adds the residual: a whole tile loads none).
    ktrace: the journal where the variant writes the K-step trace (KTRACE), else None.
    twin: a TwinSource where a second opcode's tiles run through this body (xb is then the
    caller's choice for the instruction), else None."""
    # the controller hands every instruction over before its waits are met (session 63 removed
    # the build that waited first): a caller without `ready` would load A before its producer
    assert ready is not None, "gemm_load: ready (the dependencies' mbarrier, phase) is required"
    a_bytes = cfg.bm * BK * 2
    k0 = Int32(0)
    if cutlass.const_expr(split is not None):
        k0 = split.k0()     # 0 in every unsplit instruction
    k_first = prefetch_weights(cfg, tma_a, gA, tma_b, gB, sA_layout, sB_layout, xb, layer, row0,
                               col0, up_row0, k0, kt, pool, full, empty, pg, npages, timeout_ns,
                               state, ticket, ready, twin)
    pg = pg + k_first * cfg.stage_pages
    for k in range(k_first, kt):
        kc = k * BK
        if cutlass.const_expr(split is not None):
            kc = k0 + k * BK
        a_off = stage_a_offset(cfg, pg, npages)
        page, ph = page_of(pg + a_off, npages)
        lane0 = cute.arch.lane_idx() == 0
        kt_stamp(ktrace, ticket, k, KT_L_START, lane0)
        bar_wait(empty + page, ph ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(full + page, a_bytes + stage_b_bytes(cfg))
        source_box(twin, False, tma_a, gA, sA_layout, cfg.bm, pool, page, 0, row0, kc, xb,
                   full + page, rk.activation_policy())
        load_b_pages(cfg, tma_b, gB, sB_layout, layer, col0, up_row0, kc, pool, full, empty,
                     pg + stage_b_offset(a_off), npages, timeout_ns, state, ticket,
                     stage_full(full + page), twin)
        kt_stamp(ktrace, ticket, k, KT_L_ISSUE, lane0)
        pg = pg + cfg.stage_pages
    if cutlass.const_expr(split is None):
        pg = load_epilogue(cfg, epi, tma_r, gR, sA_layout, yb, row0, col0, pool, full, empty,
                           pg, npages, timeout_ns, state, ticket, rows, cols)
    else:
        if cutlass.const_expr(epi in ROW_SCALED_EPIS and split.counters is not None):
            # norm_fold=2: the row-scale norm ran beside the mainloop; the epilogue pages go to
            # the consumers, who then read ROW_SCALE, once its counter is met (a split tile has
            # no epilogue wait: its reduce waits)
            wait_epilogue_counter(split.counters, split.epi_wait(), split.epi_target(),
                                  timeout_ns, state, ticket, split.backoff_ns)
        if split.nsplit() < 2:
            pg = load_epilogue(cfg, epi, tma_r, gR, sA_layout, yb, row0, col0, pool, full,
                               empty, pg, npages, timeout_ns, state, ticket, rows, cols)
    return pg


@cute.jit
def wait_epilogue_counter(counters: cute.Tensor, epi_wait: Int32, target: Int32,
                          timeout_ns: Int64, state: cute.Tensor, ticket: Int32,
                          backoff_ns: cutlass.Constexpr):
    """The loader's wait for a tile's epilogue wait (word A_EPI_WAIT = counter + 1; 0: none)."""
    if epi_wait > 0:
        rk.wait_counter(counters, epi_wait - 1, target, timeout_ns, state, ticket, backoff_ns)


# Who observes a GEMM stage's B pages' own `full` phases under ONE_FULL. Their bytes complete on
# the A page's barrier, so each B page's `full` gets a plain arrival that completes its phase, and
# the PTX ISA requires every mbarrier phase to be observed by a successful wait before the next
# arrival ("Phases of the mbarrier object"); without one synccheck stops the kernel with "Missing
# wait" at the page's next use (session 32, bench/probes/synccheck_mbarrier_probe.py). Consumer
# thread 0 waits on them once the stage's wgmmas are queued and the previous stage is freed,
# before its own arrival frees this stage (b_phases_seen, gemm_consume; session 35), off the
# loader's path. The alternatives lost and are gone (MK_OWN_PHASE_SEEN, removed in session 63):
# the loader waiting right after each arrival ("inline", session 32) cost 8-10% of decode B=256
# against nobody waiting (sessions 34 / 35, bench/results/ownphase_*); nobody waiting ("0") is
# synccheck-unclean; waiting after the stage's loads ("after") cost as much as inline; a
# test_wait nothing branches on ("test", "consumer_test") is no observation for synccheck
# (session 38's probe, `synccheck_probe_4eee517_2026-12-04_s38.log`); warp 0's lanes waiting
# right after the stage's wgmmas ("early") lost +5.7% at B=256 in session 37
# (bench/results/ownphase_*_s37.json); thread 0 waiting right after the stage's commit, before
# the wait for the previous stage's wgmmas (MK_GEMM_PHASES_EARLY, sessions 68-69, removed) was
# correct and no faster with the page cursor: DOWN 1024 91.8 against 91.2 / 90.2 us, GATE_UP
# 4096 619.8 against 615.8 / 618.4 (bench/results/phasesearly_*_s69_h100*). Consumer costs ~2%
# at B=256 against nobody waiting.


@cute.jit
def own_phase_seen(bar: cute.Pointer, phase: Int32, timeout_ns: Int64, state: cute.Tensor,
                   ticket: Int32):
    """The loader's wait on a B page's `full` phase its own plain arrival completed (the "nob1"
    EXPERIMENT's granted page): returns at once."""
    bar_wait(bar, phase, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)


@cute.jit
def b_phases_seen_at(nb: cutlass.Constexpr, full: cute.Pointer, pb0: Int32, qb0: Int32,
                     pb1: Int32, qb1: Int32, timeout_ns: Int64, state: cute.Tensor,
                     ticket: Int32):
    """b_phases_seen with the stage's NB (1 or 2) B pages given as (page, parity) (the K loop's
    carried slots)."""
    seen = cute.arch.mbarrier_try_wait(full + pb0, qb0)
    if cutlass.const_expr(nb > 1):
        seen = seen & cute.arch.mbarrier_try_wait(full + pb1, qb1)
    if not seen:
        bar_wait(full + pb0, qb0, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
        if cutlass.const_expr(nb > 1):
            bar_wait(full + pb1, qb1, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)


@cute.jit
def b_phases_seen(cfg: cutlass.Constexpr, full: cute.Pointer, pg_b: Int32,
                  npages: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
                  ticket: Int32):
    """One consumer thread's wait on the `full` phases of a stage's NB
    B pages, the first at ring count pg_b, after the stage's A-page barrier passed. They were
    complete before it (the loader arrives on each before issuing the TMA whose bytes that
    barrier counts), so the try_waits go back to back and normally all pass; the bounded waits
    only when one did not."""
    pb0, qb0 = page_of(pg_b, npages)
    pb1, qb1 = page_of(pg_b + cfg.nb - 1, npages)
    b_phases_seen_at(cfg.nb, full, pb0, qb0, pb1, qb1, timeout_ns, state, ticket)


class TwinSource:
    """The x / w TMA sources (tma_a, gA, tma_b, gB) of a second opcode whose tiles run through a
    GEMM body compiled for another (mk.megakernel.GemmSlot.twin_of: the same tile, epilogue,
    split-K code and destination, so only the loads differ), and `use`, the run-time condition
    that the loader's instruction is that opcode's. Trace-time object."""

    def __init__(self, use, tma_a, gA, tma_b, gB):
        self.use, self.tma_a, self.gA, self.tma_b, self.gB = use, tma_a, gA, tma_b, gB


@cute.jit
def source_box(twin, weights: cutlass.Constexpr, tma: cute.CopyAtom, g: cute.Tensor,
               s_layout: cute.ComposedLayout, box_rows: cutlass.Constexpr, pool: Int32,
               page: Int32, byte_off, row: Int32, col: Int32, z: Int32, bar: cute.Pointer,
               policy=None):
    """rk.tma_box of the body's own x (weights False) or w (True) source (tma, g), or where a
    TwinSource's `use` holds, of the twin's: only the TMA issue is duplicated, the stage's waits
    and arrivals around it are the body's."""
    if cutlass.const_expr(twin is None):
        tma_box(tma, g, s_layout, box_rows, pool, page, byte_off, row, col, z, bar, policy)
    else:
        twin_tma, twin_g = twin.tma_a, twin.gA
        if cutlass.const_expr(weights):
            twin_tma, twin_g = twin.tma_b, twin.gB
        if twin.use:
            tma_box(twin_tma, twin_g, s_layout, box_rows, pool, page, byte_off, row, col, z,
                    bar, policy)
        else:
            tma_box(tma, g, s_layout, box_rows, pool, page, byte_off, row, col, z, bar, policy)


@cute.jit
def load_b_pages(cfg: cutlass.Constexpr, tma_b: cute.CopyAtom, gB: cute.Tensor,
                 sB_layout: cute.ComposedLayout, layer: Int32, col0: Int32, up_row0: Int32,
                 kc: Int32, pool: Int32, full: cute.Pointer, empty: cute.Pointer, pg_b: Int32,
                 npages: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor, ticket: Int32,
                 a_full=None, twin=None):
    """A stage's NB weight (B) pages, the first at ring count pg_b: wait for each to be free,
    TMA its b_rows weight rows x 64 K columns at K column kc (gate_up: the second page is the up
    rows from up_row0).

    a_full: the stage's A-page `full` barrier under ONE_FULL (stage_full; None otherwise): the
    B loads complete their bytes there (the caller expects them) and each B page's own `full`
    gets a plain arrival, whose phase consumer thread 0 then observes (b_phases_seen). twin: as
    gemm_load's (the instruction's weights may be a twin opcode's)."""
    policy = rk.weight_policy()
    for j in cutlass.range_constexpr(cfg.nb):
        page, ph = page_of(pg_b + j, npages)
        bar_wait(empty + page, ph ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)
        bar = full + page
        if cutlass.const_expr(a_full is not None):
            bar = a_full
        if cutlass.const_expr(j == 1 and "nob1" in EXPERIMENT):
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive(full + page)      # granted, not loaded (EXPERIMENT)
                own_phase_seen(full + page, ph, timeout_ns, state, ticket)
        else:
            with cute.arch.elect_one():
                if cutlass.const_expr(a_full is not None):
                    cute.arch.mbarrier_arrive(full + page)
                else:
                    cute.arch.mbarrier_arrive_and_expect_tx(full + page, cfg.b_bytes)
            if cutlass.const_expr(cfg.half_gate_up):
                # b_rows / 2 gate rows, then the up rows of the same columns (sB_layout: that box)
                half = cfg.b_bytes // 2
                source_box(twin, True, tma_b, gB, sB_layout, cfg.b_rows // 2, pool, page, 0,
                           col0, kc, layer, bar, policy)
                source_box(twin, True, tma_b, gB, sB_layout, cfg.b_rows // 2, pool, page, half,
                           up_row0, kc, layer, bar, policy)
            else:
                wrow = col0 + j * cfg.b_rows
                if cutlass.const_expr(cfg.gate_up and j == 1):
                    wrow = up_row0
                source_box(twin, True, tma_b, gB, sB_layout, cfg.b_rows, pool, page, 0, wrow, kc,
                           layer, bar, policy)


def stage_full(a_full):
    """The barrier a stage's B pages complete on: the A page's under ONE_FULL, else their own
    (None)."""
    return a_full if ONE_FULL else None


def stage_b_bytes(cfg) -> int:
    """Bytes of a stage's B loads that its A page's `full` barrier expects (ONE_FULL; else 0)."""
    if not ONE_FULL:
        return 0
    nb = cfg.nb - 1 if "nob1" in EXPERIMENT else cfg.nb
    return nb * cfg.b_bytes


@cute.jit
def prefetch_weights(cfg: cutlass.Constexpr, tma_a: cute.CopyAtom, gA: cute.Tensor,
                     tma_b: cute.CopyAtom, gB: cute.Tensor, sA_layout: cute.ComposedLayout,
                     sB_layout: cute.ComposedLayout, xb: Int32, layer: Int32, row0: Int32,
                     col0: Int32, up_row0: Int32, k0: Int32, kt: Int32, pool: Int32,
                     full: cute.Pointer, empty: cute.Pointer, pg: Int32,
                     npages: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
                     ticket: Int32, ready, twin=None) -> Int32:
    """gemm_load's first stages: the B pages of up to a ring's worth of
    stages (their A pages taken in ring order but left empty), then the wait for the
    instruction's dependencies, then those stages' A pages. Returns the stages done."""
    a_bytes = cfg.bm * BK * 2
    npre = kt
    if npre > npages // cfg.stage_pages:
        npre = Int32(npages // cfg.stage_pages)
    for k in range(npre):
        kc = k0 + k * BK
        stage_pg = pg + k * cfg.stage_pages
        a_off = stage_a_offset(cfg, stage_pg, npages)
        page, ph = page_of(stage_pg + a_off, npages)
        bar_wait(empty + page, ph ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)
        if cutlass.const_expr(ONE_FULL):
            # the A page is free (its last phase of `full` completed): its barrier may take this
            # stage's B bytes now, its arrival (with the A bytes) comes after `ready`
            with cute.arch.elect_one():
                cute.arch.mbarrier_expect_tx(full + page, stage_b_bytes(cfg))
        load_b_pages(cfg, tma_b, gB, sB_layout, layer, col0, up_row0, kc, pool, full, empty,
                     stage_pg + stage_b_offset(a_off), npages, timeout_ns, state, ticket,
                     stage_full(full + page), twin)
    bar_wait(ready[0], ready[1], timeout_ns, state, rk.ERR_INSTR_READY, ticket)
    # the activations were written by generic-proxy stores of other CTAs (acquired by the
    # controller's waits, handed over by `ready`): order them before the async-proxy reads
    cute.arch.fence_proxy("async.global")
    for k in range(npre):
        stage_pg = pg + k * cfg.stage_pages
        page, ph = page_of(stage_pg + stage_a_offset(cfg, stage_pg, npages), npages)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(full + page, a_bytes)
        source_box(twin, False, tma_a, gA, sA_layout, cfg.bm, pool, page, 0, row0, k0 + k * BK,
                   xb, full + page)
    return npre


@cute.jit
def load_epilogue(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, tma_r, gR,
                  sA_layout: cute.ComposedLayout, yb: Int32, row0: Int32, col0: Int32, pool: Int32,
                  full: cute.Pointer, empty: cute.Pointer, pg: Int32, npages: cutlass.Constexpr,
                  timeout_ns: Int64, state: cute.Tensor, ticket: Int32, rows=None,
                  cols=None) -> Int32:
    """Loader: grant the E epilogue pages (RESIDUAL: TMA-load the residual tile into them)."""
    ob = out_bytes_of(epi)
    nbox = cfg.epi_boxes(ob)
    bpp = 128 // cfg.bm
    for e in cutlass.range_constexpr(cfg.epi_pages(ob)):
        page, ph = page_of(pg + e, npages)
        bar_wait(empty + page, ph ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)
        if cutlass.const_expr(epi == EPI_RESIDUAL):
            nb_here = min(bpp, nbox - e * bpp)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(full + page, nb_here * cfg.bm * 128)
            for s in cutlass.range_constexpr(nb_here):
                tma_box(tma_r, gR, sA_layout, cfg.bm, pool, page, s * cfg.bm * 128, row0,
                        col0 + (e * bpp + s) * 64, yb, full + page)
        else:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive(full + page)
    return pg + cfg.epi_pages(ob)


# ============================================================================ consumers (2 WGs)
@cute.jit
def epi_addr(pool: Int32, ep0: Int32, r: Int32, c: Int32, bm: cutlass.Constexpr,
             ob: cutlass.Constexpr, npages: cutlass.Constexpr) -> Int32:
    """smem byte address of output element (r, c) of the tile in the epilogue pages (first page
    index ep0, ring-wrapped): 128-byte rows of bm-row boxes, 128 // bm boxes a page, the 16-byte
    chunks of row r XOR-swizzled by r % 8 (the TMA's 128B swizzle). r, c >= 0, so shifts and
    masks stand for // and %: on Int32 those are signed, ~4 SASS instructions each, and this runs
    unrolled for every accumulator pair of the epilogue (session 8: the epilogue's code is
    fetched cold on every visit, like the attention storer's in session 7)."""
    assert bm in (64, 128), bm
    lbpp = 1 if bm == 64 else 0             # log2 of the boxes per page
    cb = c * ob
    box = cb >> 7
    within = cb & 127
    pidx = ep0 + (box >> lbpp)
    if pidx >= npages:
        pidx = pidx - npages
    return (pool + pidx * PAGE + (box & ((1 << lbpp) - 1)) * (bm * 128) + r * 128
            + (((within >> 4) ^ (r & 7)) << 4) + (within & 15))


# ---------------------------------------------------------------- epilogue math (shared with the
# SPLITK_REDUCE body, mk/instructions/_splitk_kernel.py: one definition of each rounding point)
residual_add = rk.residual_add     # RESIDUAL: res + bf16(acc) (shared with the folded RMSNORM)


@cute.jit
def silu_mul_bf16(g: Float32, u: Float32) -> Float32:
    """bf16(silu(bf16(g)) * bf16(u)) like the torch face (F.silu on bf16, then a bf16 product)."""
    gb = g.to(BFloat16).to(Float32)
    # x * rcp.approx(1 + e^-x) instead of an IEEE division (its Newton steps and slow-path test
    # were ~16 SASS instructions of the unrolled epilogue per element, session 8): <= 1 ulp in
    # float32 before the bf16 rounding, like the fastmath exp already is; e^-x = inf -> -0
    s = (gb * cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-gb, fastmath=True))
         ).to(BFloat16).to(Float32)
    return s * u.to(BFloat16).to(Float32)


def out_pairs(cfg, acc) -> int:
    """Accumulator pairs of a chain that hold output columns (trace time): all of them, or for a
    one-page gate/up tile the gate half (columns c < b_rows / 2; their up at + cfg.partner)."""
    return cfg.partner // 2 if cfg.half_gate_up else cute.size(acc) // 2


def up_pair(cfg, accs, acc, i: int):
    """The up values of a GATE_UP tile's gate pair i: the second chain's pair i (two B pages), or
    the same chain's pair cfg.partner later (one page)."""
    if cfg.half_gate_up:
        return acc[2 * i + cfg.partner], acc[2 * i + 1 + cfg.partner]
    return accs[1][2 * i], accs[1][2 * i + 1]


def out_pair(cfg, accs, acc, i: int):
    """Output pair i of chain acc before the destination's part of the epilogue: the
    accumulators, or for GATE_UP silu_mul_bf16 of the gate pair and its up pair."""
    v0 = acc[2 * i]
    v1 = acc[2 * i + 1]
    if cutlass.const_expr(cfg.gate_up):
        u0, u1 = up_pair(cfg, accs, acc, i)
        v0 = silu_mul_bf16(v0, u0)
        v1 = silu_mul_bf16(v1, u1)
    return v0, v1


@cute.jit
def gemm_consume(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, tiled_mma: cute.TiledMma,
                 mainloop_mma: cute.TiledMma, sA_layout: cute.ComposedLayout,
                 sB_layout: cute.ComposedLayout, kt: Int32,
                 pool: Int32, full: cute.Pointer, empty: cute.Pointer, done: cute.Pointer,
                 pg: Int32, npages: cutlass.Constexpr, ctid: Int32, timeout_ns: Int64,
                 state: cute.Tensor, ticket: Int32, meta: cute.Tensor, inv_freq: cute.Tensor,
                 row0: Int32, rows: Int32, section: Int32,
                 share: cutlass.Constexpr = DONE_ARRIVALS, split=None,
                 journal: cute.Tensor = None, stamp_epi: cutlass.Constexpr = -1,
                 wait_word: cutlass.Constexpr = -1, mma_word: cutlass.Constexpr = -1,
                 epi_word: cutlass.Constexpr = -1, cols=None, ktrace=None) -> Int32:
    """Both consumer warpgroups (ctid in [0, 256)): mainloop + fused epilogue into the epilogue
    pages. Returns the new page count.

    tiled_mma: the fragment map of a chain (the epilogues'); mainloop_mma / sB_layout: the
    mainloop's wgmma and B operand (GemmAtoms.mainloop_mma / sB_mainloop_layout: for a wide tile
    one chain over both B pages, whose accumulator is the chains' side by side).

    journal / stamp_epi (the megakernel's journal variant only): word of row `ticket` that gets
    the time the last wgmma retired (the epilogue, or a split tile's partial stores, start);
    wait_word / mma_word: words that get consumer thread 0's time in the mainloop waiting for
    full operand pages (the loads late), and for the previous K step's wgmmas to retire (the
    tensor pipe busy), each summed over the instruction (mk.trace: cons_wait / mma_wait);
    epi_word: the word that gets the time the epilogue pages were all full (a RESIDUAL tile's
    residual loads landed; mk.trace: epi_wait = cons_epi0 -> epi_ready).

    share: done[p]'s init count. CONSUMER_THREADS = every consumer thread arrives itself (the
    megakernel's "thread" hand-off, which compute-sanitizer racecheck credits); otherwise lane 0 of
    each consumer warp arrives with share // NUM_CONSUMER_WARPS (after __syncwarp for the
    epilogue pages).

    EPI_ROPE only: meta is the step metadata (positions at meta[meta[M_OFF_POS] + row]), inv_freq
    the head's 64 (llama3-scaled) inverse frequencies in float32 (mk.instructions.qkv.inv_freq),
    section the qkv section (V: no RoPE). The other epilogues ignore these. cols: the tile's
    output columns (RESIDUAL where the store adds the residual: a whole tile stages bf16(acc)).

    split: a SplitTile when the variant runs split-K tiles (None: not compiled in). A tile whose
    nsplit word is >= 2 stores its float32 accumulators to the SPLITK workspace (store_partial)
    instead of the epilogue, and takes no epilogue pages.

    ktrace: the journal where the variant writes the K-step trace (KTRACE), else None."""
    wg = ctid // 128
    lane = ctid % 32
    mma_tid = ctid
    if cutlass.const_expr(cfg.wg == "PAGE"):
        mma_tid = ctid % 128
    thr_mma = tiled_mma.get_slice(mma_tid)
    main_tid = mma_tid
    if cutlass.const_expr(UNIFORM_PAGES):
        # a wgmma's smem operands are the whole warpgroup's: its first thread's slice is every
        # thread's, and a warp-uniform one keeps the descriptors in uniform registers
        main_tid = cute.arch.make_warp_uniform(mma_tid - mma_tid % 128)
    thr_main = mainloop_mma.get_slice(main_tid)
    nch = cfg.chains()
    spp = cfg.stage_pages

    # accumulators: one per wgmma chain (a wide tile: one for both, split after the mainloop)
    cC = cute.make_identity_tensor((64 * cfg.atom_layout()[0], cfg.wn * cfg.atom_layout()[1]))
    tCcC = thr_mma.partition_C(cC)
    accs = [cute.make_rmem_tensor(tCcC.shape, Float32) for _ in range(nch)]
    mains = accs
    if cutlass.const_expr(cfg.wide):
        cW = cute.make_identity_tensor((64 * cfg.atom_layout()[0], cfg.mainloop_wn()))
        mains = [cute.make_rmem_tensor(thr_main.partition_C(cW).shape, Float32)]
    for ch in cutlass.range_constexpr(len(mains)):
        mains[ch].fill(0.0)
    # PlanConfig.norm_fold=3: a self-scaled tile's rows' sums of squares (SplitTile.self_scale)
    # (norm_fold=4: a ROW_PARTS tile's sums of squares from ROW_PART, before the mainloop)
    own, ssq = None, None
    if cutlass.const_expr(split is not None and epi in ROW_SCALED_EPIS):
        if cutlass.const_expr(split.self_scale or split.row_parts):
            ssq = cute.make_rmem_tensor(cute.make_layout(2), Float32)
            ssq.fill(0.0)
        if cutlass.const_expr(split.self_scale):
            own = split.self_scaled()
        elif cutlass.const_expr(split.row_parts):
            own = split.row_part_scaled()
            if own:
                row_part_sumsq(ssq, split, row0, rows, tCcC[0][0], tCcC[2][0], lane % 4)
    mainloop_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
    wclk = rk.make_wait_clock(wait_word)
    mclk = rk.make_wait_clock(mma_word)
    # PAGE_CURSOR: (page, parity) of the K step's stage's ring positions 0..2 (one division each
    # per tile, then a ring_add each per K step), and the previous stage's pages (its release)
    s0, s0p = page_of(pg, npages)
    s1, s1p = rk.ring_add(s0, s0p, 1, npages)
    s2, s2p = rk.ring_add(s0, s0p, 2, npages)
    r0, r1, r2 = s0, s1, s2
    for k in range(kt):
        sp = pg + k * cfg.stage_pages
        if cutlass.const_expr(PAGE_CURSOR):
            a_off = stage_a_offset_at(cfg, s0, npages)
        else:
            a_off = stage_a_offset(cfg, sp, npages)
        b_off = stage_b_offset(a_off)
        slots = ((s0, s0p), (s1, s1p), (s2, s2p))
        pa, pha = stage_page(slots, sp, a_off, npages)
        t0 = rk.wait_clock_start(wclk)
        kt_stamp(ktrace, ticket, k, KT_C_WAIT, ctid == 0)
        bar_wait(full + pa, pha, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
        if cutlass.const_expr(not ONE_FULL):
            for j in cutlass.range_constexpr(cfg.nb):
                pb, phb = stage_page(slots, sp, b_off + j, npages)
                bar_wait(full + pb, phb, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
        kt_stamp(ktrace, ticket, k, KT_C_FULL, ctid == 0)
        kt_stamp(ktrace, ticket, k, KT_C1_FULL, ctid == 128)
        rk.wait_clock_add(wclk, t0)
        if cutlass.const_expr(UNIFORM_PAGES):
            pa = cute.arch.make_warp_uniform(pa)
        tCrA = mainloop_mma.make_fragment_A(
            thr_main.partition_A(page_tensor(pool, pa, sA_layout)))
        cute.nvgpu.warpgroup.fence()
        for ch in cutlass.range_constexpr(len(mains)):
            jb = ch
            if cutlass.const_expr(cfg.wg == "PAGE"):
                jb = wg
            pb, _ = stage_page(slots, sp, b_off + jb, npages)
            if cutlass.const_expr(UNIFORM_PAGES):
                pb = cute.arch.make_warp_uniform(pb)
            tCrB = mainloop_mma.make_fragment_B(
                thr_main.partition_B(page_tensor(pool, pb, sB_layout)))
            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(mainloop_mma, mains[ch], tCrA[(None, None, kb)],
                          tCrB[(None, None, kb)], mains[ch])
        cute.nvgpu.warpgroup.commit_group()
        if cutlass.const_expr(own is not None and split.self_scale):
            # while the stage's wgmmas run: this thread's quarter of its two rows in the A page
            if own:
                row_sumsq(ssq, pool + pa * PAGE, tCcC[0][0], tCcC[2][0], lane % 4)
        if cutlass.const_expr("earlyfree" in EXPERIMENT):
            if k > 0:
                release_previous_stage((r0, r1, r2), pg + (k - 1) * spp, spp, npages,
                                       operand_bar(empty, done), lane, share)
        t0 = rk.wait_clock_start(mclk)
        cute.nvgpu.warpgroup.wait_group(1)
        rk.wait_clock_add(mclk, t0)
        kt_stamp(ktrace, ticket, k, KT_C_RET, ctid == 0)
        if cutlass.const_expr("earlyfree" not in EXPERIMENT):
            if k > 0:
                # the previous stage's wgmmas retired: free its pages (OPERAND_FREE): every use
                # of a page completes exactly one phase of full and of empty, and no waiter can
                # fall two phases behind
                release_previous_stage((r0, r1, r2), pg + (k - 1) * spp, spp, npages,
                                       operand_bar(empty, done), lane, share)
        if cutlass.const_expr(ONE_FULL):
            stage_b_phases_seen(cfg, full, slots, sp, b_off, npages, ctid, timeout_ns, state,
                                ticket)
        if cutlass.const_expr(PAGE_CURSOR):
            r0, r1, r2 = s0, s1, s2
            s0, s0p = rk.ring_add(s0, s0p, spp, npages)
            s1, s1p = rk.ring_add(s1, s1p, spp, npages)
            if cutlass.const_expr(spp > 2):
                s2, s2p = rk.ring_add(s2, s2p, spp, npages)
    cute.nvgpu.warpgroup.wait_group(0)
    if cutlass.const_expr(cfg.wide):
        # the N = 256 fragment is the two N = 128 chains' side by side (element e + 2h + 4j holds
        # column 8j + ..., j < 32): each chain's accumulator is a view of its half
        per_chain = cute.size(accs[0])
        accs = [cute.make_tensor(mains[0].iterator + ch * per_chain, accs[ch].layout)
                for ch in range(nch)]
    if cutlass.const_expr(stamp_epi >= 0):
        rk.journal_stamp(journal, ticket, stamp_epi, ctid == 0)
    rk.wait_clock_write(wclk, journal, ticket, wait_word, ctid == 0)
    rk.wait_clock_write(mclk, journal, ticket, mma_word, ctid == 0)
    if cutlass.const_expr(split is not None):
        if split.nsplit() >= 2:
            # before the last stage's `done`: the storer's walk of the operand pages then orders
            # these global stores before its signal (no epilogue pages for a split tile)
            store_partial(cfg, accs, tCcC, wg, split, row0, rows)
            if cutlass.const_expr(share != CONSUMER_THREADS):
                cute.arch.sync_warp()       # lane 0's `done` arrive speaks for the warp's stores
    release_stage(pg + (kt - 1) * spp, spp, npages, done, lane, share)
    ep = pg + kt * spp              # the epilogue pages (after the last stage)
    pg = pg + kt * spp
    if cutlass.const_expr(split is None):
        pg = pg + consume_epilogue(cfg, epi, accs, tCcC, wg, pool, full, empty, done, ep, npages,
                                   lane, timeout_ns, state, ticket, meta, inv_freq, row0, rows,
                                   section, share, journal, epi_word, ctid == 0, cols) - ep
    else:
        if split.nsplit() < 2:
            pg = pg + consume_epilogue(cfg, epi, accs, tCcC, wg, pool, full, empty, done, ep,
                                       npages, lane, timeout_ns, state, ticket, meta, inv_freq,
                                       row0, rows, section, share, journal, epi_word,
                                       ctid == 0, cols, split, own, ssq) - ep
    return pg


@cute.jit
def consume_epilogue(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, accs, tCcC: cute.Tensor,
                     wg: Int32, pool: Int32, full: cute.Pointer, empty: cute.Pointer,
                     done: cute.Pointer, pg: Int32, npages: cutlass.Constexpr, lane: Int32,
                     timeout_ns: Int64, state: cute.Tensor, ticket: Int32, meta: cute.Tensor,
                     inv_freq: cute.Tensor, row0: Int32, rows: Int32, section: Int32,
                     share: cutlass.Constexpr, journal: cute.Tensor = None,
                     epi_word: cutlass.Constexpr = -1, me=None, cols=None,
                     split=None, own=None, ssq=None) -> Int32:
    """Consumers: the fused epilogue of the accumulators into the E epilogue pages (first page at
    ring count pg), handed to the storer. Returns the new page count. split: the tile's
    SplitTile (variants with split-K): an unsplit QKV_ROPE / GATE_UP tile with an epilogue wait
    scales its rows by ROW_SCALE first (scale_rows); own / ssq (SplitTile.self_scale /
    row_parts): whether the tile is self-scaled (or scaled from ROW_PART), and its rows' sums of
    squares (row_sumsq / row_part_sumsq), by which it then scales them (scale_own_rows); an
    h-writing RESIDUAL tile in a row_parts slot writes ROW_PART (stsm_epilogue's parts)."""
    nch = cfg.chains()
    ob = out_bytes_of(epi)
    ne = cfg.epi_pages(ob)
    # chain_pages: chain ch's pages [ch * cp, (ch + 1) * cp) waited for and handed over around
    # its own epilogue (cp = 0: every page before the first chain, all handed over after the last)
    cp = chain_pages(cfg, epi)
    wait_epilogue_pages(full, empty, pg, 0, cp if cp > 0 else ne, npages, timeout_ns, state,
                        ticket)
    if cutlass.const_expr(split is not None and epi in ROW_SCALED_EPIS):
        # the loader granted these pages after the row-scale norm's counter (gemm_load)
        scale_rows(accs, tCcC, split.sk, split.tokens, split.epi_wait(), row0)
    if cutlass.const_expr(own is not None):
        own_k, own_eps = split.k(), split.eps      # (the `if` below carries run-time values only)
        if own:
            scale_own_rows(accs, tCcC, ssq, own_k, own_eps)
    parts = None
    if cutlass.const_expr(split is not None and epi == EPI_RESIDUAL):
        if cutlass.const_expr(split.row_parts):
            parts = row_part_target(split, row0, rows)
    if cutlass.const_expr(epi_word >= 0):
        # a time, not a summed clock: a clock register held through the waits spilled the
        # journal variant's consumers (8 bytes at M1024 / max); chain by chain the first
        # chain's pages
        rk.journal_stamp(journal, ticket, epi_word, me)
    ep0 = pg % npages
    col_off = tile_col_off(cfg, wg)
    nout = 1 if cfg.gate_up else nch
    if cutlass.const_expr("noepi" in EXPERIMENT):
        # keep every accumulator live (with no use of them the compiler dropped the wgmmas:
        # session 22's first noepi timings ran above the tensor pipe's peak): their sum, stored
        # only if it is never-seen value
        tot = Float32(0.0)
        for ch in cutlass.range_constexpr(nch):
            for i in cutlass.range_constexpr(cute.size(accs[ch])):
                tot = tot + accs[ch][i]
        if tot == Float32(-1.2345e-30):
            d = cute.make_tensor(cute.make_ptr(Float32, pool + ep0 * PAGE, cute.AddressSpace.smem,
                                               assumed_align=4), cute.make_layout(1))
            d[0] = tot
    if cutlass.const_expr(epi == EPI_ROPE and "noepi" not in EXPERIMENT):
        rope_epilogue(cfg, accs, tCcC, col_off, pool, ep0, npages, meta, inv_freq, row0, rows,
                      section)
    handed = 0
    for ch in cutlass.range_constexpr(0 if (epi == EPI_ROPE or "noepi" in EXPERIMENT) else nout):
        if cutlass.const_expr(cp > 0 and ch > 0):
            wait_epilogue_pages(full, empty, pg, ch * cp, (ch + 1) * cp, npages, timeout_ns,
                                state, ticket)
        acc = accs[ch]
        npair = out_pairs(cfg, acc)
        if cutlass.const_expr(stsm_chain_ok(epi, npair)):
            stsm_epilogue(cfg, epi, accs, acc, tCcC, col_off + ch * cfg.wn, pool, ep0, npages,
                          lane, parts)
        else:
            if cutlass.const_expr(parts is not None):
                raise ValueError("PlanConfig.norm_fold=4's ROW_PART sums are written by the "
                                 "stmatrix epilogue only")
            pair_epilogue(cfg, epi, accs, acc, tCcC, col_off + ch * cfg.wn, pool, ep0, npages)
        if cutlass.const_expr(cp > 0 and ch < nout - 1):
            hand_off_epilogue_pages(cfg, epi, done, pg, ch * cp, (ch + 1) * cp, npages, lane,
                                    share)
            handed = (ch + 1) * cp
    hand_off_epilogue_pages(cfg, epi, done, pg, handed, ne, npages, lane, share)
    return pg + ne


@cute.jit
def row_sumsq(ssq: cute.Tensor, page: Int32, ra: Int32, rb: Int32, quarter: Int32):
    """ssq[0] / ssq[1] += the squares (float32) of this thread's quarter of A-page rows ra / rb:
    their 16-byte chunks 2 * quarter and 2 * quarter + 1 (the page is SW128: row r's chunk c at
    byte r * 128 + ((c ^ (r & 7)) << 4)). The four lanes of a row pair (lane % 4) cover its 64
    columns; scale_own_rows sums them. PlanConfig.norm_fold=3's statistic, on the very bf16
    values the wgmmas read."""
    for h in cutlass.range_constexpr(2):
        r = ra
        if cutlass.const_expr(h == 1):
            r = rb
        acc = ssq[h]
        for c in cutlass.range_constexpr(2):
            chunk = 2 * quarter + c
            addr = page + r * 128 + ((chunk ^ (r & 7)) << 4)
            v = cute.make_tensor(cute.make_ptr(BFloat16, addr, cute.AddressSpace.smem,
                                               assumed_align=16),
                                 cute.make_layout(8)).load().to(Float32)
            acc = acc + (v * v).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        ssq[h] = acc


# ROW_PART chunks (4 floats) of one row a lane sums (norm_fold=4): a quarter of a set of at most
# tiles.NORM_MAX_HIDDEN / 64 columns
ROW_PART_LANE_CHUNKS = tiles.NORM_MAX_HIDDEN // mc.ROW_PART_COLS // 4 // 4


@cute.jit
def row_part_sumsq(ssq: cute.Tensor, split, row0: Int32, rows: Int32, ra: Int32, rb: Int32,
                   quarter: Int32):
    """ssq[0] / ssq[1] = this thread's quarter of the sums of squares of its tile rows ra / rb
    from ROW_PART (PlanConfig.norm_fold=4): of the G = K / 64 columns of the tile's set (G a
    multiple of 4, check_plan), the 16-byte chunks quarter, quarter + 4, ..., each lane of the
    four that share the rows a quarter of them (scale_own_rows sums the four). Every load is
    issued before the first sum; rows past the tile's (its padding) and chunks past the set load
    the last ones again and are not summed."""
    ld = split.row_part_ld()
    base = split.row_part_addr() + Int64(split.row_part_col()) * 4
    nchunk = split.k() // (4 * mc.ROW_PART_COLS)
    last = rows - 1
    vals = []
    for h in cutlass.range_constexpr(2):
        r = ra
        if cutlass.const_expr(h == 1):
            r = rb
        row = Int64(row0 + rk.imin(r, last)) * Int64(ld) * 4
        for u in cutlass.range_constexpr(ROW_PART_LANE_CHUNKS):
            j = rk.imin(quarter + 4 * u, nchunk - 1)
            vals.append(cute.make_tensor(
                cute.make_ptr(Float32, base + row + Int64(j) * 16, cute.AddressSpace.gmem,
                              assumed_align=16), cute.make_layout(4)).load())
    for h in cutlass.range_constexpr(2):
        acc = ssq[h]
        for u in cutlass.range_constexpr(ROW_PART_LANE_CHUNKS):
            if quarter + 4 * u < nchunk:
                acc = acc + vals[h * ROW_PART_LANE_CHUNKS + u].reduce(cute.ReductionOp.ADD,
                                                                       Float32(0.0), 0)
        ssq[h] = acc


@cute.jit
def scale_own_rows(accs, tCcC: cute.Tensor, ssq: cute.Tensor, k: Int32, eps: Float32):
    """A self-scaled tile (norm_fold=3): each accumulator times its row's rsqrt(mean(h^2) + eps),
    the row-scale RMSNORM's expression (rk.rmsnorm_rows: the sum times 1 / K), from the sums of
    squares of the thread's rows tCcC[0] / tCcC[2] (row_sumsq), a quarter in each lane of the
    four that share them. ssq holds the two rows' scales afterwards."""
    inv_k = Float32(1.0) / Float32(k)
    for h in cutlass.range_constexpr(2):
        x = ssq[h]
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
        x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
        ssq[h] = cute.math.rsqrt(x * inv_k + eps)
    ra = tCcC[0][0]
    for ch in cutlass.range_constexpr(len(accs)):
        for i in cutlass.range_constexpr(cute.size(accs[ch])):
            accs[ch][i] = accs[ch][i] * cutlass.select_(tCcC[i][0] == ra, ssq[0], ssq[1])


@cute.jit
def scale_rows(accs, tCcC: cute.Tensor, sk: cute.Tensor, tokens: Int32, epi_wait: Int32,
               row0: Int32):
    """acc *= ROW_SCALE[row0 + row] for every accumulator element (its tile row from tCcC), the
    float32 scale before the epilogue's rounding (y = bf16(acc * r), as a row-scaled
    SPLITK_REDUCE; PlanConfig.norm_fold=2). Rows past the arena's (a partial tile's padding)
    read the last one: their values are not stored. The loads of one row are the same address,
    which the compiler loads once. epi_wait: the tile's A_EPI_WAIT word (0: no scale)."""
    if epi_wait > 0:
        last = tokens - 1
        for ch in cutlass.range_constexpr(len(accs)):
            for i in cutlass.range_constexpr(cute.size(accs[ch])):
                r = row0 + tCcC[i][0]
                if r > last:
                    r = last
                accs[ch][i] = accs[ch][i] * rk.row_scale_at(sk, tokens, r)[0]


@cute.jit
def wait_epilogue_pages(full: cute.Pointer, empty: cute.Pointer, pg: Int32,
                        e0: cutlass.Constexpr, e1: cutlass.Constexpr,
                        npages: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
                        ticket: Int32):
    """Consumers: epilogue pages e0 .. e1 - 1 (ring counts pg + e) granted (full: a RESIDUAL
    tile's residual landed) and their previous use's storer reads done."""
    for e in cutlass.range_constexpr(e0, e1):
        pe, phe = page_of(pg + e, npages)
        bar_wait(full + pe, phe, timeout_ns, state, rk.ERR_PAGE_FULL, ticket)
        # the storer's reads of the page's previous use (complete already: the loader waited on
        # it before granting the page): a direct storer-read -> consumer-write edge for racecheck
        bar_wait(empty + pe, phe ^ 1, timeout_ns, state, rk.ERR_PAGE_EMPTY, ticket)


@cute.jit
def hand_off_epilogue_pages(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, done: cute.Pointer,
                            pg: Int32, e0: cutlass.Constexpr, e1: cutlass.Constexpr,
                            npages: cutlass.Constexpr, lane: Int32,
                            share: cutlass.Constexpr):
    """Consumers: epilogue pages e0 .. e1 - 1, staged, to the storer (`done`)."""
    if cutlass.const_expr(e1 > e0):
        if cutlass.const_expr(tma_stores(epi, cfg)):
            # the storer may hand these pages to the TMA engine (async proxy): order this
            # thread's generic st.shared before its reads (CUTLASS's tma_store_fence, by every
            # writer)
            cute.arch.fence_proxy("async.shared", space="cta")
        if cutlass.const_expr(share != CONSUMER_THREADS):
            cute.arch.sync_warp()
        for e in cutlass.range_constexpr(e0, e1):
            pe, _ = page_of(pg + e, npages)
            consumer_arrive(done + pe, lane, share)


def stsm_chain_ok(epi: int, npair: int) -> bool:
    """Whether a chain of npair output pairs of epilogue epi takes the stmatrix epilogue (RESIDUAL
    chains of whole groups of four pairs; trace time)."""
    return epi == EPI_RESIDUAL and npair % 4 == 0 and "noepi" not in EXPERIMENT


@cute.jit
def pair_epilogue(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, accs, acc, tCcC: cute.Tensor,
                  coff: Int32, pool: Int32, ep0: Int32, npages: cutlass.Constexpr):
    """One chain's output pairs (accumulator acc, its columns at tile column offset coff) into
    the epilogue pages at first page ep0: a 4- (8-) byte st.shared per pair at its swizzled
    address, RESIDUAL's residual read from the same place first."""
    ob = out_bytes_of(epi)
    npair = out_pairs(cfg, acc)
    resid = [None] * npair
    if cutlass.const_expr(epi == EPI_RESIDUAL and EPI_BATCH):
        # every residual pair of this chain in flight before the first store (see EPI_BATCH)
        for i in cutlass.range_constexpr(npair):
            r, c = tCcC[2 * i]
            a = epi_addr(pool, ep0, r, c + coff, cfg.bm, ob, npages)
            d = cute.make_tensor(cute.make_ptr(BFloat16, a, cute.AddressSpace.smem,
                                               assumed_align=4), cute.make_layout(2))
            resid[i] = (d[0].to(Float32), d[1].to(Float32))
    for i in cutlass.range_constexpr(npair):
        r, c = tCcC[2 * i]
        c = c + coff
        v0, v1 = out_pair(cfg, accs, acc, i)
        a = epi_addr(pool, ep0, r, c, cfg.bm, ob, npages)
        if cutlass.const_expr(ob == 4):
            d = cute.make_tensor(cute.make_ptr(Float32, a, cute.AddressSpace.smem,
                                               assumed_align=8), cute.make_layout(2))
            d[0] = v0
            d[1] = v1
        else:
            d = cute.make_tensor(cute.make_ptr(BFloat16, a, cute.AddressSpace.smem,
                                               assumed_align=4), cute.make_layout(2))
            if cutlass.const_expr(epi == EPI_RESIDUAL):
                # torch: dst + bf16(y), rounded once more to bf16
                if cutlass.const_expr(EPI_BATCH):
                    v0 = residual_add(resid[i][0], v0)
                    v1 = residual_add(resid[i][1], v1)
                else:
                    v0 = residual_add(d[0].to(Float32), v0)
                    v1 = residual_add(d[1].to(Float32), v1)
            d[0] = v0.to(BFloat16)
            d[1] = v1.to(BFloat16)


@cute.jit
def stsm_epilogue(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, accs, acc, tCcC: cute.Tensor,
                  coff: Int32, pool: Int32, ep0: Int32, npages: cutlass.Constexpr, lane: Int32,
                  parts=None):
    """pair_epilogue with one stmatrix.x4 per four output pairs (RESIDUAL): pairs 4k .. 4k + 3 of a
    thread are the wgmma fragment's (rows r, r + 8) x (columns c, c + 8) of column group k, i.e.
    the four 8 x 8 matrices of the warp's 16 rows x 16 columns in the order stmatrix takes them;
    lane l gives the row address of matrix l // 8, row l % 8 (matrix m: rows + 8 (m & 1),
    columns + 8 (m >> 1)). A group's 16 columns lie in one 64-column box, each matrix row in one
    16-byte chunk of the swizzle, so epi_addr of the row's first column is its address.
    The residual by one ldmatrix.x4 of the same addresses (the same fragment order), group by
    group (every group's first, as EPI_BATCH, spilled 176 bytes at M1024), added in packed bf16
    (rk.add_bf16x2).
    parts (RESIDUAL, PlanConfig.norm_fold=4: row_part_target's): the sums of squares of the h
    words over each four column groups (64 columns) into ROW_PART (store_row_part; an m64n64
    tile's two warpgroups join their halves first: join_warpgroup_halves)."""
    ob = out_bytes_of(epi)
    ngroup = out_pairs(cfg, acc) // 4
    r0, c0 = tCcC[0]
    ss = [Float32(0.0), Float32(0.0)]       # parts: the thread's rows r0 / r0 + 8
    m = lane >> 3
    # the warp's first row and the thread's first column group, from its first pair's (row
    # r0 = base + lane / 4, column c0 = base + 2 (lane % 4))
    row = r0 - ((lane & 31) >> 2) + ((m & 1) << 3) + (lane & 7)
    col = c0 - ((lane & 3) << 1) + ((m >> 1) << 3) + coff
    for k in cutlass.range_constexpr(ngroup):
        a = epi_addr(pool, ep0, row, col + 16 * k, cfg.bm, ob, npages)
        resid = prims.ldmatrix(cute.make_ptr(BFloat16, a, cute.AddressSpace.smem,
                                             assumed_align=16).llvm_ptr, 4, prims.MMALayout.ROW)
        words = []
        for i in cutlass.range_constexpr(4):
            v0, v1 = out_pair(cfg, accs, acc, 4 * k + i)
            # torch: dst + bf16(y), rounded once more to bf16 (residual_add's value)
            words.append(rk.add_bf16x2(Int32(resid[i]), rk.pack_bf16x2(v0, v1)))
        if cutlass.const_expr(parts is not None):
            # word i holds row r0 + 8 (i & 1)'s pair of the group (the fragment's order)
            for i in cutlass.range_constexpr(4):
                lo, hi = rk.unpack_bf16x2(words[i])
                ss[i & 1] = ss[i & 1] + lo * lo + hi * hi
            if cutlass.const_expr(k % 4 == 3 or k == ngroup - 1):
                # the group's first column in the tile: the warp's (c0 less the lane's pair,
                # which in "N" mode carries the warpgroup's 64 columns) + coff + 16 k
                gcol = c0 - ((lane & 3) << 1) + coff + 16 * (k - k % 4)
                if cutlass.const_expr(cfg.wn < mc.ROW_PART_COLS):
                    # m64n64: each warpgroup holds half of the part's columns
                    half = (c0 - ((lane & 3) << 1)) // cfg.wn
                    xs = join_warpgroup_halves(cfg, quad_row_sums(ss), r0, lane, half, pool,
                                               ep0)
                    if half == 0:
                        store_row_part(parts, xs, r0, 0, lane, True)
                else:
                    store_row_part(parts, ss, r0, gcol // mc.ROW_PART_COLS, lane)
                ss = [Float32(0.0), Float32(0.0)]
        prims.stmatrix(cute.make_ptr(BFloat16, a, cute.AddressSpace.smem,
                                     assumed_align=16).llvm_ptr, words, prims.MMALayout.ROW)


def row_part_target(split, row0: Int32, rows: Int32):
    """stsm_epilogue's `parts` of an h-writing tile (PlanConfig.norm_fold=4): ROW_PART's address
    and row length, the tile's A_ROW_PART word (0: it writes none), its first column, its rows,
    its columns."""
    return (split.row_part_addr(), split.row_part_ld(), split.row_part_word(),
            split.ring[split.base + W_COL0], row0, rows, split.ring[split.base + W_COLS])


def quad_row_sums(ss: list) -> list:
    """The sums of the four lanes of each row pair (ss: the thread's rows r / r + 8), in every
    lane of the four (store_row_part's own sums, for a tile that joins them first)."""
    xs = []
    for h in range(2):          # trace time (a plain helper, not a @cute.jit body)
        x = ss[h]
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
        x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
        xs.append(x)
    return xs


@cute.jit
def store_row_part(parts, ss: list, r: Int32, slot: Int32, lane: Int32,
                   summed: cutlass.Constexpr = False):
    """The four lanes of a row pair sum their squares (ss: rows r / r + 8 of the tile; summed:
    already quad_row_sums') and lane 0 of the four stores each row's into ROW_PART[row0 + row,
    word - 1 + col0 / 64 + slot] (the tile's rows and column groups only: a tile narrower than
    its config computes padding columns; nothing where the tile's A_ROW_PART word is 0)."""
    rp, ld, word, col0, row0, rows, cols = parts
    for h in cutlass.range_constexpr(2):
        x = ss[h]
        if cutlass.const_expr(not summed):
            x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
            x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
        row = r + 8 * h
        if word > 0:
            if lane % 4 == 0:
                if row < rows and slot * mc.ROW_PART_COLS < cols:
                    col = word - 1 + col0 // mc.ROW_PART_COLS + slot
                    addr = rp + (Int64(row0 + row) * Int64(ld) + Int64(col)) * 4
                    cute.make_tensor(cute.make_ptr(Float32, addr, cute.AddressSpace.gmem,
                                                   assumed_align=4), cute.make_layout(1))[0] = x


@cute.jit
def join_warpgroup_halves(cfg: cutlass.Constexpr, xs: list, r: Int32, lane: Int32, half: Int32,
                          pool: Int32, ep0: Int32) -> list:
    """A tile whose warpgroups hold 32 columns each of one 64-column ROW_PART group (m64n64):
    warpgroup 1's row sums (quad_row_sums) to warpgroup 0 through the epilogue page's unused
    second box (the tile's output is its first), after both consumer warpgroups' named barrier;
    returns warpgroup 0's sums plus warpgroup 1's, in that order (deterministic)."""
    assert cfg.bm == 64 and cfg.epi_boxes(2) == 1, "the scratch is the second 64-row box"
    scratch = cute.make_tensor(cute.make_ptr(Float32, pool + ep0 * PAGE + cfg.bm * 128,
                                             cute.AddressSpace.smem, assumed_align=4),
                               cute.make_layout(cfg.bm))
    if half == 1:
        if lane % 4 == 0:
            scratch[r] = xs[0]
            scratch[r + 8] = xs[1]
    cute.arch.barrier(barrier_id=BAR_CONSUMERS, number_of_threads=CONSUMER_THREADS)
    lo, hi = xs[0], xs[1]
    if half == 0:
        lo = lo + scratch[r]
        hi = hi + scratch[r + 8]
    return [lo, hi]


def operand_bar(empty: cute.Pointer, done: cute.Pointer) -> cute.Pointer:
    """The barriers the consumers arrive on for an operand stage but the last (OPERAND_FREE)."""
    return empty if OPERAND_FREE == "consumer" else done


@cute.jit
def release_stage(stage_pg: Int32, spp: cutlass.Constexpr, npages: cutlass.Constexpr,
                  bars: cute.Pointer, lane: Int32, share: cutlass.Constexpr):
    """A consumer thread's hand-off of the spp pages of the stage starting at ring count
    stage_pg, whose wgmmas retired, on barriers `bars`: `empty` (the page is free again) or
    `done` (the storer's walk frees it in ring order, gemm_store)."""
    for j in cutlass.range_constexpr(spp):
        pp, _ = page_of(stage_pg + j, npages)
        consumer_arrive(bars + pp, lane, share)


def stage_page(slots, stage_pg, d, npages: int):
    """(page, parity) of ring offset d (0..2) in a K step's stage: one of the loop's carried
    slots (PAGE_CURSOR; a run-time d picks by selects), else page_of the stage's ring count."""
    if not PAGE_CURSOR:
        return page_of(stage_pg + d, npages)
    if isinstance(d, int):
        return slots[d]
    return _pick_slot(d, slots[0][0], slots[0][1], slots[1][0], slots[1][1], slots[2][0],
                      slots[2][1])


@cute.jit
def _pick_slot(d: Int32, p0: Int32, q0: Int32, p1: Int32, q1: Int32, p2: Int32, q2: Int32):
    page, parity = p0, q0
    if d == 1:
        page, parity = p1, q1
    if d == 2:
        page, parity = p2, q2
    return page, parity


def stage_b_phases_seen(cfg, full: cute.Pointer, slots, sp, b_off, npages: int, ctid: Int32,
                        timeout_ns: Int64, state: cute.Tensor, ticket: Int32):
    """ONE_FULL: consumer thread 0 observes this stage's B pages' own `full` phases before its
    arrival frees the stage (the next K step, or the `done` after the loop)."""
    if PAGE_CURSOR:
        pb0, qb0 = stage_page(slots, sp, b_off, npages)
        pb1, qb1 = stage_page(slots, sp, b_off + cfg.nb - 1, npages)
        _b_phases_seen_by_thread0(cfg.nb, full, pb0, qb0, pb1, qb1, ctid, timeout_ns, state,
                                  ticket)
    else:
        _b_phases_seen_count_by_thread0(cfg, full, sp + b_off, npages, ctid, timeout_ns, state,
                                        ticket)


@cute.jit
def _b_phases_seen_by_thread0(nb: cutlass.Constexpr, full: cute.Pointer, pb0: Int32, qb0: Int32,
                              pb1: Int32, qb1: Int32, ctid: Int32, timeout_ns: Int64,
                              state: cute.Tensor, ticket: Int32):
    if ctid == 0:
        b_phases_seen_at(nb, full, pb0, qb0, pb1, qb1, timeout_ns, state, ticket)


@cute.jit
def _b_phases_seen_count_by_thread0(cfg: cutlass.Constexpr, full: cute.Pointer, pg_b: Int32,
                                    npages: cutlass.Constexpr, ctid: Int32, timeout_ns: Int64,
                                    state: cute.Tensor, ticket: Int32):
    if ctid == 0:
        b_phases_seen(cfg, full, pg_b, npages, timeout_ns, state, ticket)


def release_previous_stage(prev_pages, stage_pg, spp: int, npages: int, bars, lane, share: int):
    """The K loop's release of the previous stage: its carried pages under PAGE_CURSOR."""
    if PAGE_CURSOR:
        for j in range(spp):
            consumer_arrive(bars + prev_pages[j], lane, share)
    else:
        release_stage(stage_pg, spp, npages, bars, lane, share)


@cute.jit
def consumer_arrive(bar: cute.Pointer, lane: Int32, share: cutlass.Constexpr):
    """One consumer thread's part of a `done` hand-off (see gemm_consume's share)."""
    if cutlass.const_expr(share == CONSUMER_THREADS):
        cute.arch.mbarrier_arrive(bar)
    else:
        if lane == 0:
            cute.arch.mbarrier_arrive(bar, arrive_count=share // NUM_CONSUMER_WARPS)


# 2 pi in three float32 parts (Cody-Waite): k * part is exact for |k| < 2^15 (angles < ~2e5 rad)
TWO_PI_1 = 6.28125
TWO_PI_2 = 0.0019353071693331003
TWO_PI_3 = 1.0253131677018246e-11


@cute.jit
def reduce_2pi(x: Float32) -> Float32:
    """x - 2 pi k in [-pi, pi] (libdevice's sinf/cosf would pull in the Payne-Hanek slow path with a
    local-memory table: a stack frame in the consumer)."""
    k = cute.math.roundeven(x * Float32(1.0 / (2.0 * math.pi)))
    r = cute.math.fma(-k, Float32(TWO_PI_1), x)
    r = cute.math.fma(-k, Float32(TWO_PI_2), r)
    return cute.math.fma(-k, Float32(TWO_PI_3), r)


@cute.jit
def bf(x: Float32) -> Float32:
    """Round to bf16 and back (the torch face computes in the model dtype)."""
    return x.to(BFloat16).to(Float32)


@cute.jit
def rope_cos_sin(pos: Float32, freq: Float32):
    """bf16(cos(pos * freq)), bf16(sin(pos * freq)) from the float32 angle (qkv.rope_cos_sin)."""
    ang = reduce_2pi(pos * freq)
    return bf(cute.math.cos(ang, fastmath=True)), bf(cute.math.sin(ang, fastmath=True))


@cute.jit
def rope_lo(y_lo: Float32, y_hi: Float32, cs: Float32, sn: Float32) -> Float32:
    """Column c < 64 of a head (bf16 inputs): x*cos + rotate_half(x)*sin = y_lo*cos - y_hi*sin,
    in bf16 steps like qkv.apply_rope."""
    return bf(bf(y_lo * cs) + bf(-y_hi * sn))


@cute.jit
def rope_hi(y_lo: Float32, y_hi: Float32, cs: Float32, sn: Float32) -> Float32:
    """Column c + 64 of a head: y_hi*cos + y_lo*sin (see rope_lo)."""
    return bf(bf(y_hi * cs) + bf(y_lo * sn))


@cute.jit
def rope_epilogue(cfg: cutlass.Constexpr, accs, tCcC: cute.Tensor, col_off: Int32, pool: Int32,
                  ep0: Int32, npages: cutlass.Constexpr, meta: cute.Tensor, inv_freq: cute.Tensor,
                  row0: Int32, rows: Int32, section: Int32):
    """QKV_ROPE: y = bf16(acc); on q/k sections x*cos + rotate_half(x)*sin per 128-wide head, in
    bf16 steps like qkv.apply_rope (cos/sin from float32 pos * inv_freq, rounded to bf16).
    The partner column c + 64 of element i (c < 64) is element i + PARTNER_64 of the same
    thread."""
    from mk.instructions._common import M_OFF_POS
    assert cfg.wn == 128, "RoPE pairs need the whole 128-column head in one wgmma chain"
    pos_off = meta[M_OFF_POS]
    rope_on = Float32(1.0)
    if section == SEC_V:
        rope_on = Float32(0.0)
    # the thread's two rows (h = 0, 1: elements 0 and 2) and their positions, loaded once
    # instead of once per element pair and chain; V section: angle 0, so cos = 1 and sin = 0
    # and the values pass through exactly
    pos_h = []
    for h in cutlass.range_constexpr(2):
        rr, _ = tCcC[2 * h]
        if rr >= rows:
            rr = rows - 1
        pos_h.append(meta[pos_off + row0 + rr].to(Float32) * rope_on)
    for ch in cutlass.range_constexpr(cfg.chains()):
        acc = accs[ch]
        for ip in cutlass.range_constexpr(16):
            i = (ip % 2) * 2 + (ip // 2) * 4          # e = 0 element of (h, j), j < 8
            r, c = tCcC[i]
            c = c + col_off + ch * cfg.wn
            pos = pos_h[ip % 2]
            y = [bf(acc[i]), bf(acc[i + 1]), bf(acc[i + PARTNER_64]),
                 bf(acc[i + 1 + PARTNER_64])]
            o = [y[0], y[1], y[2], y[3]]
            for e in cutlass.range_constexpr(2):
                cs, sn = rope_cos_sin(pos, inv_freq[(c + e) % 64])
                o[e] = rope_lo(y[e], y[2 + e], cs, sn)
                o[2 + e] = rope_hi(y[e], y[2 + e], cs, sn)
            for half in cutlass.range_constexpr(2):
                a = epi_addr(pool, ep0, r, c + half * 64, cfg.bm, 2, npages)
                d = cute.make_tensor(cute.make_ptr(BFloat16, a, cute.AddressSpace.smem,
                                                   assumed_align=4), cute.make_layout(2))
                d[0] = o[2 * half].to(BFloat16)
                d[1] = o[2 * half + 1].to(BFloat16)


# ============================================================================ destinations
@cute.jit
def row_addr(base: Int64, row: Int32, ld: Int32, col: Int32, ob: cutlass.Constexpr) -> Int64:
    """Byte address of element (row, col) of a row-major buffer at base with pitch ld elements.
    64-bit: K/V cache rows x pitch pass 2^31 bytes (80 layers x 256 sequences x 1024 positions
    faulted with a 32-bit product)."""
    return base + (Int64(row) * Int64(ld) + Int64(col)) * ob


@cute.jit
def dest_row(meta: cute.Tensor, rowmap_off: Int32, row_add: Int32, row: Int32) -> Int32:
    """Destination row of token row `row`: itself, or (rowmap_off >= 0: the K/V cache append)
    meta[rowmap_off + row] + row_add = kv_slot[row] + layer * kv_layer_stride."""
    drow = row
    if rowmap_off >= 0:
        drow = meta[rowmap_off + row] + row_add
    return drow


def z_base(y: cute.Tensor, yz, ob: int):
    """(byte address of y[0, 0, yz], its row pitch in elements): a slot's destination (T, N, Z),
    row-major planes of ob-byte elements."""
    return y.iterator.toint() + Int64(yz) * Int64(y.shape[0]) * Int64(y.shape[1]) * ob, y.shape[1]


def dest_z(ring: cute.Tensor, w0, yb: int):
    """The destination's z index in its slot's buffer view: the instruction's dst word - yb
    (w0: where its unsplit argument words start, gemm_dest)."""
    return ring[w0 + U_DST] - yb


@cute.jit
def gemm_dest(epi: cutlass.Constexpr, y: cute.Tensor, kv: cute.Tensor, meta: cute.Tensor,
              ring: cute.Tensor, base: Int32, w0: Int32, yb: cutlass.Constexpr, col0: Int32):
    """Where a tile's output goes: (ybase, ld, rowmap_off, row_add, dcol0) for gemm_store /
    dest_row / row_addr. The instruction is ring slot `base`; its unsplit argument words start at
    ring index w0 (base + ARG0 for a GEMM instruction, further on for SPLITK_REDUCE's copy), read
    where needed. y: the slot's destination (T, N, Z), z = dst word - yb; QKV_ROPE's K/V sections:
    the paged cache kv (rows, hkv*D, 2), rows kv_slot[t] + layer * stride, column c - sec_col0."""
    ob = out_bytes_of(epi)
    ybase, ld = z_base(y, dest_z(ring, w0, yb), ob)
    rowmap = Int32(-1)
    radd = Int32(0)
    dcol0 = col0
    if cutlass.const_expr(epi == EPI_ROPE):
        sec = ring[w0 + U_SECTION]
        if sec != SEC_Q:
            # K/V rows go to the paged cache: kv_slot[t] + layer * stride
            ybase = kv.iterator.toint() + Int64(kv.shape[0]) * Int64(kv.shape[1]) * 2 * Int64(sec - 1)
            ld = kv.shape[1]
            rowmap = meta[mc.M_OFF_SLOT]
            radd = ring[base + W_LAYER] * meta[mc.M_KV_LAYER_STRIDE]
            dcol0 = col0 - ring[w0 + U_SEC_COL0]
    return ybase, ld, rowmap, radd, dcol0


# ============================================================================ split-K tiles
class SplitTile:
    """The split-K words of the GEMM instruction in instruction-ring slot `base` (A_NSPLIT,
    A_SPLIT_J, A_K0, A_SPLIT_ROW), read from the ring where a role needs them (nothing stays live
    across the mainloop), and the SPLITK workspace sk (float32 [rows, width], compact).
    up_col: the SPLITK column of GATE_UP's up part (intermediate_local; None for other opcodes).
    A tile with nsplit >= 2 computes x[rows, k0:k0+K] @ W[cols, k0:k0+K]^T and stores it in
    float32 to SPLITK[j * stride + row, c] (c = the tile's output column; GATE_UP: gate part at
    c, up part at up_col + c), with no epilogue.
    Also an unsplit QKV_ROPE / GATE_UP tile's epilogue wait (A_EPI_WAIT / A_EPI_TARGET,
    PlanConfig.norm_fold=2: its rows scaled by ROW_SCALE, which lies in sk's last `tokens`
    floats) and what the loader needs to wait for it (counters, backoff_ns).
    splits False (trace-time): the variant never runs this opcode's split tiles (the slot's
    GemmSlot.splits), only the epilogue wait: nsplit() is the constant 1 and k0() 0, so the
    split-tile code folds away.
    self_scale (trace-time, GemmSlot.self_scale): the consumers' code for a tile marked
    SELF_SCALE (PlanConfig.norm_fold=3) is compiled in: its rows' sum of squares over the A pages
    of the mainloop (row_sumsq), rsqrt(sum / K + eps) with K the tile's K word (k_word) and eps
    the model's, and its rows scaled by it before the epilogue (scale_own_rows).
    row_parts (trace-time, GemmSlot.row_parts; PlanConfig.norm_fold=4; hidden: the arena's
    width): QKV_ROPE / GATE_UP, a tile marked ROW_PARTS takes its rows' sums of squares from
    ROW_PART before its mainloop (row_part_sumsq) and scales them as a self-scaled tile;
    O_PROJ / DOWN, a tile with an A_ROW_PART word writes its rows' sums of squares of h there
    from its RESIDUAL epilogue (stsm_epilogue's `parts`)."""

    def __init__(self, ring: cute.Tensor, base, sk: cute.Tensor, up_col=None, tokens=None,
                 counters=None, backoff_ns: int = 200, splits: bool = True,
                 self_scale: bool = False, k_word: int = -1, eps=None, row_parts: bool = False,
                 hidden=None):
        self.ring, self.base, self.sk, self.up_col = ring, base, sk, up_col
        self.tokens, self.counters, self.backoff_ns = tokens, counters, backoff_ns
        self.splits = splits
        self.self_scale = self_scale and eps is not None
        self.k_word, self.eps = k_word, eps
        self.row_parts, self.hidden = row_parts, hidden

    def row_part_scaled(self):
        """Whether the tile scales its rows from ROW_PART (A_EPI_WAIT = ROW_PARTS)."""
        return self.ring[self.base + A_EPI_WAIT] == Int32(mc.ROW_PARTS)

    def row_part_col(self):
        """A scaled tile's ROW_PART set: its first column (A_EPI_TARGET)."""
        return self.ring[self.base + A_EPI_TARGET]

    def row_part_word(self):
        """An h-writing tile's A_ROW_PART word (1 + its set's first column; 0: none)."""
        return self.ring[self.base + mc.A_ROW_PART]

    def row_part_ld(self):
        """ROW_PART's row length (both sets: 2 * ceil(hidden / 64) floats)."""
        return mc.row_part_ld(self.hidden)

    def row_part_addr(self):
        """Byte address of ROW_PART[0, 0] (rk.row_part_addr)."""
        return rk.row_part_addr(self.sk, self.tokens, self.row_part_ld())

    def self_scaled(self):
        """Whether the tile computes its rows' statistic itself (A_EPI_WAIT = SELF_SCALE)."""
        return self.ring[self.base + A_EPI_WAIT] == Int32(mc.SELF_SCALE)

    def k(self):
        """The tile's K word (its reduction width)."""
        return self.ring[self.base + self.k_word]

    def epi_wait(self):
        """The epilogue wait's counter + 1 (0: none, the tile's rows not scaled)."""
        return self.ring[self.base + A_EPI_WAIT]

    def epi_target(self):
        return self.ring[self.base + A_EPI_TARGET]

    def nsplit(self):
        if not self.splits:
            return Int32(1)
        return self.ring[self.base + A_NSPLIT]

    def k0(self):
        if not self.splits:
            return Int32(0)
        return self.ring[self.base + A_K0]

    def partial_base(self, row0, col0):
        """Byte address of SPLITK[j * stride + row0, col0]."""
        r = self.ring[self.base + A_SPLIT_J] * self.ring[self.base + A_SPLIT_ROW] + row0
        return row_addr(self.sk.iterator.toint(), r, self.sk.shape[1], col0, 4)


@cute.jit
def st_f32x2(addr: Int64, v0: Float32, v1: Float32):
    """One 8-byte global store of (v0, v1)."""
    f = cute.make_rmem_tensor(cute.make_layout(2), Float32)
    f[0] = v0
    f[1] = v1
    cute.make_tensor(cute.make_ptr(Float32, addr, cute.AddressSpace.gmem, assumed_align=8),
                     cute.make_layout(2)).store(f.load())


@cute.jit
def tile_col_off(cfg: cutlass.Constexpr, wg: Int32) -> Int32:
    """Column offset of warpgroup wg's fragment in the tile (PAGE mode: its B page)."""
    col_off = Int32(0)
    if cutlass.const_expr(cfg.wg == "PAGE"):
        col_off = wg * cfg.wn
    return col_off


@cute.jit
def store_partial(cfg: cutlass.Constexpr, accs, tCcC: cute.Tensor, wg: Int32, split,
                  row0: Int32, rows: Int32):
    """Consumers: the float32 accumulators of a split tile straight to SPLITK (8-byte stores of
    the fragment's column pairs: each quad of lanes writes 32 contiguous bytes of a row), rows
    r < rows and columns c < cols of the tile only (the workspace rows past the tile belong to
    other tiles). The fragment's (r, c) map is the epilogue's (consume_epilogue)."""
    ring, base = split.ring, split.base
    cols = ring[base + W_COLS]
    ld = split.sk.shape[1]
    pb = split.partial_base(row0, ring[base + W_COL0])
    col_off = tile_col_off(cfg, wg)
    nout = 1 if cfg.gate_up else cfg.chains()
    for ch in cutlass.range_constexpr(nout):
        acc = accs[ch]
        for i in cutlass.range_constexpr(out_pairs(cfg, acc)):
            r, c = tCcC[2 * i]
            c = c + col_off + ch * cfg.wn
            if r < rows:
                if c < cols:
                    a = pb + Int64(r * ld + c) * 4
                    st_f32x2(a, acc[2 * i], acc[2 * i + 1])
                    if cutlass.const_expr(cfg.gate_up):
                        u0, u1 = up_pair(cfg, accs, acc, i)
                        st_f32x2(a + Int64(split.up_col) * 4, u0, u1)


# ============================================================================ storer (2 warps)
@cute.jit
def gemm_store(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, ybase: Int64, ld: Int32,
               row0: Int32, rows: Int32, col0: Int32, cols: Int32, pool: Int32,
               empty: cute.Pointer, done: cute.Pointer, dpar: cute.Tensor, pg: Int32, kt: Int32,
               npages: cutlass.Constexpr, sid: Int32, bar_id: cutlass.Constexpr,
               nthreads: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
               ticket: Int32, meta: cute.Tensor, rowmap_off: Int32, row_add: Int32,
               dcol0: Int32, share: cutlass.Constexpr = EMPTY_ARRIVALS, split=None,
               tma_store=None) -> Int32:
    """Storer warps (nthreads threads): copy the epilogue pages to y (byte address ybase of the
    destination's (0, 0), row pitch ld elements) with 16-byte stores and exact row/column masks,
    freeing each page after its stores. Returns the new page count.

    The storer walks the operand pages the consumers hand it in ring order (every stage's with
    OPERAND_FREE "storer", the last stage's with "consumer"): it waits on `done` (the consumers'
    wgmmas on the page retired) and frees the page (`empty`). A parity wait only tells phase u
    from u - 1: done[p]'s parity is the storer's own count of its waits on the page (dpar,
    rk.wait_done), never the ring generation, since the pages the consumers free themselves
    complete no `done` phase. The first GPU runs jumped kt stages ahead straight to the epilogue
    pages with the generation's parity: it passed at once on a stale phase, stored stale operand
    data (the weights) and freed pages still in use (page waits timed out, launch failures).

    Tile element (r, c) goes to destination row drow(row0 + r), column dcol0 + c, where
    drow(t) = t, or meta[rowmap_off + t] + row_add when rowmap_off >= 0 (the K/V cache rows of
    QKV_ROPE: kv_slot[t] + layer * kv_layer_stride).

    share: empty[p]'s init count. A multiple of nthreads = every storer thread frees an epilogue
    page itself after its own reads (the megakernel's "thread" hand-off); otherwise the storer
    threads meet in named barrier bar_id and thread 0 arrives with the whole share.

    split: a SplitTile when the variant runs split-K tiles (None: not compiled in); a split tile
    has operand pages only (the consumers stored its partial; their last `done` follows those
    stores, so the signal after this walk is ordered after them).

    tma_store: (S2G atom, its gmem view, z, the box's smem layout) of the destination where full
    tiles leave through TMA stores (tma_stores(epi, cfg); None: the copy for every tile)."""
    j0 = Int32(0)
    if cutlass.const_expr(OPERAND_FREE == "consumer"):
        j0 = (kt - 1) * cfg.stage_pages     # the consumers freed the stages before the last
    for j in range(j0, kt * cfg.stage_pages):
        # operand pages: the consumers are done with them (their wgmmas retired): free them
        page, _ = page_of(pg + j, npages)
        rk.wait_done(done, page, dpar, timeout_ns, state, ticket)
        rk.free_waited_page(page, empty, sid, nthreads, share)
    ep = pg + kt * cfg.stage_pages
    pg = ep
    if cutlass.const_expr(split is None):
        pg = pg + store_epilogue(cfg, epi, ybase, ld, row0, rows, col0, cols, pool, empty, done,
                                 dpar, ep, npages, sid, bar_id, nthreads, timeout_ns, state,
                                 ticket, meta, rowmap_off, row_add, dcol0, share, tma_store) - ep
    else:
        if split.nsplit() < 2:
            pg = pg + store_epilogue(cfg, epi, ybase, ld, row0, rows, col0, cols, pool, empty,
                                     done, dpar, ep, npages, sid, bar_id, nthreads, timeout_ns,
                                     state, ticket, meta, rowmap_off, row_add, dcol0, share,
                                     tma_store) - ep
    return pg


@cute.jit
def store_epilogue(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, ybase: Int64, ld: Int32,
                   row0: Int32, rows: Int32, col0: Int32, cols: Int32, pool: Int32,
                   empty: cute.Pointer, done: cute.Pointer, dpar: cute.Tensor, pg: Int32,
                   npages: cutlass.Constexpr,
                   sid: Int32, bar_id: cutlass.Constexpr, nthreads: cutlass.Constexpr,
                   timeout_ns: Int64, state: cute.Tensor, ticket: Int32, meta: cute.Tensor,
                   rowmap_off: Int32, row_add: Int32, dcol0: Int32,
                   share: cutlass.Constexpr, tma_store=None) -> Int32:
    """Storer: the E epilogue pages (first at ring count pg) to y, freeing each (gemm_store):
    copied by the storer threads, or (tma_store, a full tile) TMA-stored by thread 0."""
    ob = out_bytes_of(epi)
    nbox = cfg.epi_boxes(ob)
    bpp = 128 // cfg.bm
    chunks = cfg.bm * 8                 # 16-byte chunks per box
    per_thread = chunks // nthreads
    UNR = min(STORE_UNROLL, per_thread)  # independent smem loads in flight before the stores
    row_end = row0 + rows
    col_end = col0 + cols
    # iteration `it` covers box rows [it, it + 1) x UNR * nthreads / 8: only those with tile rows
    # (a decode step of B tokens fills B of a 64- or 128-row tile)
    n_it = (rows * 8 + (UNR * nthreads - 1)) // (UNR * nthreads)
    if n_it > per_thread // UNR:
        n_it = Int32(per_thread // UNR)
    ne = cfg.epi_pages(ob)
    # 1: this tile leaves through TMA stores (every row and column of its boxes in the matrix)
    by_tma = 0
    if cutlass.const_expr(tma_store is not None):
        by_tma = whole_tile(cfg, epi, rows, cols)
    # chain_pages: a chain's pages freed once the engine has read them, before the wait for the
    # next chain's (cp = 0: every page after the last store)
    cp = chain_pages(cfg, epi) if tma_store is not None else 0
    freed = 0
    for e in cutlass.range_constexpr(ne):
        if cutlass.const_expr(cp > 0 and e > 0 and e % cp == 0):
            if by_tma == 1:
                if sid == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                for f in cutlass.range_constexpr(e - cp, e):
                    page_f, _ = page_of(pg + f, npages)
                    rk.free_page(page_f, empty, sid, bar_id, nthreads, share)
            freed = e
        page, _ = page_of(pg + e, npages)
        rk.wait_done(done, page, dpar, timeout_ns, state, ticket)
        if cutlass.const_expr(tma_store is not None and "nostore" not in EXPERIMENT):
            if by_tma == 1:
                if sid == 0:
                    # the consumers fenced their writes to the async proxy before `done`
                    for s in cutlass.range_constexpr(min(bpp, nbox - e * bpp)):
                        rk.tma_store_box(tma_store[0], tma_store[1], tma_store[3], cfg.bm,
                                         pool, page, s * (cfg.bm * 128), row0,
                                         col0 + (e * bpp + s) * (128 // ob), tma_store[2],
                                         Float32 if ob == 4 else BFloat16)
                    cute.arch.cp_async_bulk_commit_group()
        if by_tma == 0:
            store_page(cfg, epi, ybase, ld, row0, row_end, col0, col_end, pool, page, e, n_it,
                       UNR, sid, nthreads, meta, rowmap_off, row_add, dcol0)
            rk.free_page(page, empty, sid, bar_id, nthreads, share)
    if cutlass.const_expr(tma_store is not None):
        if by_tma == 1:
            # each page back to the loader once the engine has read it (page e's group is the
            # e-th of ne: ne - 1 - e groups may still be pending), then the writes complete
            # before the instruction's signal (the caller's barrier + release)
            for e in cutlass.range_constexpr(freed, ne):
                page, _ = page_of(pg + e, npages)
                if sid == 0:
                    cute.arch.cp_async_bulk_wait_group(ne - 1 - e, read=True)
                rk.free_page(page, empty, sid, bar_id, nthreads, share)
            if sid == 0:
                cute.arch.cp_async_bulk_wait_group(0)
                cute.arch.fence_proxy("async.global")
    return pg + ne


@cute.jit
def store_page(cfg: cutlass.Constexpr, epi: cutlass.Constexpr, ybase: Int64, ld: Int32,
               row0: Int32, row_end: Int32, col0: Int32, col_end: Int32, pool: Int32,
               page: Int32, e: cutlass.Constexpr, n_it: Int32, UNR: cutlass.Constexpr,
               sid: Int32, nthreads: cutlass.Constexpr, meta: cute.Tensor, rowmap_off: Int32,
               row_add: Int32, dcol0: Int32):
    """The storer threads' copy of epilogue page e (pool page `page`) to y with 16-byte stores
    and exact row / column masks (store_epilogue)."""
    ob = out_bytes_of(epi)
    nbox = cfg.epi_boxes(ob)
    bpp = 128 // cfg.bm
    epc = 16 // ob                      # elements per 16-byte chunk
    ety = Float32 if ob == 4 else BFloat16
    for s in cutlass.range_constexpr(0 if "nostore" in EXPERIMENT else min(bpp, nbox - e * bpp)):
        box = e * bpp + s
        sbase = pool + page * PAGE + s * (cfg.bm * 128)
        for it in range(n_it):
            vals = [None] * UNR
            for u in cutlass.range_constexpr(UNR):
                q = (it * UNR + u) * nthreads + sid
                r = q >> 3                  # q >= 0: q // 8 and q % 8 without sign fix-ups
                ch = q & 7
                sp = cute.make_ptr(Int32, sbase + r * 128 + ((ch ^ (r & 7)) << 4),
                                   cute.AddressSpace.smem, assumed_align=16)
                vals[u] = cute.make_tensor(sp, cute.make_layout(4)).load()
            for u in cutlass.range_constexpr(UNR):
                q = (it * UNR + u) * nthreads + sid
                r = q >> 3
                ch = q & 7
                row = row0 + r
                col = col0 + box * (128 // ob) + ch * epc
                if row < row_end:
                    if col < col_end:
                        drow = row
                        if cutlass.const_expr(epi == EPI_ROPE):
                            drow = dest_row(meta, rowmap_off, row_add, row)
                        dcol = col - col0 + dcol0
                        gp = cute.make_ptr(ety, row_addr(ybase, drow, ld, dcol, ob),
                                           cute.AddressSpace.gmem, assumed_align=16)
                        gp = cute.recast_ptr(gp, dtype=Int32)
                        cute.make_tensor(gp, cute.make_layout(4)).store(vals[u])


# ============================================================================ descriptions
def describe(cfg: TileConfig, epi: int, k: int, npages: int = 13) -> dict:
    """Numbers for notes/tests: pages, stages in the pool, accumulator registers, FLOP per page."""
    ob = out_bytes_of(epi)
    kt = math.ceil(k / BK)
    return dict(name=cfg.name, bm=cfg.bm, bn=cfg.bn, nb=cfg.nb, wn=cfg.wn, wg=cfg.wg,
                stage_pages=cfg.stage_pages, stages_in_pool=cfg.stages_in_pool(npages),
                epi_pages=cfg.epi_pages(ob), pages_per_tile=pages_per_instr(cfg, epi, kt),
                acc_regs=cfg.acc_regs())
