"""ATTENTION / ATTN_REDUCE on the GPU: a standalone harness kernel running the CuTe DSL bodies of
mk/instructions/_attention_kernel.py with the megakernel's roles and page protocol, checks against
the torch faces (mk/instructions/attention.py) on plans made by mk.plan for real batches, and timing
against torch SDPA (flash) on the same GPU.

One command on the GPU machine:

    python bench/attention.py                 # checks (all cases) + timing, JSON to bench/results
    python bench/attention.py --check-only
    python bench/attention.py --compile-only  # CPU: compile for sm_90a (CUTE_DSL_ARCH=sm_90a)

Leave-one-out experiments (ak.EXPERIMENT, MK_ATTN_EXPERIMENT, read at import: one subprocess per
experiment; bench/ATTENTION_NOTES.md "Leave-one-out experiments"):

    python bench/attention.py --experiments none,nomath,noload,nostore,noload+nomath \
        --cases decode-ctx1024-b1,decode-ctx1024-b64
    python bench/attention.py --compile-only --ptxas --experiments none,nomath,noload \
        --cases decode-ctx1024-b1                   # CPU: each variant compiled, ptxas spills

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
from mk.provenance import git_commit  # noqa: E402

from bench import _jobs  # noqa: E402
from mk.ir import (INSTR_WORDS, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0, W_ROWS,  # noqa: E402
                   W_SIGNAL, W_SIGNAL_COUNT, Op)

THREADS = 384
NPAGES = 13
LAUNCH_REGS = (65536 // THREADS) // 8 * 8        # 168
REG_LOW = int(os.environ.get("MK_ATTN_REG_LOW", 72))
REG_HIGH = int(os.environ.get("MK_ATTN_REG_HIGH", 216))
BAR_STORER = 2
N_STORER = 64
HANDOFF = os.environ.get("MK_ATTN_HANDOFF", "thread")   # the megakernel's DEFAULT_HANDOFF
TIMEOUT_S = 5.0                                           # page-wait bound (--timeout-s)


def page_share(handoff: str) -> int:
    """done[p] / empty[p] init count of a hand-off mode (mk.megakernel.page_share)."""
    return ak.THREAD_SHARE if handoff == "thread" else ak.DONE_ARRIVALS


def reg_split_ok(low: int = REG_LOW, high: int = REG_HIGH) -> bool:
    return 128 * low + 256 * high <= THREADS * LAUNCH_REGS and low % 8 == 0 and high % 8 == 0


class AttnHarnessDSL:
    """q: (T, hq*D) bf16; kv: (KVROWS, hkv*D, 2) bf16 (z = 0 K cache, 1 V cache); out: (T, hq*D)
    bf16; part: (P, hq*D) fp32; lse: (P, hq) fp32; meta: the step metadata (int32)."""

    def __init__(self, page_size: int, npages: int = NPAGES, handoff: str = HANDOFF,
                 wg_split: bool | None = None):
        assert reg_split_ok(), f"setmaxnreg {REG_LOW}/{REG_HIGH} over-subscribes the CTA"
        assert handoff in ("thread", "warp"), f"hand-off {handoff!r}: 'thread' or 'warp'"
        self.page_size = page_size
        self.npages = npages
        self.handoff = handoff
        # decode units split by key blocks between the two consumer WGs (ak.attn_consume)
        self.wg_split = ak.WG_SPLIT if wg_split is None else bool(wg_split)

    @cute.jit
    def __call__(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor,
                 state: cute.Tensor, meta: cute.Tensor, q: cute.Tensor, kv: cute.Tensor,
                 out: cute.Tensor, part: cute.Tensor, lse: cute.Tensor, timeout_ns: Int64,
                 grid: Int32, stream):
        a = ak.AttnAtoms(kv, self.page_size)

        fields = dict(
            full=cute.struct.MemRange[cutlass.Int64, self.npages],
            empty=cute.struct.MemRange[cutlass.Int64, self.npages],
            done=cute.struct.MemRange[cutlass.Int64, self.npages],
            pool=cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.npages * ak.PAGE],
                                   1024])
        if cutlass.const_expr(ak.SWAPPED):      # the swapped decode chain's Q^T / P^T, per WG
            fields["ascr"] = cute.struct.Align[cute.struct.MemRange[cutlass.Uint8,
                                                                    2 * ak.SWAP_SCRATCH], 1024]
        Storage = cute.struct(type("Storage", (), {"__annotations__": fields}))
        self.storage = Storage
        self.kernel(instrs, n_instr, counters, state, meta, q, a.tma, a.gKV, a.box_layout,
                    a.mma_qk, a.mma_pv, a.sK_layout, a.sV_layout, out, part, lse,
                    timeout_ns, a.swap_ops()).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream,
                                       max_number_threads=[THREADS, 1, 1], min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor,
               state: cute.Tensor, meta: cute.Tensor, q: cute.Tensor, tma: cute.CopyAtom,
               gKV: cute.Tensor, box_layout: cute.ComposedLayout, mma_qk: cute.TiledMma,
               mma_pv: cute.TiledMma, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, out: cute.Tensor, part: cute.Tensor,
               lse: cute.Tensor, timeout_ns: Int64, swap_ops: list):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        NP = self.npages
        PS = page_share(self.handoff)
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        full = st.full.data_ptr()
        empty = st.empty.data_ptr()
        done = st.done.data_ptr()
        pool = st.pool.data_ptr().toint()
        swap = None                     # wg_split's decode units keep the m64n64 chain
        if cutlass.const_expr(ak.SWAPPED and not self.wg_split):
            swap = tuple(swap_ops) + (st.ascr.data_ptr().toint(),)
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma)
            with cute.arch.elect_one():
                for p in cutlass.range_constexpr(NP):
                    cute.arch.mbarrier_init(full + p, 1)
                    cute.arch.mbarrier_init(empty + p, PS)
                    cute.arch.mbarrier_init(done + p, PS)
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
                dpar = cute.make_rmem_tensor(cute.make_layout(1), Int32)    # rk.wait_done
                rk.done_parity_init(dpar)
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
                                           instrs[t, at.A_SLOT], pool, empty, done, dpar, pg, NP,
                                           sid, BAR_STORER, N_STORER, timeout_ns, state, t, PS)
                    elif op == ak.OP_ATTN_REDUCE:
                        pg = ak.reduce_store(out_base, ldo, instrs[t, W_ROW0], instrs[t, W_ROWS],
                                             instrs[t, W_COL0], instrs[t, W_COLS],
                                             instrs[t, at.A_QPK], pool, empty, done, dpar, pg,
                                             NP, sid, BAR_STORER, N_STORER, timeout_ns, state,
                                             t, PS)
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
            ak.attn_mma_init(mma_qk, mma_pv, swap)
            ctid = tidx - 128
            pg = Int32(0)
            t = Int32(bidx)
            q_base = q.iterator.toint()
            ldq = q.shape[1]
            while t < n_instr:
                op = instrs[t, W_OPCODE]
                if op == ak.OP_ATTENTION:
                    # (mk.megakernel's dispatch: the swapped chain's trace for <= 8 query rows)
                    args = (mma_qk, mma_pv, sK_layout, sV_layout, q_base, ldq, instrs[t, W_ROW0],
                            instrs[t, W_ROWS], instrs[t, W_COL0], instrs[t, W_COLS],
                            instrs[t, at.A_POS0], instrs[t, at.A_KV0], instrs[t, at.A_KV1],
                            instrs[t, at.A_MODE], instrs[t, at.A_QPK], pool, full, empty, done,
                            pg, NP, ctid, timeout_ns, state, t, PS, self.wg_split)
                    if cutlass.const_expr(swap is None):
                        pg = ak.attn_consume(*args)
                    else:
                        if ak.swapped_rows(instrs[t, W_ROWS], instrs[t, at.A_QPK]):
                            pg = ak.attn_consume(*args, swap=swap)
                        else:
                            pg = ak.attn_consume(*args)
                elif op == ak.OP_ATTN_REDUCE:
                    pg = ak.reduce_consume(part, lse, instrs[t, W_ROW0], instrs[t, W_ROWS],
                                           instrs[t, W_COL0], instrs[t, W_COLS],
                                           instrs[t, at.A_SLOT0], instrs[t, at.A_NSPLIT],
                                           instrs[t, at.A_QPK], pool, full, done, pg, NP, ctid,
                                           timeout_ns, state, t, PS, empty)
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


def compile_fake(page_size: int = 16, npages: int = NPAGES, handoff: str = HANDOFF,
                 wg_split: bool | None = None):
    """cute.compile for sm_90a on the CPU; returns the compiled object (PTX in __ptx__)."""
    return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN](
        AttnHarnessDSL(page_size, npages, handoff, wg_split), *fake_args())



# ============================================================================ problems (mk.plan)
# Llama-70B at TP 8: one rank holds 8 q heads and 1 KV head of head_dim 128 (qpk = 8)
LLAMA70B_TP8 = dict(hq=8, hkv=1)


def case_list(quick: bool = False):
    """Named batches: decode at several context lengths (split-KV beyond kv_split), prefill chunks
    with start_pos > 0 (causal, chunked, variable lengths, segments crossing token blocks), a mix,
    GQA/grouping variants and page sizes."""
    C = []
    dec = [(1, 100), (1, 1000), (1, 1030)]
    C.append(dict(name="decode-ctx512-b64", seqs=[(1, 511)] * 64, **LLAMA70B_TP8, page_size=16))
    C.append(dict(name="decode-ctx2048-b64", seqs=[(1, 2047)] * 64, **LLAMA70B_TP8, page_size=16))
    C.append(dict(name="decode-ctx8192-b32", seqs=[(1, 8191)] * 32, **LLAMA70B_TP8, page_size=16))
    if not quick:
        C.append(dict(name="decode-ctx32768-b8", seqs=[(1, 32767)] * 8, **LLAMA70B_TP8,
                      page_size=16))
    C.append(dict(name="decode-varlen", seqs=dec + [(1, 1), (1, 63), (1, 64), (1, 3000)],
                  **LLAMA70B_TP8, page_size=16))
    C.append(dict(name="prefill-chunks", seqs=[(256, 1000), (100, 37), (300, 0), (5, 2047)],
                  **LLAMA70B_TP8, page_size=16))
    C.append(dict(name="prefill-1k-at-3k", seqs=[(1024, 3072)], **LLAMA70B_TP8, page_size=16))
    C.append(dict(name="mixed-page64", seqs=[(1, 700), (1, 2500), (200, 900), (77, 0)],
                  **LLAMA70B_TP8, page_size=64))
    C.append(dict(name="gqa-qpk4-2groups", seqs=[(1, 1500), (130, 600)], hq=8, hkv=2,
                  page_size=32))
    C.append(dict(name="gqa-qpk2-heads2", seqs=[(1, 2100), (64, 64)], hq=8, hkv=4,
                  page_size=16, attn_kv_heads=2))
    # the 70B TP8 rank's decode over 1024 keys (one ATTENTION instruction per sequence, no split:
    # the megakernel journal's 44 us instruction): one sequence (one CTA), and 64
    C.append(dict(name="decode-ctx1024-b1", seqs=[(1, 1023)], **LLAMA70B_TP8, page_size=16))
    C.append(dict(name="decode-ctx1024-b64", seqs=[(1, 1023)] * 64, **LLAMA70B_TP8, page_size=16))
    return C


def make_problem(case: dict, seed: int = 0, device="cuda", kv_split: int = 1024):
    """Plan the case's batch with mk.plan; random Q and K/V cache (cache rows no sequence holds
    are NaN, so a read past a sequence's keys shows); outputs poisoned with NaN.
    Returns a dict with the plan, the ATTENTION / ATTN_REDUCE streams of the last layer, and the
    buffers (CPU copies for the oracle, device tensors for the kernel)."""
    import random

    import torch

    from mk.batch import SeqChunk, StepBatch
    from mk.config import KernelConfig, ModelConfig, ParallelConfig
    from mk.instructions.base import Buf
    from mk.plan import PlanConfig, buffer_dtype, buffer_shapes, plan_step

    hq, hkv, ps = case["hq"], case["hkv"], case["page_size"]
    seqs = case["seqs"]
    ctx = max(n + s for n, s in seqs)
    T = sum(n for n, _ in seqs)
    npages = sum(-(-(n + s) // ps) for n, s in seqs) + 3
    model = ModelConfig(hidden_size=hq * ak.D, intermediate_size=256, num_layers=2, num_heads=hq,
                        num_kv_heads=hkv, head_dim=ak.D, vocab_size=256)
    kernel = KernelConfig(page_size=ps, max_batch_tokens=T, max_seqs=len(seqs),
                          max_context=max(ctx, 1), num_kv_pages=npages)
    # ATTN_PARTIAL rows: PlanConfig's own bound (it counts the decode splits spread over the SMs,
    # kv_split_min, which T x ceil(ctx / kv_split) did not: decode-varlen needed 84 rows of 21)
    pcfg = PlanConfig(kv_split=kv_split, attn_kv_heads=case.get("attn_kv_heads", 1))
    rng = random.Random(seed)
    ids = list(range(npages))
    rng.shuffle(ids)
    chunks = []
    for n, s in seqs:
        need = -(-(n + s) // ps)
        chunks.append(SeqChunk(tokens=[1] * n, start_pos=s, pages=ids[:need]))
        ids = ids[need:]
    batch = StepBatch(chunks)
    plan = plan_step(batch, model, ParallelConfig(), kernel, pcfg)
    shapes = buffer_shapes(model, ParallelConfig(), kernel, pcfg)
    g = torch.Generator().manual_seed(seed)
    bufs = {b: torch.full(shapes[b], float("nan"), dtype=buffer_dtype(b, torch.bfloat16))
            for b in (Buf.Q, Buf.ATTN_OUT, Buf.ATTN_PARTIAL, Buf.ATTN_LSE, Buf.K_CACHE, Buf.V_CACHE)}
    bufs[Buf.Q].copy_(torch.randn(shapes[Buf.Q], generator=g).bfloat16())
    layer = model.num_layers - 1
    m = plan.meta.tensor
    from mk.instructions.attention import kv_cache_rows
    for si, (n, s) in enumerate(seqs):
        rows = kv_cache_rows(m, layer, int(plan.meta.page_off[si]), 0, n + s)
        for b in (Buf.K_CACHE, Buf.V_CACHE):
            bufs[b][rows] = torch.randn(len(rows), hkv * ak.D, generator=g).bfloat16()
    s_all = plan.instrs
    sel = (s_all[:, W_LAYER] == layer)
    attn = s_all[sel & (s_all[:, W_OPCODE] == int(Op.ATTENTION))].contiguous()
    red = s_all[sel & (s_all[:, W_OPCODE] == int(Op.ATTN_REDUCE))].contiguous()
    return dict(case=case, plan=plan, model=model, kernel=kernel, attn=attn, red=red, bufs=bufs,
                layer=layer, T=T)


class _State:
    def __init__(self, bufs, meta):
        self.bufs, self.meta, self.rank, self.weights = bufs, meta, 0, None

    def buf(self, i, rank=None):
        return self.bufs[i]


def oracle(prob):
    """The torch faces (mk/instructions/attention.py) in queue order on CPU copies."""
    from mk.instructions.base import family_of
    from mk.ir import deserialize
    bufs = {k: v.clone() for k, v in prob["bufs"].items()}
    st = _State(bufs, prob["plan"].meta)
    for stream in (prob["attn"], prob["red"]):
        for ins in deserialize(stream):
            family_of(ins.opcode).run_torch(ins, st)
    return bufs


# ============================================================================ host runner (GPU)
_COMPILED: dict = {}


def _dl(t, align: int = 16, dynamic: bool = True):
    from cutlass.cute.runtime import from_dlpack
    x = from_dlpack(t, assumed_align=align)
    if dynamic:
        lead = [i for i in range(t.dim()) if t.stride(i) == 1 and t.shape[i] > 1]
        x = x.mark_layout_dynamic(leading_dim=lead[0] if lead else t.dim() - 1)
    return x


class AttnHarness:
    """Device buffers of one problem + the compiled harness kernel; run() = the ATTENTION launch
    then the ATTN_REDUCE launch (stream order is the dependency)."""

    def __init__(self, prob, timeout_s: float | None = None, grid: int | None = None,
                 handoff: str | None = None, wg_split: bool | None = None):
        import torch

        from mk.instructions.base import Buf
        self.prob = prob
        b = prob["bufs"]
        dev = torch.device("cuda")
        self.q = b[Buf.Q].to(dev)
        self.kv = torch.stack([b[Buf.K_CACHE], b[Buf.V_CACHE]], 0).to(dev).contiguous()
        self.out = b[Buf.ATTN_OUT].to(dev)
        self.part = b[Buf.ATTN_PARTIAL].to(dev)
        self.lse = b[Buf.ATTN_LSE].to(dev)
        self.meta = prob["plan"].meta.tensor.to(dev, torch.int32).contiguous()
        self.counters = torch.zeros(max(prob["plan"].num_counters, 1), dtype=torch.int32,
                                    device=dev)
        self.state = torch.zeros(rk.STATE_WORDS, dtype=torch.int32, device=dev)
        self.streams = [s.to(dev) for s in (prob["attn"], prob["red"])]
        self.timeout_ns = int((timeout_s or TIMEOUT_S) * 1e9)
        self.handoff = handoff or HANDOFF
        self.wg_split = ak.WG_SPLIT if wg_split is None else bool(wg_split)
        self.grid = grid or torch.cuda.get_device_properties(dev).multi_processor_count
        self.page_size = prob["case"]["page_size"]

    def _args(self, s):
        import cuda.bindings.driver as drv
        import torch
        n = s.shape[0]
        if n == 0:
            s = torch.zeros((1, INSTR_WORDS), dtype=torch.int32, device=self.q.device)
        return [_dl(s, 4), Int32(n), _dl(self.counters, 4), _dl(self.state, 4, dynamic=False),
                _dl(self.meta, 4), _dl(self.q), _dl(self.kv.permute(1, 2, 0)), _dl(self.out),
                _dl(self.part), _dl(self.lse, 4), Int64(self.timeout_ns), Int32(self.grid),
                drv.CUstream(torch.cuda.current_stream().cuda_stream)]

    def compiled(self):
        key = (self.page_size, self.handoff, self.wg_split)
        if key not in _COMPILED:
            t0 = time.time()
            _COMPILED[key] = cute.compile(AttnHarnessDSL(self.page_size, handoff=self.handoff,
                                                         wg_split=self.wg_split),
                                          *self._args(self.streams[0]))
            print(f"[attention] compiled page_size={key[0]} handoff={key[1]} "
                  f"wg_split={int(key[2])} in "
                  f"{time.time() - t0:.1f} s", flush=True)
        return _COMPILED[key]

    def launchers(self):
        comp = self.compiled()
        argsets = [self._args(s) for s in self.streams if s.shape[0]]

        def go():
            for a in argsets:
                comp(*a)
        return go

    def check_state(self):
        st = self.state.cpu()
        if int(st[rk.S_ERR_FLAG]) or int(st[rk.S_ABORT]):
            raise RuntimeError(f"attention harness wait timed out: kind {int(st[rk.S_ERR_KIND])} "
                               f"instruction {int(st[rk.S_ERR_INSTR])} phase "
                               f"{int(st[rk.S_ERR_TARGET])} (SM {int(st[rk.S_ERR_SM])}, "
                               f"CTA {int(st[rk.S_ERR_CTA])})")


DUMP: dict = {}      # case name -> the kernel's outputs (CPU), filled when --dump is given
DUMP_ON = False


def check_case(case, seed: int = 0, tol: float = 2e-2, wg_split: bool | None = None,
               prob=None, want=None) -> dict:
    """Run one case on the GPU and compare ATTN_OUT (every row), the partials and LSEs of split
    segments, and the signal counters with the torch faces / plan targets. prob / want: a problem
    and its oracle outputs to reuse (several kernel variants on one case)."""
    import torch

    from mk.instructions.base import Buf
    if prob is None:
        prob = make_problem(case, seed)
    if want is None:
        want = oracle(prob)
    h = AttnHarness(prob, wg_split=wg_split)
    h.launchers()()
    torch.cuda.synchronize()
    if DUMP_ON:   # the problem is rebuilt on the CPU from (case, seed): only outputs travel back
        DUMP[case["name"]] = dict(seed=seed, out=h.out.cpu(), part=h.part.cpu(), lse=h.lse.cpu(),
                                  counters=h.counters.cpu(), state=h.state.cpu())
    h.check_state()
    T = prob["T"]
    got_o = h.out[:T].float().cpu()
    want_o = want[Buf.ATTN_OUT][:T].float()
    finite = bool(torch.isfinite(got_o).all())
    err = float((got_o - want_o).abs().max()) if finite else float("inf")
    rel = err / max(float(want_o.abs().max()), 1e-6)
    # partials / lse of the slots the plan used (those the face wrote: not NaN there)
    used = ~torch.isnan(want[Buf.ATTN_LSE])
    rel_p, lse_err = 0.0, 0.0
    if bool(used.any()):
        gl = h.lse.cpu()
        wl = want[Buf.ATTN_LSE]
        both_inf = torch.isinf(gl) & torch.isinf(wl) & used
        fin = used & ~both_inf
        lse_err = float((gl[fin] - wl[fin]).abs().max()) if bool(fin.any()) else 0.0
        rows = used.any(dim=1)
        gp = h.part[rows.to(h.part.device)].cpu()
        wp = want[Buf.ATTN_PARTIAL][rows]
        ok_rows = ~torch.isnan(wp)
        rel_p = float((gp[ok_rows] - wp[ok_rows]).abs().max()) / max(float(wp[ok_rows].abs().max()), 1e-6)
    ctr = h.counters.cpu()
    tg = prob["plan"].targets
    sig = torch.cat([s[:, W_SIGNAL] for s in (prob["attn"], prob["red"])]).unique()
    sig = sig[sig >= 0].long()
    ctr_ok = bool(torch.equal(ctr[sig], tg[sig].to(ctr.dtype)))
    ok = finite and rel < tol and rel_p < tol and lse_err < 5e-2 and ctr_ok
    return dict(case=case["name"], wg_split=int(h.wg_split), ok=ok, finite=finite, rel_err=rel, max_abs_err=err,
                rel_err_partial=rel_p, lse_abs_err=lse_err, counters_ok=ctr_ok,
                attention_instrs=int(prob["attn"].shape[0]), reduce_instrs=int(prob["red"].shape[0]),
                T=T)


# ============================================================================ timing
def gpu_sleep_cycles() -> int:
    # ~2 ms at 1.98 GHz: covers the host's enqueue of event + launch(es) + event (bench/gemm.py)
    return int(os.environ.get("MK_BENCH_SLEEP_CYCLES", 4e6))


_FLUSH: list = []


def _flush_l2():
    """Overwrite 256 MiB (> the H200's 60 MiB L2): the next kernel reads its K/V from HBM, as a
    decode step does (80 layers of K/V do not stay in L2)."""
    import torch
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    _FLUSH[0].fill_(1)


def _time(fn, reps: int = 20, warm: int = 3, how: str = "device") -> float:
    """Median us of fn() between two events. how: "host" (the event pair also times the host's
    launch cost: the figure of the first runs), "device" (behind a GPU sleep: the kernels alone,
    L2 warm from the previous rep), "cold" (device, L2 flushed before each rep)."""
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if how == "cold":
            _flush_l2()
        if how != "host":
            torch.cuda._sleep(gpu_sleep_cycles())
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


TIMINGS = ("cold", "device", "host")


def baselines(prob) -> dict:
    """torch SDPA on contiguous per-sequence K/V (flash backend where it applies; an explicit
    bottom-right causal mask for prefill chunks), and flash_attn's paged kv-cache kernel when the
    package is installed (flash-decoding with split-KV)."""
    import torch
    import torch.nn.functional as F

    from mk.instructions.attention import kv_cache_rows
    from mk.instructions.base import Buf
    case, b = prob["case"], prob["bufs"]
    hq, hkv = case["hq"], case["hkv"]
    m = prob["plan"].meta.tensor
    dev = torch.device("cuda")
    q_all = b[Buf.Q].to(dev)
    Kc, Vc = b[Buf.K_CACHE].to(dev), b[Buf.V_CACHE].to(dev)
    calls, r0 = [], 0
    for si, (n, s) in enumerate(case["seqs"]):
        idx = kv_cache_rows(m, prob["layer"], int(prob["plan"].meta.page_off[si]), 0, n + s).to(dev)
        k = Kc[idx].view(-1, hkv, ak.D).transpose(0, 1)[None]
        v = Vc[idx].view(-1, hkv, ak.D).transpose(0, 1)[None]
        q = q_all[r0:r0 + n].view(n, hq, ak.D).transpose(0, 1)[None]
        mask = None
        if n > 1:
            qp = torch.arange(s, s + n, device=dev)[:, None]
            mask = torch.arange(0, n + s, device=dev)[None, :] <= qp
        calls.append((q, k, v, mask))
        r0 += n
    same = len({(c[0].shape, c[1].shape) for c in calls}) == 1 and all(c[3] is None for c in calls)
    if same:   # a uniform decode batch: one batched call
        qb = torch.cat([c[0] for c in calls])
        kb = torch.cat([c[1] for c in calls])
        vb = torch.cat([c[2] for c in calls])

        def sdpa():
            F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)
    else:
        def sdpa():
            for q, k, v, mask in calls:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out = {f"torch_sdpa_{how}_us": _time(sdpa, how=how) for how in TIMINGS}
    try:
        from flash_attn import flash_attn_with_kvcache  # noqa: F401
        out["flash_attn"] = "installed (paged baseline not wired yet)"
    except ImportError:
        out["flash_attn"] = "not installed"
    return out


def bench_case(case, seed: int = 0, variants=(None,), prob=None, sdpa: bool = True,
               reps: int = 20) -> dict:
    """Times (cold L2 / device / with host launch, see _time) of every kernel variant (wg_split
    values) and of torch SDPA; mk = the ATTENTION launch + the ATTN_REDUCE launch if any.
    prob: a problem to reuse; sdpa=False leaves the baselines out (the experiment workers)."""
    if prob is None:
        prob = make_problem(case, seed)
    kv_bytes = 0
    for n, s in case["seqs"]:
        kv_bytes += 2 * (n + s) * case["hkv"] * ak.D * 2
    r = dict(case=case["name"], attention_instrs=int(prob["attn"].shape[0]),
             reduce_instrs=int(prob["red"].shape[0]), kv_bytes=kv_bytes)
    if sdpa:
        r.update(baselines(prob))
    for v in variants:
        h = AttnHarness(prob, wg_split=v)
        go = h.launchers()
        tag = f"mk_split{int(h.wg_split)}"
        for how in TIMINGS:
            r[f"{tag}_{how}_us"] = _time(go, reps=reps, how=how)
        h.check_state()
        r[f"{tag}_kv_TBps"] = kv_bytes / r[f"{tag}_cold_us"] / 1e6
        if sdpa:
            r[f"{tag}_over_sdpa"] = r[f"{tag}_cold_us"] / r["torch_sdpa_cold_us"]
    return r


def print_table(timing):
    """One line per case: us (cold L2 / warm) of each variant and of SDPA, K/V TB/s (cold)."""
    for r in timing:
        cols = [f"{r['case']:<20}"]
        for tag in ("mk_split0", "mk_split1", "torch_sdpa"):
            if f"{tag}_cold_us" in r:
                cols.append(f"{tag} {r[f'{tag}_cold_us']:7.1f} / {r[f'{tag}_device_us']:7.1f} "
                            f"(host {r[f'{tag}_host_us']:6.1f})")
            if f"{tag}_kv_TBps" in r:
                cols.append(f"{r[f'{tag}_kv_TBps']:.2f} TB/s")
        print("[attention] table " + " | ".join(cols), flush=True)


# ============================================================================ leave-one-out
# ak.EXPERIMENT (MK_ATTN_EXPERIMENT) is read when _attention_kernel is imported, so each experiment
# runs in its own process (bench/gemm_profile.py's pattern): the driver starts one worker per
# experiment at once (imports, problems, oracles and compiles overlap) and a file lock lets one
# worker at a time use the GPU for its checks and timings.
EXPERIMENT_PARTS = ("nomath", "noload", "nostore")
EXPERIMENT_CASES = ("decode-ctx1024-b1", "decode-ctx1024-b64")   # --experiments without --cases
EXP_LOCK = "/tmp/mk_attn_gpu.lock"
ROOT = Path(__file__).resolve().parents[1]


def experiment_env(exp: str) -> str:
    """An experiment name ("none", "nomath", "noload+nomath", ...) -> MK_ATTN_EXPERIMENT."""
    parts = [] if exp == "none" else [t for t in exp.replace(",", "+").split("+") if t]
    bad = [t for t in parts if t not in EXPERIMENT_PARTS]
    assert not bad, f"unknown experiment parts {bad} (known: none, {', '.join(EXPERIMENT_PARTS)})"
    return ",".join(parts)


def run_info() -> dict:
    import shlex
    return dict(command=" ".join(shlex.quote(x) for x in [sys.executable] + sys.argv),
                commit=git_commit(), date=time.strftime("%Y-%m-%d %H:%M:%S"))


def experiment_worker(exp: str, cases, seed: int, reps: int) -> dict:
    """One experiment in this process (MK_ATTN_EXPERIMENT already set by the driver): problems and
    compiles first, then under the GPU lock the checks ("none" only: the other variants' outputs
    are garbage by design) and the timings (no SDPA baseline)."""
    import fcntl

    import torch
    assert ak.EXPERIMENT == frozenset(t for t in experiment_env(exp).split(",") if t), \
        f"worker of {exp!r} imported ak.EXPERIMENT = {set(ak.EXPERIMENT)}"
    res = dict(experiment=exp, mk_attn_experiment=experiment_env(exp), checks=[], timing=[])
    probs = []
    for c in cases:
        prob = make_problem(c, seed)
        want = oracle(prob) if exp == "none" else None
        AttnHarness(prob).compiled()            # compile outside the lock
        probs.append((c, prob, want))
    with open(EXP_LOCK, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        for c, prob, want in probs:
            if exp == "none":
                r = check_case(c, seed, prob=prob, want=want)
                res["checks"].append(r)
                print(f"[attention] {'ok  ' if r.get('ok') else 'FAIL'} {json.dumps(r)}",
                      flush=True)
            r = bench_case(c, seed, (None,), prob=prob, sdpa=False, reps=reps)
            res["timing"].append(r)
            print(f"[attention] {exp} time {json.dumps(r)}", flush=True)
        torch.cuda.synchronize()
    return res


def experiment_table(runs: dict, case_names) -> list:
    """Rows (case, experiment, cold us, warm us, d cold, d warm) with d = the time minus that of
    "none" (same case), from the workers' results."""
    t = {}
    for exp, res in runs.items():
        for r in res.get("timing", []):
            tag = next((k[:-8] for k in r if k.startswith("mk_split") and k.endswith("_cold_us")),
                       None)
            if tag:
                t[(r["case"], exp)] = (r[f"{tag}_cold_us"], r[f"{tag}_device_us"])
    rows = []
    for c in case_names:
        base = t.get((c, "none"))
        for exp in runs:
            v = t.get((c, exp))
            if v is None:
                rows.append(dict(case=c, experiment=exp,
                                 error=runs[exp].get("error", "no timing")[-300:]))
                continue
            row = dict(case=c, experiment=exp, cold_us=v[0], warm_us=v[1])
            if base is not None:
                row.update(d_cold_us=v[0] - base[0], d_warm_us=v[1] - base[1])
            rows.append(row)
    return rows


def print_experiment_table(rows, exps):
    print("[attention] experiments: us cold L2 / warm (device), [d = minus 'none' of the same "
          "case]; outputs of every experiment but 'none' are garbage by design: not checked",
          flush=True)
    w = 30
    print("[attention] exp " + f"{'case':<20}" + "".join(f" | {e:<{w}}" for e in exps), flush=True)
    by = {(r["case"], r["experiment"]): r for r in rows}
    for c in dict.fromkeys(r["case"] for r in rows):
        cols = []
        for e in exps:
            r = by.get((c, e), {})
            if "cold_us" not in r:
                cols.append(f"{'error':<{w}}")
            elif e == "none" or "d_cold_us" not in r:
                cols.append(f"{r['cold_us']:6.1f} / {r['warm_us']:6.1f}".ljust(w))
            else:
                cols.append(f"{r['cold_us']:6.1f} / {r['warm_us']:6.1f} "
                            f"[{r['d_cold_us']:+.1f}/{r['d_warm_us']:+.1f}]".ljust(w))
        print("[attention] exp " + f"{c:<20}" + "".join(f" | {x}" for x in cols), flush=True)


def run_experiments(a, exps) -> int:
    """The driver of --experiments: one subprocess per experiment with MK_ATTN_EXPERIMENT set.
    --compile-only: each variant compiled on the CPU (ptxas with --ptxas), one after another."""
    import subprocess
    names = [c["name"] for c in case_list(a.quick)]
    cases = a.cases.split(",") if a.cases else list(EXPERIMENT_CASES)
    unknown = [c for c in cases if c not in names]
    assert not unknown, f"unknown cases {unknown}"
    envs = {e: experiment_env(e) for e in exps}
    me = [sys.executable, "-u", str(Path(__file__).resolve())]
    common = ["--cases", ",".join(cases), "--seed", str(a.seed), "--handoff", a.handoff,
              "--timeout-s", str(a.timeout_s)] + (["--quick"] if a.quick else [])
    if a.compile_only:
        rc = 0
        for e, v in envs.items():
            print(f"[attention] == experiment {e} (MK_ATTN_EXPERIMENT={v!r})", flush=True)
            r = subprocess.run(me + ["--compile-only"] + (["--ptxas"] if a.ptxas else []) + common,
                               env=dict(os.environ, MK_ATTN_EXPERIMENT=v))
            rc |= r.returncode
        return rc
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("error: needs a Hopper GPU", file=sys.stderr)
        return 1
    procs = []
    for e, v in envs.items():
        cmd = me + ["--experiment-worker", e, "--reps", str(a.reps)] + common
        procs.append((e, _jobs.start(cmd, dict(os.environ, MK_ATTN_EXPERIMENT=v))))
    runs = {}
    for e, txt in _jobs.collect(procs, a.exp_timeout):
        for ln in txt.splitlines():
            if ln.startswith("[attention]"):
                print(ln, flush=True)
        got = [ln[6:] for ln in txt.splitlines() if ln.startswith("@@EXP ")]
        runs[e] = json.loads(got[0]) if got else dict(experiment=e, error=txt[-3000:])
        if not got:
            print(f"[attention] experiment {e} FAILED:\n{txt[-3000:]}", flush=True)
    rows = experiment_table(runs, cases)
    print_experiment_table(rows, list(envs))
    checks = runs.get("none", {}).get("checks", [])
    ok = all("error" not in r for r in runs.values()) and all(c.get("ok") for c in checks)
    results = dict(run_info(), device=torch.cuda.get_device_name(), handoff=a.handoff,
                   wg_split=int(ak.WG_SPLIT), experiments=list(envs), cases=cases, reps=a.reps,
                   note="times in us; d_* = minus the 'none' time of the same case; experiments "
                        "other than 'none' are not checked (garbage outputs by design)",
                   table=rows, runs=runs)
    path = a.out or str(Path(__file__).parent / "results" /
                        f"attention_{time.strftime('%Y-%m-%d')}_experiments.json")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=1))
    print(f"[attention] experiments {'done' if ok else 'FAILED'}; results in {path}", flush=True)
    return 0 if ok else 1


