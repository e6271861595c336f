"""A standalone persistent kernel that runs GEMM-tile instructions (mk.ir format, matmul.py's
argument words) with the megakernel's roles and protocols, so each GEMM body can be compiled,
checked and timed over a whole matrix before (and independently of) its wiring into
mk/megakernel.py. One compiled kernel per (opcode, tile config).

Block = 384 threads:
    warp 0      controller: global queue ticket (atomic add), 32 words into a shared-memory
                instruction ring slot, bounded counter waits (ld.acquire + nanosleep), publish
    warp 1      loader: TMA of A/B operand pages and of the residual tile (mk.instructions._gemm_kernel)
    warps 2-3   storer: 16-byte masked stores of the epilogue pages, then fence + red.release
                of the instruction's signal counter
    warps 4-11  two consumer warpgroups: wgmma mainloop + fused epilogue (setmaxregister_increase)
Pages: NPAGES x 16 KiB in ring order, full (1) / empty (8) / done (8) mbarriers per page.
Counters and the queue head are reset by the last CTA out (like the megakernel), so a launch can
be replayed without host memsets; every wait is bounded (state buffer error record, abort flag).

GPU:   python -m bench.gemm          (runs this harness for every GEMM op; see bench/gemm.py)
CPU:   compile_fake(op, cfg) compiles for sm_90a with fake tensors (tests/test_gemm_compile.py)
"""

from __future__ import annotations

import os
import time

import cutlass
import cutlass.cute as cute
import cutlass.experimental.primitives as prims
from cutlass import BFloat16, Float32, Int32, Int64

from mk.instructions import _gemm_kernel as gk
from mk.instructions import _rows_kernel as rk
from mk.instructions import _common as mc
from mk.instructions import qkv as qk
from mk.instructions.matmul import A_K as MM_A_K
from mk.ir import (INSTR_WORDS, MAX_WAITS, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0, W_ROWS,
                   W_SIGNAL, W_SIGNAL_COUNT, W_WAIT0, Op)

