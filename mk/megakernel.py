"""The persistent CuTe DSL megakernel: one launch runs a whole instruction stream on the GPU.

GPU-only module (imports cutlass at the top); `import mk` never loads it.

Execution model
---------------
* Grid = SM count x resident blocks per SM from the occupancy query (asserted >= 1): every CTA is
  resident, so a queue in topological order cannot deadlock.
* Block = 256 threads in warp roles (DESIGN.md):
    warp 0      controller: takes instruction tickets from the global queue (atomic add on the queue
                head), copies the 32 header/arg words into a shared-memory instruction ring slot,
                waits for the instruction's (counter, target) pairs (lanes 0..3, one wait each,
                ld.acquire.gpu + nanosleep doubling from 20 ns to backoff_ns = 200 ns, bounded),
                then publishes the slot (mbarrier).
    warp 1      loader: TMA (cp.async.bulk.tensor) loads of the instruction's row chunks into pages
                of the shared-memory page pool (full/empty mbarriers per page).
    warps 2-3   storer: 16-byte st.global of result pages with exact masks, frees each page after
                its last read, then signals the instruction's counter with red.release.gpu after a
                fence (after all the instruction's stores).
    warps 4-7   consumer warpgroup: the instruction body's math (setmaxregister_increase); the
                other warpgroup runs setmaxregister_decrease.
  The controller runs up to NISLOTS instructions ahead, so the next instruction's waits overlap
  the current instruction's body.
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

Test mode (`--backend megakernel` for plans made only of the rows family)
-------------------------------------------------------------------------
    python -m mk.megakernel selftest [--model DIR] [--tokens T] [--json]
builds rows-only plans (norm/residual DAGs of the model's shape in random topological queue orders,
cross-SM dependency chains, NOOP joins) with the model's norm weights (default: the tiny random
checkpoint), runs them on the GPU through MegakernelBackend(..., test_mode=True).run_stream and
compares every buffer with the rows family's torch faces (rows_oracle): bit-exact where the plan has
no RMSNORM, else within bf16 rounding. Exit code 0 = passed, 1 = mismatch or no usable GPU.
A model step needs opcodes the megakernel has no GPU body for yet: `--backend megakernel` for a
model (launch/generate.py, mk.Engine) stops at once with a NotImplementedError naming them.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch

try:
    import cutlass
except ImportError as _e:  # `python -m mk.megakernel ...` without CuTe DSL: a clear message
    if __name__ == "__main__":
        sys.exit(f"error: the megakernel needs NVIDIA's CuTe DSL (pip install "
                 f"nvidia-cutlass-dsl): {_e}")
    raise
import cutlass.cute as cute
import cutlass.experimental.primitives as prims
from cutlass import BFloat16, Float32, Int32, Int64

from mk.instructions import _rows_kernel as rk
from mk.instructions.base import Buf, NormWeight
from mk.ir import (ARG0, INSTR_WORDS, MAX_WAITS, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0, W_ROWS,
                   W_SIGNAL, W_SIGNAL_COUNT, W_SIGNAL_SCOPE, W_WAIT0, Op, SignalScope)
from mk.instructions.rows import A_DST, A_NORM_WEIGHT, A_SRC

THREADS = 256
NISLOTS = 4            # instruction ring slots (controller look-ahead)
NPAGES = 13            # 13 x 16 KiB page pool
REG_LOW = 56           # controller / loader / storer warpgroup
REG_HIGH = 232         # consumer warpgroup
OP_END = -1
JOURNAL_WORDS = 8      # journal row: sm, cta, opcode, t_fetch, t_ready, t_end, ticket, 0
J_SM, J_CTA, J_OP, J_FETCH, J_READY, J_END, J_TICKET = range(7)
JCTA_WORDS = 4         # per-CTA row: t_entry, t_exit, sm, 0
BAR_CONSUMER = 1
BAR_STORER = 2
N_STORER = 64
N_CONSUMER = 128
# Generic-proxy hand-offs through the ring and the page pool (see mk/instructions/_rows_kernel.py):
# "thread" = every accessing thread arrives on the mbarrier (what compute-sanitizer racecheck
# models; CUTLASS PipelineAsync style); "warp" = __syncwarp + one arrival per warp; "group" = named
# barrier + one arrival (the original protocol; racecheck reports it).
DEFAULT_HANDOFF = "thread"
# Cap of the growing nanosleep in counter waits (ns). A waiter sleeps at most this long between two
# polls, so the cap bounds the wake-up latency of a cross-SM hand-off.
DEFAULT_BACKOFF_NS = 200
SUPPORTED_OPS = (int(Op.NOOP), int(Op.COPY), int(Op.RMSNORM), int(Op.RESIDUAL_ADD))


class MegakernelError(RuntimeError):
    """A bounded wait inside the megakernel timed out (or the kernel found a bad plan)."""

    KINDS = {rk.ERR_COUNTER_WAIT: "counter wait", rk.ERR_PAGE_EMPTY: "page-empty wait",
             rk.ERR_PAGE_FULL: "page-full wait", rk.ERR_PAGE_DONE: "page-done wait",
             rk.ERR_INSTR_SLOT: "instruction-slot wait", rk.ERR_BAD_OPCODE: "bad opcode"}

    def __init__(self, kind, instr, counter, value, target, sm, cta):
        self.kind, self.instr, self.counter = kind, instr, counter
        self.value, self.target, self.sm, self.cta = value, target, sm, cta
        super().__init__(
            f"megakernel {self.KINDS.get(kind, kind)} timed out: instruction {instr} waited on "
            f"counter {counter} = {value}, target {target} (SM {sm}, CTA {cta})")


# ==================================================================================== device side
@cute.jit
def wait_counter(counters: cute.Tensor, c: Int32, target: Int32, timeout_ns: Int64,
                 state: cute.Tensor, ticket: Int32, backoff_ns: cutlass.Constexpr) -> Int32:
    """Spin until counters[c] >= target (ld.acquire.gpu, nanosleep doubling from 20 ns up to
    backoff_ns, bounded by timeout_ns from globaltimer). 1 = ok."""
    p = (counters.iterator + c).llvm_ptr
    v = cute.arch.load(p, Int32, sem="acquire", scope="gpu")
    ok = Int32(1)
    if v < target:
        t0 = cute.arch.globaltimer()
        ns = Int32(20)
        st = Int32(0)
        while st == 0:
            prims.nanosleep(ns)
            if ns < backoff_ns:
                ns = ns * 2
                if ns > backoff_ns:
                    ns = Int32(backoff_ns)
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


class MegakernelDSL:
    """The compiled object: one per (journal, npages, handoff, backoff_ns) variant; shapes are
    dynamic."""

    def __init__(self, journal: bool = False, npages: int = NPAGES, handoff: str = DEFAULT_HANDOFF,
                 backoff_ns: int = DEFAULT_BACKOFF_NS):
        assert handoff in rk.HANDOFF_MODES, handoff
        self.journal = journal
        self.npages = npages
        self.handoff = handoff
        self.backoff_ns = int(backoff_ns)

    @cute.jit
    def __call__(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor, n_ctr: Int32,
                 state: cute.Tensor, bufs: cute.Tensor, normw: cute.Tensor, n_layers: Int32,
                 eps: Float32, timeout_ns: Int64, journal: cute.Tensor, jcta: cute.Tensor,
                 grid: Int32, stream):
        box = cute.make_layout((rk.PR, rk.BOXC), stride=(rk.BOXC, 1))
        tma, mT = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), bufs, box, (rk.PR, rk.BOXC))

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
            pool: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.npages * rk.PAGE], 1024]
        self.storage = Storage
        self.kernel(instrs, n_instr, counters, n_ctr, state, tma, mT, bufs, normw, n_layers, eps,
                    timeout_ns, journal, jcta).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream,
            max_number_threads=[THREADS, 1, 1], min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, instrs: cute.Tensor, n_instr: Int32, counters: cute.Tensor, n_ctr: Int32,
               state: cute.Tensor, tma: cute.CopyAtom, mT: cute.Tensor, bufs: cute.Tensor,
               normw: cute.Tensor, n_layers: Int32, eps: Float32, timeout_ns: Int64,
               journal: cute.Tensor, jcta: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        NP = self.npages
        HM = self.handoff
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

        if cutlass.const_expr(self.journal):
            if tidx == 0:
                jcta[bidx, 0] = cute.arch.globaltimer()
                jcta[bidx, 2] = Int64(cute.arch.smid())
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma)
            with cute.arch.elect_one():
                for s in cutlass.range_constexpr(NISLOTS):
                    cute.arch.mbarrier_init(ifull + s, rk.arrivals(HM, 32))   # controller
                    # loader + storer + consumer
                    cute.arch.mbarrier_init(iempty + s, rk.arrivals(HM, 32) + rk.arrivals(HM, N_STORER)
                                            + rk.arrivals(HM, N_CONSUMER))
                for p in cutlass.range_constexpr(NP):
                    cute.arch.mbarrier_init(full + p, 1)
                    cute.arch.mbarrier_init(empty + p, rk.arrivals(HM, N_CONSUMER))
                    cute.arch.mbarrier_init(done + p, rk.arrivals(HM, N_CONSUMER))
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
                    tf = cute.arch.globaltimer()
                    w = Int32(OP_END)
                    if t < n_instr:
                        w = instrs[t, lane]
                        wi = W_WAIT0 + 2 * (lane % MAX_WAITS)
                        c = cute.arch.shuffle_sync(w, wi)
                        tg = cute.arch.shuffle_sync(w, wi + 1)
                        ok = Int32(1)
                        if lane < MAX_WAITS:
                            if c >= 0:
                                ok = wait_counter(counters, c, tg, timeout_ns, state, t,
                                                  self.backoff_ns)
                        if cute.arch.vote_all_sync(ok == 1):
                            if cutlass.const_expr(self.journal):
                                if lane == 0:
                                    if t < journal.shape[0]:
                                        journal[t, J_SM] = Int64(cute.arch.smid())
                                        journal[t, J_CTA] = Int64(bidx)
                                        journal[t, J_OP] = Int64(w)
                                        journal[t, J_FETCH] = tf
                                        journal[t, J_READY] = cute.arch.globaltimer()
                                        journal[t, J_TICKET] = Int64(t)
                        else:
                            w = Int32(OP_END)
                            live = Int32(0)
                    else:
                        live = Int32(0)
                    if lane == 0:
                        ring[islot * INSTR_WORDS] = w      # opcode word (END on stop)
                        tick[islot] = t
                    else:
                        ring[islot * INSTR_WORDS + lane] = w
                    rk.release(ifull + islot, rk.arrivals(HM, 32), 32, lane, 0, HM)
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
                while live == 1:
                    rk.bounded_bar_wait(ifull + islot, iph, timeout_ns, state, rk.ERR_INSTR_SLOT,
                                        Int32(-1))
                    base = islot * INSTR_WORDS
                    op = ring[base + W_OPCODE]
                    if op == OP_END:
                        live = Int32(0)
                    else:
                        t = tick[islot]
                        if op == rk.OP_COPY or op == rk.OP_RESIDUAL_ADD or op == rk.OP_RMSNORM:
                            pg = rk.rows_load(tma, mT, op, ring[base + A_SRC], ring[base + A_DST],
                                              ring[base + W_ROW0], ring[base + W_ROWS],
                                              ring[base + W_COL0], ring[base + W_COLS], pool,
                                              full, empty, pg, NP, timeout_ns, state, t)
                        rk.release(iempty + islot, rk.arrivals(HM, 32), 32, lane, 0, HM)
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
                while live == 1:
                    rk.bounded_bar_wait(ifull + islot, iph, timeout_ns, state, rk.ERR_INSTR_SLOT,
                                        Int32(-1))
                    base = islot * INSTR_WORDS
                    op = ring[base + W_OPCODE]
                    if op == OP_END:
                        live = Int32(0)
                    else:
                        t = tick[islot]
                        if op == rk.OP_COPY or op == rk.OP_RESIDUAL_ADD or op == rk.OP_RMSNORM:
                            pg = rk.rows_store(op, ring[base + A_DST], ring[base + W_ROW0],
                                               ring[base + W_ROWS], ring[base + W_COL0],
                                               ring[base + W_COLS], bufs, pool, empty, done, pg,
                                               NP, sid, BAR_STORER, N_STORER, timeout_ns, state, t,
                                               HM)
                        cute.arch.barrier(barrier_id=BAR_STORER, number_of_threads=N_STORER)
                        if sid == 0:
                            sig = ring[base + W_SIGNAL]
                            if sig >= 0:
                                # every store of this instruction precedes the barrier above
                                cute.arch.fence_acq_rel_gpu()
                                cute.arch.red((counters.iterator + sig).llvm_ptr,
                                              ring[base + W_SIGNAL_COUNT], op="add", dtype="s32",
                                              sem="release", scope="gpu")
                            if cutlass.const_expr(self.journal):
                                if t < journal.shape[0]:
                                    journal[t, J_END] = cute.arch.globaltimer()
                        # (the barrier above already ordered the storer threads' ring reads)
                        rk.release(iempty + islot, rk.arrivals(HM, N_STORER), N_STORER, sid,
                                   BAR_STORER, HM, sync=(HM == "warp"))
                        islot = islot + 1
                        if islot == NISLOTS:
                            islot = Int32(0)
                            iph = iph ^ 1
        else:
            # ---------------------------------------------------------------- consumer warpgroup
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
                if op == OP_END:
                    live = Int32(0)
                else:
                    t = tick[islot]
                    if op == rk.OP_COPY or op == rk.OP_RESIDUAL_ADD or op == rk.OP_RMSNORM:
                        pg = rk.rows_consume(op, ring[base + W_ROWS], ring[base + W_COL0],
                                             ring[base + W_COLS], ring[base + W_LAYER],
                                             ring[base + A_NORM_WEIGHT], normw, n_layers, eps,
                                             pool, full, empty, done, pg, NP, ctid, BAR_CONSUMER,
                                             N_CONSUMER, timeout_ns, state, t, HM)
                    rk.release(iempty + islot, rk.arrivals(HM, N_CONSUMER), N_CONSUMER, ctid,
                               BAR_CONSUMER, HM)
                    islot = islot + 1
                    if islot == NISLOTS:
                        islot = Int32(0)
                        iph = iph ^ 1

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
                if cute.arch.load((state.iterator + rk.S_ABORT).llvm_ptr, Int32, sem="relaxed",
                                  scope="gpu") == 0:
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


# ==================================================================================== host side
_COMPILED: dict = {}


def _dl(t: torch.Tensor, align: int = 16, dynamic: bool = True):
    from cutlass.cute.runtime import from_dlpack
    x = from_dlpack(t, assumed_align=align)
    if dynamic:
        lead = [i for i in range(t.dim()) if t.stride(i) == 1 and t.shape[i] > 1]
        x = x.mark_layout_dynamic(leading_dim=lead[0] if lead else t.dim() - 1)
    return x


def compile_megakernel(args, journal: bool, verbose: bool = True, shape_key=(),
                       handoff: str = DEFAULT_HANDOFF, backoff_ns: int = DEFAULT_BACKOFF_NS):
    """cute.compile with an in-process cache per variant and arena/norm-table shape."""
    key = (journal, handoff, int(backoff_ns)) + tuple(shape_key)
    if key not in _COMPILED:
        t0 = time.time()
        _COMPILED[key] = cute.compile[cute.KeepCUBIN](
            MegakernelDSL(journal=journal, handoff=handoff, backoff_ns=backoff_ns), *args)
        if verbose:
            print(f"[mk.megakernel] compiled variant journal={journal} handoff={handoff} "
                  f"backoff_ns={backoff_ns} in {time.time() - t0:.1f} s", flush=True)
    return _COMPILED[key]


def resident_blocks_per_sm(compiled, smem_bytes: int, device: int = 0) -> tuple[int, str]:
    """Blocks of THREADS threads with smem_bytes of dynamic shared memory resident per SM.

    Uses cuOccupancyMaxActiveBlocksPerMultiprocessor on the compiled cubin when it can be loaded,
    else the device limits (shared memory, threads, registers) — both are reported."""
    props = torch.cuda.get_device_properties(device)
    try:
        import cuda.bindings.driver as drv
        cubin = compiled.__cubin__
        if cubin is None:
            raise RuntimeError("no cubin kept")
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
        per_sm_smem = props.shared_memory_per_multiprocessor
        by_smem = per_sm_smem // (smem_bytes + 1024)
        by_threads = props.max_threads_per_multi_processor // THREADS
        by_regs = 65536 // (THREADS * 128)   # setmaxnreg budget: 56*128 + 232*128 <= 128/thread avg
        return int(min(by_smem, by_threads, by_regs)), f"device limits ({type(e).__name__}: {e})"


def smem_bytes_estimate(npages: int = NPAGES) -> int:
    return (npages * rk.PAGE + 1024 + 8 * (2 * NISLOTS + 3 * npages)
            + 4 * (NISLOTS * INSTR_WORDS + NISLOTS + 4))


def norm_table(weights, dtype=torch.bfloat16) -> torch.Tensor:
    """[3L, H] norm weights: rows which*L + layer (ATTN, MLP, FINAL; FINAL is row 2L)."""
    L, H = weights.attn_norm.shape
    t = torch.zeros(3 * L, H, dtype=dtype, device=weights.attn_norm.device)
    t[0:L] = weights.attn_norm
    t[L:2 * L] = weights.mlp_norm
    t[2 * L:3 * L] = weights.final_norm
    return t


def check_plan(stream: torch.Tensor, nbuf: int, T: int, H: int, n_counters: int, npages: int = NPAGES):
    """Host-side refusal of what this kernel cannot run (before it could hang or fault)."""
    s = stream.detach().cpu()
    if s.dtype != torch.int32 or s.dim() != 2 or s.shape[1] != INSTR_WORDS:
        raise ValueError(f"instruction stream must be int32 [N, {INSTR_WORDS}]")
    ops = s[:, W_OPCODE]
    bad = [int(o) for o in ops.unique() if int(o) not in SUPPORTED_OPS]
    if bad:
        raise NotImplementedError(f"megakernel has no GPU body for opcodes {bad}")
    if (s[:, W_SIGNAL_SCOPE] != int(SignalScope.LOCAL)).any():
        raise NotImplementedError("megakernel: PEER/ALL signal scopes need mk.comm (not yet)")
    sig = s[:, W_SIGNAL]
    waits = s[:, W_WAIT0:W_WAIT0 + 2 * MAX_WAITS:2]
    mx = max(int(sig.max()) if len(s) else -1, int(waits.max()) if len(s) else -1)
    if mx >= n_counters:
        raise ValueError(f"plan uses counter {mx}, the megakernel has {n_counters}")
    pageops = (ops != int(Op.NOOP))
    if pageops.any():
        p = s[pageops]
        if ((p[:, W_COL0] % 8) != 0).any() or ((p[:, W_COLS] % 8) != 0).any():
            raise ValueError("rows tiles must start and end on 8-column boundaries")
        if (p[:, W_ROW0] < 0).any() or (p[:, W_ROW0] + p[:, W_ROWS] > T).any() \
                or (p[:, W_COL0] + p[:, W_COLS] > H).any() or (p[:, W_ROWS] <= 0).any():
            raise ValueError("rows tile outside the [T, H] buffers")
        if (p[:, A_SRC] >= nbuf).any() or (p[:, A_DST] >= nbuf).any():
            raise ValueError(f"buffer id beyond the arena's {nbuf} buffers")
        rn = p[p[:, W_OPCODE] == int(Op.RMSNORM)]
        if len(rn) and (((rn[:, W_COL0] != 0) | (rn[:, W_COLS] != H)).any()):
            raise ValueError("RMSNORM tiles must span the whole row")
        if -(-H // rk.PC) > npages:
            raise ValueError(f"H={H} needs {-(-H // rk.PC)} pages per RMSNORM row group, "
                             f"the pool has {npages}")
    return mx + 1


class Megakernel:
    """Runs instruction streams of the rows family on one GPU.

    arena: [NBUF, T, H] bf16 CUDA tensor (buffers by Buf id); normw: [3L, H] (norm_table);
    journal: compile the variant that writes the per-instruction journal; handoff / backoff_ns:
    the compile-time hand-off mode and counter-wait backoff cap (DEFAULT_HANDOFF,
    DEFAULT_BACKOFF_NS)."""

    def __init__(self, arena: torch.Tensor, normw: torch.Tensor, n_layers: int, eps: float,
                 n_counters: int = 1 << 16, journal: bool = False, timeout_s: float = 2.0,
                 journal_capacity: int = 1 << 16, grid: int | None = None, verbose: bool = True,
                 handoff: str = DEFAULT_HANDOFF, backoff_ns: int = DEFAULT_BACKOFF_NS):
        assert handoff in rk.HANDOFF_MODES, f"handoff must be one of {rk.HANDOFF_MODES}"
        assert 20 <= backoff_ns <= 1_000_000, "backoff_ns must lie in [20 ns, 1 ms]"
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
        dev = arena.device
        self.counters = torch.zeros(n_counters, dtype=torch.int32, device=dev)
        self.state = torch.zeros(rk.STATE_WORDS, dtype=torch.int32, device=dev)
        self.journal_on = journal
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

    # -- compile & launch ---------------------------------------------------------------------
    def _args(self, stream_dev: torch.Tensor, n_ctr: int, cu_stream):
        bufs = self.arena.permute(1, 2, 0)            # (T, H, NBUF), H contiguous
        return [_dl(stream_dev, 4), Int32(stream_dev.shape[0]), _dl(self.counters, 4),
                Int32(n_ctr), _dl(self.state, 4, dynamic=False), _dl(bufs, 16),
                _dl(self.normw, 16), Int32(self.n_layers), Float32(self.eps),
                Int64(self.timeout_ns), _dl(self.journal, 8), _dl(self.jcta, 8),
                Int32(self.grid or 1), cu_stream]

    def prepare(self, stream: torch.Tensor):
        """Check and upload a plan; returns a handle for launch()."""
        n_ctr = check_plan(stream, self.nbuf, self.T, self.H, self.counters.numel())
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
        if self.grid is None:
            self.grid = 1
            comp = compile_megakernel(self._args(s, n_ctr, cs), self.journal_on, self.verbose,
                                      self._shape_key, self.handoff, self.backoff_ns)
            nb, src = resident_blocks_per_sm(comp, smem_bytes_estimate())
            assert nb >= 1, f"megakernel: {nb} resident blocks per SM ({src})"
            self.blocks_per_sm = nb
            self.occupancy_source = src
            self.grid = self._grid_override or self.num_sms * nb
            assert self.grid <= self.num_sms * nb, "more CTAs than can be resident would deadlock"
            assert self.grid <= self.jcta.shape[0]
            if self.verbose:
                print(f"[mk.megakernel] grid {self.grid} = {self.num_sms} SMs x {nb} blocks/SM "
                      f"({src})", flush=True)
        return compile_megakernel(self._args(s, n_ctr, cs), self.journal_on, False,
                                  self._shape_key, self.handoff, self.backoff_ns), cs

    def launch(self, prepared, check: bool = True):
        s, n, n_ctr = prepared
        comp, cs = self._ensure_compiled(s, n_ctr)
        args = self._args(s, n_ctr, cs)
        args[1] = Int32(n)
        comp(*args)
        if check:
            self.check()

    def launcher(self, prepared):
        """A no-argument launch on the then-current stream (for CUDA-graph capture / benchmarks)."""
        s, n, n_ctr = prepared
        comp, _ = self._ensure_compiled(s, n_ctr)

        def go():
            import cuda.bindings.driver as drv
            cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
            args = self._args(s, n_ctr, cs)
            args[1] = Int32(n)
            comp(*args)
        return go

    def run(self, stream: torch.Tensor, check: bool = True):
        self.launch(self.prepare(stream), check)

    def check(self):
        """Synchronise and raise MegakernelError if a bounded wait timed out."""
        st = self.state.cpu()
        if int(st[rk.S_ERR_FLAG]) or int(st[rk.S_ABORT]):
            e = MegakernelError(int(st[rk.S_ERR_KIND]), int(st[rk.S_ERR_INSTR]),
                                int(st[rk.S_ERR_COUNTER]), int(st[rk.S_ERR_VALUE]),
                                int(st[rk.S_ERR_TARGET]), int(st[rk.S_ERR_SM]),
                                int(st[rk.S_ERR_CTA]))
            self.reset()
            raise e
        if int(st[rk.S_HEAD]) or int(st[rk.S_EXIT]):
            raise RuntimeError(f"megakernel state not reset by the kernel: head {int(st[0])} "
                               f"exit {int(st[1])}")

    def reset(self):
        """After an error: clear counters, queue and error record (not on the critical path)."""
        self.counters.zero_()
        self.state.zero_()
        torch.cuda.synchronize()

    def journal_rows(self, n: int):
        return self.journal[:n].cpu(), self.jcta[:self.grid].cpu()


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


# ==================================================================================== backend
def missing_opcodes() -> list[str]:
    """The opcodes of mk.ir without a megakernel GPU body (a model step uses them)."""
    return [o.name for o in Op if int(o) not in SUPPORTED_OPS]


def not_implemented_message() -> str:
    return ("megakernel backend: a model step needs GPU bodies for opcodes "
            f"{', '.join(missing_opcodes())}, which the megakernel does not have yet (it runs "
            "NOOP, COPY, RMSNORM and RESIDUAL_ADD). Test mode: `python -m mk.megakernel selftest` "
            "runs rows-only plans end to end on the GPU against the torch faces. To generate, use "
            "--backend vm or --backend reference.")


def require_gpu(what: str = "the megakernel backend", hint: str = " (use --backend vm on the CPU)"):
    """RuntimeError unless a Hopper (sm_90) GPU is visible."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU (Hopper, sm_90); none is visible{hint}")
    cap = torch.cuda.get_device_capability()
    if cap[0] < 9:
        raise RuntimeError(f"{what} needs a Hopper GPU (sm_90); this one is sm_{cap[0]}{cap[1]}")


class MegakernelBackend:
    """`--backend megakernel`.

    Test mode (test_mode=True): streams made only of the rows family (NOOP/COPY/RMSNORM/
    RESIDUAL_ADD) run on the GPU through run_stream() (see `python -m mk.megakernel selftest`).
    Without test_mode (the engine's factory: a model step) construction fails at once with a
    NotImplementedError naming the opcodes that have no GPU body yet, before any step runs."""

    name = "megakernel"

    def __init__(self, weights, kernel=None, group=None, test_mode: bool = False):
        require_gpu()
        if not test_mode:
            raise NotImplementedError(not_implemented_message())
        self.weights = weights
        self.kernel_config = kernel
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

    def forward(self, batch):
        raise NotImplementedError(not_implemented_message())


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
    be = MegakernelBackend(w, test_mode=True)
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


try:
    from mk.engine import register_backend as _register_backend
except ImportError:  # engine not importable: the backend is still usable directly
    _register_backend = None
if _register_backend is not None:
    # a model step: fails at construction (no GPU: RuntimeError; else NotImplementedError)
    _register_backend("megakernel")(lambda weights, kernel, group=None:
                                     MegakernelBackend(weights, kernel, group))

if __name__ == "__main__":
    sys.exit(_main())