def compile_only(a) -> int:
    """CPU compile for sm_90a of the page sizes of the chosen cases (default 16 and 64), in the
    experiment this process imported (ak.EXPERIMENT); --ptxas: ptxas -v, 1 on spills."""
    import re
    import tempfile
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sizes = (16, 64)
    if a.cases:
        want = set(a.cases.split(","))
        sizes = tuple(sorted({c["page_size"] for c in case_list(a.quick) if c["name"] in want}))
    rc = 0
    for ps in sizes:
        t0 = time.time()
        comp = compile_fake(ps, handoff=a.handoff)
        ptx = comp.__ptx__ or ""
        msg = (f"page_size {ps}: compiled in {time.time() - t0:.1f}s, PTX {len(ptx)} chars, "
               f"experiment {','.join(sorted(ak.EXPERIMENT)) or 'none'}: "
               f"{len(re.findall(r'wgmma[.]mma_async', ptx))} wgmma, "
               f"{len(re.findall(r'cp[.]async[.]bulk[.]tensor', ptx))} TMA, "
               f"{len(re.findall(r'st[.]global', ptx))} st.global")
        if a.ptxas:
            sys.path.insert(0, str(ROOT / "tests"))
            from _compile_gate import ptxas_report
            rep = ptxas_report(ptx, tempfile.mkdtemp(prefix="mk_attn_ptxas_"))
            sp = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
            regs = re.findall(r"Used (\d+) registers", rep)
            clean = bool(sp) and all(x == "0" and y == "0" for x, y in sp)
            msg += f"; ptxas: {regs} registers, spills {sp}{'' if clean else '  SPILLS'}"
            rc |= 0 if clean else 1
        print(msg, flush=True)
    return rc