THREADS = 384
NISLOTS = 4
NPAGES = 13
# setmaxnreg moves registers within the CTA's own pool (PTX ISA: "a pool of available registers is
# maintained per-CTA"; .inc blocks until the pool has enough): the launch allocates THREADS x
# LAUNCH_REGS (384 x 168 = 64512, what ptxas uses under .maxntid 384 / .minnctapersm 1), so
# 128 x REG_LOW + 256 x REG_HIGH must not exceed it. 64/224 (= 65536) left one consumer warp
# blocked in setmaxnreg.inc forever (first GPU run: hang / unspecified launch failure).
# 72/216 = 64512 exactly, no spills in any tile config (56/224 spills 36 bytes in QKV m64n256).
LAUNCH_REGS = (65536 // 384) // 8 * 8     # 168
REG_LOW = int(os.environ.get("MK_GEMM_REG_LOW", 72))
REG_HIGH = int(os.environ.get("MK_GEMM_REG_HIGH", 216))


def reg_split_ok(low: int = None, high: int = None, launch_regs: int = LAUNCH_REGS) -> bool:
    low = REG_LOW if low is None else low
    high = REG_HIGH if high is None else high
    return 128 * low + 256 * high <= 384 * launch_regs and low % 8 == 0 and high % 8 == 0
OP_END = -1
BAR_STORER = 2
N_STORER = 64
IEMPTY_ARRIVALS = 1 + 2 + gk.NUM_CONSUMER_WARPS   # loader warp, storer warps, consumer warps


@cute.jit
def wait_counter(counters: cute.Tensor, c: Int32, target: Int32, timeout_ns: Int64,
                 state: cute.Tensor, ticket: Int32) -> Int32:
    """Spin until counters[c] >= target (ld.acquire.gpu, growing nanosleep, bounded). 1 = ok."""
    p = (counters.iterator + c).llvm_ptr
    v = cute.arch.load(p, Int32, sem="acquire", scope="gpu")
    ok = Int32(1)
    if v < target:
        t0 = cute.arch.globaltimer()
        ns = Int32(20)
        st = Int32(0)
        while st == 0:
            prims.nanosleep(ns)
            if ns < 1000:
                ns = ns * 2
            v = cute.arch.load(p, Int32, sem="acquire", scope="gpu")
            if v >= target:
                st = Int32(1)
            elif cute.arch.load((state.iterator + rk.S_ABORT).llvm_ptr, Int32, sem="relaxed",
                                scope="gpu") != 0:
                st = Int32(3)
            elif cute.arch.globaltimer() - t0 > timeout_ns:
                st = Int32(2)
        if st == 2:
            rk.write_error(state, rk.ERR_COUNTER_WAIT, ticket, c, v, target)
        if st != 1:
            ok = Int32(0)
    return ok


class GemmHarnessDSL:
    """x: (T, K, NBX) bf16 K-contiguous; w: (N, K, L) bf16 K-contiguous (layer-stacked weights);
    y: (T, N, NBY) bf16 (or (S, V, 1) float32 for LM_HEAD), N-contiguous, compact.
    QKV_ROPE also: meta (int32 step metadata, mk.instructions._common layout), inv_freq (float32
    [64]), kv: (KVROWS, hkv*D, 2) bf16, z = 0 the K cache, 1 the V cache; y is the Q buffer.
    Other opcodes get small dummies for these."""

    def __init__(self, op, cfg: gk.TileConfig, npages: int = NPAGES):
        assert reg_split_ok(), (f"setmaxnreg split {REG_LOW}/{REG_HIGH} over-subscribes the CTA's "
                                f"{THREADS} x {LAUNCH_REGS} registers")
        self.op = int(op)
        self.epi = gk.epi_of(op)
        self.cfg = cfg.check(gk.out_bytes_of(self.epi), npages)
        self.npages = npages

    @cute.jit
    def __call__(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor, n_ctr: Int32,
                 state: cute.Tensor, x: cute.Tensor, w: cute.Tensor, y: cute.Tensor,
                 meta: cute.Tensor, inv_freq: cute.Tensor, kv: cute.Tensor,
                 timeout_ns: Int64, grid: Int32, stream):
        resid = self.epi == gk.EPI_RESIDUAL
        at = gk.GemmAtoms(self.cfg, x, w, y, residual=resid)
        tma_r, gR = at.tma_a, at.gA          # placeholders (never used) without a residual
        if cutlass.const_expr(resid):
            tma_r, gR = at.tma_r, at.gR

        @cute.struct
        class Storage:
            ifull: cute.struct.MemRange[cutlass.Int64, NISLOTS]
            iempty: cute.struct.MemRange[cutlass.Int64, NISLOTS]
            full: cute.struct.MemRange[cutlass.Int64, self.npages]
            empty: cute.struct.MemRange[cutlass.Int64, self.npages]
            done: cute.struct.MemRange[cutlass.Int64, self.npages]
            ring: cute.struct.MemRange[cutlass.Int32, NISLOTS * INSTR_WORDS]
            tick: cute.struct.MemRange[cutlass.Int32, NISLOTS]
            flag: cute.struct.MemRange[cutlass.Int32, 4]
            pool: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.npages * gk.PAGE], 1024]
        self.storage = Storage
        self.kernel(instrs, n_instr, counters, n_ctr, state, at.tma_a, at.gA, at.tma_b, at.gB,
                    tma_r, gR, at.tiled_mma, at.sA_layout, at.sB_layout, y, w, meta, inv_freq,
                    kv, timeout_ns).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream,
            max_number_threads=[THREADS, 1, 1], min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor, n_ctr: Int32,
               state: cute.Tensor, tma_a: cute.CopyAtom, gA: cute.Tensor, tma_b: cute.CopyAtom,
               gB: cute.Tensor, tma_r: cute.CopyAtom, gR: cute.Tensor, tiled_mma: cute.TiledMma,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout, y: cute.Tensor,
               w: cute.Tensor, meta: cute.Tensor, inv_freq: cute.Tensor, kv: cute.Tensor,
               timeout_ns: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        NP = self.npages
        cfg = self.cfg
        epi = self.epi
        is_qkv = self.op == int(Op.QKV_ROPE)
        KW = qk.A_K if is_qkv else MM_A_K        # the K word of the opcode's arguments
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        ifull = st.ifull.data_ptr()
        iempty = st.iempty.data_ptr()
        full = st.full.data_ptr()
        empty = st.empty.data_ptr()
        done = st.done.data_ptr()
        ring = st.ring.get_tensor(cute.make_layout(NISLOTS * INSTR_WORDS))
        tick = st.tick.get_tensor(cute.make_layout(NISLOTS))
        flag = st.flag.get_tensor(cute.make_layout(4))
        pool = st.pool.data_ptr().toint()

        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
            if cutlass.const_expr(epi == gk.EPI_RESIDUAL):
                cute.nvgpu.cpasync.prefetch_descriptor(tma_r)
            with cute.arch.elect_one():
                for s in cutlass.range_constexpr(NISLOTS):
                    cute.arch.mbarrier_init(ifull + s, 1)
                    cute.arch.mbarrier_init(iempty + s, IEMPTY_ARRIVALS)
                for p in cutlass.range_constexpr(NP):
                    cute.arch.mbarrier_init(full + p, 1)
                    cute.arch.mbarrier_init(empty + p, gk.EMPTY_ARRIVALS)
                    cute.arch.mbarrier_init(done + p, gk.DONE_ARRIVALS)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if warp < 4:
            cute.arch.setmaxregister_decrease(REG_LOW)
            if warp == 0:
                # ------------------------------------------------------------ controller
                islot = Int32(0)
                iph = Int32(0)
                live = Int32(1)
                while live == 1:
                    rk.bounded_bar_wait(iempty + islot, iph ^ 1, timeout_ns, state,
                                        rk.ERR_INSTR_SLOT, Int32(-1))
                    t = Int32(0)
                    if lane == 0:
                        t = cute.arch.atomic_add((state.iterator + rk.S_HEAD).llvm_ptr, Int32(1),
                                                 sem="relaxed", scope="gpu")
                    t = cute.arch.shuffle_sync(t, 0)
                    wd = Int32(OP_END)
                    if t < n_instr:
                        wd = instrs[t, lane]
                        wi = W_WAIT0 + 2 * (lane % MAX_WAITS)
                        c = cute.arch.shuffle_sync(wd, wi)
                        tg = cute.arch.shuffle_sync(wd, wi + 1)
                        ok = Int32(1)
                        if lane < MAX_WAITS:
                            if c >= 0:
                                ok = wait_counter(counters, c, tg, timeout_ns, state, t)
                        if not cute.arch.vote_all_sync(ok == 1):
                            wd = Int32(OP_END)
                            live = Int32(0)
                    else:
                        live = Int32(0)
                    if lane == 0:
                        ring[islot * INSTR_WORDS] = wd
                        tick[islot] = t
                    else:
                        ring[islot * INSTR_WORDS + lane] = wd
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(ifull + islot)
                    islot = islot + 1
                    if islot == NISLOTS:
                        islot = Int32(0)
                        iph = iph ^ 1
            elif warp == 1:
                # ------------------------------------------------------------ TMA loader
                islot = Int32(0)
                iph = Int32(0)
                live = Int32(1)
                pg = Int32(0)
                half = w.shape[0] // 2
                while live == 1:
                    rk.bounded_bar_wait(ifull + islot, iph, timeout_ns, state, rk.ERR_INSTR_SLOT,
                                        Int32(-1))
                    base = islot * INSTR_WORDS
                    op = ring[base + W_OPCODE]
                    t = tick[islot]
                    layer = ring[base + W_LAYER]
                    row0 = ring[base + W_ROW0]
                    col0 = ring[base + W_COL0]
                    kt = (ring[base + KW] + (gk.BK - 1)) // gk.BK
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(iempty + islot)
                    if op == OP_END:
                        live = Int32(0)
                    elif op == self.op:
                        pg = gk.gemm_load(cfg, epi, tma_a, gA, tma_b, gB, tma_r, gR, sA_layout,
                                          sB_layout, Int32(0), Int32(0), layer, row0, col0,
                                          half + col0, kt, pool, full, empty, pg, NP, timeout_ns,
                                          state, t)
                    islot = islot + 1
                    if islot == NISLOTS:
                        islot = Int32(0)
                        iph = iph ^ 1
            else:
                # ------------------------------------------------------------ storer (warps 2-3)
                sid = tidx - 64
                islot = Int32(0)
                iph = Int32(0)
                live = Int32(1)
                pg = Int32(0)
                y_ld = y.shape[1]
                y_base = y.iterator.toint()
                kv_ld = kv.shape[1]
                kv_base = kv.iterator.toint()
                kv_z = Int64(kv.shape[0]) * Int64(kv.shape[1]) * 2
                while live == 1:
                    rk.bounded_bar_wait(ifull + islot, iph, timeout_ns, state, rk.ERR_INSTR_SLOT,
                                        Int32(-1))
                    base = islot * INSTR_WORDS
                    op = ring[base + W_OPCODE]
                    t = tick[islot]
                    row0 = ring[base + W_ROW0]
                    rows = ring[base + W_ROWS]
                    col0 = ring[base + W_COL0]
                    cols = ring[base + W_COLS]
                    kt = (ring[base + KW] + (gk.BK - 1)) // gk.BK
                    sig = ring[base + W_SIGNAL]
                    sigc = ring[base + W_SIGNAL_COUNT]
                    layer = ring[base + W_LAYER]
                    sec = ring[base + qk.A_SECTION]
                    sec_c0 = ring[base + qk.A_SEC_COL0]
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(iempty + islot)
                    if op == OP_END:
                        live = Int32(0)
                    elif op == self.op:
                        ybase = y_base
                        ld = y_ld
                        rowmap = Int32(-1)
                        radd = Int32(0)
                        dcol0 = col0
                        if cutlass.const_expr(is_qkv):
                            if sec != gk.SEC_Q:
                                # K/V rows go to the paged cache: kv_slot[t] + layer * stride
                                ybase = kv_base + kv_z * Int64(sec - 1)
                                ld = kv_ld
                                rowmap = meta[mc.M_OFF_SLOT]
                                radd = layer * meta[mc.M_KV_LAYER_STRIDE]
                                dcol0 = col0 - sec_c0
                        pg = gk.gemm_store(cfg, epi, ybase, ld, row0, rows, col0, cols, pool,
                                           empty, done, pg, kt, NP, sid, BAR_STORER, N_STORER,
                                           timeout_ns, state, t, meta, rowmap, radd, dcol0)
                        # every store of this instruction precedes the storer barrier inside
                        if sid == 0:
                            if sig >= 0:
                                cute.arch.fence_acq_rel_gpu()
                                cute.arch.red((counters.iterator + sig).llvm_ptr, sigc, op="add",
                                              dtype="s32", sem="release", scope="gpu")
                    islot = islot + 1
                    if islot == NISLOTS:
                        islot = Int32(0)
                        iph = iph ^ 1
        else:
            # ---------------------------------------------------------------- consumers (2 WGs)
            cute.arch.setmaxregister_increase(REG_HIGH)
            ctid = tidx - 128
            islot = Int32(0)
            iph = Int32(0)
            live = Int32(1)
            pg = Int32(0)
            while live == 1:
                rk.bounded_bar_wait(ifull + islot, iph, timeout_ns, state, rk.ERR_INSTR_SLOT,
                                    Int32(-1))
                base = islot * INSTR_WORDS
                op = ring[base + W_OPCODE]
                t = tick[islot]
                kt = (ring[base + KW] + (gk.BK - 1)) // gk.BK
                row0 = ring[base + W_ROW0]
                rows = ring[base + W_ROWS]
                sec = ring[base + qk.A_SECTION]
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(iempty + islot)
                if op == OP_END:
                    live = Int32(0)
                elif op == self.op:
                    pg = gk.gemm_consume(cfg, epi, tiled_mma, sA_layout, sB_layout, kt, pool,
                                         full, empty, done, pg, NP, ctid, timeout_ns, state, t,
                                         meta, inv_freq, row0, rows, sec)
                islot = islot + 1
                if islot == NISLOTS:
                    islot = Int32(0)
                    iph = iph ^ 1

        # -------------------------------------------------------------------- teardown
        cute.arch.sync_threads()
        if tidx == 0:
            cute.arch.fence_acq_rel_gpu()
            old = cute.arch.atomic_add((state.iterator + rk.S_EXIT).llvm_ptr, Int32(1),
                                       sem="acq_rel", scope="gpu")
            last = Int32(0)
            if old == Int32(gdim) - 1:
                if cute.arch.load((state.iterator + rk.S_ABORT).llvm_ptr, Int32, sem="relaxed",
                                  scope="gpu") == 0:
                    last = Int32(1)
            flag[0] = last
        cute.arch.sync_threads()
        if flag[0] == 1:
            for i in range(tidx, n_ctr, THREADS):
                counters[i] = Int32(0)
            if tidx == 0:
                state[rk.S_HEAD] = Int32(0)
                state[rk.S_EXIT] = Int32(0)



