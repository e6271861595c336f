"""The persistent CuTe DSL megakernel: one launch runs a whole instruction stream on the GPU.

GPU-only module (imports cutlass at the top); `import mk` never loads it.

Execution model
---------------
* Grid = SM count x resident blocks per SM from the occupancy query (asserted >= 1): every CTA is
  resident, so a queue in topological order cannot deadlock.
* Block = THREADS = 384 threads in warp roles (DESIGN.md):
    warp 0      controller: takes instruction tickets from the global queue (atomic add on the queue
                head), copies the 32 header/arg words into a shared-memory instruction ring slot,
                waits for the instruction's (counter, target) pairs (lanes 0..3, one wait each,
                ld.acquire.gpu + nanosleep doubling from 20 ns to backoff_ns = 200 ns, bounded),
                then publishes the slot (mbarrier).
    warp 1      loader: TMA (cp.async.bulk.tensor) loads of the instruction's row chunks into pages
                of the shared-memory page pool (full/empty mbarriers per page).
    warps 2-3   storer: 16-byte st.global of result pages with exact masks, frees each page after
                its last read (a page it only waits on: after both warps' waits,
                rk.free_waited_page), then signals the instruction's counter with
                red.release.gpu after a fence (after all the instruction's stores).
    warps 4-11  two consumer warpgroups: the instruction body's math, both on every instruction
                (setmaxregister_increase; warps 0-3 run setmaxregister_decrease).
  The controller runs up to NISLOTS instructions ahead, so the next instruction's waits overlap
  the current instruction's body; in the variants that claim after loads (claim_after_loads_for:
  the M classes above 64 tokens) it claims the next one only once the loader has issued the
  current one's loads, so that a long tile does not hold tickets other SMs could run. It hands
  an instruction over before its waits and signals the slot's `iready` after them, so the loader
  can stream a GEMM's weights (and an ATTENTION's earlier-step K/V) during the waits.
* Split-K (Megakernel(splitk=<SPLITK workspace>), a compile-time variant): split GEMM tiles run in
  their opcode's slot (mk/instructions/_gemm_kernel.py: K slice, float32 partials from the
  consumers' registers); SPLITK_REDUCE (mk/instructions/_splitk_kernel.py) runs in both consumer
  warpgroups with one hand-off page to the storer, which signals. Only the opcodes of split_ops
  (the backend: those its M class's plans may split) get split code (GemmSlot.splits).
* Pages: NPAGES x 16 KiB shared-memory pages used in ring order by every role (see
  mk/instructions/_rows_kernel.py for the page geometry); a page is freed at its last read.
* Hand-offs of shared memory between roles (ring slots, pages written in place) are mbarrier
  arrivals by *every* thread that accessed the data (handoff="thread", the CUTLASS PipelineAsync
  pattern), not a bar.sync + one arrival: both are correct by the PTX memory model, but
  compute-sanitizer racecheck only credits an arrival with the arriving thread's own accesses
  (bench/probes/racecheck_mbarrier_probe.py), so only the per-thread form is racecheck-clean. It
  costs nothing measurable (bench/results/megakernel_core_*.json, "ab_core_figures").
* Buffers: the activation buffers addressed by Buf id (HIDDEN, NORMED, SCRATCH, ...) live in one
  arena tensor [NBUF, T, H] (bf16); the kernel sees it as (T, H, NBUF) with one TMA descriptor for
  all buffers (the buffer id is the TMA's third coordinate). More same-width buffers only grow
  NBUF; buffers of another width will get their own arena and descriptor.
* Norm weights: one [3L+... , H] table: rows which * L + layer (which = NormWeight: ATTN, MLP,
  FINAL; FINAL uses layer 0), built once from RankWeights by `norm_table`.
* Counters: int32, counted exactly (targets from the stream), reset by the kernel itself: the last
  CTA to finish (an acq_rel exit counter) zeroes counters[0:n_ctr), the queue head and the exit
  counter, so a step needs no host-side memset. After an error the host resets them (off the
  critical path).
* Every spin is bounded (timeout_ns from globaltimer). A timed-out counter wait writes
  (instruction, counter, value, target, SM, CTA) to the state buffer (first error wins), raises
  the abort flag (other controllers' spins see it and stop), and the kernel ends cleanly; the host
  raises MegakernelError naming them.
* Journal (optional compile variant): per instruction (SM, CTA, opcode, fetch, ready, end
  globaltimer ns) and per CTA (entry, exit, SM); mk.trace turns it into a Chrome trace + PNG.

Selftest (plans made only of the rows family)
---------------------------------------------
    python -m mk.megakernel selftest [--model DIR] [--tokens T] [--json]
builds rows-only plans (norm/residual DAGs of the model's shape in random topological queue orders,
cross-SM dependency chains, NOOP joins) with the model's norm weights (default: the tiny random
checkpoint), runs them on the GPU through RowsStreamRunner.run_stream and
compares every buffer with the rows family's torch faces (rows_oracle): bit-exact where the plan has
no RMSNORM, else within bf16 rounding. Exit code 0 = passed, 1 = mismatch or no usable GPU.
A model step (`--backend megakernel`: launch/generate.py, mk.Engine) runs through
mk.megakernel_step.MegakernelStepBackend; this module registers no engine backend.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

try:
    import cutlass
except ImportError as _e:  # `python -m mk.megakernel ...` without CuTe DSL: a clear message
    if __name__ == "__main__":
        sys.exit(f"error: the megakernel needs NVIDIA's CuTe DSL (pip install "
                 f"nvidia-cutlass-dsl): {_e}")
    raise
import cuda.bindings.driver as cuda_driver
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from mk import tiles
from mk.config import cache_root
from mk.instructions import _attention_kernel as ak
from mk.instructions import _gather_kernel as gat
from mk.instructions import _gemm_kernel as gk
from mk.instructions import _common as mc
from mk.instructions import _prefetch_kernel as pfk
from mk.instructions import _rows_kernel as rk
from mk.instructions import _splitk_kernel as skk
from mk.instructions import attention as at
from mk.instructions import embed as em
from mk.instructions import lm as lmn
from mk.instructions import prefetch as pf
from mk.instructions import qkv as qk
from mk.instructions.base import Buf, NormWeight
from mk.instructions.matmul import A_EPI as MM_A_EPI
from mk.instructions.matmul import A_K as MM_A_K
from mk.instructions.matmul import A_UP_COL as MM_A_UP_COL
from mk.instructions.matmul import Epi
from mk.ir import (ARG0, INSTR_WORDS, MAX_WAITS, W_COL0, W_COLS, W_LAYER, W_OPCODE,
                   W_ROW0, W_ROWS, W_SIGNAL, W_SIGNAL_COUNT, W_SIGNAL_SCOPE, W_WAIT0, Op,
                   SignalScope)
from mk.instructions.rows import A_DST, A_NORM_WEIGHT, A_RED_NSPLIT, A_RED_STRIDE, A_SRC

THREADS = 384          # controller, loader, 2 storer warps, two consumer warpgroups
# Instruction ring slots: the controller holds up to NISLOTS tickets per SM (the one in the
# consumers, the storer's tail, the loader's next, one waiting). MK_NISLOTS (2 .. 8) builds another
# depth for A/Bs; a shallower ring alone changed the step by at most 2.2% (bench/E2E_NOTES.md
# session 13): when a ticket is claimed matters, not how many (claim after loads, below).
NISLOTS = int(os.environ.get("MK_NISLOTS", 4))
if not 2 <= NISLOTS <= 8:
    raise ValueError(f"MK_NISLOTS={NISLOTS}: the instruction ring has 2 .. 8 slots")
NPAGES = 13            # 13 x 16 KiB page pool
# setmaxnreg moves registers within the CTA's own pool (PTX ISA: "a pool of available registers is
# maintained per-CTA"; .inc blocks until the pool has enough): the launch allocates THREADS x
# LAUNCH_REGS (384 x 168 = 64512 under .maxntid 384 / .minnctapersm 1), so 128 x REG_LOW +
# 256 x REG_HIGH must not exceed it. 64/224 (= 65536) left a consumer warp blocked in
# setmaxnreg.inc forever on the GPU (bench/GEMM_NOTES.md); 72/216 = 64512 exactly, no spills.
LAUNCH_REGS = (65536 // THREADS) // 8 * 8      # 168
REG_LOW = int(os.environ.get("MK_REG_LOW", 72))      # controller / loader / storer warpgroup
REG_HIGH = int(os.environ.get("MK_REG_HIGH", 216))   # the two consumer warpgroups


# QKV_ROPE's storer (the K/V row map) needs more than 72 registers beside the rows storer: 80/208
# (63488 <= 64512) is its split; 72/216 spilled 72 bytes there (compile gate).
REG_SPLIT_QKV = (80, 208)


def reg_split_ok(low: int = REG_LOW, high: int = REG_HIGH, launch_regs: int = LAUNCH_REGS) -> bool:
    return 128 * low + 256 * high <= THREADS * launch_regs and low % 8 == 0 and high % 8 == 0


def reg_split(gemm: tuple = ()) -> tuple[int, int]:
    """(low, high) setmaxnreg split of a variant (compile-time)."""
    if any(g.op == int(Op.QKV_ROPE) for g in gemm) and "MK_REG_LOW" not in os.environ:
        return REG_SPLIT_QKV
    return REG_LOW, REG_HIGH


assert reg_split_ok(), f"setmaxnreg {REG_LOW}/{REG_HIGH} over-subscribes {THREADS} x {LAUNCH_REGS}"
OP_END = -1
# journal row: sm, cta, opcode, t_fetch (ticket taken), t_ready (waits met), t_end (signalled),
# ticket, 0, then each role's own times for the instruction: loader start / end (TMA issued),
# consumer start / end, storer start (it ends at t_end). globaltimer ns, one clock for every SM.
JOURNAL_WORDS = gk.KT_BASE + gk.ktrace_words()     # + the GEMM K-step trace (MK_GEMM_KTRACE)
J_SM, J_CTA, J_OP, J_FETCH, J_READY, J_END, J_TICKET = range(7)
J_LOAD0, J_LOAD1, J_CONS0, J_CONS1, J_STORE0, J_CONS1_WG1, J_STORE1 = range(8, 15)
# ATTENTION's storer, its first unit (ak.attn_store's stamps): K/V pages all freed, epilogue
# page 0 done, stored, freed, page 1 done
J_STORE_KV, J_STORE_EPI, J_STORE_P0, J_FREE_P0, J_EPI1 = 15, 7, 16, 17, 18
STORE_STAMPS = (J_STORE_KV, J_STORE_EPI, J_STORE_P0, J_FREE_P0, J_EPI1)
# GEMM consumers: the last wgmma retired (their epilogue, or a split tile's partial stores, start)
J_CONS_EPI = 19
# ATTENTION's page waits, each summed over the instruction (ns, not times): the loader's for free
# K/V pages, consumer thread 0's for full ones, storer thread 0's for the consumers' `done` (which
# role of a decode instruction waits on which: its ~14 GB/s per SM, bench/ATTENTION_NOTES.md);
# a GEMM's consumer thread 0 sums its mainloop's waits for full operand pages into J_CONS_WAIT
J_LOAD_WAIT, J_CONS_WAIT, J_STORE_WAIT = 20, 21, 22
# ... and consumer thread 0's time waiting for wgmmas to retire (ATTENTION: its key blocks'; a
# GEMM: the previous K step's, i.e. the tensor pipe busy), and ATTENTION's online softmax
# (session 11: in the step at B=256 the consumers wait 3.7 us of a 41 us instruction for K/V
# pages while the storer waits 23 us for them: where do the other 31 go?)
J_MMA_WAIT, J_ATTN_SOFTMAX = 23, 24
# ... and the time a GEMM's epilogue pages were all full (a RESIDUAL tile's residual tile loaded
# into them; from J_CONS_EPI: the consumers' wait for it, session 23's per-tile cost,
# bench/GEMM_NOTES.md)
J_EPI_READY = 25
assert gk.KT_BASE >= J_EPI_READY + 1, "the K-step trace starts after the journal's own words"
JCTA_WORDS = 4         # per-CTA row: t_entry, t_exit, sm, 0
BAR_CONSUMER = gk.BAR_CONSUMERS   # both consumer warpgroups (256 threads)
BAR_STORER = 2
BAR_WG0 = 4            # consumer warpgroup 0 alone (the rows bodies, "group" hand-off);
                       # 3 is ak.BAR_ATTN (both consumer warpgroups, inside attn_consume)
N_STORER = 64
N_CONSUMER = 256       # two consumer warpgroups
N_WG = 128             # one warpgroup: the rows bodies run in warpgroup 0
# Generic-proxy hand-offs through the ring and the page pool (see mk/instructions/_rows_kernel.py):
# "thread" = every accessing thread arrives on the mbarrier (what compute-sanitizer racecheck
# models; CUTLASS PipelineAsync style); "warp" = __syncwarp + one arrival per warp; "group" = named
# barrier + one arrival (the original protocol; racecheck reports it).
DEFAULT_HANDOFF = os.environ.get("MK_HANDOFF", "thread")   # MK_HANDOFF: A/B of the modes
# Cap of the growing nanosleep in counter waits (ns). A waiter sleeps at most this long between two
# polls, so the cap bounds the wake-up latency of a cross-SM hand-off. 200 since session 1, never
# timed in the whole step; MK_BACKOFF_NS sets it (compile-time: a variant of its own) for that A/B
# (`gpu_next.sh backoff`: at B=1 the step is a chain of ~46k such hand-offs in 9 ms).
BACKOFF_NS_RANGE = (20, 1_000_000)


def _backoff_ns_default() -> int:
    raw = os.environ.get("MK_BACKOFF_NS", "200")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    lo, hi = BACKOFF_NS_RANGE
    if not lo <= value <= hi:
        raise ValueError(f"MK_BACKOFF_NS={raw}: an integer number of ns in [{lo}, {hi}]")
    return value


DEFAULT_BACKOFF_NS = _backoff_ns_default()
ROWS_OPS = (int(Op.NOOP), int(Op.COPY), int(Op.RMSNORM), int(Op.RESIDUAL_ADD))
# GEMM-tile family (mk/instructions/_gemm_kernel.py), in kernel-parameter slot order
GEMM_OPS = (int(Op.QKV_ROPE), int(Op.O_PROJ), int(Op.GATE_UP), int(Op.DOWN), int(Op.LM_HEAD))
# attention family (mk/instructions/_attention_kernel.py) and the metadata-driven row gathers
# (mk/instructions/_gather_kernel.py)
ATTN_OPS = (int(Op.ATTENTION), int(Op.ATTN_REDUCE))
GATHER_OPS = (int(Op.EMBED), int(Op.LM_NORM))
# split-K (mk/instructions/_splitk_kernel.py): split tiles of these GEMM opcodes run through their
# slot; SPLITK_REDUCE sums the partials and runs the opcode's epilogue
SPLITK_OPS = skk.SPLITK_OPS
ROW_SCALED_OPS = skk.ROW_SCALED_OPS
# the GEMM opcodes with ROW_PART code in a norm_fold=4 variant (GemmSlot.row_parts): the scaled
# ones, and the RESIDUAL tiles that write h
ROW_PART_OPS = ROW_SCALED_OPS + (int(Op.O_PROJ), int(Op.DOWN))
OP_SPLITK_REDUCE = skk.OP_SPLITK_REDUCE
# L2 prefetches of the stacked GEMM weights (mk/instructions/_prefetch_kernel.py): a compile-time
# variant (Megakernel(l2_prefetch=True)), so the code of every other variant is unchanged
OP_L2_PREFETCH = pfk.OP_L2_PREFETCH
PREFETCH_OPS = tuple(int(o) for o in pf.WEIGHT_OPS)
SUPPORTED_OPS = ROWS_OPS + GEMM_OPS + ATTN_OPS + GATHER_OPS + (OP_SPLITK_REDUCE, OP_L2_PREFETCH)
ERR_BAD_META = 7       # the step metadata contradicts the compiled variant (KV page size)
# The controller hands an instruction to the roles before its dependency waits, and signals a
# per-slot `iready` barrier once they are met: the loader streams a GEMM's first weight pages
# during the waits (weights depend on no instruction; at decode a GEMM phase is a few us of
# weights per SM behind a dependency chain), and an ATTENTION's first K/V blocks of positions
# before the step's new rows (written by earlier steps); every other load, and the consumers and
# the storer, wait for `iready` first. A failed wait still releases `iready` (the abort flag is
# raised, the roles finish the instruction on whatever is in memory, the host raises the recorded
# error) and ends the queue at the next slot. GPU-checked in session 6 (rows 31/31, step 7/7,
# two-layer checks, racecheck 0); the controller that waited before it handed an instruction
# over (the build of sessions 1-5, MK_EARLY_WEIGHTS=0 until session 63) was 2.2% / 0.8% slower
# at B=1 / 64 of the 70B rank's decode step (bench/results/ab_2026-11-29_s6_summary.json).
# The storer's signal (the instruction's counter, after the barrier that orders every store of
# the instruction before it) is red.release.gpu alone: a release is cumulative in the PTX model,
# and the storer barrier synchronizes the other storer threads' stores (and thread 0's drained
# TMA stores + proxy fence) before it, the consumers' own stores reach the storer through the
# page's `done` mbarrier; one MEMBAR.GPU, no L1 invalidation. The fence.acq_rel.gpu before it
# (the build of sessions 1-33, MK_SIGNAL_FENCE=both until session 63) cost session 34 3.4% / 3.2%
# of decode B=1 / 64 (bench/results/sigfence_*_s34.json).
# The loader grants the data-less page of RMSNORM, SPLITK_REDUCE and ATTN_REDUCE without waiting
# for `iready` (their consumers wait for it anyway): the controller's release then wakes the
# consumers directly instead of the loader, whose grant then woke them, on every small
# instruction of the critical path (4-5 a layer at B <= 64; session 33: the loader that waited
# first, MK_GRANT_EARLY=0 until session 63, was 0.5% slower at B=1 and 64).
# Claim after loads (a compile-time variant, MegakernelDSL(claim_after_loads=True)): the controller
# claims the next ticket only once the loader has issued every load of the instruction before it
# (`lnext`), not as soon as a ring slot is free. A free slot is no sign that the SM can run the
# instruction soon: an SM in the middle of a 60-120 us GATE_UP tile claimed the next tiles and
# norms and ran them back to back while other SMs went idle. Claimed after the loads, the next
# instruction's waits and weight prefetch still overlap the consumers' last ring's worth of the
# current one; short instructions (norms, reduces) are loaded at once, so their claims come as
# early as before. H200, 70B TP8 rank decode ctx 1024 (bench/results/claim_*_2026-11-30_s13,
# bench/E2E_NOTES.md session 13): B=1024 81.02 -> 66.48 ms (-17.9%), B=192 -1.4%, B=256 -0.8%,
# B=64 +0.3%, but B=1 / 16 +2.3% / +2.1% (there every SM runs about one instruction per phase
# and the look-ahead hides the claim), so it is on for the M classes above CLAIM_AFTER_LOADS_MIN_M
# tokens. MK_CLAIM_AFTER_LOADS=0 / 1 forces it off / on in every variant (A/Bs).
CLAIM_AFTER_LOADS_MIN_M = 64
CLAIM_AFTER_LOADS_ENV = os.environ.get("MK_CLAIM_AFTER_LOADS", "")
if CLAIM_AFTER_LOADS_ENV not in ("", "0", "1"):
    raise ValueError(f"MK_CLAIM_AFTER_LOADS={CLAIM_AFTER_LOADS_ENV!r}: 0, 1 or unset")


def claim_after_loads_for(gemm_m: int | None) -> bool:
    """Whether the variant of M class bound gemm_m (None: no GEMM class) claims after loads."""
    if CLAIM_AFTER_LOADS_ENV:
        return CLAIM_AFTER_LOADS_ENV == "1"
    return gemm_m is not None and gemm_m > CLAIM_AFTER_LOADS_MIN_M


def page_share(handoff: str) -> int:
    """Init count of every page's done[p] and empty[p] barrier (both families share the ring).

    "thread": every consumer thread of both warpgroups (256); the rows bodies' single warpgroup
    arrives with 2 per thread, the storer's 64 threads with 4 each. "warp" / "group": 8 (one per
    consumer warp for the GEMM bodies; the rows bodies' warps or thread 0 arrive for the rest)."""
    return N_CONSUMER if handoff == "thread" else gk.NUM_CONSUMER_WARPS


def default_handoff(attention: bool = False) -> str:
    """Every family follows the page barriers' share in every hand-off mode (the attention bodies
    through their `share` parameter): one default for all variants."""
    return DEFAULT_HANDOFF


def check_handoff(handoff: str, attention: bool = False) -> None:
    if handoff not in rk.HANDOFF_MODES:
        raise ValueError(f"handoff must be one of {rk.HANDOFF_MODES}, got {handoff!r}")
    if attention:
        ak.handoff_of(page_share(handoff))      # the attention bodies' shares: 256 or 8


@dataclass(frozen=True)
class GemmSlot:
    """One GEMM opcode compiled into a megakernel variant (all compile-time)."""

    op: int
    tile: str           # gk.TILES name
    xb: int             # Buf id of z = 0 of the operand tensor x (z = src word - xb)
    yb: int             # Buf id of z = 0 of the destination y (z = dst word - yb)
    # its split-K tiles and SPLITK_REDUCE compiled in (with Megakernel(splitk=...)); False where
    # the plans of the variant's M class never split the opcode (mk.plan.PlanConfig.split_ops):
    # the slot's bodies are then the unsplit ones, but for a row-scaled opcode's epilogue wait
    splits: bool = True
    # -1: the slot's tiles run through its own compiled bodies; else the opcode of the slot whose
    # bodies they run through (GEMM_TWIN: same tile, epilogue, split code and destination; the
    # loader takes this slot's x / w at run time, gk.TwinSource)
    twin_of: int = -1
    # QKV_ROPE / GATE_UP: its unsplit tiles may compute their rows' statistic themselves
    # (PlanConfig.norm_fold=3, A_EPI_WAIT = SELF_SCALE; the consumers' sums of squares over the
    # A pages of the mainloop, gk.row_sumsq / gk.scale_own_rows)
    self_scale: bool = False
    # PlanConfig.norm_fold=4: QKV_ROPE / GATE_UP, its unsplit tiles may scale their rows from
    # ROW_PART (A_EPI_WAIT = ROW_PARTS; gk.row_part_sumsq / gk.scale_own_rows); O_PROJ / DOWN,
    # its RESIDUAL tiles may write their rows' sums of squares of h there (A_ROW_PART;
    # gk.stsm_epilogue's parts). In a variant with such a slot EMBED may write them too.
    row_parts: bool = False

    @property
    def cfg(self) -> gk.TileConfig:
        return gk.TILES[self.tile]

    @property
    def epi(self) -> int:
        return gk.epi_of(self.op)

    @property
    def kw(self) -> int:
        """Word of the instruction holding K."""
        return qk.A_K if self.op == int(Op.QKV_ROPE) else MM_A_K

    @property
    def slot(self) -> int:
        return GEMM_OPS.index(self.op)