def main(argv=None) -> int:
    global DUMP_ON, HANDOFF, TIMEOUT_S
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--compile-only", action="store_true", help="CPU compile for sm_90a")
    ap.add_argument("--quick", action="store_true", help="skip the 32k-context decode case")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="JSON results path (default bench/results/attention_<date>.json)")
    ap.add_argument("--dump", default="", help="torch.save the kernel outputs of every checked case here")
    ap.add_argument("--handoff", default=HANDOFF, choices=("thread", "warp"),
                    help="done/empty hand-off: 'thread' (the megakernel's default) or 'warp'")
    ap.add_argument("--wg-split", default="default", choices=("default", "0", "1", "both"),
                    help="kernel variant(s): decode units split between the consumer WGs "
                         "(ak.attn_consume wg_split; default = ak.WG_SPLIT)")
    ap.add_argument("--timeout-s", type=float, default=TIMEOUT_S,
                    help="page-wait bound (raise it under compute-sanitizer)")
    ap.add_argument("--experiments", default="",
                    help="leave-one-out variants timed side by side, one subprocess each with "
                         "MK_ATTN_EXPERIMENT set, e.g. none,nomath,noload,nostore,noload+nomath "
                         f"(default cases: {','.join(EXPERIMENT_CASES)}); with --compile-only: "
                         "each variant compiled on the CPU")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions (--experiments)")
    ap.add_argument("--exp-timeout", type=float, default=480.0,
                    help="seconds for all experiment workers together")
    ap.add_argument("--ptxas", action="store_true", help="--compile-only: ptxas -v, fail on spills")
    ap.add_argument("--experiment-worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    DUMP_ON = bool(a.dump)
    HANDOFF, TIMEOUT_S = a.handoff, a.timeout_s
    if a.experiments:
        return run_experiments(a, [e for e in a.experiments.split(",") if e])
    if a.compile_only:
        return compile_only(a)
    if a.experiment_worker:
        names = a.cases.split(",")
        cases = [c for c in case_list(a.quick) if c["name"] in names]
        r = experiment_worker(a.experiment_worker, cases, a.seed, a.reps)
        print("@@EXP " + json.dumps(r), flush=True)
        return 0
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        print("error: needs a Hopper GPU", file=sys.stderr)
        return 1
    cases = case_list(a.quick)
    if a.cases:
        want = set(a.cases.split(","))
        cases = [c for c in cases if c["name"] in want]
    variants = {"default": (None,), "0": (False,), "1": (True,), "both": (False, True)}[a.wg_split]
    assert not ak.EXPERIMENT, (f"MK_ATTN_EXPERIMENT={os.environ.get('MK_ATTN_EXPERIMENT')!r}: "
                               "experiment variants run through --experiments only")
    results, ok_all = dict(run_info(), device=torch.cuda.get_device_name(), handoff=HANDOFF,
                           wg_split=a.wg_split, checks=[], timing=[]), True
    dead = False
    for c in cases:
        prob = want = None
        for v in variants:
            try:
                if prob is None:
                    prob = make_problem(c, a.seed)
                    want = oracle(prob)
                r = check_case(c, a.seed, wg_split=v, prob=prob, want=want)
            except Exception as e:  # noqa: BLE001 - report and go on (a hang ends the process anyway)
                r = dict(case=c["name"], wg_split=int(ak.WG_SPLIT if v is None else v), ok=False,
                         error=f"{type(e).__name__}: {e}")
            ok_all &= bool(r.get("ok"))
            results["checks"].append(r)
            print(f"[attention] {'ok  ' if r.get('ok') else 'FAIL'} {json.dumps(r)}", flush=True)
            if a.dump:
                torch.save(DUMP, a.dump)
            if "illegal" in r.get("error", "") or "unspecified launch" in r.get("error", ""):
                dead = True   # the CUDA context is gone: every later case would fail the same way
                break
        if dead:
            break
    # timing: every variant that passed all its checks
    good = tuple(v for v in variants
                 if all(r.get("ok") for r in results["checks"]
                        if r["wg_split"] == int(ak.WG_SPLIT if v is None else v)))
    if not a.check_only and good and not dead:
        for c in cases:
            r = bench_case(c, a.seed, good)
            results["timing"].append(r)
            print(f"[attention] time {json.dumps(r)}", flush=True)
    print_table(results["timing"])
    path = a.out or str(Path(__file__).parent / "results" / f"attention_{time.strftime('%Y-%m-%d')}.json")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=1))
    print(f"[attention] {'passed' if ok_all else 'FAILED'}; results in {path}", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
