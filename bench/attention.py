"""ATTENTION / ATTN_REDUCE on the GPU: a standalone harness kernel running the CuTe DSL bodies of
mk/instructions/_attention_kernel.py with the megakernel's roles and page protocol, checks against
the torch faces (mk/instructions/attention.py) on plans made by mk.plan for real batches, and timing
against torch SDPA (flash) on the same GPU.

One command on the GPU machine:

    python bench/attention.py                 # checks (all cases) + timing, JSON to bench/results
    python bench/attention.py --check-only
    python bench/attention.py --compile-only  # CPU: compile for sm_90a (CUTE_DSL_ARCH=sm_90a)

Harness kernel (384 threads, like the megakernel after the GEMM wiring):
    warp 0      idle here (the megakernel's controller; no counter waits are needed: a launch holds
                instructions without dependencies: all ATTENTION, then a second launch of all
                ATTN_REDUCE)
    warp 1      loader     ak.attn_load / ak.reduce_load
    warps 2-3   storer     ak.attn_store / ak.reduce_store, then fence + red.release of the signal
    warps 4-11  consumers  ak.attn_consume / ak.reduce_consume (setmaxregister_increase)
CTA b runs instructions b, b + grid, b + 2 grid, ... with the page count `pg` carried across them
(the megakernel's ring), so page-ring wrap-around across instructions is exercised too. The
signals land in a counters array; after both launches every signalled counter must equal its
plan target (SPLIT: groups x splits, ATTN: per block).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mk.instructions import _attention_kernel as ak  # noqa: E402
from mk.instructions import _rows_kernel as rk  # noqa: E402
from mk.instructions import attention as at  # noqa: E402
from mk.ir import (INSTR_WORDS, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0, W_ROWS,  # noqa: E402
                   W_SIGNAL, W_SIGNAL_COUNT, Op)

THREADS = 384
NPAGES = 13
LAUNCH_REGS = (65536 // THREADS) // 8 * 8        # 168
REG_LOW = int(os.environ.get("MK_ATTN_REG_LOW", 72))
REG_HIGH = int(os.environ.get("MK_ATTN_REG_HIGH", 216))
BAR_STORER = 2
N_STORER = 64


def reg_split_ok(low: int = REG_LOW, high: int = REG_HIGH) -> bool:
    return 128 * low + 256 * high <= THREADS * LAUNCH_REGS and low % 8 == 0 and high % 8 == 0


class AttnHarnessDSL:
    """q: (T, hq*D) bf16; kv: (KVROWS, hkv*D, 2) bf16 (z = 0 K cache, 1 V cache); out: (T, hq*D)
    bf16; part: (P, hq*D) fp32; lse: (P, hq) fp32; meta: the step metadata (int32)."""

    def __init__(self, page_size: int, npages: int = NPAGES):
        assert reg_split_ok(), f"setmaxnreg {REG_LOW}/{REG_HIGH} over-subscribes the CTA"
        self.page_size = page_size
        self.npages = npages

    @cute.jit
    def __call__(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor,
                 state: cute.Tensor, meta: cute.Tensor, q: cute.Tensor, kv: cute.Tensor,
                 out: cute.Tensor, part: cute.Tensor, lse: cute.Tensor, timeout_ns: Int64,
                 grid: Int32, stream):
        a = ak.AttnAtoms(kv, self.page_size)

        @cute.struct
        class Storage:
            full: cute.struct.MemRange[cutlass.Int64, self.npages]
            empty: cute.struct.MemRange[cutlass.Int64, self.npages]
            done: cute.struct.MemRange[cutlass.Int64, self.npages]
            pool: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.npages * ak.PAGE], 1024]
        self.storage = Storage
        self.kernel(instrs, n_instr, counters, state, meta, q, a.tma, a.gKV, a.box_layout,
                    a.mma_qk, a.mma_pv, a.sK_layout, a.sV_layout, out, part, lse,
                    timeout_ns).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream,
                                       max_number_threads=[THREADS, 1, 1], min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor,
               state: cute.Tensor, meta: cute.Tensor, q: cute.Tensor, tma: cute.CopyAtom,
               gKV: cute.Tensor, box_layout: cute.ComposedLayout, mma_qk: cute.TiledMma,
               mma_pv: cute.TiledMma, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, out: cute.Tensor, part: cute.Tensor,
               lse: cute.Tensor, timeout_ns: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        NP = self.npages
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        full = st.full.data_ptr()
        empty = st.empty.data_ptr()
        done = st.done.data_ptr()
        pool = st.pool.data_ptr().toint()
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma)
            with cute.arch.elect_one():
                for p in cutlass.range_constexpr(NP):
                    cute.arch.mbarrier_init(full + p, 1)
                    cute.arch.mbarrier_init(empty + p, ak.EMPTY_ARRIVALS)
                    cute.arch.mbarrier_init(done + p, ak.DONE_ARRIVALS)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp < 4:
            cute.arch.setmaxregister_decrease(REG_LOW)
            if warp == 1:
                # ------------------------------------------------------------ loader
                pg = Int32(0)
                t = Int32(bidx)
                while t < n_instr:
                    op = instrs[t, W_OPCODE]
                    if op == ak.OP_ATTENTION:
                        pg = ak.attn_load(tma, gKV, box_layout, self.page_size, meta,
                                          instrs[t, W_LAYER], instrs[t, W_ROWS], instrs[t, W_COL0],
                                          instrs[t, W_COLS], instrs[t, at.A_POS0],
                                          instrs[t, at.A_KV0], instrs[t, at.A_KV1],
                                          instrs[t, at.A_PAGE_OFF], instrs[t, at.A_MODE],
                                          instrs[t, at.A_QPK], pool, full, empty, pg, NP,
                                          timeout_ns, state, t)
                    elif op == ak.OP_ATTN_REDUCE:
                        pg = ak.reduce_load(instrs[t, W_ROWS], instrs[t, W_COLS],
                                            instrs[t, at.A_QPK], pool, full, empty, pg, NP,
                                            timeout_ns, state, t)
                    t = t + gdim
            elif warp >= 2:
                # ------------------------------------------------------------ storer (warps 2-3)
                sid = tidx - 64
                pg = Int32(0)
                t = Int32(bidx)
                out_base = out.iterator.toint()
                part_base = part.iterator.toint()
                lse_base = lse.iterator.toint()
                ldo = out.shape[1]
                ldp = part.shape[1]
                ldl = lse.shape[1]
                while t < n_instr:
                    op = instrs[t, W_OPCODE]
                    if op == ak.OP_ATTENTION:
                        pg = ak.attn_store(out_base, ldo, part_base, ldp, lse_base, ldl,
                                           instrs[t, W_ROW0], instrs[t, W_ROWS], instrs[t, W_COL0],
                                           instrs[t, W_COLS], instrs[t, at.A_POS0],
                                           instrs[t, at.A_KV0], instrs[t, at.A_KV1],
                                           instrs[t, at.A_MODE], instrs[t, at.A_QPK],
                                           instrs[t, at.A_SLOT], pool, empty, done, pg, NP, sid,
                                           BAR_STORER, N_STORER, timeout_ns, state, t)
                    elif op == ak.OP_ATTN_REDUCE:
                        pg = ak.reduce_store(out_base, ldo, instrs[t, W_ROW0], instrs[t, W_ROWS],
                                             instrs[t, W_COL0], instrs[t, W_COLS],
                                             instrs[t, at.A_QPK], pool, empty, done, pg, NP, sid,
                                             BAR_STORER, N_STORER, timeout_ns, state, t)
                    cute.arch.barrier(barrier_id=BAR_STORER, number_of_threads=N_STORER)
                    if sid == 0:
                        sig = instrs[t, W_SIGNAL]
                        if sig >= 0:
                            cute.arch.fence_acq_rel_gpu()
                            cute.arch.red((counters.iterator + sig).llvm_ptr,
                                          instrs[t, W_SIGNAL_COUNT], op="add", dtype="s32",
                                          sem="release", scope="gpu")
                    t = t + gdim
        else:
            # ---------------------------------------------------------------- consumers (2 WGs)
            cute.arch.setmaxregister_increase(REG_HIGH)
            ctid = tidx - 128
            pg = Int32(0)
            t = Int32(bidx)
            q_base = q.iterator.toint()
            ldq = q.shape[1]
            while t < n_instr:
                op = instrs[t, W_OPCODE]
                if op == ak.OP_ATTENTION:
                    pg = ak.attn_consume(mma_qk, mma_pv, sK_layout, sV_layout, q_base, ldq,
                                         instrs[t, W_ROW0], instrs[t, W_ROWS], instrs[t, W_COL0],
                                         instrs[t, W_COLS], instrs[t, at.A_POS0],
                                         instrs[t, at.A_KV0], instrs[t, at.A_KV1],
                                         instrs[t, at.A_MODE], instrs[t, at.A_QPK], pool, full,
                                         empty, done, pg, NP, ctid, timeout_ns, state, t)
                elif op == ak.OP_ATTN_REDUCE:
                    pg = ak.reduce_consume(part, lse, instrs[t, W_ROW0], instrs[t, W_ROWS],
                                           instrs[t, W_COL0], instrs[t, W_COLS],
                                           instrs[t, at.A_SLOT0], instrs[t, at.A_NSPLIT],
                                           instrs[t, at.A_QPK], pool, full, done, pg, NP, ctid,
                                           timeout_ns, state, t)
                t = t + gdim
        cute.arch.sync_threads()


# ============================================================================ CPU compile (fake)
def fake_args():
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor
    S = cute.sym_int
    W, WK, HQ = S(divisibility=128), S(divisibility=128), S()
    q = make_fake_tensor(BFloat16, (S(), W), stride=(S(divisibility=128), 1), assumed_align=16)
    kv = make_fake_tensor(BFloat16, (S(), WK, 2), stride=(S(divisibility=128), 1, S(divisibility=128)),
                          assumed_align=16)
    out = make_fake_tensor(BFloat16, (S(), W), stride=(S(divisibility=128), 1), assumed_align=16)
    part = make_fake_tensor(Float32, (S(), W), stride=(S(divisibility=128), 1), assumed_align=16)
    lse = make_fake_tensor(Float32, (S(), HQ), stride=(S(), 1), assumed_align=4)
    return [make_fake_compact_tensor(Int32, (S(), INSTR_WORDS), stride_order=(1, 0), assumed_align=4),
            Int32(1), make_fake_compact_tensor(Int32, (S(),), assumed_align=4),
            make_fake_compact_tensor(Int32, (rk.STATE_WORDS,), assumed_align=4),
            make_fake_compact_tensor(Int32, (S(),), assumed_align=4), q, kv, out, part, lse,
            Int64(1), Int32(132), make_fake_stream()]


def compile_fake(page_size: int = 16, npages: int = NPAGES):
    """cute.compile for sm_90a on the CPU; returns the compiled object (PTX in __ptx__)."""
    return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN](
        AttnHarnessDSL(page_size, npages), *fake_args())


if __name__ == "__main__" and "--compile-only" in sys.argv:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    for ps in (16, 64):
        t0 = time.time()
        comp = compile_fake(ps)
        print(f"page_size {ps}: compiled in {time.time() - t0:.1f}s, PTX {len(comp.__ptx__ or '')} chars")
    sys.exit(0)