# Twin GEMM slots (MK_GEMM_TWIN, compile-time; the default since session 44, =0 gives every
# opcode its own bodies): an opcode whose slot has the tile, epilogue, K word, split-K code and
# destination of an earlier slot's runs through that slot's compiled loader / consumer / storer
# bodies, the loader taking the instruction's own x and w TMA sources at run time
# (gk.TwinSource: only the TMA issue is duplicated). O_PROJ and DOWN in every M class (RESIDUAL
# tiles into HIDDEN): one slot's code, ~2.9k of the M1024 class's SASS instructions
# (bench/code_size.py). With MK_WAIT_COMPACT the step runs decode B=64 / 256 / 1024 4.2% /
# 1.9-2.4% / 1.0% faster than without either (bench/GEMM_NOTES.md session 44).
GEMM_TWIN = os.environ.get("MK_GEMM_TWIN", "1") == "1"


def pair_twins(slots: tuple, same_dest=None, twin: bool | None = None) -> tuple:
    """The slots with GemmSlot.twin_of set where GEMM_TWIN (or twin) pairs them: a slot runs the
    bodies of the first earlier slot of the same tile, epilogue, K word, split code and
    destination buffer id whose bodies are its own and that has no twin yet; same_dest(op_a, op_b): whether their
    destinations are the same tensor (the host's operands; None: assumed, the fake compile)."""
    if not (GEMM_TWIN if twin is None else twin):
        return tuple(slots)
    out = []
    for s in slots:
        # one twin per host: the loader picks its loads by one run-time condition
        host = next((h for h in out if h.twin_of < 0 and h.op not in ROW_SCALED_OPS
                     and not any(t.twin_of == h.op for t in out)
                     and s.op not in ROW_SCALED_OPS
                     and (h.tile, h.epi, h.kw, h.splits, h.yb, h.row_parts)
                     == (s.tile, s.epi, s.kw, s.splits, s.yb, s.row_parts)
                     and (same_dest is None or same_dest(h.op, s.op))), None)
        out.append(s if host is None else dataclasses.replace(s, twin_of=host.op))
    return tuple(out)


class MegakernelError(RuntimeError):
    """A bounded wait inside the megakernel timed out (or the kernel found a bad plan)."""

    KINDS = {rk.ERR_COUNTER_WAIT: "counter wait", rk.ERR_PAGE_EMPTY: "page-empty wait",
             rk.ERR_PAGE_FULL: "page-full wait", rk.ERR_PAGE_DONE: "page-done wait",
             rk.ERR_INSTR_SLOT: "instruction-slot wait", rk.ERR_BAD_OPCODE: "bad opcode",
             ERR_BAD_META: "metadata check", rk.ERR_INSTR_READY: "instruction-ready wait",
             rk.ERR_INSTR_STALLED: "stalled instruction (its roles past the bound)"}

    def __init__(self, kind, instr, counter, value, target, sm, cta):
        self.kind, self.instr, self.counter = kind, instr, counter
        self.value, self.target, self.sm, self.cta = value, target, sm, cta
        super().__init__(
            f"megakernel {self.KINDS.get(kind, kind)} timed out: instruction {instr} waited on "
            f"counter {counter} = {value}, target {target} (SM {sm}, CTA {cta})")


def error_of_state(words: list[int]) -> MegakernelError:
    """The MegakernelError the state words hold after an abort: write_error's record where there
    is one (a counter wait's, or any wait's without MK_WAIT_COMPACT), else a compact mbarrier
    wait's (S_ERR_PACKED, rk.unpack_wait_error). With both, write_error's is reported, whichever
    came first: either names a wait that starved."""
    if not words[rk.S_ERR_FLAG]:
        packed = (words[rk.S_ERR_PACKED] & 0xFFFFFFFF) | (words[rk.S_ERR_PACKED + 1] << 32)
        if packed:
            f = rk.unpack_wait_error(packed & (1 << 64) - 1)
            return MegakernelError(f["kind"], f["instr"], f["counter"], f["value"], f["target"],
                                   f["sm"], f["cta"])
    return MegakernelError(words[rk.S_ERR_KIND], words[rk.S_ERR_INSTR], words[rk.S_ERR_COUNTER],
                           words[rk.S_ERR_VALUE], words[rk.S_ERR_TARGET], words[rk.S_ERR_SM],
                           words[rk.S_ERR_CTA])


# page-locked state snapshots per Megakernel: launches kept apart in flight (the engine queues a
# step behind the one running: two)
LAUNCH_RECORDS = 3


@dataclass
class LaunchRecord:
    """A launch not waited for (Megakernel.launch(record=True)): an event recorded behind it and
    its state words copied there, read by Megakernel.finish_launch."""
    done: "torch.cuda.Event"
    host: torch.Tensor              # [STATE_WORDS] int32, page-locked
    pending: bool = False


class MegakernelHang(RuntimeError):
    """A launch did not finish (Megakernel.wait): the process's GPU context is unusable after it."""


def hang_report(hang_s: float, st: list | None, grid: int) -> str:
    """MegakernelHang's text: how many CTAs ended and the state words read while the launch ran
    (None: the read did not complete), with any error record written meanwhile."""
    where = "the state words could not be read"
    if st is not None:
        # the queue head counts each CTA's claim past the end too
        where = (f"{st[rk.S_EXIT]} of {grid} CTAs ended, queue head {st[rk.S_HEAD]}; "
                 f"state words {st}")
        if st[rk.S_ERR_FLAG] or st[rk.S_ABORT]:
            where += f"; recorded meanwhile: {error_of_state(st)}"
    return f"megakernel still running after {hang_s:.0f} s (a wait that is not bounded): {where}"


# ==================================================================================== device side
# the controller's (and a folded GEMM tile's epilogue) counter wait: mk/instructions/_rows_kernel.py
wait_counter = rk.wait_counter


@cute.jit
def next_slot(islot: Int32, iph: Int32):
    """The next instruction ring slot and its mbarrier phase (the controller, loader and storer
    walk the NISLOTS slots in order; the phase flips at each wrap)."""
    islot = islot + 1
    if islot == NISLOTS:
        islot = Int32(0)
        iph = iph ^ 1
    return islot, iph


@cute.jit
def opaque_copy(x: Int32, ticket: Int32) -> Int32:
    """x, as a value the compiler cannot prove loop-invariant (ticket >= 0 at run time)."""
    r = x
    if ticket < 0:
        r = Int32(0)
    return r


@cute.jit
def next_instruction(ring: cute.Tensor, slot_full: cute.Pointer, islot: Int32, phase: Int32,
                     timeout_ns: Int64, state: cute.Tensor):
    """A role's wait for the controller's fill of instruction-ring slot islot (phase `phase` of
    its barrier slot_full = ifull + islot; bounded: a starved slot is ERR_INSTR_SLOT); the slot's
    first word and its opcode."""
    rk.bounded_bar_wait(slot_full, phase, timeout_ns, state, rk.ERR_INSTR_SLOT, Int32(-1))
    base = islot * INSTR_WORDS
    return base, ring[base + W_OPCODE]