# ============================================================================ host side (GPU)
GROUP_M = 8            # tiles raster: GROUP_M row tiles x all column tiles, then the next group


def plan_tiles(op, cfg: gk.TileConfig, m: int, n_out: int, k: int, layer: int = 0,
               src: int = 0, dst: int = 0, signal_base: int | None = 0, group_m: int = GROUP_M):
    """The instructions of one whole GEMM (rows [0, m) x output columns [0, n_out)), in mk.ir
    format with matmul.py's argument words, in grouped raster order (group_m row tiles share each
    weight tile while it is in L2). signal_base: row tile i signals counter signal_base + i (target:
    the number of column tiles), None for no signals. Returns (int32 [n, 32] tensor, n_counters)."""
    import torch

    from mk.instructions.matmul import A_EPI, A_K, A_SLOT_STRIDE, A_DST, A_SRC
    from mk.ir import ARG0, NUM_ARGS, Instruction, serialize
    mt = -(-m // cfg.bm)
    nt = -(-n_out // cfg.bn)
    epi = int(gk.epi_of(op)) if gk.epi_of(op) != gk.EPI_STORE_F32 else 0
    out = []
    for g0 in range(0, mt, group_m):
        for j in range(nt):
            for i in range(g0, min(mt, g0 + group_m)):
                args = [0] * NUM_ARGS
                args[A_SRC - ARG0], args[A_DST - ARG0], args[A_EPI - ARG0] = src, dst, epi
                args[A_SLOT_STRIDE - ARG0], args[A_K - ARG0] = 0, k
                r0, c0 = i * cfg.bm, j * cfg.bn
                out.append(Instruction(
                    int(op), layer=layer, row0=r0, rows=min(cfg.bm, m - r0), col0=c0,
                    cols=min(cfg.bn, n_out - c0),
                    signal=(-1 if signal_base is None else signal_base + i), args=args))
    return serialize(out), (0 if signal_base is None else signal_base + mt)


def plan_qkv(cfg: gk.TileConfig, m: int, sections, k: int, head_dim: int = 128, layer: int = 0,
             src: int = 0, dst: int = 0, signal_base: int | None = 0, group_m: int = GROUP_M):
    """QKV_ROPE tiles over rows [0, m): sections = [(section, first col, end col)] of the qkv
    output (q, k, v), column tiles of cfg.bn within each section (qkv.py's argument words)."""
    from mk.ir import ARG0, NUM_ARGS, Instruction, serialize
    mt = -(-m // cfg.bm)
    out = []
    for g0 in range(0, mt, group_m):
        for sec, s0, s1 in sections:
            for c0 in range(s0, s1, cfg.bn):
                for i in range(g0, min(mt, g0 + group_m)):
                    args = [0] * NUM_ARGS
                    for word, v in ((qk.A_SRC, src), (qk.A_DST, dst), (qk.A_SECTION, sec),
                                    (qk.A_SEC_COL0, s0), (qk.A_HEAD_DIM, head_dim), (qk.A_K, k)):
                        args[word - ARG0] = v
                    r0 = i * cfg.bm
                    out.append(Instruction(
                        int(Op.QKV_ROPE), layer=layer, row0=r0, rows=min(cfg.bm, m - r0), col0=c0,
                        cols=min(cfg.bn, s1 - c0),
                        signal=(-1 if signal_base is None else signal_base + i), args=args))
    return serialize(out), (0 if signal_base is None else signal_base + mt)


def _dl(t, align: int = 16, dynamic: bool = True):
    from cutlass.cute.runtime import from_dlpack
    x = from_dlpack(t, assumed_align=align)
    if dynamic:
        lead = [i for i in range(t.dim()) if t.stride(i) == 1 and t.shape[i] > 1]
        x = x.mark_layout_dynamic(leading_dim=lead[0] if lead else t.dim() - 1)
    return x


def as3d(t):
    """torch [R, C] (C contiguous) or [Z, R, C] -> the (R, C, Z) view the kernel takes."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    assert t.stride(-1) == 1 and t[0].is_contiguous(), "rows must be C-contiguous"
    return t.permute(1, 2, 0)


_COMPILED: dict = {}


class HarnessHang(RuntimeError):
    """The launch did not finish: the process's GPU context is unusable after this."""


class GemmHarness:
    """Runs plan_tiles() streams of one opcode on the GPU with the harness kernel.

        h = GemmHarness(Op.O_PROJ, gk.TILES["m128n256"])
        prepared = h.prepare(instrs, x, w, y)    # x [T, K] bf16, w [L, N, K] bf16, y [T, N]
        h.launch(prepared)                        # raises MegakernelError-like RuntimeError on a
                                                  # timed-out wait
    """

    def __init__(self, op, cfg: gk.TileConfig, n_counters: int = 4096, timeout_s: float = 2.0,
                 npages: int = NPAGES, grid: int | None = None, device=None):
        import torch
        self.op, self.cfg, self.npages = Op(op), cfg, npages
        dev = torch.device(device or "cuda")
        self.counters = torch.zeros(n_counters, dtype=torch.int32, device=dev)
        self.state = torch.zeros(rk.STATE_WORDS, dtype=torch.int32, device=dev)
        self.timeout_ns = int(timeout_s * 1e9)
        props = torch.cuda.get_device_properties(dev)
        self.grid = grid or props.multi_processor_count   # 1 CTA/SM: ~210 KB of shared memory
        self.key = (int(op), cfg.name, npages)
        self._host_state = torch.zeros(rk.STATE_WORDS, dtype=torch.int32).pin_memory()

    def prepare(self, instrs, x, w, y, meta=None, inv_freq=None, kv=None):
        """kv: [2, KVROWS, hkv*D] (K cache, V cache) for QKV_ROPE."""
        import torch
        dev = self.counters.device
        if meta is None:
            meta = torch.zeros(16, dtype=torch.int32, device=dev)
        if inv_freq is None:
            inv_freq = torch.zeros(64, dtype=torch.float32, device=dev)
        if kv is None:
            kv = torch.zeros(2, 8, 8, dtype=torch.bfloat16, device=dev)
        assert kv.dim() == 3 and kv.shape[0] == 2 and kv.is_contiguous()
        s = instrs.to(self.counters.device, torch.int32).contiguous()
        n_ctr = int(max(int(s[:, W_SIGNAL].max()) + 1, 1)) if len(s) else 1
        assert n_ctr <= self.counters.numel()
        if w.dim() == 2:
            w = w.unsqueeze(0)
        args = [_dl(s, 4), Int32(s.shape[0]), _dl(self.counters, 4), Int32(n_ctr),
                _dl(self.state, 4, dynamic=False), _dl(as3d(x)), _dl(w.permute(1, 2, 0)),
                _dl(as3d(y)), _dl(meta.contiguous(), 4), _dl(inv_freq.float().contiguous(), 16),
                _dl(kv.permute(1, 2, 0)), Int64(self.timeout_ns), Int32(self.grid)]
        return args, (s, x, w, y, meta, inv_freq, kv)       # keep the tensors alive

    def _compiled(self, args):
        import cuda.bindings.driver as drv
        import torch
        cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
        if self.key not in _COMPILED:
            t0 = time.time()
            _COMPILED[self.key] = cute.compile(GemmHarnessDSL(self.op, self.cfg, self.npages),
                                               *args, cs)
            print(f"[gemm_harness] compiled {self.op.name} {self.cfg.name} in "
                  f"{time.time() - t0:.1f} s", flush=True)
        return _COMPILED[self.key], cs

    def launcher(self, prepared):
        """A no-argument launch on the then-current stream."""
        args, _keep = prepared
        comp, _ = self._compiled(args)

        def go():
            import cuda.bindings.driver as drv
            import torch
            comp(*args, drv.CUstream(torch.cuda.current_stream().cuda_stream))
        return go

    def launch(self, prepared, check: bool = True, hang_s: float = 20.0):
        self.launcher(prepared)()
        if check:
            self.wait(hang_s)
            self.check()

    def wait(self, hang_s: float = 20.0):
        """Wait for the launch; if it is still running after hang_s (a wait that is not bounded:
        setmaxnreg, a named barrier, the teardown's sync), read the state words through a
        non-blocking side stream and raise HarnessHang with the error record."""
        import torch
        ev = torch.cuda.Event()
        ev.record()
        t0 = time.time()
        while not ev.query():
            if time.time() - t0 > hang_s:
                side = torch.cuda.Stream(device=self.state.device)
                with torch.cuda.stream(side):
                    self._host_state.copy_(self.state, non_blocking=True)
                    e2 = torch.cuda.Event()
                    e2.record(side)
                t1 = time.time()
                while not e2.query() and time.time() - t1 < 5:
                    time.sleep(0.01)
                st = self._host_state.tolist() if e2.query() else None
                raise HarnessHang(f"kernel still running after {hang_s:.0f} s (a wait that is not "
                                  f"bounded); state words {st}")
            time.sleep(0.001)

    def check(self):
        st = self.state.cpu()
        if int(st[rk.S_ERR_FLAG]) or int(st[rk.S_ABORT]):
            msg = (f"gemm harness wait timed out: kind {int(st[rk.S_ERR_KIND])} instruction "
                   f"{int(st[rk.S_ERR_INSTR])} counter {int(st[rk.S_ERR_COUNTER])} = "
                   f"{int(st[rk.S_ERR_VALUE])} target {int(st[rk.S_ERR_TARGET])} "
                   f"(SM {int(st[rk.S_ERR_SM])}, CTA {int(st[rk.S_ERR_CTA])})")
            self.counters.zero_()
            self.state.zero_()
            raise RuntimeError(msg)
        if int(st[rk.S_HEAD]) or int(st[rk.S_EXIT]):
            raise RuntimeError(f"harness state not reset by the kernel: {st.tolist()}")
        if int(self.counters.abs().sum()):
            raise RuntimeError("counters not reset by the kernel")


# ============================================================================ CPU compile (fake)
def fake_args(op, M=None, N=None, K=None):
    """Fake tensors with dynamic shapes for a CPU compile (shapes only fix divisibility)."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor
    S = cute.sym_int
    T, Kd, Nd = S(), S(divisibility=64), S(divisibility=8)
    out_ty = Float32 if gk.epi_of(op) == gk.EPI_STORE_F32 else BFloat16
    x = make_fake_tensor(BFloat16, (T, Kd, S()), stride=(S(divisibility=64), 1, S(divisibility=64)),
                         assumed_align=16)
    w = make_fake_tensor(BFloat16, (Nd, Kd, S()), stride=(S(divisibility=64), 1, S(divisibility=64)),
                         assumed_align=16)
    y = make_fake_tensor(out_ty, (T, Nd, S()), stride=(S(divisibility=8), 1, S(divisibility=8)),
                         assumed_align=16)
    meta = make_fake_compact_tensor(Int32, (S(),), assumed_align=4)
    inv_freq = make_fake_compact_tensor(Float32, (64,), assumed_align=16)
    kv = make_fake_tensor(BFloat16, (S(), Nd, 2), stride=(S(divisibility=8), 1, S(divisibility=8)),
                          assumed_align=16)
    return [make_fake_compact_tensor(Int32, (S(), INSTR_WORDS), stride_order=(1, 0), assumed_align=4),
            Int32(1), make_fake_compact_tensor(Int32, (S(),), assumed_align=4), Int32(1),
            make_fake_compact_tensor(Int32, (rk.STATE_WORDS,), assumed_align=4),
            x, w, y, meta, inv_freq, kv, Int64(1), Int32(132), make_fake_stream()]


def compile_fake(op, cfg: gk.TileConfig, npages: int = NPAGES):
    """cute.compile for sm_90a on the CPU; returns the compiled object (PTX in __ptx__)."""
    return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN](
        GemmHarnessDSL(op, cfg, npages), *fake_args(op))


if __name__ == "__main__":
    import sys
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    op = Op[sys.argv[1].upper()] if len(sys.argv) > 1 else Op.O_PROJ
    name = sys.argv[2] if len(sys.argv) > 2 else "m128n256"
    t0 = time.time()
    comp = compile_fake(op, gk.TILES[name])
    print(f"{op.name} {name}: compiled in {time.time() - t0:.1f}s, PTX {len(comp.__ptx__ or '')} chars")