class MegakernelDSL:
    """The compiled object: one per (journal, npages, handoff, backoff_ns, gemm) variant; shapes
    are dynamic. gemm: the GemmSlots compiled in (one tile config per opcode: the M class of the
    step, gk.TILE_TABLE); () = the rows family only."""

    def __init__(self, journal: bool = False, npages: int = NPAGES, handoff: str = DEFAULT_HANDOFF,
                 backoff_ns: int = DEFAULT_BACKOFF_NS, gemm: tuple = (), attn_page_size: int = 0,
                 gather: bool = False, splitk: bool = False, l2_prefetch: bool = False,
                 claim_after_loads: bool = False):
        check_handoff(handoff, attn_page_size > 0)
        if attn_page_size:
            ak.box_rows(attn_page_size)         # a power of two >= 8
        self.attn_ps = int(attn_page_size)      # 0: no attention family compiled in
        self.gather = bool(gather)              # EMBED / LM_NORM compiled in
        # split-K tiles + SPLITK_REDUCE compiled in (False: the PTX of the unsplit bodies as before)
        self.splitk = bool(splitk)
        self.l2_prefetch = bool(l2_prefetch)    # L2_PREFETCH compiled in (the loader's body)
        self.claim_after_loads = bool(claim_after_loads)   # see claim_after_loads_for
        self.gemm = tuple(sorted(gemm, key=lambda g: g.slot))
        # PlanConfig.norm_fold=4's ROW_PART code (GemmSlot.row_parts): EMBED's too
        self.row_parts = self.splitk and any(g.row_parts for g in self.gemm)
        self.reg_low, self.reg_high = reg_split(self.gemm)
        assert reg_split_ok(self.reg_low, self.reg_high), (
            f"setmaxnreg split {self.reg_low}/{self.reg_high} over-subscribes the CTA's "
            f"{THREADS} x {LAUNCH_REGS} registers")
        self.journal = journal
        self.npages = npages
        self.handoff = handoff
        self.backoff_ns = int(backoff_ns)
        self.gemm = tuple(sorted(gemm, key=lambda g: g.slot))
        assert len({g.op for g in self.gemm}) == len(self.gemm), "one tile config per opcode"
        for g in self.gemm:
            g.cfg.check(gk.out_bytes_of(g.epi), npages)

    @cute.jit
    def __call__(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor, n_ctr: Int32,
                 state: cute.Tensor, bufs: cute.Tensor, normw: cute.Tensor, n_layers: Int32,
                 eps: Float32, timeout_ns: Int64, journal: cute.Tensor, jcta: cute.Tensor,
                 gx0: cute.Tensor, gw0: cute.Tensor, gy0: cute.Tensor,
                 gx1: cute.Tensor, gw1: cute.Tensor, gy1: cute.Tensor,
                 gx2: cute.Tensor, gw2: cute.Tensor, gy2: cute.Tensor,
                 gx3: cute.Tensor, gw3: cute.Tensor, gy3: cute.Tensor,
                 gx4: cute.Tensor, gw4: cute.Tensor, gy4: cute.Tensor,
                 meta: cute.Tensor, inv_freq: cute.Tensor, kv: cute.Tensor,
                 aq: cute.Tensor, aout: cute.Tensor, apart: cute.Tensor, alse: cute.Tensor,
                 embed: cute.Tensor, lastn: cute.Tensor, sk: cute.Tensor, grid: Int32,
                 stream: cuda_driver.CUstream):
        """GEMM slot i (GEMM_OPS order): gx_i activations (T, K, Z) K-contiguous, gw_i the
        layer-stacked weights (N, K, L), gy_i the destination (T, N, Z) N-contiguous (float32 for
        LM_HEAD; the Q buffer for QKV_ROPE), compact in z; small dummies for opcodes not compiled
        in. meta / inv_freq / kv: QKV_ROPE's step metadata, inverse frequencies and the
        (rows, hkv*D, 2) K/V caches (z = 0 K, 1 V; also the attention's TMA source).
        aq / aout / apart / alse: Q (T, hq*D) bf16, ATTN_OUT (T, hq*D) bf16, ATTN_PARTIAL
        (P, hq*D) fp32, ATTN_LSE (P, hq) fp32 of the attention family; embed: the [V, H] bf16
        table (EMBED); lastn: LAST_NORMED [S, H] bf16 (LM_NORM); sk: the SPLITK workspace
        float32 [rows, width] (split-K); small dummies where a family is not compiled in."""
        box = cute.make_layout((rk.PR, rk.BOXC), stride=(rk.BOXC, 1))
        tma, mT = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), bufs, box, (rk.PR, rk.BOXC))
        gt = ((gx0, gw0, gy0), (gx1, gw1, gy1), (gx2, gw2, gy2), (gx3, gw3, gy3), (gx4, gw4, gy4))
        gops = []
        for g in self.gemm:
            x, w, y = gt[g.slot]
            resid = g.epi == gk.EPI_RESIDUAL
            at = gk.GemmAtoms(g.cfg, x, w, y, residual=resid, store=gk.tma_stores(g.epi, g.cfg))
            tma_r, gR = at.tma_a, at.gA          # placeholders (never used) without a residual
            if cutlass.const_expr(resid):
                tma_r, gR = at.tma_r, at.gR
            # [12]: the mainloop's wgmma where it is not tiled_mma (a wide tile); last: the TMA
            # store atom and its view of y where full tiles leave that way (gk.tma_store_of)
            gops.append((at.tma_a, at.gA, at.tma_b, at.gB, tma_r, gR, at.tiled_mma, at.sA_layout,
                         at.sB_mainloop_layout, y, w, at.sB_load_layout)
                        + ((at.mainloop_mma,) if g.cfg.wide else ())
                        + ((at.tma_s, at.gS, at.sY_layout) if gk.tma_stores(g.epi, g.cfg)
                           else ()))
        aops = []
        if cutlass.const_expr(self.attn_ps > 0):
            aa = ak.AttnAtoms(kv, self.attn_ps)
            aops = [aa.tma, aa.gKV, aa.box_layout, aa.mma_qk, aa.mma_pv, aa.sK_layout,
                    aa.sV_layout] + aa.swap_ops()

        # the CTA's shared memory
        fields = dict(ifull=cute.struct.MemRange[cutlass.Int64, NISLOTS],
                      iempty=cute.struct.MemRange[cutlass.Int64, NISLOTS],
                      iready=cute.struct.MemRange[cutlass.Int64, NISLOTS])
        if cutlass.const_expr(self.claim_after_loads):
            fields["lnext"] = cute.struct.MemRange[cutlass.Int64, NISLOTS]
        fields.update(
            full=cute.struct.MemRange[cutlass.Int64, self.npages],
            empty=cute.struct.MemRange[cutlass.Int64, self.npages],
            done=cute.struct.MemRange[cutlass.Int64, self.npages],
            ring=cute.struct.MemRange[cutlass.Int32, NISLOTS * INSTR_WORDS],
            tick=cute.struct.MemRange[cutlass.Int32, NISLOTS],
            flag=cute.struct.MemRange[cutlass.Int32, 4],
            pool=cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.npages * rk.PAGE],
                                   1024])
        if cutlass.const_expr(self.attn_ps > 0 and ak.SWAPPED):
            # the swapped decode chain's Q^T / P^T operands, one area per consumer warpgroup
            fields["ascr"] = cute.struct.Align[cute.struct.MemRange[cutlass.Uint8,
                                                                    2 * ak.SWAP_SCRATCH], 1024]
        self.storage = cute.struct(type("Storage", (), {"__annotations__": fields}))
        skops = [sk] if self.splitk else []      # not a kernel parameter unless compiled in
        self.kernel(instrs, n_instr, counters, n_ctr, state, tma, mT, bufs, normw, n_layers, eps,
                    timeout_ns, journal, jcta, gops, meta, inv_freq, kv, aops, aq, aout, apart,
                    alse, embed, lastn, skops).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream,
            max_number_threads=[THREADS, 1, 1], min_blocks_per_mp=1)

    @cute.jit
    def instr_waits(self, w: Int32, t: Int32, tf: Int64, lane: Int32, counters: cute.Tensor,
                    state: cute.Tensor, timeout_ns: Int64, journal: cute.Tensor,
                    meta: cute.Tensor, bidx: Int32) -> Int32:
        """The controller warp's waits for instruction t (its words w, one per lane): the metadata
        check, then the (counter, target) pairs (lanes 0..MAX_WAITS-1, one wait each); the
        journal's fetch / ready times. 1 = every wait met (warp-uniform), 0 = one failed (its
        error recorded, the abort flag raised)."""
        wi = W_WAIT0 + 2 * (lane % MAX_WAITS)
        c = cute.arch.shuffle_sync(w, wi)
        tg = cute.arch.shuffle_sync(w, wi + 1)
        ok = Int32(1)
        if cutlass.const_expr(self.attn_ps > 0):
            # the KV page size is compiled in (TMA box rows): refuse a step whose metadata says
            # otherwise instead of reading wrong cache rows
            if cute.arch.shuffle_sync(w, W_OPCODE) == ak.OP_ATTENTION:
                mps = meta[mc.M_PAGE_SIZE]
                if mps != self.attn_ps:
                    ok = Int32(0)
                    if lane == 0:
                        rk.write_error(state, ERR_BAD_META, t, Int32(-1), mps,
                                       Int32(self.attn_ps))
        if lane < MAX_WAITS:
            if c >= 0:
                if ok == 1:
                    ok = wait_counter(counters, c, tg, timeout_ns, state, t, self.backoff_ns)
        met = Int32(0)
        if cute.arch.vote_all_sync(ok == 1):
            met = Int32(1)
            if cutlass.const_expr(self.journal):
                if lane == 0:
                    if t < journal.shape[0]:
                        journal[t, J_SM] = Int64(cute.arch.smid())
                        journal[t, J_CTA] = Int64(bidx)
                        journal[t, J_OP] = Int64(w)
                        journal[t, J_FETCH] = tf
                        journal[t, J_READY] = cute.arch.globaltimer()
                        journal[t, J_TICKET] = Int64(t)
        return met

    @cute.jit
    def controller(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor,
                   state: cute.Tensor, timeout_ns: Int64, journal: cute.Tensor, meta: cute.Tensor,
                   ring: cute.Tensor, tick: cute.Tensor, ifull: cute.Pointer,
                   iempty: cute.Pointer, iready, lnext, lane: Int32, bidx: Int32,
                   HM: cutlass.Constexpr):
        """The controller warp: per free ring slot a ticket from the queue, the instruction's
        words into the slot, `ifull`, then its waits (instr_waits) and `iready` (after a failed
        wait too: the roles finish that instruction, the error is recorded and the host raises
        it); END goes into the next slot. With claim_after_loads a ticket is claimed only once
        the loader is done with the previous slot's instruction (`lnext`)."""
        islot = Int32(0)
        iph = Int32(0)
        live = Int32(1)
        stop = Int32(0)
        if cutlass.const_expr(self.claim_after_loads):
            prev_slot = Int32(-1)              # the slot of the last claim (-1: none yet)
            prev_ph = Int32(0)
        if cutlass.const_expr(rk.WATCHDOG):
            nfill = Int32(0)                   # slots filled so far (the drain after END)
        while live == 1:
            if cutlass.const_expr(rk.WATCHDOG):
                # the slot's last instruction (tick: its ticket, lane 0's write of that fill)
                rk.watchdog_slot_wait(iempty + islot, iph ^ 1, timeout_ns, state,
                                      self.slot_ticket(tick, islot, lane))
            else:
                rk.bounded_bar_wait(iempty + islot, iph ^ 1, timeout_ns, state,
                                    rk.ERR_INSTR_SLOT, Int32(-1))
            if cutlass.const_expr(self.claim_after_loads):
                if prev_slot >= 0:
                    if cutlass.const_expr(rk.WATCHDOG):
                        rk.watchdog_slot_wait(lnext + prev_slot, prev_ph, timeout_ns, state,
                                              self.slot_ticket(tick, prev_slot, lane))
                    else:
                        rk.bounded_bar_wait(lnext + prev_slot, prev_ph, timeout_ns, state,
                                            rk.ERR_INSTR_SLOT, Int32(-1))
                prev_slot = islot
                prev_ph = iph
            t = self.claim(state, n_instr, stop, lane)
            tf = cute.arch.globaltimer()
            w = Int32(OP_END)
            if t < n_instr:
                w = instrs[t, lane]
            else:
                live = Int32(0)
            if lane == 0:
                ring[islot * INSTR_WORDS] = w      # opcode word (END on stop)
                tick[islot] = t
            else:
                ring[islot * INSTR_WORDS + lane] = w
            rk.release(ifull + islot, rk.arrivals(HM, 32), 32, lane, 0, HM)
            if t < n_instr:
                if self.instr_waits(w, t, tf, lane, counters, state, timeout_ns, journal,
                                    meta, bidx) == 0:
                    stop = Int32(1)
                # the waits' acquire loads are this warp's; the release hands them on
                rk.release(iready + islot, rk.arrivals(HM, 32), 32, lane, 0, HM)
            if cutlass.const_expr(rk.WATCHDOG):
                nfill = nfill + 1
            islot, iph = next_slot(islot, iph)
        if cutlass.const_expr(rk.WATCHDOG):
            # the roles leave on END without freeing its slot; the instructions before it in the
            # ring (fills nfill - NISLOTS .. nfill - 2) have no later refill whose wait would
            # see them stall: wait for them here, oldest first
            for back in cutlass.range_constexpr(NISLOTS - 1, 0, -1):
                f = nfill - 1 - back
                if f >= 0:
                    rk.watchdog_slot_wait(iempty + f % NISLOTS, (f // NISLOTS) & 1, timeout_ns,
                                          state, self.slot_ticket(tick, f % NISLOTS, lane))

    @cute.jit
    def slot_ticket(self, tick: cute.Tensor, slot: Int32, lane: Int32) -> Int32:
        """The ticket the controller put in ring slot `slot`, for the watchdog's record: read by
        lane 0, which wrote it, and broadcast (another lane's read of lane 0's shared-memory
        write, with no barrier of the warp between, is a race to racecheck; session 53)."""
        t = Int32(-1)
        if lane == 0:
            t = tick[slot]
        return cute.arch.shuffle_sync(t, 0)

    @cute.jit
    def claim(self, state: cute.Tensor, n_instr: Int32, stop: Int32, lane: Int32) -> Int32:
        """The controller's next ticket from the queue (lane 0's atomic, broadcast); n_instr
        (END) once a wait failed (stop)."""
        t = Int32(n_instr)
        if stop == 0:
            if lane == 0:
                t = cute.arch.atomic_add((state.iterator + rk.S_HEAD).llvm_ptr, Int32(1),
                                         sem="relaxed", scope="gpu")
            t = cute.arch.shuffle_sync(t, 0)
        return t

    @cute.kernel
    def kernel(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor, n_ctr: Int32,
               state: cute.Tensor, tma: cute.CopyAtom, mT: cute.Tensor, bufs: cute.Tensor,
               normw: cute.Tensor, n_layers: Int32, eps: Float32, timeout_ns: Int64,
               journal: cute.Tensor, jcta: cute.Tensor, gops: list, meta: cute.Tensor,
               inv_freq: cute.Tensor, kv: cute.Tensor, aops: list, aq: cute.Tensor,
               aout: cute.Tensor, apart: cute.Tensor, alse: cute.Tensor, embed: cute.Tensor,
               lastn: cute.Tensor, skops: list):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        NP = self.npages
        assert NP <= 32, "rk.wait_done keeps one done-parity bit per page in an Int32"
        HM = self.handoff
        PS = page_share(HM)          # done[p] / empty[p] init count (both families)
        GS = self.gemm
        NG = len(GS)
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        ifull = st.ifull.data_ptr()
        iempty = st.iempty.data_ptr()
        iready = st.iready.data_ptr()
        lnext = None
        if cutlass.const_expr(self.claim_after_loads):
            lnext = st.lnext.data_ptr()
        full = st.full.data_ptr()
        empty = st.empty.data_ptr()
        done = st.done.data_ptr()
        ring = st.ring.get_tensor(cute.make_layout(NISLOTS * INSTR_WORDS))
        tick = st.tick.get_tensor(cute.make_layout(NISLOTS))
        flag = st.flag.get_tensor(cute.make_layout(4))
        pool = st.pool.data_ptr().toint()
        aswap = None
        if cutlass.const_expr(self.attn_ps > 0 and ak.SWAPPED):
            aswap = tuple(aops[7:13]) + (st.ascr.data_ptr().toint(),)

        if cutlass.const_expr(self.journal):
            if tidx == 0:
                jcta[bidx, 0] = cute.arch.globaltimer()
                jcta[bidx, 2] = Int64(cute.arch.smid())
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma)
            for gi in cutlass.range_constexpr(NG):
                cute.nvgpu.cpasync.prefetch_descriptor(gops[gi][0])
                cute.nvgpu.cpasync.prefetch_descriptor(gops[gi][2])
                if cutlass.const_expr(GS[gi].epi == gk.EPI_RESIDUAL):
                    cute.nvgpu.cpasync.prefetch_descriptor(gops[gi][4])
                if cutlass.const_expr(gk.tma_stores(GS[gi].epi, GS[gi].cfg)):
                    cute.nvgpu.cpasync.prefetch_descriptor(
                        gk.tma_store_of(GS[gi].cfg, GS[gi].epi, gops[gi])[0])
            if cutlass.const_expr(self.attn_ps > 0):
                cute.nvgpu.cpasync.prefetch_descriptor(aops[0])
            with cute.arch.elect_one():
                for s in cutlass.range_constexpr(NISLOTS):
                    cute.arch.mbarrier_init(ifull + s, rk.arrivals(HM, 32))   # controller
                    cute.arch.mbarrier_init(iready + s, rk.arrivals(HM, 32))
                    if cutlass.const_expr(self.claim_after_loads):
                        cute.arch.mbarrier_init(lnext + s, rk.arrivals(HM, 32))   # loader
                    # loader + storer + consumer
                    cute.arch.mbarrier_init(iempty + s, rk.arrivals(HM, 32) + rk.arrivals(HM, N_STORER)
                                            + rk.arrivals(HM, N_CONSUMER))
                for p in cutlass.range_constexpr(NP):
                    cute.arch.mbarrier_init(full + p, 1)
                    cute.arch.mbarrier_init(empty + p, PS)
                    cute.arch.mbarrier_init(done + p, PS)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp < 4:
            cute.arch.setmaxregister_decrease(self.reg_low)
            if warp == 0:
                # ------------------------------------------------------------ controller
                self.controller(instrs, n_instr, counters, state, timeout_ns, journal, meta,
                                ring, tick, ifull, iempty, iready, lnext, lane, bidx, HM)
            elif warp == 1:
                # ------------------------------------------------------------ TMA loader
                islot = Int32(0)
                iph = Int32(0)
                live = Int32(1)
                pg = Int32(0)
                while live == 1:
                    base, op = next_instruction(ring, ifull + islot, islot, iph, timeout_ns, state)
                    if op == OP_END:
                        live = Int32(0)
                    else:
                        t = tick[islot]
                        self.stamp(journal, t, J_LOAD0, lane == 0)
                        # a GEMM waits for `iready` inside gemm_load, after its first weight
                        # pages, ATTENTION inside attn_load after its first K/V blocks of
                        # earlier steps; every other body's loads wait here. Bodies whose
                        # pages the loader only grants (no data: RMSNORM, SPLITK_REDUCE,
                        # ATTN_REDUCE) do not wait: their consumers wait for `iready`
                        # themselves before they read, so the grant is off the path from
                        # the controller's waits to the body
                        ready = (iready + islot, iph)
                        early_op = Int32(0)
                        for gi in cutlass.range_constexpr(NG):
                            if op == GS[gi].op:
                                early_op = Int32(1)
                        if cutlass.const_expr(self.attn_ps > 0):
                            if op == ak.OP_ATTENTION:
                                early_op = Int32(1)
                        if op == rk.OP_RMSNORM:
                            early_op = Int32(1)
                        if cutlass.const_expr(self.lm_norm_as_norm()):
                            if op == gat.OP_EMBED or op == gat.OP_LM_NORM:
                                early_op = Int32(1)
                        if cutlass.const_expr(self.splitk):
                            if op == OP_SPLITK_REDUCE:
                                early_op = Int32(1)
                        if cutlass.const_expr(self.attn_ps > 0):
                            if op == ak.OP_ATTN_REDUCE:
                                early_op = Int32(1)
                        if early_op == 0:
                            rk.bar_wait(iready + islot, iph, timeout_ns, state,
                                        rk.ERR_INSTR_READY, t)
                        if op == rk.OP_COPY or op == rk.OP_RESIDUAL_ADD:
                            pg = rk.rows_load(tma, mT, op, ring[base + A_SRC], ring[base + A_DST],
                                              ring[base + W_ROW0], ring[base + W_ROWS],
                                              ring[base + W_COL0], ring[base + W_COLS], pool,
                                              full, empty, pg, NP, timeout_ns, state, t)
                        elif op == rk.OP_RMSNORM:
                            # the consumers read and write global memory themselves: one page
                            # without data orders their stores before the signal
                            pg = rk.grant_page(pg, NP, full, empty, timeout_ns, state, t)
                        if cutlass.const_expr(self.lm_norm_as_norm()):
                            if op == gat.OP_EMBED or op == gat.OP_LM_NORM:
                                pg = rk.grant_page(pg, NP, full, empty, timeout_ns, state, t)
                        for gi in self.bodies():
                            if self.runs_on(op, gi):
                                g = gops[gi]
                                col0 = ring[base + W_COL0]
                                kt = (ring[base + GS[gi].kw] + (gk.BK - 1)) // gk.BK
                                twin, zx = self.twin_source(op, gi, gops, ring[base + A_SRC])
                                pg = gk.gemm_load(GS[gi].cfg, GS[gi].epi, g[0], g[1], g[2], g[3],
                                                  g[4], g[5], g[7], g[11], zx,
                                                  ring[base + A_DST] - GS[gi].yb,
                                                  ring[base + W_LAYER], ring[base + W_ROW0], col0,
                                                  g[10].shape[0] // 2 + col0, kt, pool, full,
                                                  empty, pg, NP, timeout_ns, state, t,
                                                  self.split_tile(GS[gi], g, ring, base, skops,
                                                                  bufs, counters),
                                                  ready, ring[base + W_ROWS], ring[base + W_COLS],
                                                  self.ktrace(journal), twin)
                        if cutlass.const_expr(self.splitk):
                            if op == OP_SPLITK_REDUCE:
                                # one page, granted with no TMA: the consumers' hand-off to the
                                # storer (ordering their stores before its signal)
                                pg = rk.grant_page(pg, NP, full, empty, timeout_ns, state, t)
                        if cutlass.const_expr(self.attn_ps > 0):
                            if op == ak.OP_ATTENTION:
                                new0 = ring[base + at.A_NEW0]
                                pg = ak.attn_load(aops[0], aops[1], aops[2], self.attn_ps, meta,
                                                  ring[base + W_LAYER], ring[base + W_ROWS],
                                                  ring[base + W_COL0], ring[base + W_COLS],
                                                  ring[base + at.A_POS0], ring[base + at.A_KV0],
                                                  ring[base + at.A_KV1],
                                                  ring[base + at.A_PAGE_OFF],
                                                  ring[base + at.A_MODE], ring[base + at.A_QPK],
                                                  pool, full, empty, pg, NP, timeout_ns, state, t,
                                                  ready, new0, journal,
                                                  J_LOAD_WAIT if self.journal else -1,
                                                  self.attn_pair(ring, base))
                            elif op == ak.OP_ATTN_REDUCE:
                                pg = ak.reduce_load(ring[base + W_ROWS], ring[base + W_COLS],
                                                    ring[base + at.A_QPK], pool, full, empty, pg,
                                                    NP, timeout_ns, state, t)
                        if cutlass.const_expr(self.l2_prefetch):
                            if op == OP_L2_PREFETCH:
                                # no page, no signal: the other roles only pass the slot on
                                wop = ring[base + pf.A_WOP]
                                for gi in cutlass.range_constexpr(NG):
                                    if cutlass.const_expr(GS[gi].op in PREFETCH_OPS):
                                        if wop == GS[gi].op:
                                            pfk.l2_prefetch(gops[gi][10], ring[base + W_LAYER],
                                                            ring[base + W_COL0],
                                                            ring[base + W_COLS],
                                                            ring[base + pf.A_K0],
                                                            ring[base + pf.A_K1], lane)
                        self.stamp(journal, t, J_LOAD1, lane == 0)
                        if cutlass.const_expr(self.claim_after_loads):
                            rk.release(lnext + islot, rk.arrivals(HM, 32), 32, lane, 0, HM)
                        rk.release(iempty + islot, rk.arrivals(HM, 32), 32, lane, 0, HM)
                        islot, iph = next_slot(islot, iph)
            else:
                # ------------------------------------------------------------ storer (warps 2-3)
                sid = tidx - 64
                islot = Int32(0)
                iph = Int32(0)
                live = Int32(1)
                pg = Int32(0)
                dpar = cute.make_rmem_tensor(cute.make_layout(1), Int32)    # rk.wait_done
                rk.done_parity_init(dpar)
                while live == 1:
                    base, op = next_instruction(ring, ifull + islot, islot, iph, timeout_ns, state)
                    if op == OP_END:
                        live = Int32(0)
                    else:
                        t = tick[islot]
                        self.stamp(journal, t, J_STORE0, sid == 0)
                        rk.bar_wait(iready + islot, iph, timeout_ns, state,
                                    rk.ERR_INSTR_READY, t)
                        sv = opaque_copy(sid, t)      # see the consumer's ctv
                        if op == rk.OP_COPY or op == rk.OP_RESIDUAL_ADD:
                            pg = rk.rows_store(op, ring[base + A_DST], ring[base + W_ROW0],
                                               ring[base + W_ROWS], ring[base + W_COL0],
                                               ring[base + W_COLS], bufs, pool, empty, done,
                                               dpar, pg, NP, sid, BAR_STORER, N_STORER,
                                               timeout_ns, state, t, HM, PS)
                        elif op == rk.OP_RMSNORM:
                            pg = rk.store_handoff(empty, done, dpar, pg, NP, sv, timeout_ns,
                                                  state, t, PS, N_STORER)
                        for gi in self.bodies():
                            if self.runs_on(op, gi):
                                pg = self.store_gemm(GS[gi], gops[gi], ring, base, meta, kv, pool,
                                                     empty, done, dpar, pg, sv, timeout_ns,
                                                     state, t, skops)
                        if cutlass.const_expr(self.splitk):
                            if op == OP_SPLITK_REDUCE:
                                pg = rk.store_handoff(empty, done, dpar, pg, NP, sv,
                                                      timeout_ns, state, t, PS, N_STORER)
                        if cutlass.const_expr(self.attn_ps > 0):
                            if op == ak.OP_ATTENTION or op == ak.OP_ATTN_REDUCE:
                                pg = self.store_attn(op, ring, base, aout, apart, alse, pool,
                                                     empty, done, dpar, pg, sv, timeout_ns,
                                                     state, t, journal)
                        if cutlass.const_expr(self.gather):
                            if op == gat.OP_EMBED or op == gat.OP_LM_NORM:
                                if cutlass.const_expr(gat.GATHER_ROLE == "consumers"):
                                    pg = rk.store_handoff(empty, done, dpar, pg, NP, sv,
                                                          timeout_ns, state, t, PS, N_STORER)
                                else:
                                    self.run_gather(op, ring, base, bufs, meta, embed, lastn,
                                                    normw, n_layers, eps, sv, N_STORER, gat.UNROLL,
                                                    skops)
                        self.stamp(journal, t, J_STORE1, sid == 0)
                        cute.arch.barrier(barrier_id=BAR_STORER, number_of_threads=N_STORER)
                        if sid == 0:
                            sig = ring[base + W_SIGNAL]
                            if sig >= 0:
                                # every store of this instruction precedes the barrier above
                                cute.arch.red((counters.iterator + sig).llvm_ptr,
                                              ring[base + W_SIGNAL_COUNT], op="add", dtype="s32",
                                              sem="release", scope="gpu")
                            if cutlass.const_expr(self.journal):
                                if t < journal.shape[0]:
                                    journal[t, J_END] = cute.arch.globaltimer()
                        # (the barrier above already ordered the storer threads' ring reads)
                        rk.release(iempty + islot, rk.arrivals(HM, N_STORER), N_STORER, sid,
                                   BAR_STORER, HM, sync=(HM == "warp"))
                        islot, iph = next_slot(islot, iph)
        else:
            # ---------------------------------------------------------------- consumer warpgroup
            cute.arch.setmaxregister_increase(self.reg_high)
            ctid = tidx - 128
            if cutlass.const_expr(self.attn_ps > 0):
                ak.attn_mma_init(aops[3], aops[4], aswap)
            # the loop carries only the instruction count (slot = nins % NISLOTS, phase from
            # nins // NISLOTS, -1 = stop) and the page count: registers are tightest here (the
            # all-opcode variant at the M128 class spilled its slot index with 4 loop-carried
            # words)
            nins = Int32(0)
            pg = Int32(0)
            while nins >= 0:
                islot = nins % NISLOTS
                base, op = next_instruction(ring, ifull + islot, islot, (nins // NISLOTS) & 1,
                                            timeout_ns, state)
                if op == OP_END:
                    nins = Int32(-1)
                else:
                    t = tick[islot]
                    self.stamp(journal, t, J_CONS0, ctid == 0)
                    rk.bar_wait(iready + islot, (nins // NISLOTS) & 1, timeout_ns, state,
                                rk.ERR_INSTR_READY, t)
                    # ctid, re-derived per instruction from a value the compiler cannot predict
                    # (tickets are >= 0): every body's thread-index-derived setup (fragment
                    # coordinates, addresses) then stays inside its own branch instead of being
                    # hoisted out of the persistent loop, where the setups of all bodies would be
                    # live at once (the all-opcode variant spilled)
                    ctv = opaque_copy(ctid, t)
                    if op == rk.OP_COPY or op == rk.OP_RESIDUAL_ADD:
                        # rows bodies are 128-thread: warpgroup 0 runs them, warpgroup 1 walks
                        # the same pages' `full` phases (each gives half of every page's
                        # release under rk.WAITED_FREE "all")
                        npg = pg + rk.rows_pages(op, ring[base + W_ROWS], ring[base + W_COLS])
                        if ctid < N_WG:
                            rk.rows_consume(op, ring[base + W_ROWS], ring[base + W_COL0],
                                            ring[base + W_COLS], pool, full, empty, done, pg, NP,
                                            ctv, BAR_WG0, N_WG, timeout_ns, state, t, HM, PS)
                        else:
                            rk.rows_skip(op, pg, npg, full, empty, done, NP, ctid % 32,
                                         timeout_ns, state, t, PS)
                        pg = npg
                    elif self.norm_body_runs(op):
                        # with split-K compiled in, a norm may fold O_PROJ's reduce (its words)
                        fold_sk, fold_ns, fold_st = None, None, None
                        if cutlass.const_expr(self.splitk):
                            fold_sk = skops[0]
                            fold_ns = ring[base + A_RED_NSPLIT]
                            fold_st = ring[base + A_RED_STRIDE]
                        src, dst = ring[base + A_SRC], ring[base + A_DST]
                        row0, rows = ring[base + W_ROW0], ring[base + W_ROWS]
                        layer, which = ring[base + W_LAYER], ring[base + A_NORM_WEIGHT]
                        rows_from = None
                        if cutlass.const_expr(self.lm_norm_as_norm()):
                            # LM_NORM through the same body: its rows gathered (lmn.A_LAST_OFF),
                            # the final norm's weight row, no fold
                            src_map = Int32(-1)
                            if op == gat.OP_LM_NORM:
                                src_map = ring[base + lmn.A_LAST_OFF]
                                layer = Int32(0)
                                which = Int32(int(NormWeight.FINAL))
                                if cutlass.const_expr(self.splitk):
                                    fold_ns = Int32(0)
                            rows_from = (meta, src_map, lastn)
                        pg = rk.rmsnorm_consume(src, dst, row0, rows, layer, which, bufs,
                                                normw, n_layers, eps, pool,
                                                full, done, pg, NP, ctv, BAR_CONSUMER, N_CONSUMER,
                                                timeout_ns, state, t, HM, PS, fold_sk, fold_ns,
                                                fold_st, norm_row_batch(GS), rows_from)
                    for gi in self.bodies():
                        if self.runs_on(op, gi):
                            g = gops[gi]
                            kt = (ring[base + GS[gi].kw] + (gk.BK - 1)) // gk.BK
                            pg = gk.gemm_consume(GS[gi].cfg, GS[gi].epi, g[6],
                                                 gk.mainloop_mma_of(GS[gi].cfg, g), g[7], g[8],
                                                 kt, pool, full, empty, done, pg, NP, ctv, timeout_ns,
                                                 state, t, meta, inv_freq, ring[base + W_ROW0],
                                                 ring[base + W_ROWS], ring[base + qk.A_SECTION],
                                                 PS, self.split_tile(GS[gi], g, ring, base, skops,
                                                                     bufs, eps=eps),
                                                 journal, J_CONS_EPI if self.journal else -1,
                                                 J_CONS_WAIT if self.journal else -1,
                                                 J_MMA_WAIT if self.journal else -1,
                                                 J_EPI_READY if self.journal else -1,
                                                 ring[base + W_COLS], self.ktrace(journal))
                    if cutlass.const_expr(self.lm_norm_as_norm()):
                        if op == gat.OP_EMBED:
                            pg = self.consume_embed(ring, base, bufs, meta, embed, full, done,
                                                    pg, NP, ctv, timeout_ns, state, t, PS, HM,
                                                    skops)
                    if cutlass.const_expr(self.splitk):
                        if op == OP_SPLITK_REDUCE:
                            # the opcode it finishes picks the slot (its destination tensor and
                            # the epilogue compiled in)
                            rop = ring[base + ARG0 + skk.R_OP]
                            for gi in self.bodies():
                                if cutlass.const_expr(GS[gi].op in SPLITK_OPS
                                                      and GS[gi].splits):
                                    if self.runs_on(rop, gi):
                                        rp = None
                                        if cutlass.const_expr(GS[gi].row_parts):
                                            # norm_fold=4: rows scaled from ROW_PART
                                            rp = (bufs.shape[1], eps, BAR_CONSUMER)
                                        pg = skk.reduce_consume(
                                            GS[gi].epi, ring, base, skops[0], bufs.shape[0],
                                            gops[gi][9], kv, meta, inv_freq, GS[gi].yb,
                                            gops[gi][10].shape[0] // 2, pool, full, done, pg, NP,
                                            ctv, timeout_ns, state, t, PS, rp)
                    if cutlass.const_expr(self.attn_ps > 0):
                        if op == ak.OP_ATTENTION:
                            # the swapped chain's trace for instructions of <= 8 query rows
                            # (decode), the m64n64 one's for the rest (ak.attn_consume's swap)
                            if cutlass.const_expr(aswap is None):
                                pg = self.consume_attention(ring, base, aops, aq, pool, full,
                                                            empty, done, pg, NP, ctv, timeout_ns,
                                                            state, t, PS, journal, None)
                            else:
                                if ak.swapped_rows(ring[base + W_ROWS], ring[base + at.A_QPK]):
                                    pg = self.consume_attention(ring, base, aops, aq, pool, full,
                                                                empty, done, pg, NP, ctv,
                                                                timeout_ns, state, t, PS, journal,
                                                                aswap)
                                else:
                                    pg = self.consume_attention(ring, base, aops, aq, pool, full,
                                                                empty, done, pg, NP, ctv,
                                                                timeout_ns, state, t, PS, journal,
                                                                None)
                        elif op == ak.OP_ATTN_REDUCE:
                            pg = ak.reduce_consume(apart, alse, ring[base + W_ROW0],
                                                   ring[base + W_ROWS], ring[base + W_COL0],
                                                   ring[base + W_COLS], ring[base + at.A_SLOT0],
                                                   ring[base + at.A_NSPLIT],
                                                   ring[base + at.A_QPK], pool, full, done, pg,
                                                   NP, ctv, timeout_ns, state, t, PS,
                                                   empty=empty)
                    self.stamp(journal, t, J_CONS1, ctid == 0)
                    self.stamp(journal, t, J_CONS1_WG1, ctid == N_WG)
                    rk.release(iempty + islot, rk.arrivals(HM, N_CONSUMER), N_CONSUMER, ctid,
                               BAR_CONSUMER, HM)
                    nins = nins + 1

        # -------------------------------------------------------------------- teardown
        cute.arch.sync_threads()
        if tidx == 0:
            if cutlass.const_expr(self.journal):
                jcta[bidx, 1] = cute.arch.globaltimer()
            cute.arch.fence_acq_rel_gpu()
            old = cute.arch.atomic_add((state.iterator + rk.S_EXIT).llvm_ptr, Int32(1),
                                       sem="acq_rel", scope="gpu")
            last = Int32(0)
            if old == Int32(gdim) - 1:
                if not rk.abort_raised(state):
                    last = Int32(1)
            flag[0] = last
        cute.arch.sync_threads()
        if flag[0] == 1:
            # the last CTA out resets the step's counters and the queue: no host memset per step
            for i in range(tidx, n_ctr, THREADS):
                counters[i] = Int32(0)
            if tidx == 0:
                state[rk.S_HEAD] = Int32(0)
                state[rk.S_EXIT] = Int32(0)


    @cute.jit
    def stamp(self, journal: cute.Tensor, t: Int32, word: cutlass.Constexpr, me):
        """Journal variant only: thread `me` of a role writes the time into word of ticket t's
        row (where the journal has one); nothing is emitted without the journal."""
        if cutlass.const_expr(self.journal):
            rk.journal_stamp(journal, t, word, me)

    def ktrace(self, journal: cute.Tensor):
        """The journal for the GEMM bodies' K-step trace (gk.KTRACE) in the journal variant,
        else None (nothing compiled in). Trace-time Python."""
        return journal if self.journal and gk.KTRACE > 0 else None

    def bodies(self) -> list[int]:
        """Indices of the GEMM slots with bodies of their own (every slot but the twins, whose
        tiles run through their host's: GemmSlot.twin_of). Trace-time Python."""
        return [i for i, g in enumerate(self.gemm) if g.twin_of < 0]

    def twins_of(self, gi: int) -> list[int]:
        return [j for j, g in enumerate(self.gemm) if g.twin_of == self.gemm[gi].op]

    def lm_norm_as_norm(self) -> bool:
        """LM_NORM runs through the consumers' RMSNORM body (rk.rmsnorm_consume's gather) in the
        variants with the gather family on the consumers (gat.GATHER_ROLE "consumers")."""
        return self.gather and gat.GATHER_ROLE == "consumers"

    def norm_body_runs(self, op):
        """The run-time condition that the consumers run rk.rmsnorm_consume for opcode `op`:
        RMSNORM, and LM_NORM where lm_norm_as_norm. Trace-time Python, emitting the compares."""
        hit = op == rk.OP_RMSNORM
        if self.lm_norm_as_norm():
            hit = hit | (op == gat.OP_LM_NORM)
        return hit

    def runs_on(self, op, gi: int):
        """The run-time condition that an instruction of opcode `op` runs through slot gi's
        bodies: its own opcode's, or a twin's. Trace-time Python, emitting the compares."""
        hit = op == self.gemm[gi].op
        for tj in self.twins_of(gi):
            hit = hit | (op == self.gemm[tj].op)
        return hit

    def twin_source(self, op, gi: int, gops: list, src):
        """(gk.TwinSource or None, z of the instruction's x) for the loader of slot gi's body:
        a twin's instruction loads its own x / w (its Buf ids from its x_buf). Trace-time
        Python."""
        twins = self.twins_of(gi)
        if not twins:
            return None, src - self.gemm[gi].xb
        assert len(twins) == 1, "one twin per body (its loads are picked by one condition)"
        tj = twins[0]
        use = op == self.gemm[tj].op
        xb = Int32(cutlass.select_(use, Int32(self.gemm[tj].xb), Int32(self.gemm[gi].xb)))
        return gk.TwinSource(use, gops[tj][0], gops[tj][1], gops[tj][2], gops[tj][3]), src - xb

    def split_tile(self, gs: GemmSlot, g, ring: cute.Tensor, base: Int32, skops: list,
                   bufs: cute.Tensor = None, counters: cute.Tensor = None, eps=None):
        """The slot's gk.SplitTile when split-K is compiled in and the opcode splits, else None
        (the unsplit bodies, as compiled without split-K). Trace-time Python: no early exit
        restriction, nothing emitted but GATE_UP's up column (the weights' half). bufs (the
        arena: its token rows locate ROW_SCALE in the workspace) / counters: for the row-scaled
        opcodes' epilogue wait (PlanConfig.norm_fold=2), the consumers' scale and the loader's
        wait; None where a role needs neither. eps (the consumers'): the model's, for a
        self-scaled tile's statistic (GemmSlot.self_scale, PlanConfig.norm_fold=3) or a ROW_PART
        scaled one's (GemmSlot.row_parts, norm_fold=4: bufs, whose shape locates ROW_PART, then
        also for O_PROJ / DOWN, which write it)."""
        if not self.splitk or gs.op not in SPLITK_OPS:
            return None
        if not gs.splits and gs.op not in ROW_SCALED_OPS and not gs.row_parts:
            return None
        up = g[10].shape[0] // 2 if gs.op == int(Op.GATE_UP) else None
        if gs.op not in ROW_SCALED_OPS:
            counters = None
            if not gs.row_parts:
                bufs = None
        return gk.SplitTile(ring, base, skops[0], up,
                            None if bufs is None else bufs.shape[0], counters, self.backoff_ns,
                            gs.splits, gs.self_scale, gs.kw, eps, gs.row_parts,
                            None if bufs is None else bufs.shape[1])

    @cute.jit
    def store_gemm(self, gs: cutlass.Constexpr, g, ring: cute.Tensor, base: Int32,
                   meta: cute.Tensor, kv: cute.Tensor, pool: Int32, empty: cute.Pointer,
                   done: cute.Pointer, dpar: cute.Tensor, pg: Int32, sid: Int32,
                   timeout_ns: Int64, state: cute.Tensor, t: Int32, skops: list) -> Int32:
        """Storer body of one GEMM slot: the destination (gk.gemm_dest: z = dst word - yb;
        QKV_ROPE's K/V sections: the paged cache rows kv_slot[t] + layer * stride), then
        gk.gemm_store."""
        row0 = ring[base + W_ROW0]
        col0 = ring[base + W_COL0]
        kt = (ring[base + gs.kw] + (gk.BK - 1)) // gk.BK
        ybase, ld, rowmap, radd, dcol0 = gk.gemm_dest(gs.epi, g[9], kv, meta, ring, base,
                                                      base + ARG0, gs.yb, col0)
        tma_store = None
        if cutlass.const_expr(gk.tma_stores(gs.epi, gs.cfg)):
            # (S2G atom, its view of y, z as gemm_dest's, the box layout)
            tma_s, gS, sY = gk.tma_store_of(gs.cfg, gs.epi, g)
            tma_store = (tma_s, gS, gk.dest_z(ring, base + ARG0, gs.yb), sY)
        return gk.gemm_store(gs.cfg, gs.epi, ybase, ld, row0, ring[base + W_ROWS], col0,
                             ring[base + W_COLS], pool, empty, done, dpar, pg, kt, self.npages,
                             sid, BAR_STORER, N_STORER, timeout_ns, state, t, meta, rowmap, radd,
                             dcol0, page_share(self.handoff),
                             self.split_tile(gs, g, ring, base, skops), tma_store)

    def consume_attention(self, ring, base, aops, aq, pool, full, empty, done, pg, NP, ctv,
                          timeout_ns, state, t, PS, journal, aswap):
        """Consumer body of ATTENTION (ak.attn_consume; aswap: the swapped chain's operands, or
        None), traced where it is called."""
        return ak.attn_consume(aops[3], aops[4], aops[5], aops[6], aq.iterator.toint(),
                               aq.shape[1], ring[base + W_ROW0], ring[base + W_ROWS],
                               ring[base + W_COL0], ring[base + W_COLS], ring[base + at.A_POS0],
                               ring[base + at.A_KV0], ring[base + at.A_KV1],
                               ring[base + at.A_MODE], ring[base + at.A_QPK], pool, full, empty,
                               done, pg, NP, ctv, timeout_ns, state, t, PS, ak.WG_SPLIT, journal,
                               J_CONS_WAIT if self.journal else -1,
                               J_MMA_WAIT if self.journal else -1,
                               J_ATTN_SOFTMAX if self.journal else -1,
                               self.attn_pair(ring, base), aswap)

    def attn_pair(self, ring: cute.Tensor, base: Int32):
        """A MODE_PAIR ATTENTION's second unit words (row0, pos0, page_off, new0) for the
        attention bodies (ak.second_unit; read whatever the mode, used only in a pair)."""
        return (ring[base + at.A_ROW0_B], ring[base + at.A_POS0_B], ring[base + at.A_PAGE_OFF_B],
                ring[base + at.A_NEW0_B])

    @cute.jit
    def store_attn(self, op: Int32, ring: cute.Tensor, base: Int32, aout: cute.Tensor,
                   apart: cute.Tensor, alse: cute.Tensor, pool: Int32, empty: cute.Pointer,
                   done: cute.Pointer, dpar: cute.Tensor, pg: Int32, sid: Int32,
                   timeout_ns: Int64, state: cute.Tensor, t: Int32,
                   journal: cute.Tensor) -> Int32:
        """Storer body of ATTENTION / ATTN_REDUCE (buffers by byte address + row pitch)."""
        if op == ak.OP_ATTENTION:
            pg = ak.attn_store(aout.iterator.toint(), aout.shape[1], apart.iterator.toint(),
                               apart.shape[1], alse.iterator.toint(), alse.shape[1],
                               ring[base + W_ROW0], ring[base + W_ROWS], ring[base + W_COL0],
                               ring[base + W_COLS], ring[base + at.A_POS0], ring[base + at.A_KV0],
                               ring[base + at.A_KV1], ring[base + at.A_MODE],
                               ring[base + at.A_QPK], ring[base + at.A_SLOT], pool, empty, done,
                               dpar, pg, self.npages, sid, BAR_STORER, N_STORER, timeout_ns,
                               state, t, page_share(self.handoff), journal,
                               STORE_STAMPS if self.journal else (),
                               J_STORE_WAIT if self.journal else -1,
                               self.attn_pair(ring, base))
        else:
            pg = ak.reduce_store(aout.iterator.toint(), aout.shape[1], ring[base + W_ROW0],
                                 ring[base + W_ROWS], ring[base + W_COL0], ring[base + W_COLS],
                                 ring[base + at.A_QPK], pool, empty, done, dpar, pg, self.npages,
                                 sid, BAR_STORER, N_STORER, timeout_ns, state, t,
                                 page_share(self.handoff))
        return pg

    @cute.jit
    def run_gather(self, op: Int32, ring: cute.Tensor, base: Int32, bufs: cute.Tensor,
                   meta: cute.Tensor, embed: cute.Tensor, lastn: cute.Tensor,
                   normw: cute.Tensor, n_layers: Int32, eps: Float32, tid: Int32,
                   nthreads: cutlass.Constexpr, unroll: cutlass.Constexpr, skops: list):
        """The body of EMBED (table rows -> an arena buffer) or LM_NORM (arena rows ->
        LAST_NORMED) on the storer's nthreads threads (tid 0..nthreads-1; gat.GATHER_ROLE
        "storer"); no pages."""
        T = bufs.shape[0]
        H = bufs.shape[1]
        arena = bufs.iterator.toint()
        if op == gat.OP_EMBED:
            self.embed_tile(ring, base, bufs, meta, embed, tid, nthreads, unroll, skops)
        else:
            gat.lm_norm_store(meta, arena + Int64(ring[base + lmn.A_SRC]) * Int64(T * H) * 2, H, T,
                              ring[base + lmn.A_LAST_OFF], lastn, normw,
                              Int32(int(NormWeight.FINAL)) * n_layers, eps, ring[base + W_ROW0],
                              ring[base + W_ROWS], ring[base + lmn.A_WIDTH], tid, nthreads,
                              unroll)

    @cute.jit
    def embed_tile(self, ring: cute.Tensor, base: Int32, bufs: cute.Tensor, meta: cute.Tensor,
                   embed: cute.Tensor, tid: Int32, nthreads: cutlass.Constexpr,
                   unroll: cutlass.Constexpr, skops: list):
        """EMBED's tile (table rows -> the arena buffer of its A_DST word) on nthreads threads
        of one role; in a row_parts variant also its rows' ROW_PART sums (its A_ROW_PART)."""
        T = bufs.shape[0]
        H = bufs.shape[1]
        parts = None
        if cutlass.const_expr(self.row_parts):
            ld = mc.row_part_ld(H)
            parts = (rk.row_part_addr(skops[0], T, ld), ld, ring[base + mc.A_ROW_PART])
        gat.embed_store(embed, meta, bufs.iterator.toint()
                        + Int64(ring[base + em.A_DST]) * Int64(T * H) * 2, H,
                        ring[base + W_ROW0], ring[base + W_ROWS], ring[base + W_COL0],
                        ring[base + W_COLS], tid, nthreads, unroll, parts)

    @cute.jit
    def consume_embed(self, ring: cute.Tensor, base: Int32, bufs: cute.Tensor,
                      meta: cute.Tensor, embed: cute.Tensor, full: cute.Pointer,
                      done: cute.Pointer, pg: Int32, npages: cutlass.Constexpr, ctid: Int32,
                      timeout_ns: Int64, state: cute.Tensor, t: Int32,
                      share: cutlass.Constexpr, mode: cutlass.Constexpr, skops: list) -> Int32:
        """Both consumer warpgroups' EMBED (gat.GATHER_ROLE "consumers"; their LM_NORM is
        rk.rmsnorm_consume's gather), on RMSNORM's protocol: the loader's data-less page waited
        for, the body, then `done` on it after the stores (the storer's wait for it orders them
        before the signal). Returns the new page count."""
        page, ph = rk.page_of(pg, npages)
        rk.bounded_bar_wait(full + page, ph, timeout_ns, state, rk.ERR_PAGE_FULL, t)
        self.embed_tile(ring, base, bufs, meta, embed, ctid, N_CONSUMER, gat.UNROLL_CONSUMERS,
                        skops)
        rk.release(done + page, share, N_CONSUMER, ctid, BAR_CONSUMER, mode)
        return pg + 1


# ==================================================================================== host side
_COMPILED: dict = {}

# Compiled variants kept on disk between processes (unset or "on": mk.config.cache_root()/kernels,
# ~/.cache/mk/kernels; MK_COMPILE_CACHE=DIR: there; "" / 0 / off / none: no cache): each variant
# takes 10-30 s to compile, once per process and M class, so a job that meets five classes
# spends minutes compiling before it is warm, in every rank. On by default since session 67
# (its GPU test passed on an H100: a second process loads both variants of the two-layer
# check, 36 -> 7 s of wall time, bench/results/compile_cache_*_s67_h100.log). A variant is
# stored as the DSL's AOT export (JitCompiledFunction.export_to_c: the host entry and the cubin
# in one object file) and loaded back with cute.runtime.load_module; its file name hashes
# everything the code generation reads (compile_cache_name), so a changed source, switch, DSL
# version or GPU gets a new file.
# The directory keeps the COMPILE_CACHE_KEEP most recently used files (each edit of mk's source
# makes new ones).
COMPILE_CACHE_KEEP = 64


def compile_cache_dir(env=None) -> str:
    """The compile cache's directory from MK_COMPILE_CACHE (see above), "" when it is off."""
    env = os.environ if env is None else env
    v = env.get("MK_COMPILE_CACHE")
    if v is None or v.strip().lower() in ("on", "1", "default"):
        return str(cache_root(env) / "kernels")
    return "" if v.strip().lower() in ("", "0", "off", "none") else v


COMPILE_CACHE_DIR = compile_cache_dir()


def _source_digest() -> bytes:
    """sha256 of every .py file of the mk package (what the traced bodies are made of)."""
    import hashlib
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, files in os.walk(root):
        dirnames.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.digest()


def _arg_signature(a) -> str:
    """What a kernel argument fixes in the compiled code: a tensor's element type, alignment
    and layout (dynamic extents print as ?), without its address; a scalar's type."""
    import re
    if hasattr(a, "element_type"):
        return "%s/%s/%s" % (a.element_type, getattr(a, "_assumed_align", None),
                             re.sub(r"0x[0-9a-fA-F]+@", "", str(a)))
    return type(a).__name__


def compile_cache_name(key: tuple, args) -> str:
    """The file name (no directory, no suffix) of variant `key` compiled for `args` in
    COMPILE_CACHE_DIR: a hash of the key, the arguments' signatures, mk's source, the
    compile-time switches (mk.provenance.knob_env's MK_* variables and CUTE_DSL_*), the DSL's
    version and the device's compute capability."""
    import hashlib
    from importlib import metadata

    from mk.provenance import knob_env
    h = hashlib.sha256(repr(key).encode())
    h.update(repr([_arg_signature(a) for a in args]).encode())
    h.update(_source_digest())
    switches = dict(knob_env(), **{k: v for k, v in os.environ.items()
                                   if k.startswith("CUTE_DSL_")})
    h.update(repr(sorted(switches.items())).encode())
    try:
        h.update(metadata.version("nvidia-cutlass-dsl").encode())
    except metadata.PackageNotFoundError:
        h.update(b"dsl ?")
    if torch.cuda.is_available():
        h.update(repr(torch.cuda.get_device_capability()).encode())
    return "mk_" + h.hexdigest()[:40]


def _cache_load(cache_dir: str, name: str):
    """The variant stored as cache_dir/name.o, or None (absent, or unreadable: then it is
    compiled again and the file replaced)."""
    path = os.path.join(cache_dir, name + ".o")
    if not os.path.isfile(path):
        return None
    try:
        fn = getattr(cute.runtime.load_module(path), name)
    except Exception as e:  # noqa: BLE001 - a bad file costs a compile, not the job
        print(f"[mk.megakernel] compile cache: {path} not loaded ({type(e).__name__}: {e}); "
              "compiling", file=sys.stderr, flush=True)
        return None
    try:
        os.utime(path)          # recently used: _cache_prune keeps it
    except OSError:             # a read-only cache still serves
        pass
    return fn


def _cache_store(comp, cache_dir: str, name: str) -> None:
    """Export a compiled variant to cache_dir/name.o: written into a private directory, then
    renamed into place (processes that compile the same variant at once, as the ranks of a
    torchrun job do, each replace the file whole). A failure is reported, not raised."""
    import shutil
    import tempfile
    try:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".export_", dir=cache_dir)
        try:
            comp.export_to_c(tmp, name, function_prefix=name)
            os.replace(os.path.join(tmp, name + ".o"), os.path.join(cache_dir, name + ".o"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _cache_prune(cache_dir, COMPILE_CACHE_KEEP)
    except Exception as e:  # noqa: BLE001
        print(f"[mk.megakernel] compile cache: {name} not stored in {cache_dir} "
              f"({type(e).__name__}: {e})", file=sys.stderr, flush=True)


def _cache_prune(cache_dir: str, keep: int) -> None:
    """Delete all but the `keep` most recently used variants (mk_*.o by modification time;
    _cache_load touches what it loads). Another process's concurrent prune is harmless: a
    file already gone is skipped, a variant deleted under a loader is compiled again."""
    entries = []
    for f in os.listdir(cache_dir):
        if f.startswith("mk_") and f.endswith(".o"):
            try:
                entries.append((os.stat(os.path.join(cache_dir, f)).st_mtime, f))
            except FileNotFoundError:
                pass
    for _, f in sorted(entries, reverse=True)[keep:]:
        try:
            os.remove(os.path.join(cache_dir, f))
        except FileNotFoundError:
            pass


def _dl(t: torch.Tensor, align: int = 16, dynamic: bool = True):
    from cutlass.cute.runtime import from_dlpack
    x = from_dlpack(t, assumed_align=align)
    if dynamic:
        lead = [i for i in range(t.dim()) if t.stride(i) == 1 and t.shape[i] > 1]
        x = x.mark_layout_dynamic(leading_dim=lead[0] if lead else t.dim() - 1)
    return x


def compile_megakernel(args, journal: bool, verbose: bool = True, shape_key=(),
                       handoff: str = DEFAULT_HANDOFF, backoff_ns: int = DEFAULT_BACKOFF_NS,
                       gemm: tuple = (), attn_page_size: int = 0, gather: bool = False,
                       splitk: bool = False, l2_prefetch: bool = False,
                       claim_after_loads: bool = False):
    """cute.compile with an in-process cache per variant (journal, hand-off, backoff, GEMM slots =
    the M class's tile configs, attention KV page size (0 = no attention), gather family, split-K,
    L2 prefetches, claim after loads) and arena/norm-table shape. Prints the compile time of each
    new variant once (verbose)."""
    key = (journal, handoff, int(backoff_ns), tuple(gemm), int(attn_page_size),
           bool(gather), bool(splitk), bool(l2_prefetch),
           bool(claim_after_loads)) + tuple(shape_key)
    name = compile_cache_name(key, args) if key not in _COMPILED and COMPILE_CACHE_DIR else None
    if name is not None:
        t0 = time.time()
        loaded = _cache_load(COMPILE_CACHE_DIR, name)
        if loaded is not None:
            _COMPILED[key] = loaded
            if verbose:
                print(f"[mk.megakernel] variant {name} loaded from {COMPILE_CACHE_DIR} in "
                      f"{time.time() - t0:.2f} s", flush=True)
    if key not in _COMPILED:
        if verbose:     # a variant takes 10-30 s: say so before the wait, not only after it
            print("[mk.megakernel] compiling a variant (once per M class; "
                  + (f"kept in {COMPILE_CACHE_DIR} for later processes" if COMPILE_CACHE_DIR
                     else "per process: MK_COMPILE_CACHE turned it off") + ") ...", flush=True)
        t0 = time.time()
        _COMPILED[key] = cute.compile[cute.KeepCUBIN](
            MegakernelDSL(journal=journal, handoff=handoff, backoff_ns=backoff_ns, gemm=gemm,
                          attn_page_size=attn_page_size, gather=gather, splitk=splitk,
                          l2_prefetch=l2_prefetch, claim_after_loads=claim_after_loads), *args)
        if name is not None:
            _cache_store(_COMPILED[key], COMPILE_CACHE_DIR, name)
        if verbose:
            tiles = ",".join(f"{Op(g.op).name}:{g.tile}"
                             + (f"(twin of {Op(g.twin_of).name})" if g.twin_of >= 0 else "")
                             for g in gemm) or "none"
            print(f"[mk.megakernel] compiled variant journal={journal} handoff={handoff} "
                  f"backoff_ns={backoff_ns} gemm={tiles} attention_page_size={attn_page_size} "
                  f"gather={gather} splitk={splitk} l2_prefetch={l2_prefetch} "
                  f"claim_after_loads={claim_after_loads} in "
                  f"{time.time() - t0:.1f} s", flush=True)
    return _COMPILED[key]


@dataclass
class GemmOperands:
    """One GEMM opcode's tensors for Megakernel(gemm={op: GemmOperands(...)}).

    x: activations [T, K] or [Z, T, K] bf16 (Z buffers stacked, e.g. the rows arena), standing for
       Buf ids x_buf .. x_buf + Z - 1 (an instruction's src word picks z = src - x_buf);
    w: weights [N, K] or layer-stacked [L, N, K] bf16 (GATE_UP: gate rows then up rows);
    y: destination [T, N] or [Z, T, N] (bf16; float32 for LM_HEAD; the Q buffer for QKV_ROPE),
       Buf ids y_buf .. (z = dst - y_buf)."""

    x: torch.Tensor
    w: torch.Tensor
    y: torch.Tensor
    x_buf: int
    y_buf: int


@dataclass
class AttnOperands:
    """The attention family's tensors for Megakernel(attn=AttnOperands(...)) (the K/V caches are
    Megakernel's kv, the tensor QKV_ROPE appends to).

    q:       Buf.Q [T, hq*D] bf16 (QKV_ROPE's y);
    out:     Buf.ATTN_OUT [T, hq*D] bf16 (O_PROJ's x);
    partial: Buf.ATTN_PARTIAL [P, hq*D] float32;
    lse:     Buf.ATTN_LSE [P, hq] float32;
    page_size: the KV page size (KernelConfig.page_size), compiled in (TMA box rows)."""

    q: torch.Tensor
    out: torch.Tensor
    partial: torch.Tensor
    lse: torch.Tensor
    page_size: int


def _as3d(t: torch.Tensor) -> torch.Tensor:
    """[R, C] or [Z, R, C] (compact) -> the (R, C, Z) view the kernel takes."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    assert t.dim() == 3 and t.is_contiguous(), "GEMM operands must be compact [Z, R, C] / [R, C]"
    return t.permute(1, 2, 0)


def gemm_slots(gemm: dict, m: int, handoff: str = DEFAULT_HANDOFF, split_ops=None,
               twin: bool | None = None, self_scale: bool = False,
               row_parts: bool = False) -> tuple:
    """The compile-time GEMM slots for operands {op: GemmOperands} at M class m (token rows, or
    sequences for LM_HEAD): one tile config per opcode from gk.choose_tile; split_ops: the
    opcodes whose split tiles the variant runs (None: every one that can; GemmSlot.splits);
    twin: pair_twins' (None: GEMM_TWIN), twins only where the destinations are one tensor;
    self_scale: the row-scaled opcodes' tiles may compute their rows' statistic themselves
    (GemmSlot.self_scale; PlanConfig.norm_fold=3); row_parts: GemmSlot.row_parts of
    ROW_PART_OPS (PlanConfig.norm_fold=4)."""
    slots = sorted((GemmSlot(int(op), gk.choose_tile(op, m).name, int(g.x_buf), int(g.y_buf),
                             split_ops is None or int(op) in split_ops,
                             self_scale=bool(self_scale) and int(op) in ROW_SCALED_OPS,
                             row_parts=bool(row_parts) and int(op) in ROW_PART_OPS)
                    for op, g in gemm.items()), key=lambda g: g.slot)

    def same_dest(a: int, b: int) -> bool:
        ya, yb = gemm[Op(a)].y, gemm[Op(b)].y
        return ya is yb or (ya.device.type != "meta" and ya.data_ptr() == yb.data_ptr()
                            and ya.shape == yb.shape and ya.stride() == yb.stride()
                            and ya.dtype == yb.dtype)
    return pair_twins(slots, same_dest, twin)


def resident_blocks_per_sm(compiled, smem_bytes: int, device: int = 0) -> tuple[int, str]:
    """Blocks of THREADS threads with smem_bytes of dynamic shared memory resident per SM.

    Uses cuOccupancyMaxActiveBlocksPerMultiprocessor on the compiled cubin when it can be loaded,
    else the device limits (shared memory, threads, registers) — both are reported."""
    props = torch.cuda.get_device_properties(device)

    def device_limits(why: str) -> tuple[int, str]:
        per_sm_smem = props.shared_memory_per_multiprocessor
        by_smem = per_sm_smem // (smem_bytes + 1024)
        by_threads = props.max_threads_per_multi_processor // THREADS
        by_regs = 65536 // (THREADS * LAUNCH_REGS)   # setmaxnreg redistributes 384 x 168
        return int(min(by_smem, by_threads, by_regs)), f"device limits ({why})"

    cubin = getattr(compiled, "__cubin__", None)
    if cubin is None:
        # a variant loaded from the compile cache (the AOT export) keeps no cubin to query; the
        # device limits give the same answer for this kernel (its shared memory allows one)
        return device_limits("no cubin to query: a variant loaded from the compile cache")
    try:
        import cuda.bindings.driver as drv
        if isinstance(cubin, str):
            cubin = cubin.encode("latin1")
        err, mod = drv.cuModuleLoadData(cubin)
        if err != drv.CUresult.CUDA_SUCCESS:
            from cutlass.base_dsl.jit_executor import get_escaped_cubin_bytes
            err, mod = drv.cuModuleLoadData(get_escaped_cubin_bytes(cubin))
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuModuleLoadData: {err}")
        err, n = drv.cuModuleGetFunctionCount(mod)
        err, funcs = drv.cuModuleEnumerateFunctions(n, mod)
        fn = funcs[0]
        drv.cuFuncSetAttribute(
            fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes)
        err, nb = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, THREADS, smem_bytes)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"occupancy query: {err}")
        return int(nb), "cuOccupancyMaxActiveBlocksPerMultiprocessor"
    except Exception as e:  # noqa: BLE001 - fall back to the device limits, and say so
        return device_limits(f"{type(e).__name__}: {e}")


def smem_bytes_estimate(npages: int = NPAGES, claim_after_loads: bool = False) -> int:
    slot_bars = 3 + int(claim_after_loads)   # ifull, iempty, iready, lnext
    return (npages * rk.PAGE + 1024 + 8 * (slot_bars * NISLOTS + 3 * npages)
            + 4 * (NISLOTS * INSTR_WORDS + NISLOTS + 4) + 2 * ak.SWAP_SCRATCH * int(ak.SWAPPED))


def norm_table(weights, dtype=torch.bfloat16) -> torch.Tensor:
    """[3L, H] norm weights: rows which*L + layer (ATTN, MLP, FINAL; FINAL is row 2L)."""
    L, H = weights.attn_norm.shape
    t = torch.zeros(3 * L, H, dtype=dtype, device=weights.attn_norm.device)
    t[0:L] = weights.attn_norm
    t[L:2 * L] = weights.mlp_norm
    t[2 * L:3 * L] = weights.final_norm
    return t


def _gemm_shapes(g: GemmOperands) -> dict:
    x, w, y = g.x, g.w, g.y
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    y3 = y if y.dim() == 3 else y.unsqueeze(0)
    w3 = w if w.dim() == 3 else w.unsqueeze(0)
    return dict(xz=x3.shape[0], xt=x3.shape[1], xk=x3.shape[2], yz=y3.shape[0], yt=y3.shape[1],
                yn=y3.shape[2], wl=w3.shape[0], wn=w3.shape[1], wk=w3.shape[2])


def _check_folded_norms(rn: np.ndarray, splitk_shape) -> None:
    """RMSNORM rows that fold a split-K reduce (O_PROJ's or DOWN's; rows.A_RED_NSPLIT > 0): the
    split-K workspace is compiled in and holds every partial row they read (all H columns)."""
    if not len(rn):
        return
    ns, st = rn[:, A_RED_NSPLIT], rn[:, A_RED_STRIDE]
    if (ns < 0).any() or (st < 0).any():
        raise ValueError("RMSNORM reduce words: nsplit and stride must be >= 0")
    fold = ns > 0
    if not fold.any():
        return
    if splitk_shape is None:
        raise ValueError("an RMSNORM folds a split-K reduce, but this megakernel has no "
                         "SPLITK workspace (Megakernel(..., splitk=...))")
    rows, width = splitk_shape
    f = rn[fold]
    if f[0, W_COLS] > width:
        raise ValueError(f"folded RMSNORM over {int(f[0, W_COLS])} columns: the SPLITK workspace "
                         f"is {width} wide")
    last = (f[:, A_RED_NSPLIT] - 1).astype(np.int64) * f[:, A_RED_STRIDE] + f[:, W_ROW0] + f[:, W_ROWS]
    if (last > rows).any():
        raise ValueError(f"folded RMSNORM reads SPLITK row {int(last.max()) - 1}, the workspace has "
                         f"{rows} partial rows")


def _check_row_scaled_tiles(s: np.ndarray, ops: np.ndarray, tiles: np.ndarray, what: str):
    """GEMM tiles that scale their rows (an epilogue wait, or self-scaled; `what` says which):
    QKV_ROPE / GATE_UP ones only (their epilogues alone have the code), unsplit (a split tile's
    rows are scaled by its SPLITK_REDUCE)."""
    bad = sorted(set(ops[tiles].tolist()) - set(ROW_SCALED_OPS))
    if bad:
        raise ValueError(f"megakernel: {[_op_name(o) for o in bad]} tiles {what}: only "
                         f"{[Op(o).name for o in ROW_SCALED_OPS]} tiles scale their rows")
    if (s[tiles, mc.A_NSPLIT] >= 2).any():
        raise ValueError(f"megakernel: a split GEMM tile {what}: split tiles are scaled by "
                         f"their SPLITK_REDUCE (its row scale word)")


def _check_self_scale(s: np.ndarray, ops: np.ndarray, H: int, compiled: set):
    """Unsplit QKV_ROPE / GATE_UP tiles that compute their rows' statistic themselves
    (A_EPI_WAIT = SELF_SCALE, PlanConfig.norm_fold=3): their opcode's slot has the code (in
    `compiled`: Megakernel(self_scale=True)), and the tile's K is the whole hidden width (the
    statistic is over every column of the row)."""
    own = np.isin(ops, GEMM_OPS) & (s[:, mc.A_EPI_WAIT] == mc.SELF_SCALE)
    if not own.any():
        return
    _check_row_scaled_tiles(s, ops, own, f"marked self-scaled (word ARG0+"
                                         f"{mc.A_EPI_WAIT - ARG0} = {mc.SELF_SCALE})")
    missing = sorted(set(ops[own].tolist()) - set(compiled))
    if missing:
        i = int(np.flatnonzero(own & np.isin(ops, missing))[0])
        where = (f"instruction {i} (layer {int(s[i, W_LAYER])}, rows {int(s[i, W_ROW0])}+"
                 f"{int(s[i, W_ROWS])})")
        raise ValueError(f"megakernel: {where} is a {_op_name(ops[i])} tile that computes its "
                         f"rows' statistic itself (PlanConfig.norm_fold=3); this megakernel was "
                         f"built without that code (Megakernel(..., self_scale=True))")
    k = np.where(ops[own] == int(Op.QKV_ROPE), s[own, qk.A_K], s[own, MM_A_K])
    if (k != H).any():
        raise ValueError(f"megakernel: a self-scaled tile's K must be the hidden width {H} (its "
                         f"rows' statistic is over all of their columns), got "
                         f"{sorted(set(k.tolist()) - {H})}")


def _check_row_parts(s: np.ndarray, ops: np.ndarray, T: int, H: int, slots: tuple,
                     splitk_shape, partial_shape):
    """PlanConfig.norm_fold=4: QKV_ROPE / GATE_UP tiles scaled from ROW_PART (A_EPI_WAIT =
    ROW_PARTS) and the O_PROJ / DOWN / EMBED tiles that write it (A_ROW_PART). ROW_PART
    and the SPLITK_REDUCEs scaled from it (row scale word FROM_ROW_PART: their QKV_ROPE /
    GATE_UP tiles split). ROW_PART
    ([T, 2 * H / 64] floats, mk.instructions.base.Buf.ROW_PART) lies in the SPLITK allocation
    before ROW_SCALE's rows (mk.plan.splitk_shape), so it needs split-K compiled in with room
    for it, and the opcodes' slots compiled with the code (Megakernel(row_parts=True): EMBED's
    with them). Scaled tiles: unsplit, K = H, their set's columns inside ROW_PART; writers:
    unsplit RESIDUAL O_PROJ / DOWN tiles or STORE EMBED tiles, columns on 64-column groups, their
    groups inside ROW_PART, token rows. H: a multiple of 256 (the consumers' 16-byte chunks, a
    quarter of a set each lane) and at most tiles.NORM_MAX_HIDDEN. Returns the SPLITK rows the
    split partials may use (partial_shape less ROW_PART's where the stream has any)."""
    scaled = np.isin(ops, ROW_SCALED_OPS) & (s[:, mc.A_EPI_WAIT] == mc.ROW_PARTS)
    writers = (np.isin(ops, (int(Op.O_PROJ), int(Op.DOWN), int(Op.EMBED)))
               & (s[:, mc.A_ROW_PART] != 0))
    red = (ops == OP_SPLITK_REDUCE) & (s[:, ARG0 + skk.R_ROW_SCALE] == skk.FROM_ROW_PART)
    if not (scaled.any() or writers.any() or red.any()):
        return partial_shape
    i = int(np.flatnonzero(scaled | writers | red)[0])
    where = (f"instruction {i} (a {_op_name(ops[i])} tile of layer {int(s[i, W_LAYER])}, rows "
             f"{int(s[i, W_ROW0])}+{int(s[i, W_ROWS])})")
    if splitk_shape is None:
        raise ValueError(f"megakernel: {where} uses ROW_PART (PlanConfig.norm_fold=4), which lies "
                         f"in the SPLITK workspace, and this megakernel has none "
                         f"(Megakernel(..., splitk=...))")
    code = {g.op for g in slots if g.row_parts}
    need = set(ops[scaled | (writers & (ops != int(Op.EMBED)))].tolist())
    need |= set(s[red, ARG0 + skk.R_OP].tolist())
    if (writers & (ops == int(Op.EMBED))).any():
        need.add(int(Op.DOWN))      # EMBED's code comes with the writers' slots
    if need - code:
        raise ValueError(f"megakernel: {where} uses ROW_PART (PlanConfig.norm_fold=4); this "
                         f"megakernel was built without that code for "
                         f"{[_op_name(o) for o in sorted(need - code)]} "
                         f"(Megakernel(..., row_parts=True))")
    if H % (4 * mc.ROW_PART_COLS) or H > tiles.NORM_MAX_HIDDEN:
        raise ValueError(f"megakernel: ROW_PART (PlanConfig.norm_fold=4) needs the hidden size a "
                         f"multiple of 256 and at most {tiles.NORM_MAX_HIDDEN}, got {H}")
    G = mc.row_part_groups(H)
    ld = mc.row_part_ld(H)
    if scaled.any():
        _check_row_scaled_tiles(s, ops, scaled, f"scaled from ROW_PART (word ARG0+"
                                                f"{mc.A_EPI_WAIT - ARG0} = {mc.ROW_PARTS})")
        k = np.where(ops[scaled] == int(Op.QKV_ROPE), s[scaled, qk.A_K], s[scaled, MM_A_K])
        col = s[scaled, mc.A_EPI_TARGET]
        if (k != H).any() or (col < 0).any() or (col % 4).any() or (col + G > ld).any():
            raise ValueError(f"megakernel: a tile scaled from ROW_PART needs K = the hidden size "
                             f"{H} and its set's first column (word ARG0+"
                             f"{mc.A_EPI_TARGET - ARG0}) a multiple of 4 with {G} columns inside "
                             f"ROW_PART's {ld}")
    if red.any():
        rop = s[red, ARG0 + skk.R_OP]
        k = np.where(rop == int(Op.QKV_ROPE), s[red, ARG0 + skk.R_EPI0 + skk.U_K_QKV],
                     s[red, ARG0 + skk.R_EPI0 + skk.U_K])
        col = s[red, ARG0 + skk.R_ROW_PART_COL]
        if (~np.isin(rop, ROW_SCALED_OPS)).any() or (k != H).any() or (col < 0).any() \
                or (col % 4).any() or (col + G > ld).any() \
                or (s[red, W_ROWS] > skk.ROW_PART_MAX_ROWS).any():
            raise ValueError(f"megakernel: a SPLITK_REDUCE scaled from ROW_PART (row scale word "
                             f"{skk.FROM_ROW_PART}) must finish a "
                             f"{[Op(o).name for o in ROW_SCALED_OPS]} tile of K = the hidden size "
                             f"{H}, its set's first column (ARG0+{skk.R_ROW_PART_COL}) a multiple "
                             f"of 4 with {G} columns inside ROW_PART's {ld}, and at most "
                             f"{skk.ROW_PART_MAX_ROWS} rows")
    if writers.any():
        w = s[writers]
        wops = ops[writers]
        epi = np.where(wops == int(Op.EMBED), w[:, em.A_EPI], w[:, MM_A_EPI])
        want = np.where(wops == int(Op.EMBED), int(Epi.STORE), int(Epi.RESIDUAL))
        c0, c1 = w[:, W_COL0], w[:, W_COL0] + w[:, W_COLS]
        first = w[:, mc.A_ROW_PART] - 1
        if ((epi != want).any() or (w[:, mc.A_NSPLIT] >= 2).any()
                or (c0 % mc.ROW_PART_COLS).any()
                or ((c1 % mc.ROW_PART_COLS != 0) & (c1 != H)).any()
                or (first < 0).any() or (first + -(-c1 // mc.ROW_PART_COLS) > ld).any()
                or (w[:, W_ROW0] + w[:, W_ROWS] > T).any()):
            raise ValueError(f"megakernel: a tile writing ROW_PART (word ARG0+"
                             f"{mc.A_ROW_PART - ARG0}) must be an unsplit O_PROJ / DOWN tile with "
                             f"the RESIDUAL epilogue or an EMBED tile with STORE, its columns on "
                             f"{mc.ROW_PART_COLS}-column groups, its groups inside ROW_PART's {ld} "
                             f"columns and its rows inside the {T} token rows")
    from mk.plan import row_part_rows, row_scale_rows
    rows, width = splitk_shape
    tail = row_part_rows(T, width, H) + row_scale_rows(T, width)
    if rows < tail:
        raise ValueError(f"megakernel: the SPLITK workspace [{rows}, {width}] has no room for "
                         f"ROW_PART and ROW_SCALE in its last {tail} rows (mk.plan.splitk_shape)")
    return min(partial_shape[0], rows - tail), width


def _check_row_scale(s: np.ndarray, ops: np.ndarray, T: int, splitk_shape):
    """Row-scale RMSNORMs (destination ROW_SCALE) and row-scaled SPLITK_REDUCEs (word
    skk.R_ROW_SCALE; PlanConfig.norm_fold). ROW_SCALE is the last T floats of the SPLITK
    allocation (T: the arena's token rows; mk.instructions.base.Buf.ROW_SCALE), so they need
    split-K compiled in, only QKV_ROPE's and GATE_UP's reduces scale (their epilogues alone have
    the code), their rows are token rows (< T), and the split partials of a stream that has them
    stay out of ROW_SCALE's rows (mk.plan.row_scale_rows). Returns the [rows, width] of the
    allocation the partials may use: splitk_shape less those rows where the stream scales rows,
    all of it otherwise (a stream without row scales may use the whole allocation)."""
    norm = (ops == int(Op.RMSNORM)) & (s[:, A_DST] == int(Buf.ROW_SCALE))
    mode = np.where(ops == OP_SPLITK_REDUCE, s[:, ARG0 + skk.R_ROW_SCALE], 0)
    if ((mode < 0) | (mode > skk.FROM_ROW_PART)).any():
        raise ValueError(f"megakernel: a SPLITK_REDUCE's row scale word (ARG0+{skk.R_ROW_SCALE}) "
                         f"must be 0, 1 (ROW_SCALE) or {skk.FROM_ROW_PART} (ROW_PART)")
    # (FROM_ROW_PART reduces: _check_row_parts)
    red = (ops == OP_SPLITK_REDUCE) & (mode == 1)
    # unsplit GEMM tiles that scale their rows in the epilogue (PlanConfig.norm_fold=2; their
    # epilogue wait, mc.A_EPI_WAIT), and stray epilogue-wait words on any other opcode
    gemm_ops = np.isin(ops, GEMM_OPS)
    tile = (gemm_ops & (s[:, mc.A_EPI_WAIT] != 0) & (s[:, mc.A_EPI_WAIT] != mc.SELF_SCALE)
            & (s[:, mc.A_EPI_WAIT] != mc.ROW_PARTS))
    if tile.any():
        _check_row_scaled_tiles(s, ops, tile,
                                f"with an epilogue wait (word ARG0+{mc.A_EPI_WAIT - ARG0})")
        c, t = s[tile, mc.A_EPI_WAIT] - 1, s[tile, mc.A_EPI_TARGET]
        if (c < 0).any() or (t <= 0).any():
            raise ValueError("megakernel: an epilogue wait needs a counter and a positive target")
        r1 = s[tile, W_ROW0] + s[tile, W_ROWS]
        if (r1 > T).any():
            raise ValueError(f"megakernel: row-scaled GEMM tile rows outside ROW_SCALE's {T} "
                             f"token rows")
    if not (norm.any() or red.any() or tile.any()):
        return splitk_shape
    if splitk_shape is None:
        i = int(np.flatnonzero(norm | red | tile)[0])
        what = ("RMSNORM into ROW_SCALE (row-scale mode)" if norm[i] else
                f"{_op_name(ops[i])} tile with an epilogue wait (a row scale)" if tile[i] else
                f"SPLITK_REDUCE of {_op_name(s[i, ARG0 + skk.R_OP])} with the row scale word")
        raise ValueError(f"megakernel: instruction {i} (layer {int(s[i, W_LAYER])}, rows "
                         f"{int(s[i, W_ROW0])}+{int(s[i, W_ROWS])}) is a {what}: ROW_SCALE lies in "
                         f"the SPLITK workspace, and this megakernel has none (Megakernel(..., "
                         f"splitk=...))")
    rop = s[red, ARG0 + skk.R_OP]
    bad = sorted(set(rop.tolist()) - set(ROW_SCALED_OPS))
    if bad:
        raise ValueError(f"megakernel: SPLITK_REDUCE of {[_op_name(o) for o in bad]} with the row "
                         f"scale word: only {[Op(o).name for o in ROW_SCALED_OPS]} reduces scale "
                         f"their rows")
    r0, r1 = s[red, W_ROW0], s[red, W_ROW0] + s[red, W_ROWS]
    if (r0 < 0).any() or (r1 > T).any():
        raise ValueError(f"megakernel: row-scaled SPLITK_REDUCE rows outside ROW_SCALE's {T} "
                         f"token rows")
    from mk.plan import row_scale_rows
    rows, width = splitk_shape
    reserved = row_scale_rows(T, width)
    if rows < reserved:
        raise ValueError(f"megakernel: the SPLITK workspace [{rows}, {width}] has no room for "
                         f"ROW_SCALE's {T} floats in its last {reserved} rows "
                         f"(mk.plan.splitk_shape)")
    return rows - reserved, width


def _op_name(op) -> str:
    return Op(int(op)).name if int(op) in Op._value2member_map_ else str(int(op))


def check_plan(stream: torch.Tensor, nbuf: int, T: int, H: int, n_counters: int, npages: int = NPAGES,
               gemm: dict | None = None, slots: tuple = (), kv_shape=None,
               attn: AttnOperands | None = None, embed_shape=None, last_normed_shape=None,
               meta_page_size: int | None = None, splitk_shape=None, l2_prefetch: bool = False):
    """Host-side refusal of what this kernel cannot run (before it could hang or fault).

    gemm / slots: the GEMM operands and compiled slots of the megakernel (GEMM opcodes without a
    slot are refused); kv_shape: (2, rows, hkv*D) of QKV_ROPE's K/V caches (attention reads
    them); attn: the attention operands (None: ATTENTION / ATTN_REDUCE refused); embed_shape:
    [V, H] of the EMBED table; last_normed_shape: [S, H] of LAST_NORMED (LM_NORM);
    meta_page_size: the step metadata's KV page size when the caller has it on the host (the
    kernel checks it too, without a host sync); splitk_shape: [rows, width] of the SPLITK
    workspace (None: split-K tiles, SPLITK_REDUCE and row scales refused; its last rows hold
    ROW_SCALE, _check_row_scale); l2_prefetch: the variant has the L2_PREFETCH body (else those
    instructions are refused). A self-scaled tile (PlanConfig.norm_fold=3) needs its slot's
    GemmSlot.self_scale (_check_self_scale), ROW_PART's tiles (norm_fold=4) theirs
    GemmSlot.row_parts (_check_row_parts)."""
    if stream.dtype != torch.int32 or stream.dim() != 2 or stream.shape[1] != INSTR_WORDS:
        raise ValueError(f"instruction stream must be int32 [N, {INSTR_WORDS}]")
    # numpy from here: a few hundred small array ops, each ~5x cheaper than torch's on the CPU
    # (the host check is on every step's critical path)
    s = stream.detach().cpu().numpy()
    ops = s[:, W_OPCODE]
    bad = [_op_name(o) for o in np.unique(ops) if int(o) not in SUPPORTED_OPS]
    if bad:
        raise NotImplementedError(f"megakernel has no GPU body for opcodes {bad}")
    if (s[:, W_SIGNAL_SCOPE] != int(SignalScope.LOCAL)).any():
        raise NotImplementedError("megakernel: PEER/ALL signal scopes need mk.comm (not yet)")
    sig = s[:, W_SIGNAL]
    waits = s[:, W_WAIT0:W_WAIT0 + 2 * MAX_WAITS:2]
    # an unsplit folded GEMM tile's epilogue wait: counter + 1 in its word (0: none)
    epi_wait = np.where(np.isin(ops, ROW_SCALED_OPS), s[:, mc.A_EPI_WAIT] - 1, -1)
    mx = max(int(sig.max()) if len(s) else -1, int(waits.max()) if len(s) else -1,
             int(epi_wait.max()) if len(s) else -1)
    if mx >= n_counters:
        raise ValueError(f"plan uses counter {mx}, the megakernel has {n_counters}")
    # the SPLITK rows the split partials may use: ROW_SCALE takes the last ones where used
    partial_shape = _check_row_scale(s, ops, T, splitk_shape)
    partial_shape = _check_row_parts(s, ops, T, H, slots, splitk_shape, partial_shape)
    _check_self_scale(s, ops, H, {g.op for g in slots if g.self_scale})
    rowops = (ops == int(Op.COPY)) | (ops == int(Op.RMSNORM)) | (ops == int(Op.RESIDUAL_ADD))
    if rowops.any():
        p = s[rowops]
        if ((p[:, W_COL0] % 8) != 0).any() or ((p[:, W_COLS] % 8) != 0).any():
            raise ValueError("rows tiles must start and end on 8-column boundaries")
        if (p[:, W_ROW0] < 0).any() or (p[:, W_ROW0] + p[:, W_ROWS] > T).any() \
                or (p[:, W_COL0] + p[:, W_COLS] > H).any() or (p[:, W_ROWS] <= 0).any():
            raise ValueError("rows tile outside the [T, H] buffers")
        # a row-scale RMSNORM's destination is ROW_SCALE, outside the arena (_check_row_scale)
        scale_norm = (p[:, W_OPCODE] == int(Op.RMSNORM)) & (p[:, A_DST] == int(Buf.ROW_SCALE))
        if (p[:, A_SRC] >= nbuf).any() or (p[~scale_norm, A_DST] >= nbuf).any():
            raise ValueError(f"buffer id beyond the arena's {nbuf} buffers")
        rn = p[p[:, W_OPCODE] == int(Op.RMSNORM)]
        if len(rn) and (((rn[:, W_COL0] != 0) | (rn[:, W_COLS] != H)).any()):
            raise ValueError("RMSNORM tiles must span the whole row")
        if len(rn) and H > rk.NORM_MAX_H:
            raise ValueError(f"RMSNORM over H={H} columns: the body holds at most "
                             f"{rk.NORM_MAX_H} per row")
        _check_folded_norms(rn, partial_shape)
    by_op = {g.op: g for g in slots}
    _check_l2_prefetch(s[ops == OP_L2_PREFETCH], by_op, gemm, l2_prefetch)
    # a SPLITK_REDUCE runs its opcode's epilogue with the unsplit words: check them as those of
    # an unsplit tile of that opcode (below), its workspace rows here
    red = s[ops == OP_SPLITK_REDUCE]
    red_eq = _check_splitk_reduce(red, by_op, gemm, partial_shape)
    for op in GEMM_OPS:
        p = np.concatenate((s[ops == op], red_eq[red_eq[:, W_OPCODE] == op]))
        if not len(p):
            continue
        name = Op(op).name
        if op not in by_op:
            raise NotImplementedError(
                f"megakernel: {name} instructions, but this megakernel was built without "
                f"{name} operands (Megakernel(..., gemm={{Op.{name}: GemmOperands(...)}}))")
        g, sh = by_op[op], _gemm_shapes(gemm[Op(op)])
        cfg = g.cfg
        K = p[:, g.kw]
        row0, rows, col0, cols = p[:, W_ROW0], p[:, W_ROWS], p[:, W_COL0], p[:, W_COLS]
        spl = p[:, gk.A_NSPLIT] >= 2
        k0 = np.where(spl, p[:, gk.A_K0], np.zeros_like(K))
        if spl.any():
            _check_split_tiles(name, op, p[spl], sh, partial_shape, g)
        u = p[~spl]       # the epilogue and destination words matter to unsplit tiles only
        if op != int(Op.QKV_ROPE):
            epi = u[:, MM_A_EPI]
            if (epi == int(Epi.SCATTER)).any():
                raise NotImplementedError(f"megakernel: {name} with the SCATTER epilogue (TP > 1) "
                                          "needs mk.comm (not yet)")
            want = {int(Op.O_PROJ): Epi.RESIDUAL, int(Op.DOWN): Epi.RESIDUAL,
                    int(Op.GATE_UP): Epi.SILU_MUL, int(Op.LM_HEAD): Epi.STORE}[op]
            if (epi != int(want)).any():
                raise ValueError(f"megakernel: {name} runs the {want.name} epilogue only, the plan "
                                 f"has epilogues {sorted(set(epi.tolist()))}")
        else:
            if (p[:, qk.A_HEAD_DIM] != 128).any():
                raise ValueError("megakernel: QKV_ROPE needs head_dim 128 (RoPE pairs in one "
                                 "wgmma chain)")
            sec = u[:, qk.A_SECTION]
            if ((sec < 0) | (sec > 2)).any():
                raise ValueError("megakernel: QKV_ROPE section must be q, k or v")
        qkv = op == int(Op.QKV_ROPE)
        err = tiles.gemm_tile_error(name, cfg, row0, rows, col0, cols, K,
                                    p[:, qk.A_HEAD_DIM] if qkv else None,
                                    p[:, qk.A_SEC_COL0] if qkv else None, k0=k0)
        if err:
            raise ValueError(f"megakernel: {err}")
        if (k0 + K > sh["xk"]).any() or (k0 + K > sh["wk"]).any():
            raise ValueError(f"megakernel: {name} K must be a positive multiple of {gk.BK} within "
                             f"the operands' {min(sh['xk'], sh['wk'])} columns")
        if (row0 + rows > sh["xt"]).any():
            raise ValueError(f"megakernel: {name} tiles need 0 < rows <= {cfg.bm} (tile "
                             f"{cfg.name}) inside the operand's {sh['xt']} rows")
        nout = sh["wn"] // 2 if op == int(Op.GATE_UP) else sh["wn"]
        if (col0 + cols > nout).any():
            raise ValueError(f"megakernel: {name} columns beyond the weight's {nout} outputs")
        if op != int(Op.QKV_ROPE):
            if (u[:, W_COL0] + u[:, W_COLS] > sh["yn"]).any() \
                    or (u[:, W_ROW0] + u[:, W_ROWS] > sh["yt"]).any():
                raise ValueError(f"megakernel: {name} tile outside the destination "
                                 f"[{sh['yt']}, {sh['yn']}]")
        else:
            q = u[u[:, qk.A_SECTION] == gk.SEC_Q]
            if len(q) and ((q[:, W_COL0] + q[:, W_COLS] > sh["yn"]).any()
                           or (q[:, W_ROW0] + q[:, W_ROWS] > sh["yt"]).any()):
                raise ValueError("megakernel: QKV_ROPE q tile outside the Q buffer")
            kvp = u[u[:, qk.A_SECTION] != gk.SEC_Q]
            if len(kvp):
                if kv_shape is None:
                    raise ValueError("megakernel: QKV_ROPE k/v tiles need the kv caches")
                d0 = kvp[:, W_COL0] - kvp[:, qk.A_SEC_COL0]
                if (d0 < 0).any() or (d0 + kvp[:, W_COLS] > kv_shape[2]).any():
                    raise ValueError("megakernel: QKV_ROPE k/v columns outside the caches")
        zx = p[:, ARG0] - g.xb          # src word (ARG0 in matmul.py and qkv.py)
        zy = u[:, ARG0 + 1] - g.yb      # dst word
        if ((zx < 0) | (zx >= sh["xz"])).any() or ((zy < 0) | (zy >= sh["yz"])).any():
            raise ValueError(f"megakernel: {name} src/dst buffer ids outside the operands "
                             f"(x: {g.xb}..{g.xb + sh['xz'] - 1}, y: {g.yb}..{g.yb + sh['yz'] - 1})")
        if ((p[:, W_LAYER] < 0) | (p[:, W_LAYER] >= sh["wl"])).any():
            raise ValueError(f"megakernel: {name} layer beyond the stacked weights' {sh['wl']}")
    _check_attention(s, ops, attn, kv_shape, meta_page_size)
    _check_gather(s, ops, nbuf, T, H, embed_shape, last_normed_shape)
    return mx + 1


def _check_l2_prefetch(p, by_op: dict, gemm, compiled: bool) -> None:
    """L2_PREFETCH rows: compiled in, of a GEMM slot's stacked weights, inside them (pf.check)."""
    if not len(p):
        return
    if not compiled:
        raise NotImplementedError("megakernel: L2_PREFETCH instructions, but this megakernel was "
                                  "built without them (Megakernel(..., l2_prefetch=True))")
    from mk.ir import Instruction
    for w in np.unique(p[:, pf.A_WOP]):
        if int(w) not in by_op or int(w) not in PREFETCH_OPS:
            raise ValueError(f"megakernel: L2_PREFETCH of the weights of opcode {int(w)}: this "
                             f"megakernel's stacked GEMM weights are "
                             f"{[Op(o).name for o in by_op if o in PREFETCH_OPS]}")
        sh = _gemm_shapes(gemm[Op(int(w))])
        q = p[p[:, pf.A_WOP] == w]
        if ((q[:, W_LAYER] < 0) | (q[:, W_LAYER] >= sh["wl"])).any():
            raise ValueError(f"megakernel: L2_PREFETCH layer beyond the stacked weights' {sh['wl']}")
        # the distinct (rows, K range) words: a handful per step
        for row in np.unique(q[:, [W_COL0, W_COLS, pf.A_K0, pf.A_K1]], axis=0):
            ins = Instruction(opcode=Op.L2_PREFETCH, col0=int(row[0]), cols=int(row[1]),
                              args=[int(w), int(row[2]), int(row[3])])
            pf.check(ins, sh["wn"], sh["wk"])


def _splitk_cols(op: int, sh: dict, col0, cols):
    """Last SPLITK column + 1 of split tiles / reduces of opcode op (GATE_UP: the up part at
    intermediate_local + col)."""
    end = col0 + cols
    if op == int(Op.GATE_UP):
        end = end + sh["wn"] // 2
    return end


def _check_workspace(name, op, sh, splitk_shape, row_lo, row_hi, col0, cols):
    """SPLITK rows [row_lo, row_hi) and the op's column map of [col0, col0+cols) inside the
    workspace, which must exist (splitk_shape: its partial rows, _check_row_scale)."""
    if splitk_shape is None:
        raise ValueError(f"megakernel: {name} needs the SPLITK workspace (Megakernel(..., "
                         f"splitk=<float32 CUDA tensor [rows, width]>))")
    R, W = splitk_shape
    if (row_lo < 0).any() or (row_hi > R).any():
        raise ValueError(f"megakernel: {name} rows outside the SPLITK workspace's {R} partial "
                         f"rows")
    if (col0 < 0).any() or (_splitk_cols(op, sh, col0, cols) > W).any():
        raise ValueError(f"megakernel: {name} columns outside the SPLITK workspace's {W} columns")


def _no_split_code(name: str) -> str:
    return (f"megakernel: {name} split tiles, but this variant was compiled without them (the "
            f"plans of its M class never split {name}: mk.plan.PlanConfig.split_ops; build the "
            f"Megakernel with split_ops= the plan's PlanConfig.split_ops)")


def _check_split_tiles(name, op, p, sh, splitk_shape, slot):
    """Split-K tiles of opcode op (nsplit >= 2; see check_plan) for its compiled GemmSlot."""
    if op not in SPLITK_OPS:
        raise ValueError(f"megakernel: {name} tiles are never split (nsplit word >= 2)")
    if not slot.splits:
        raise ValueError(_no_split_code(name))
    ns, j, k0, stride = (p[:, gk.A_NSPLIT], p[:, gk.A_SPLIT_J], p[:, gk.A_K0],
                         p[:, gk.A_SPLIT_ROW])
    if (j < 0).any() or (j >= ns).any() or (stride < 0).any():
        raise ValueError(f"megakernel: {name} split tiles need 0 <= j < nsplit and a row stride "
                         f">= 0")
    if (k0 < 0).any() or (k0 % gk.BK != 0).any():
        raise ValueError(f"megakernel: {name} split tiles need K0 a multiple of {gk.BK}")
    r0 = j * stride + p[:, W_ROW0]
    _check_workspace(f"{name} split tile", op, sh, splitk_shape, r0, r0 + p[:, W_ROWS],
                     p[:, W_COL0], p[:, W_COLS])
    _check_up_col(name, op, p, sh, MM_A_UP_COL)


def _check_up_col(name, op, p, sh, word):
    """GATE_UP's up-part column word, where the plan writes one, must be the weights' half (the
    kernel takes it from the weights)."""
    if op == int(Op.GATE_UP):
        up = p[:, word]
        if ((up != 0) & (up != sh["wn"] // 2)).any():
            raise ValueError(f"megakernel: {name} up column word {sorted(set(up.tolist()))} is not "
                             f"intermediate_local = {sh['wn'] // 2}")


def _check_splitk_reduce(r, by_op, gemm, splitk_shape):
    """SPLITK_REDUCE instructions (see check_plan): workspace rows of every split; returns them
    rewritten as the unsplit tiles whose epilogue they run (opcode word = the op, ARG0+i = their
    word ARG0+3+i, no split words) for the GEMM checks."""
    eq = np.zeros((0, INSTR_WORDS), dtype=np.int32)
    if not len(r):
        return eq
    rop = r[:, ARG0 + skk.R_OP]
    bad = sorted(set(rop.tolist()) - set(SPLITK_OPS))
    if bad:
        raise ValueError(f"megakernel: SPLITK_REDUCE of opcodes {bad}: only "
                         f"{[Op(o).name for o in SPLITK_OPS]} split")
    ns, stride = r[:, ARG0 + skk.R_NSPLIT], r[:, ARG0 + skk.R_STRIDE]
    if (ns < 1).any() or (stride < 0).any():
        raise ValueError("megakernel: SPLITK_REDUCE needs nsplit >= 1 and a row stride >= 0")
    for op in sorted(set(rop.tolist())):
        name = Op(op).name
        if op not in by_op:
            raise NotImplementedError(
                f"megakernel: SPLITK_REDUCE of {name}, but this megakernel was built without "
                f"{name} operands (Megakernel(..., gemm={{Op.{name}: GemmOperands(...)}}))")
        if not by_op[op].splits:
            raise ValueError(_no_split_code(name))
        p = r[rop == op]
        sh = _gemm_shapes(gemm[Op(op)])
        r0 = p[:, W_ROW0]
        _check_workspace(f"SPLITK_REDUCE of {name}", op, sh, splitk_shape, r0,
                         (p[:, ARG0 + skk.R_NSPLIT] - 1) * p[:, ARG0 + skk.R_STRIDE] + r0
                         + p[:, W_ROWS], p[:, W_COL0], p[:, W_COLS])
    eq = r.copy()
    eq[:, W_OPCODE] = rop
    # the unsplit words only (not the row scale word after them)
    n_epi = skk.UNSPLIT_WORDS
    eq[:, ARG0:ARG0 + n_epi] = r[:, ARG0 + skk.R_EPI0:ARG0 + skk.R_EPI0 + n_epi]
    eq[:, ARG0 + n_epi:] = 0
    for op in sorted(set(rop.tolist())):
        if op == int(Op.GATE_UP):
            _check_up_col("SPLITK_REDUCE of GATE_UP", op, eq[rop == op],
                          _gemm_shapes(gemm[Op(op)]), MM_A_UP_COL)
    return eq


def _check_attention(s, ops, attn, kv_shape, meta_page_size):
    """ATTENTION / ATTN_REDUCE against the compiled attention operands (see check_plan)."""
    a = s[ops == int(Op.ATTENTION)]
    r = s[ops == int(Op.ATTN_REDUCE)]
    if not len(a) and not len(r):
        return
    if attn is None:
        raise NotImplementedError("megakernel: ATTENTION / ATTN_REDUCE instructions, but this "
                                  "megakernel was built without attention operands "
                                  "(Megakernel(..., attn=AttnOperands(...)))")
    D = ak.D
    hqD, Tq, P, hq = attn.q.shape[1], attn.q.shape[0], attn.partial.shape[0], attn.lse.shape[1]
    if meta_page_size is not None and int(meta_page_size) != attn.page_size:
        raise ValueError(f"megakernel: the step metadata's KV page size {int(meta_page_size)} is "
                         f"not the compiled one ({attn.page_size})")
    for p, name in ((a, "ATTENTION"), (r, "ATTN_REDUCE")):
        if not len(p):
            continue
        if (p[:, at.A_HEAD_DIM] != D).any():
            raise ValueError(f"megakernel: {name} needs head_dim {D} (the page geometry of the "
                             f"attention bodies), the plan has "
                             f"{sorted(set(p[:, at.A_HEAD_DIM].tolist()))}")
        row0, rows, col0, cols, qpk = (p[:, W_ROW0], p[:, W_ROWS], p[:, W_COL0], p[:, W_COLS],
                                       p[:, at.A_QPK])
        if (rows <= 0).any() or (cols <= 0).any() or (qpk <= 0).any() or (col0 < 0).any() \
                or (row0 < 0).any():
            raise ValueError(f"megakernel: {name} needs rows, KV heads and qpk > 0")
        if (row0 + rows > min(Tq, attn.out.shape[0])).any():
            raise ValueError(f"megakernel: {name} rows beyond the Q / ATTN_OUT buffers "
                             f"({min(Tq, attn.out.shape[0])} rows)")
        if ((col0 + cols) * qpk * D > min(hqD, attn.out.shape[1])).any() \
                or ((col0 + cols) * qpk > hq).any():
            raise ValueError(f"megakernel: {name} q heads beyond the Q / ATTN_OUT / ATTN_LSE "
                             f"columns ({hqD // D} heads)")
    if len(a):
        if kv_shape is None:
            raise ValueError("megakernel: ATTENTION needs the K/V caches (Megakernel(kv=...))")
        if ((a[:, W_COL0] + a[:, W_COLS]) * D > kv_shape[2]).any():
            raise ValueError(f"megakernel: ATTENTION KV heads beyond the caches' "
                             f"{kv_shape[2] // D} heads")
        if (a[:, at.A_KV0] % ak.KB != 0).any() or (a[:, at.A_KV0] < 0).any():
            raise ValueError(f"megakernel: an ATTENTION KV split starts off a {ak.KB}-key block "
                             f"(PlanConfig.kv_split must be a multiple of {ak.KB})")
        if ((a[:, at.A_NEW0] < 0) | (a[:, at.A_NEW0] > a[:, at.A_POS0])).any():
            raise ValueError("megakernel: an ATTENTION's A_NEW0 (the sequence's first position "
                             "written by this step) must be in [0, pos0]: keys before it are read "
                             "before the instruction's waits")
        mode = a[:, at.A_MODE]
        if ((mode != at.MODE_DIRECT) & (mode != at.MODE_PARTIAL) & (mode != at.MODE_PAIR)).any():
            raise ValueError("megakernel: ATTENTION mode must be 0 (direct), 1 (partial) or 2 "
                             "(a pair of decode units)")
        pr = a[mode == at.MODE_PAIR]
        if len(pr):
            # the second unit: one row, keys [kv0, pos0 + 1), in the buffers, A_NEW0 as above
            if ((pr[:, W_ROWS] != 1) | (pr[:, at.A_KV0] != 0) | (pr[:, at.A_ROW0_B] < 0)
                    | (pr[:, at.A_ROW0_B] >= min(Tq, attn.out.shape[0]))
                    | (pr[:, at.A_NEW0_B] < 0) | (pr[:, at.A_NEW0_B] > pr[:, at.A_POS0_B])
                    | (pr[:, at.A_PAGE_OFF_B] < 0) | (pr[:, at.A_QPK] > at.PAIR_MAX_QPK)).any():
                raise ValueError(f"megakernel: an ATTENTION pair (mode 2) must be two one-row "
                                 f"decode units from key 0 of at most {at.PAIR_MAX_QPK} q heads "
                                 f"(a warpgroup's rows), the second's row in the Q / ATTN_OUT "
                                 f"buffers and its A_NEW0_B in [0, its pos0]")
        pa = a[mode == at.MODE_PARTIAL]
        if len(pa) and ((pa[:, at.A_SLOT] < 0).any()
                        or (pa[:, at.A_SLOT] + pa[:, W_ROWS] > min(P, attn.lse.shape[0])).any()):
            raise ValueError(f"megakernel: ATTENTION split slots beyond ATTN_PARTIAL / ATTN_LSE "
                             f"({P} rows)")
    if len(r):
        ns = r[:, at.A_NSPLIT]
        if (ns <= 0).any() or (r[:, at.A_SLOT0] < 0).any() \
                or (r[:, at.A_SLOT0] + ns * r[:, W_ROWS] > min(P, attn.lse.shape[0])).any():
            raise ValueError(f"megakernel: ATTN_REDUCE slots beyond ATTN_PARTIAL / ATTN_LSE "
                             f"({P} rows)")


def _check_gather(s, ops, nbuf, T, H, embed_shape, last_normed_shape):
    """EMBED / LM_NORM against the arena, the embedding table and LAST_NORMED (see check_plan)."""
    e = s[ops == int(Op.EMBED)]
    if len(e):
        if embed_shape is None:
            raise NotImplementedError("megakernel: EMBED instructions, but this megakernel was "
                                      "built without the embedding table (Megakernel(embed=...))")
        epi = e[:, em.A_EPI]
        if (epi == int(Epi.SCATTER)).any():
            raise NotImplementedError("megakernel: EMBED with the SCATTER epilogue (TP > 1) needs "
                                      "mk.comm (not yet)")
        if (epi != int(Epi.STORE)).any():
            raise ValueError(f"megakernel: EMBED runs the STORE epilogue only, the plan has "
                             f"epilogues {sorted(set(epi.tolist()))}")
        dst = e[:, em.A_DST]
        if ((dst < 0) | (dst >= nbuf)).any():
            raise ValueError(f"megakernel: EMBED destination buffer ids "
                             f"{sorted(set(dst.tolist()))} are not arena buffers (0..{nbuf - 1}: "
                             f"HIDDEN, NORMED, SCRATCH)")
        row0, rows, col0, cols = e[:, W_ROW0], e[:, W_ROWS], e[:, W_COL0], e[:, W_COLS]
        if (col0 % 8 != 0).any() or (cols % 8 != 0).any():
            raise ValueError("megakernel: EMBED tiles must start and end on 8-column boundaries")
        if (row0 < 0).any() or (rows <= 0).any() or (row0 + rows > T).any() or (col0 < 0).any() \
                or (col0 + cols > min(H, embed_shape[1])).any():
            raise ValueError(f"megakernel: EMBED tile outside the [{T}, {H}] arena or the "
                             f"embedding table's {embed_shape[1]} columns")
    m = s[ops == int(Op.LM_NORM)]
    if len(m):
        if last_normed_shape is None:
            raise NotImplementedError("megakernel: LM_NORM instructions, but this megakernel was "
                                      "built without LAST_NORMED (Megakernel(last_normed=...))")
        src, dst = m[:, lmn.A_SRC], m[:, lmn.A_DST]
        if ((src < 0) | (src >= nbuf)).any():
            raise ValueError(f"megakernel: LM_NORM source buffer ids {sorted(set(src.tolist()))} "
                             f"are not arena buffers (0..{nbuf - 1})")
        if (dst != int(Buf.LAST_NORMED)).any():
            raise ValueError(f"megakernel: LM_NORM destination buffer ids "
                             f"{sorted(set(dst.tolist()))}: the kernel binds LAST_NORMED "
                             f"({int(Buf.LAST_NORMED)}) only")
        width = m[:, lmn.A_WIDTH]
        if (width != H).any() or H != last_normed_shape[1] or H % 8:
            raise ValueError(f"megakernel: LM_NORM width must be the hidden size {H} = "
                             f"LAST_NORMED's {last_normed_shape[1]} columns (a multiple of 8)")
        row0, rows = m[:, W_ROW0], m[:, W_ROWS]
        if (row0 < 0).any() or (rows <= 0).any() or (row0 + rows > last_normed_shape[0]).any() \
                or (m[:, lmn.A_LAST_OFF] < 0).any():
            raise ValueError(f"megakernel: LM_NORM sequences outside LAST_NORMED's "
                             f"{last_normed_shape[0]} rows")


def gemm_tensor_args(gemm: dict | None, meta=None, inv_freq=None, kv=None, device="cuda"):
    """The 15 GEMM slot tensors (x, w, y per GEMM_OPS slot; small dummies for absent opcodes)
    + meta, inv_freq, kv, as torch tensors in kernel-parameter order (views kept alive by the
    caller)."""
    gemm = gemm or {}
    out = []
    for op in GEMM_OPS:
        g = gemm.get(Op(op))
        if g is None:
            d = torch.zeros(8, 8, dtype=torch.bfloat16, device=device)
            out += [_as3d(d), _as3d(d), _as3d(d)]
        else:
            assert g.x.dtype == torch.bfloat16 and g.w.dtype == torch.bfloat16
            assert g.y.dtype == (torch.float32 if Op(op) == Op.LM_HEAD else torch.bfloat16)
            out += [_as3d(g.x), _as3d(g.w), _as3d(g.y)]
    if meta is None:
        meta = torch.zeros(16, dtype=torch.int32, device=device)
    if inv_freq is None:
        inv_freq = torch.zeros(64, dtype=torch.float32, device=device)
    if kv is None:
        kv = torch.zeros(2, 8, 8, dtype=torch.bfloat16, device=device)
    assert kv.dim() == 3 and kv.shape[0] == 2 and kv.is_contiguous()
    out += [meta.contiguous(), inv_freq.float().contiguous(), kv.permute(1, 2, 0)]
    return out


def family_tensor_args(attn: AttnOperands | None, embed=None, last_normed=None, device="cuda"):
    """q, out, partial, lse (attention), the embedding table and LAST_NORMED, in kernel-parameter
    order; small dummies for absent families."""
    def dummy(dtype, cols=128):
        return torch.zeros(8, cols, dtype=dtype, device=device)
    if attn is None:
        out = [dummy(torch.bfloat16), dummy(torch.bfloat16), dummy(torch.float32),
               dummy(torch.float32, 8)]
    else:
        for name, t, dt in (("q", attn.q, torch.bfloat16), ("out", attn.out, torch.bfloat16),
                            ("partial", attn.partial, torch.float32),
                            ("lse", attn.lse, torch.float32)):
            if t.dtype != dt or t.dim() != 2 or not t.is_contiguous() or not t.is_cuda:
                raise ValueError(f"AttnOperands.{name} must be a contiguous 2-D {dt} CUDA tensor, "
                                 f"got {tuple(t.shape)} {t.dtype}")
        if attn.q.shape[1] % ak.D or attn.q.shape[1] != attn.partial.shape[1] \
                or attn.q.shape[1] != attn.lse.shape[1] * ak.D:
            raise ValueError(f"AttnOperands: q [T, hq*{ak.D}], partial [P, hq*{ak.D}] and lse "
                             f"[P, hq] disagree: {tuple(attn.q.shape)}, "
                             f"{tuple(attn.partial.shape)}, {tuple(attn.lse.shape)}")
        out = [attn.q, attn.out, attn.partial, attn.lse]
    for name, t in (("embed", embed), ("last_normed", last_normed)):
        if t is not None and (t.dtype != torch.bfloat16 or t.dim() != 2 or not t.is_contiguous()
                              or not t.is_cuda or t.shape[1] % 8):
            raise ValueError(f"{name} must be a contiguous [rows, H] bf16 CUDA tensor (H % 8 == "
                             f"0), got {tuple(t.shape)} {t.dtype}")
    out += [dummy(torch.bfloat16) if embed is None else embed,
            dummy(torch.bfloat16) if last_normed is None else last_normed]
    return out


class Megakernel:
    """Runs instruction streams of the rows family and the GEMM-tile family on one GPU.

    arena: [NBUF, T, H] bf16 CUDA tensor (buffers by Buf id); normw: [3L, H] (norm_table);
    journal: compile the variant that writes the per-instruction journal; handoff / backoff_ns:
    the compile-time hand-off mode and counter-wait backoff cap (DEFAULT_HANDOFF,
    DEFAULT_BACKOFF_NS).
    gemm: {Op: GemmOperands} for the GEMM opcodes the plans use (None: rows family only);
    gemm_m: the step's M class (token rows; sequences for LM_HEAD) that picks each opcode's tile
    config (gk.choose_tile; one compiled variant per class, default: the largest x's rows);
    meta / inv_freq / kv: the step metadata (mk.instructions._common layout; a fixed-capacity
    int32 CUDA tensor the caller rewrites between launches: nothing about its length or
    contents is compiled in), float32 inverse frequencies [64] and the K/V caches
    [2, rows, hkv*D] (QKV_ROPE appends, ATTENTION reads);
    attn: AttnOperands (Q, ATTN_OUT, ATTN_PARTIAL, ATTN_LSE, KV page size) or None;
    embed: the [V, H] bf16 embedding table (EMBED) or None; last_normed: LAST_NORMED [S, H] bf16
    (LM_NORM) or None;
    splitk: the SPLITK workspace, float32 [rows, width] CUDA tensor (mk.plan.buffer_shapes'
    Buf.SPLITK) for split-K tiles and SPLITK_REDUCE, or None: the variant without split-K (plans
    with split tiles are refused; the unsplit bodies' code is the same as before split-K);
    split_ops: with splitk, the opcodes whose split tiles the variant runs (None: every one;
    mk.plan.PlanConfig.split_ops: those the plans of its M class may split; the others' split
    code is left out, ~10% of the M1024 class's SASS, and plans splitting them are refused).
    self_scale: QKV_ROPE / GATE_UP tiles may compute their rows' statistic themselves
    (PlanConfig.norm_fold=3; GemmSlot.self_scale); row_parts: h's writers may leave their rows'
    sums of squares in ROW_PART and QKV_ROPE / GATE_UP tiles scale by them (PlanConfig.
    norm_fold=4; GemmSlot.row_parts; needs splitk, where ROW_PART lies).
    handoff None: DEFAULT_HANDOFF (every family runs in every hand-off mode);
    claim_after_loads None: claim_after_loads_for(gemm_m) (the controller's claim policy).
    timeout_s: the bound of the kernel's waits (a starved wait ends the launch with its record:
    MegakernelError); hang_s: how long a checked launch (launch / run with check=True) may run
    before it is reported as MegakernelHang instead of waited on for ever (None: the larger of
    60 s and 10 x timeout_s; a hang is a wait without a bound, e.g. a probe build's)."""

    # its state words and counters are updated in place by later calls (reset, the records'
    # copies) in whatever autograd mode those run: never inference tensors
    @torch.inference_mode(False)
    def __init__(self, arena: torch.Tensor, normw: torch.Tensor, n_layers: int, eps: float,
                 n_counters: int = 1 << 16, journal: bool = False, timeout_s: float = 2.0,
                 journal_capacity: int = 1 << 16, grid: int | None = None, verbose: bool = True,
                 handoff: str | None = None, backoff_ns: int = DEFAULT_BACKOFF_NS,
                 gemm: dict | None = None, gemm_m: int | None = None, meta=None, inv_freq=None,
                 kv=None, attn: AttnOperands | None = None, embed=None, last_normed=None,
                 splitk: torch.Tensor | None = None, l2_prefetch: bool = False,
                 claim_after_loads: bool | None = None, split_ops=None, self_scale: bool = False,
                 row_parts: bool = False, hang_s: float | None = None):
        if handoff is None:
            handoff = default_handoff(attn is not None)
        check_handoff(handoff, attn is not None)
        if attn is not None:
            ak.box_rows(attn.page_size)
            if kv is None or meta is None:
                raise ValueError("Megakernel: attention needs the K/V caches (kv=) and the step "
                                 "metadata (meta=)")
        if splitk is not None and (splitk.dtype != torch.float32 or splitk.dim() != 2
                                   or not splitk.is_contiguous() or not splitk.is_cuda
                                   or splitk.shape[1] % 8):
            raise ValueError(f"Megakernel: splitk must be a contiguous float32 [rows, width] CUDA "
                             f"tensor with width % 8 == 0, got {tuple(splitk.shape)} "
                             f"{splitk.dtype} on {splitk.device}")
        if (embed is not None or last_normed is not None) and meta is None:
            raise ValueError("Megakernel: EMBED / LM_NORM read the step metadata: pass meta=")
        if not BACKOFF_NS_RANGE[0] <= backoff_ns <= BACKOFF_NS_RANGE[1]:
            raise ValueError(f"Megakernel: backoff_ns={backoff_ns} outside "
                             f"{list(BACKOFF_NS_RANGE)} ns")
        self.handoff = handoff
        self.backoff_ns = int(backoff_ns)
        assert arena.is_cuda and arena.dtype == torch.bfloat16 and arena.dim() == 3
        assert arena.is_contiguous() and arena.shape[2] % 8 == 0
        self.arena = arena
        self.nbuf, self.T, self.H = arena.shape
        self.normw = normw.contiguous().to(torch.bfloat16)
        self.n_layers = n_layers
        self.eps = float(eps)
        self.timeout_ns = int(timeout_s * 1e9)
        self.hang_s = max(60.0, 10.0 * timeout_s) if hang_s is None else float(hang_s)
        if not (timeout_s > 0 and self.hang_s > 0):
            raise ValueError(f"Megakernel: timeout_s ({timeout_s}) and hang_s ({hang_s}) must be "
                             f"positive")
        dev = arena.device
        self.counters = torch.zeros(n_counters, dtype=torch.int32, device=dev)
        self.state = torch.zeros(rk.STATE_WORDS, dtype=torch.int32, device=dev)
        self.journal_on = journal
        self._hang_probe = None                # wait()'s event, side stream, pinned buffer
        self._records: tuple = ()              # launch(record=True)'s slots, made with it
        self._launches = 0
        self.journal = torch.zeros((journal_capacity if journal else 1, JOURNAL_WORDS),
                                   dtype=torch.int64, device=dev)
        props = torch.cuda.get_device_properties(dev)
        self.num_sms = props.multi_processor_count
        self.jcta = torch.zeros((self.num_sms * 4, JCTA_WORDS), dtype=torch.int64, device=dev)
        self.verbose = verbose
        self._grid_override = grid
        self.grid = None
        self.occupancy_source = None
        self._shape_key = (tuple(arena.shape), tuple(self.normw.shape))
        self.gemm = {Op(k): v for k, v in (gemm or {}).items()}
        if gemm_m is None and self.gemm:
            gemm_m = max(_gemm_shapes(g)["xt"] for g in self.gemm.values())
        self.gemm_m = gemm_m
        self.split_ops = None if split_ops is None else frozenset(int(o) for o in split_ops)
        self.slots = (gemm_slots(self.gemm, gemm_m, handoff, self.split_ops,
                                 self_scale=self_scale, row_parts=row_parts) if self.gemm else ())
        self.kv = kv
        self.meta = meta
        self.inv_freq = inv_freq
        self.attn = attn
        self.attn_page_size = int(attn.page_size) if attn is not None else 0
        self.embed = embed
        self.last_normed = last_normed
        self.gather = embed is not None or last_normed is not None
        self.splitk = splitk
        self.l2_prefetch = bool(l2_prefetch)
        self.claim_after_loads = (claim_after_loads_for(gemm_m) if claim_after_loads is None
                                  else bool(claim_after_loads))
        self._gemm_t = (gemm_tensor_args(self.gemm, meta, inv_freq, kv, dev)
                        + family_tensor_args(attn, embed, last_normed, dev)
                        + [splitk if splitk is not None
                           else torch.zeros(8, 8, dtype=torch.float32, device=dev)])
        # byte alignment per tensor parameter: int32 metadata and the [P, hq] LSE rows (pitch
        # 4 hq bytes) 4, everything else 16
        self._align = [4 if t.dtype == torch.int32 else 16 for t in self._gemm_t]
        self._align[len(GEMM_OPS) * 3 + 3 + 3] = 4
        self._fixed_args = None                 # _args' DLPack views, made at the first launch
        self._stream_arg = (None, None)         # (the stream tensor, its DLPack view)
        self._compiled = None                   # the variant, once compiled and sized

    # -- compile & launch ---------------------------------------------------------------------
    def _args(self, stream_dev: torch.Tensor, n_ctr: int, cu_stream, n: int | None = None):
        # n: the instructions to run (default the stream's rows; an empty plan launches n = 0
        # over upload()'s one-row placeholder). The DLPack views of the tensors that live as
        # long as the kernel are made once, the
        # stream's once per uploaded stream: ~8 us each, ~33 of them a launch, on the host's
        # path between two steps of a generation loop (bench/host_step.py: launch_args)
        if self._fixed_args is None:
            bufs = self.arena.permute(1, 2, 0)            # (T, H, NBUF), H contiguous
            self._fixed_args = (
                [_dl(self.counters, 4)],
                [_dl(self.state, 4, dynamic=False), _dl(bufs, 16), _dl(self.normw, 16),
                 Int32(self.n_layers), Float32(self.eps), Int64(self.timeout_ns),
                 _dl(self.journal, 8), _dl(self.jcta, 8)]
                + [_dl(t, a) for t, a in zip(self._gemm_t, self._align)])
        if self._stream_arg[0] is not stream_dev:
            self._stream_arg = (stream_dev, _dl(stream_dev, 4))
        counters, rest = self._fixed_args
        n = stream_dev.shape[0] if n is None else n
        return [self._stream_arg[1], Int32(n), *counters, Int32(n_ctr), *rest,
                Int32(self.grid or 1), cu_stream]

    def prepare(self, stream: torch.Tensor, meta_page_size: int | None = None,
                check_stream: torch.Tensor | None = None):
        """Check and upload a plan; returns a handle for launch(). meta_page_size: the step
        metadata's KV page size, if the caller has it on the host (else the kernel checks it).
        check_stream: check these rows instead of the stream's (mk.plan.StepPlan.
        representative_stream of a planner-made stream, whose other rows are copies of them
        shifted by layer); default every row."""
        return self.upload(stream, self.check_stream(
            stream if check_stream is None else check_stream, meta_page_size))

    def check_stream(self, checked: torch.Tensor, meta_page_size: int | None = None) -> int:
        """The host half of prepare(): check the rows `checked` against this kernel's operands;
        returns the counters the plan uses. No device work: a caller may run it while a launch
        is in flight (mk.megakernel_step's pipelined steps)."""
        return check_plan(checked, self.nbuf, self.T, self.H, self.counters.numel(),
                          gemm=self.gemm, slots=self.slots,
                          kv_shape=None if self.kv is None else tuple(self.kv.shape),
                          attn=self.attn,
                          embed_shape=None if self.embed is None else tuple(self.embed.shape),
                          last_normed_shape=(None if self.last_normed is None
                                             else tuple(self.last_normed.shape)),
                          meta_page_size=meta_page_size,
                          splitk_shape=None if self.splitk is None else tuple(self.splitk.shape),
                          l2_prefetch=self.l2_prefetch)

    def upload(self, stream: torch.Tensor, n_ctr: int):
        """The device half of prepare(): the stream on the device, as launch()'s handle (n_ctr:
        check_stream's count for it)."""
        s = stream.to(self.arena.device, torch.int32).contiguous()
        if s.shape[0] == 0:
            s = torch.zeros((1, INSTR_WORDS), dtype=torch.int32, device=self.arena.device)
            n = 0
        else:
            n = s.shape[0]
        return s, n, max(n_ctr, 1)

    def _ensure_compiled(self, s, n_ctr):
        import cuda.bindings.driver as drv
        cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
        if self._compiled is not None and self.grid is not None:
            return self._compiled, cs
        if self.grid is None:
            self.grid = 1
            comp = compile_megakernel(self._args(s, n_ctr, cs), self.journal_on, self.verbose,
                                      self._shape_key, self.handoff, self.backoff_ns, self.slots,
                                      self.attn_page_size, self.gather, self.splitk is not None,
                                      self.l2_prefetch, self.claim_after_loads)
            nb, src = resident_blocks_per_sm(
                comp, smem_bytes_estimate(claim_after_loads=self.claim_after_loads))
            assert nb >= 1, f"megakernel: {nb} resident blocks per SM ({src})"
            self.blocks_per_sm = nb
            self.occupancy_source = src
            self.grid = self._grid_override or self.num_sms * nb
            assert self.grid <= self.num_sms * nb, "more CTAs than can be resident would deadlock"
            assert self.grid <= self.jcta.shape[0]
            if self.verbose:
                print(f"[mk.megakernel] grid {self.grid} = {self.num_sms} SMs x {nb} blocks/SM "
                      f"({src})", flush=True)
        self._compiled = compile_megakernel(self._args(s, n_ctr, cs), self.journal_on, False,
                                            self._shape_key, self.handoff, self.backoff_ns,
                                            self.slots, self.attn_page_size, self.gather,
                                            self.splitk is not None, self.l2_prefetch,
                                            self.claim_after_loads)
        return self._compiled, cs

    def launch(self, prepared, check: bool = True, record: bool = False
               ) -> "LaunchRecord | None":
        """Launch a prepared plan on the current stream. check: wait for it (bounded) and raise
        its error; else, with record, return its LaunchRecord for finish_launch() (the launch's
        own end and its state words, so that a launch queued behind it is not waited for; at
        most LAUNCH_RECORDS such launches unfinished: one more is refused before it launches),
        without it leave it to wait() and check()."""
        s, n, n_ctr = prepared
        comp, cs = self._ensure_compiled(s, n_ctr)
        args = self._args(s, n_ctr, cs, n)
        self._ensure_hang_probe()       # before the launch, also for a later wait()
        rec = self._free_record() if record and not check else None
        comp(*args)
        if check:
            self.wait(self.hang_s)
            self.check()
            return None
        if rec is not None:
            # the state words as the teardown left them, copied behind the launch into a
            # page-locked slot: finish_launch reads them without a synchronous copy (which would
            # wait for any launch queued after this one)
            self._launches += 1
            rec.host.copy_(self.state, non_blocking=True)
            rec.done.record()
            rec.pending = True
        return rec

    def _free_record(self) -> "LaunchRecord":
        slots = self._records
        rec = slots[self._launches % len(slots)]
        if rec.pending:
            raise RuntimeError(f"Megakernel: {len(slots)} recorded launches in flight without "
                               f"finish_launch, the most that are kept apart")
        return rec

    def finish_launch(self, rec: "LaunchRecord", hang_s: float | None = None) -> None:
        """Wait (bounded by hang_s, default self.hang_s) for the launch that returned rec, and
        raise MegakernelError if one of its bounded waits timed out, as wait() + check() do for
        the last launch."""
        if not rec.pending:
            raise RuntimeError("Megakernel.finish_launch: this launch was finished already")
        self._poll(rec.done, self.hang_s if hang_s is None else hang_s)
        rec.pending = False
        self._check_words([int(v) for v in rec.host.tolist()])

    def drop_launch(self, rec: "LaunchRecord") -> None:
        """Forget a recorded launch without waiting for it: one queued behind a launch that
        failed (after a hang nothing more can be waited for; an error's reset() synchronised the
        device, and the launches behind ran with its abort flag set)."""
        rec.pending = False

    def launcher(self, prepared):
        """A no-argument launch on the then-current stream (for CUDA-graph capture / benchmarks;
        wait() after it reports a hang, its objects made here, before any launch)."""
        s, n, n_ctr = prepared
        comp, _ = self._ensure_compiled(s, n_ctr)
        self._ensure_hang_probe()

        def go():
            import cuda.bindings.driver as drv
            cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
            comp(*self._args(s, n_ctr, cs, n))
        return go

    def run(self, stream: torch.Tensor, check: bool = True):
        self.launch(self.prepare(stream), check)

    def _ensure_hang_probe(self):
        """wait()'s CUDA objects, made before a launch: a page-locked allocation while the kernel
        runs would order the state read after it (CUDA's implicit synchronisation rules), so a
        hung launch's report would hang too."""
        if self._hang_probe is not None:
            return
        # normal tensors even when the first launch runs in inference mode: later launches copy
        # into them in place, in whatever mode their caller runs
        with torch.inference_mode(False):
            self._hang_probe = (torch.cuda.Event(), torch.cuda.Stream(device=self.state.device),
                                torch.cuda.Event(),
                                torch.zeros(rk.STATE_WORDS, dtype=torch.int32).pin_memory())
            self._records = tuple(
                LaunchRecord(torch.cuda.Event(),
                             torch.zeros(rk.STATE_WORDS, dtype=torch.int32).pin_memory())
                for _ in range(LAUNCH_RECORDS))

    def wait(self, hang_s: float = 20.0):
        """Wait for the launch; if it still runs after hang_s (a wait that is not bounded:
        setmaxnreg, a named barrier, the teardown's sync), read the state words through a
        non-blocking side stream and raise MegakernelHang (the process's context is lost then)."""
        self._ensure_hang_probe()
        launch_done = self._hang_probe[0]
        launch_done.record()
        self._poll(launch_done, hang_s)

    def _poll(self, launch_done, hang_s: float):
        """Wait for the event launch_done, recorded behind a launch (the hang report: wait())."""
        _, side, read_done, host = self._hang_probe
        t0 = time.time()
        while not launch_done.query():
            if time.time() - t0 > hang_s:
                with torch.cuda.stream(side):
                    host.copy_(self.state, non_blocking=True)
                    read_done.record(side)
                t1 = time.time()
                while not read_done.query() and time.time() - t1 < 5:
                    time.sleep(0.01)
                st = host.tolist() if read_done.query() else None
                raise MegakernelHang(hang_report(hang_s, st, self.grid))
            # a step takes a few ms: no timer sleep (~1 ms of latency a step), but let other
            # threads run (the GIL) while polling
            time.sleep(0)

    def check(self):
        """Synchronise and raise MegakernelError if a bounded wait timed out."""
        self._check_words([int(v) for v in self.state.cpu()])

    def _check_words(self, st: list[int]):
        if st[rk.S_ERR_FLAG] or st[rk.S_ABORT]:
            e = error_of_state(st)
            self.reset()
            raise e
        if st[rk.S_HEAD] or st[rk.S_EXIT]:
            raise RuntimeError(f"megakernel state not reset by the kernel: head {st[rk.S_HEAD]} "
                               f"exit {st[rk.S_EXIT]}")

    def reset(self):
        """After an error: clear counters, queue and error record (not on the critical path)."""
        self.counters.zero_()
        self.state.zero_()
        torch.cuda.synchronize()

    def journal_rows(self, n: int):
        return self.journal[:n].cpu(), self.jcta[:self.grid].cpu()


# ==================================================================================== CPU compile
def fake_args(gemm: tuple = (), attention: bool = False):
    """Fake (dynamic-shape) arguments for a CPU compile for sm_90a (the compile gate): the
    arena, norm table and, for each GEMM slot, x (T, K, Z) / w (N, K, L) / y (T, N, Z) with the
    divisibility a real plan guarantees (K % 64, N % 8); the attention buffers (widths multiples
    of the head dim 128), the embedding table and LAST_NORMED."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor
    S = cute.sym_int
    T, H, NB = S(), S(divisibility=8), S()
    args = [make_fake_compact_tensor(Int32, (S(), INSTR_WORDS), stride_order=(1, 0),
                                     assumed_align=4), Int32(1),
            make_fake_compact_tensor(Int32, (S(),), assumed_align=4), Int32(1),
            make_fake_compact_tensor(Int32, (rk.STATE_WORDS,), assumed_align=4),
            make_fake_tensor(BFloat16, (T, H, NB), stride=(S(divisibility=8), 1, S(divisibility=8)),
                             assumed_align=16),
            make_fake_tensor(BFloat16, (S(), H), stride=(S(divisibility=8), 1), assumed_align=16),
            Int32(1), Float32(1e-5), Int64(1),
            make_fake_compact_tensor(Int64, (S(), JOURNAL_WORDS), stride_order=(1, 0),
                                     assumed_align=8),
            make_fake_compact_tensor(Int64, (S(), JCTA_WORDS), stride_order=(1, 0),
                                     assumed_align=8)]
    ops = {g.op for g in gemm}
    for op in GEMM_OPS:
        out_ty = Float32 if op == int(Op.LM_HEAD) else BFloat16
        if op in ops:
            Tg, Kd, Nd = S(), S(divisibility=64), S(divisibility=8)
            args += [make_fake_tensor(BFloat16, (Tg, Kd, S()), stride=(S(divisibility=64), 1,
                                      S(divisibility=64)), assumed_align=16),
                     make_fake_tensor(BFloat16, (Nd, Kd, S()), stride=(S(divisibility=64), 1,
                                      S(divisibility=64)), assumed_align=16),
                     make_fake_tensor(out_ty, (Tg, Nd, S()), stride=(S(divisibility=8), 1,
                                      S(divisibility=8)), assumed_align=16)]
        else:
            args += [make_fake_tensor(BFloat16, (S(), S(), S()), stride=(S(), 1, S()),
                                      assumed_align=16) for _ in range(3)]
    kd = 128 if attention else 8
    args += [make_fake_compact_tensor(Int32, (S(),), assumed_align=4),
             make_fake_compact_tensor(Float32, (64,), assumed_align=16),
             make_fake_tensor(BFloat16, (S(), S(divisibility=kd), 2),
                              stride=(S(divisibility=kd), 1, S(divisibility=kd)), assumed_align=16)]
    W = S(divisibility=128)
    args += [make_fake_tensor(BFloat16, (S(), W), stride=(S(divisibility=128), 1), assumed_align=16),
             make_fake_tensor(BFloat16, (S(), W), stride=(S(divisibility=128), 1), assumed_align=16),
             make_fake_tensor(Float32, (S(), W), stride=(S(divisibility=128), 1), assumed_align=16),
             make_fake_tensor(Float32, (S(), S()), stride=(S(), 1), assumed_align=4),
             make_fake_tensor(BFloat16, (S(), H), stride=(S(divisibility=8), 1), assumed_align=16),
             make_fake_tensor(BFloat16, (S(), H), stride=(S(divisibility=8), 1), assumed_align=16),
             # SPLITK: float32 [rows, width], width a multiple of 8 (check_plan)
             make_fake_tensor(Float32, (S(), S(divisibility=8)), stride=(S(divisibility=8), 1),
                              assumed_align=16),
             Int32(132), make_fake_stream()]
    return args


def compile_fake(journal: bool = False, handoff: str | None = None, gemm: tuple = (),
                 backoff_ns: int = DEFAULT_BACKOFF_NS, attn_page_size: int = 0,
                 gather: bool = False, splitk: bool = False, l2_prefetch: bool = False,
                 claim_after_loads: bool | None = None):
    """cute.compile for sm_90a on the CPU (fake tensors); the compiled object keeps its PTX.
    attn_page_size: compile the attention family in for that KV page size (0: not); splitk:
    compile the split-K tiles and SPLITK_REDUCE in; l2_prefetch: L2_PREFETCH;
    claim_after_loads None: as MK_CLAIM_AFTER_LOADS says, else off."""
    if claim_after_loads is None:
        claim_after_loads = claim_after_loads_for(None)
    if handoff is None:
        handoff = default_handoff(attn_page_size > 0)
    dsl = MegakernelDSL(journal=journal, handoff=handoff, backoff_ns=backoff_ns, gemm=gemm,
                        attn_page_size=attn_page_size, gather=gather, splitk=splitk,
                        l2_prefetch=l2_prefetch, claim_after_loads=claim_after_loads)
    return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN](
        dsl, *fake_args(gemm, attn_page_size > 0))


# Builds of the kernel for bisecting what its compiled-in code costs (launch/bench.py
# --isolated-builds, bench/code_size.py --build; bench/GEMM_NOTES.md session 42): name ->
# (only the measured opcode's GEMM slot, else every GEMM slot; the attention and gather families)
BUILDS = {"full": (False, True), "lean": (True, False), "gemms": (False, False),
          "families": (True, True)}


def norm_row_batch(gemm: tuple) -> int:
    """RMSNORM's rows per load group in a variant of GEMM slots gemm: 1 without any (the
    rows-only journal variant spills with 2), rk.NORM_ROW_BATCH with 64-row tiles (the M64
    class), else rk.NORM_ROW_BATCH_BIG."""
    if not gemm:
        return 1
    if any(g.cfg.bm == 64 for g in gemm):
        return rk.NORM_ROW_BATCH
    return rk.NORM_ROW_BATCH_BIG


def class_slots(m: int, ops=GEMM_OPS, xb: int = 0, yb: int = 0, split_ops=None,
                twin: bool | None = None, self_scale: bool = False,
                row_parts: bool = False) -> tuple:
    """The GEMM slots of M class m for opcodes ops (buffer ids xb / yb at z = 0); split_ops:
    the opcodes whose split tiles they run (None: every one that can, GemmSlot.splits); twin:
    pair_twins' (None: GEMM_TWIN; the fake operands' destinations taken as one tensor);
    self_scale: GemmSlot.self_scale of the row-scaled opcodes; row_parts: GemmSlot.row_parts
    of ROW_PART_OPS."""
    return pair_twins(sorted((GemmSlot(int(op), gk.choose_tile(op, m).name, xb, yb,
                                       split_ops is None or int(op) in split_ops,
                                       self_scale=self_scale and int(op) in ROW_SCALED_OPS,
                                       row_parts=row_parts and int(op) in ROW_PART_OPS)
                              for op in ops), key=lambda g: g.slot), twin=twin)


# ==================================================================================== test plans
def rows_oracle(stream: torch.Tensor, arena: torch.Tensor, weights) -> torch.Tensor:
    """The CPU oracle: the rows family's torch faces in queue order on a copy of the arena.

    Uses mk.vm when it can run the stream; else a tiny state with .buf(id), .weights, .rank."""
    from mk.instructions.base import family_of
    from mk.ir import deserialize

    class _State:
        def __init__(self, bufs, weights):
            self.bufs, self.weights, self.rank = bufs, weights, 0

        def buf(self, i, rank=None):
            return self.bufs[i]

    bufs = arena.detach().cpu().clone()
    st = _State(bufs, weights)
    for ins in deserialize(stream.cpu()):
        family_of(ins.opcode).run_torch(ins, st)
    return bufs


def _ri(op, src, dst, row0, rows, col0, cols, waits=(), signal=-1, layer=0, which=0):
    from mk.instructions.rows import rows_instruction
    return rows_instruction(Op(op), Buf(src), Buf(dst), row0, rows, col0, cols, layer=layer,
                            norm_weight=NormWeight(which), waits=list(waits), signal=signal)


def _random_topo(instrs, preds, rng):
    """A random topological order (random Kahn) of instructions with predecessor lists."""
    n = len(instrs)
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    for i, ps in enumerate(preds):
        for p in set(ps):
            succ[p].append(i)
            indeg[i] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        k = rng.randrange(len(ready))
        i = ready[k]
        ready[k] = ready[-1]
        ready.pop()
        order.append(i)
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    assert len(order) == n, "cycle in the test DAG"
    return [instrs[i] for i in order]


def plan_layers(T: int, H: int, n_layers: int, seed: int = 0, tile_rows=(8, 16, 24, 32),
                col_splits=(1, 2, 4), with_norm: bool = True, shuffle: bool = True, noops: int = 0):
    """A DAG shaped like the norm/residual part of a model, in a random topological queue order.

    Per layer and row tile r: RMSNORM(HIDDEN->NORMED) [or COPY when with_norm=False] signals A;
    k column tiles COPY(NORMED->SCRATCH) wait A>=1 and signal B; k column tiles
    RESIDUAL_ADD(SCRATCH->HIDDEN) wait B>=k (exact arrivals) and signal C; the next layer's first
    instruction of the tile waits C>=k. Row tiles of varying sizes; NOOPs with random waits."""
    import random
    rng = random.Random(seed)
    tiles = []
    r = 0
    while r < T:
        rows = min(rng.choice(tile_rows), T - r)
        tiles.append((r, rows))
        r += rows
    instrs, preds = [], []
    nctr = 0
    last_c = {}                       # tile -> (counter, target, producing instruction ids)
    for layer in range(n_layers):
        for ti, (r0, rows) in enumerate(tiles):
            k = rng.choice(col_splits)
            while H % (8 * k):
                k //= 2
            w = H // k
            a, b, c = nctr, nctr + 1, nctr + 2
            nctr += 3
            prev = last_c.get(ti)
            waits = [(prev[0], prev[1])] if prev else []
            pp = prev[2] if prev else []
            if with_norm:
                i0 = _ri(Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, r0, rows, 0, H, waits, a, layer,
                         rng.choice((0, 1)))
            else:
                i0 = _ri(Op.COPY, Buf.HIDDEN, Buf.NORMED, r0, rows, 0, H, waits, a)
            instrs.append(i0)
            preds.append(pp)
            ia = len(instrs) - 1
            copies = []
            for j in range(k):
                instrs.append(_ri(Op.COPY, Buf.NORMED, Buf.SCRATCH, r0, rows, j * w, w, [(a, 1)], b))
                preds.append([ia])
                copies.append(len(instrs) - 1)
            adds = []
            for j in range(k):
                instrs.append(_ri(Op.RESIDUAL_ADD, Buf.SCRATCH, Buf.HIDDEN, r0, rows, j * w, w,
                                  [(b, k)], c))
                preds.append(copies)
                adds.append(len(instrs) - 1)
            last_c[ti] = (c, k, adds)
    for _ in range(noops):
        j = rng.randrange(len(instrs))
        src = instrs[j]
        if src.signal >= 0:   # exact target: every signaler of that counter
            sigs = [i for i, x in enumerate(instrs) if x.signal == src.signal]
            instrs.append(_ri(Op.NOOP, 0, 0, 0, 0, 0, 0, [(src.signal, len(sigs))], nctr))
            preds.append(sigs)
            nctr += 1
    order = _random_topo(instrs, preds, rng) if shuffle else instrs
    from mk.ir import serialize
    return serialize(order), nctr


def plan_chain(n: int, T: int, H: int, rows: int = 8, ops=("copy", "add"), chains: int = 1):
    """`chains` independent dependency chains of n instructions each (interleaved in the queue, so
    consecutive links run on different SMs): instruction i of a chain waits for link i-1's counter.
    ops cycles through 'copy' (HIDDEN->SCRATCH), 'add' (SCRATCH->NORMED), 'norm' (HIDDEN->NORMED),
    'noop'."""
    from mk.ir import serialize
    instrs = []
    for i in range(n):
        for ch in range(chains):
            r0 = (ch * rows) % max(T - rows + 1, 1)
            c = ch * n + i
            waits = [(c - 1, 1)] if i else []
            kind = ops[i % len(ops)]
            if kind == "copy":
                ins = _ri(Op.COPY, Buf.HIDDEN, Buf.SCRATCH, r0, rows, 0, H, waits, c)
            elif kind == "add":
                ins = _ri(Op.RESIDUAL_ADD, Buf.SCRATCH, Buf.NORMED, r0, rows, 0, H, waits, c)
            elif kind == "norm":
                ins = _ri(Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, r0, rows, 0, H, waits, c)
            else:
                ins = _ri(Op.NOOP, 0, 0, 0, 0, 0, 0, waits, c)
            instrs.append(ins)
    return serialize(instrs), n * chains


def plan_noops(n: int, signal: bool = False):
    from mk.ir import serialize
    nc = min(n, 4096)    # signals spread over 4096 counters nobody waits on
    return serialize([_ri(Op.NOOP, 0, 0, 0, 0, 0, 0, [], (i % nc if signal else -1))
                      for i in range(n)]), (nc if signal else 0)


def plan_page_cycle(k: int, T: int, H: int, seed: int = 0):
    """Instructions sized so that 1 page-pool cycle (NPAGES pages) holds about k instructions:
    each uses ceil(NPAGES / k) pages (H <= 1024: one page per 8-row group; RESIDUAL_ADD uses two
    pages per chunk). Dependent pairs, random queue order."""
    import random
    rng = random.Random(seed)
    assert H <= rk.PC
    pages = max(1, -(-NPAGES // k))
    instrs, preds = [], []
    r = 0
    ctr = 0
    while r + 8 <= T:
        op = rng.choice((Op.COPY, Op.RMSNORM, Op.RESIDUAL_ADD))
        rows = 8 * (max(1, pages // 2) if op == Op.RESIDUAL_ADD else pages)
        rows = min(rows, T - r)
        if op == Op.RMSNORM:
            instrs.append(_ri(op, Buf.HIDDEN, Buf.NORMED, r, rows, 0, H, [], ctr))
        elif op == Op.COPY:
            instrs.append(_ri(op, Buf.HIDDEN, Buf.NORMED, r, rows, 0, H, [], ctr))
        else:
            instrs.append(_ri(Op.COPY, Buf.HIDDEN, Buf.NORMED, r, rows, 0, H, [], ctr))
        preds.append([])
        instrs.append(_ri(Op.RESIDUAL_ADD, Buf.NORMED, Buf.SCRATCH, r, rows, 0, H, [(ctr, 1)], ctr + 1))
        preds.append([len(instrs) - 2])
        ctr += 2
        r += rows
    from mk.ir import serialize
    return serialize(_random_topo(instrs, preds, rng)), ctr


# ==================================================================================== rows runner
def require_gpu(what: str = "the megakernel backend", hint: str = " (use --backend vm on the CPU)"):
    """RuntimeError unless a Hopper (sm_90) GPU is visible."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU (Hopper, sm_90); none is visible{hint}")
    cap = torch.cuda.get_device_capability()
    if cap[0] < 9:
        raise RuntimeError(f"{what} needs a Hopper GPU (sm_90); this one is sm_{cap[0]}{cap[1]}")


class RowsStreamRunner:
    """The selftest's runner: streams made only of the rows family (NOOP/COPY/RMSNORM/
    RESIDUAL_ADD) on the GPU over one arena (see `python -m mk.megakernel selftest`). The model
    step's backend (`--backend megakernel`) is mk.megakernel_step.MegakernelStepBackend."""

    def __init__(self, weights):
        require_gpu()
        self.weights = weights
        self._mk = {}

    def run_stream(self, stream: torch.Tensor, arena: torch.Tensor) -> torch.Tensor:
        """Run a rows-family stream on arena [NBUF, T, H] (any device); returns the new arena."""
        cfg = self.weights.config
        key = tuple(arena.shape)
        if key not in self._mk:
            buf = torch.zeros(arena.shape, dtype=torch.bfloat16, device="cuda")
            self._mk[key] = Megakernel(buf, norm_table(self.weights).cuda(), cfg.num_layers,
                                       cfg.rms_norm_eps)
        mk = self._mk[key]
        mk.arena.copy_(arena)
        mk.run(stream)
        return mk.arena.to(arena.device, arena.dtype)


# ==================================================================================== selftest
def selftest(argv=None) -> int:
    """`python -m mk.megakernel selftest`: rows-only plans on the GPU vs the torch faces."""
    import argparse
    import json
    import types

    ap = argparse.ArgumentParser(prog="python -m mk.megakernel selftest",
                                 description=selftest.__doc__)
    ap.add_argument("--model", default=None, help="HF Llama checkpoint (norm weights and H); "
                    "default: the tiny random checkpoint")
    ap.add_argument("--tokens", type=int, default=256, help="token rows T of the buffers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON summary line")
    a = ap.parse_args(argv)
    try:
        require_gpu("the megakernel selftest", hint="")
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from pathlib import Path

    from mk.config import ParallelConfig
    from mk.weights import load_rank_weights
    if a.model is None:
        from mk.tiny import tiny_checkpoint
        model_dir = Path(tiny_checkpoint())
    else:
        model_dir = Path(a.model)
    w = load_rank_weights(model_dir, ParallelConfig(), dtype=torch.bfloat16,
                          device=torch.device("cpu"), progress=False)
    cfg = w.config
    T, H, L = a.tokens, cfg.hidden_size, cfg.num_layers
    be = RowsStreamRunner(w)
    wc = types.SimpleNamespace(attn_norm=w.attn_norm, mlp_norm=w.mlp_norm,
                               final_norm=w.final_norm, config=cfg)
    plans = [
        ("layers (RMSNORM/COPY/RESIDUAL_ADD DAG, random queue order)",
         plan_layers(T, H, L, seed=a.seed, noops=20), False),
        ("layers without RMSNORM (bit-exact)",
         plan_layers(T, H, L, seed=a.seed + 1, with_norm=False, noops=10), True),
        ("8 cross-SM chains of COPY/RESIDUAL_ADD/NOOP (bit-exact)",
         plan_chain(100, T, H, rows=8, ops=("copy", "add", "noop"), chains=8), True),
    ]
    g = torch.Generator().manual_seed(a.seed)
    results, ok_all = [], True
    for name, (stream, _n_ctr), exact in plans:
        x0 = torch.randn(3, T, H, generator=g).bfloat16()
        t0 = time.time()
        got = be.run_stream(stream, x0)
        dt = time.time() - t0
        want = rows_oracle(stream, x0, wc)
        if exact:
            ok = bool(torch.equal(got, want))
        else:   # RMSNORM's fp32 statistic is summed in another order than torch
            ok = bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2))
        err = float((got.float() - want.float()).abs().max())
        ok_all &= ok
        results.append(dict(plan=name, instructions=int(stream.shape[0]), exact=exact, ok=ok,
                            max_abs_err=err, seconds=round(dt, 3)))
        print(f"[mk.megakernel selftest] {'ok  ' if ok else 'FAIL'} {name}: "
              f"{stream.shape[0]} instructions, max |err| {err:.3g}, {dt:.2f} s", file=sys.stderr)
    summary = dict(passed=ok_all, device=torch.cuda.get_device_name(), model=str(model_dir),
                   T=T, H=H, layers=L, plans=results)
    if a.json:
        print(json.dumps(summary), flush=True)
    print(f"[mk.megakernel selftest] {'passed' if ok_all else 'FAILED'}", file=sys.stderr)
    return 0 if ok_all else 1


def _main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "selftest":
        print("usage: python -m mk.megakernel selftest [--model DIR] [--tokens T] [--json]",
              file=sys.stderr)
        return 2
    return selftest(argv[1:])


if __name__ == "__main__":
    sys.exit(_main())
