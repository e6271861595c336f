"""Can the decode attention run with the keys on wgmma's M (the "swapped formulation"), and how
long is its per-block chain?

bench/ATTENTION_NOTES.md session 30: a decode unit has qpk = 8 query rows, and today's
S = Q K^T runs as m64n64k16 (56 of 64 rows padding) with the whole softmax on warp 0 (~1.1 us a
64-key block in the step, ~0.7 us of it math by the harness's leave-one-out). Swapped:

    S^T = K Q^T   A = the K block in shared memory (M = 64 keys, K = 128 dims, K-major: the
                  bytes of a K page as the loader lands them), B = Q (N = 8 heads, K-major)
    O^T = V^T P^T A = the V block read M-major (M = 128 dims, K = 64 keys: the bytes of a V page),
                  B = P^T (N = 8 heads, K = 64 keys, K-major: P written [head, key] by the threads)

both m64n8k16 chains; the accumulators are 4 (S^T) and 8 (O^T) floats a thread over all four
warps, each thread holding two heads (columns 2 (lane % 4), + 1). The online softmax per block:
each thread's max over its two keys, `shfl.xor` 4 / 8 / 16 (the 8 lanes of a column), the four
warps' maxima through shared memory and one named barrier; the row sums stay per thread until
the end (every thread of a head rescales by the same factor). P goes to shared memory as bf16,
then a second barrier before the O^T chain.

One warpgroup, one CTA: R key blocks resident in shared memory (no loads in the loop: the
consumer chain alone, the part that sets the decode unit's pace), NB blocks walked (block
i = resident i % R), timed with globaltimer around the loop.

    python bench/probes/swapped_decode_probe.py [--blocks 16] [--resident 4]   # Hopper GPU
    python bench/probes/swapped_decode_probe.py --compile-only                 # any machine

The GPU run checks block 0's S^T, the final max / sum and O against torch (outputs poisoned)
and prints ns per block (median of --reps launches). --compile-only compiles for sm_90a with
fake tensors and prints the wgmma instructions (transpose flags) and ptxas's register / spill
line. Session 30 compiled it on the CPU; it has not run on a GPU yet.
"""

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
if "--compile-only" in sys.argv:    # before cutlass is imported: the DSL reads it once
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.utils.hopper_helpers as sm90_utils  # noqa: E402
from cutlass import BFloat16, Float32, Int32, Int64  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402
import cuda.bindings.driver as drv  # noqa: E402

KEYS = 64       # one key block (a ring block of the decode attention)
HEADS = 8       # qpk: query heads per KV head at Llama-70B TP8 (wgmma N: a multiple of 8)
D = 128         # head_dim
THREADS = 128   # one warpgroup


LOG2E = 1.4426950408889634


def build(resident: int):
    """The probe's kernel class for `resident` key blocks in shared memory."""
    K_, MN_ = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
    R = resident
    scale_log2 = LOG2E / D ** 0.5      # softmax(S / sqrt(D)) through exp2

    class SwappedDecode:
        def _build(self):
            # S^T (64 keys x 8 heads) over K = 128 dims; O^T (128 dims x 8 heads) over K = 64 keys
            self.mma_s = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, K_, K_, Float32,
                                                           (1, 1, 1), (64, HEADS))
            self.mma_o = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, MN_, K_, Float32,
                                                           (1, 1, 1), (64, HEADS))
            row, col = LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR
            # the K blocks as A (M = keys, K = dims), K-major; Q as B (N = heads, K = dims)
            self.sK_layout = sm90_utils.make_smem_layout_a(row, (KEYS, HEADS, D), BFloat16, R)
            self.sQ_layout = cute.slice_(sm90_utils.make_smem_layout_b(
                row, (KEYS, HEADS, D), BFloat16, 1), (None, None, 0))
            # the V blocks as A of O^T (M = dims, K = keys), M-major; P^T as B (N = heads, K = keys)
            self.sV_layout = sm90_utils.make_smem_layout_a(col, (D, HEADS, KEYS), BFloat16, R)
            self.sP_layout = cute.slice_(sm90_utils.make_smem_layout_b(
                row, (D, HEADS, KEYS), BFloat16, 1), (None, None, 0))

        @cute.jit
        def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_out: cute.Tensor,
                     o_out: cute.Tensor, stats: cute.Tensor, timing: cute.Tensor, nblocks: Int32,
                     stream):
            @cute.struct
            class Storage:
                sK: cute.struct.Align[cute.struct.MemRange[BFloat16, R * KEYS * D], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[BFloat16, R * KEYS * D], 1024]
                sQ: cute.struct.Align[cute.struct.MemRange[BFloat16, HEADS * D], 1024]
                sP: cute.struct.Align[cute.struct.MemRange[BFloat16, HEADS * KEYS], 1024]
                red: cute.struct.Align[cute.struct.MemRange[Float32, 4 * HEADS], 16]
            self.storage = Storage
            self._build()
            self.kernel(q, k, v, s_out, o_out, stats, timing, nblocks, self.mma_s, self.mma_o,
                        self.sK_layout, self.sV_layout, self.sQ_layout, self.sP_layout).launch(
                grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_out: cute.Tensor,
                   o_out: cute.Tensor, stats: cute.Tensor, timing: cute.Tensor, nblocks: Int32,
                   mma_s: cute.TiledMma, mma_o: cute.TiledMma, sK_layout: cute.ComposedLayout,
                   sV_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout,
                   sP_layout: cute.ComposedLayout):
            tidx, _, _ = cute.arch.thread_idx()
            warp = tidx // 32
            lane = tidx % 32
            smem = cutlass.memory.SmemAllocator()
            st = smem.allocate(self.storage)
            sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sP = st.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
            red = st.red.get_tensor(cute.make_layout((4, HEADS), stride=(HEADS, 1)))
            # the loader's part, plainly: K / V [key, dim], Q [head, dim] into the swizzled views
            # (sV is indexed (dim, key, block): the same bytes as [key, dim] row-major pages)
            for i in range(tidx, R * KEYS * D, THREADS):
                r = i // D
                c = i % D
                sK[r % KEYS, c, r // KEYS] = k[r, c]
                sV[c, r % KEYS, r // KEYS] = v[r, c]
            for i in range(tidx, HEADS * D, THREADS):
                sQ[i // D, i % D] = q[i // D, i % D]
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()

            thr_s = mma_s.get_slice(tidx)
            tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK))
            tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ))
            accS = thr_s.make_fragment_C(thr_s.partition_shape_C((KEYS, HEADS)))
            tScS = thr_s.partition_C(cute.make_identity_tensor((KEYS, HEADS)))
            thr_o = mma_o.get_slice(tidx)
            tOrV = thr_o.make_fragment_A(thr_o.partition_A(sV))
            tOrP = thr_o.make_fragment_B(thr_o.partition_B(sP))
            accO = thr_o.make_fragment_C(thr_o.partition_shape_C((D, HEADS)))
            tOcO = thr_o.partition_C(cute.make_identity_tensor((D, HEADS)))
            accO.fill(0.0)
            mma_o.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            # per thread: its two heads' running max (log2 units, the same in every thread of a
            # head) and its own keys' share of the row sums
            m_run = cute.make_rmem_tensor(cute.make_layout(2), Float32)
            l_run = cute.make_rmem_tensor(cute.make_layout(2), Float32)
            m_run.fill(-3.0e38)
            l_run.fill(0.0)
            x = cute.make_rmem_tensor(cute.make_layout(4), Float32)

            t0 = cute.arch.globaltimer()
            for b in range(nblocks):
                blk = b % R
                # S^T = K Q^T
                mma_s.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                cute.nvgpu.warpgroup.fence()
                for kb in cutlass.range_constexpr(cute.size(tSrK, mode=[2])):
                    cute.gemm(mma_s, accS, tSrK[(None, None, kb, blk)], tSrQ[(None, None, kb)],
                              accS)
                    mma_s.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
                if b == 0:
                    for e in cutlass.range_constexpr(4):
                        key, head = tScS[e]
                        s_out[key, head] = accS[e]
                # the block's max per head: the thread's two keys, the column's 8 lanes, 4 warps
                for e in cutlass.range_constexpr(4):
                    x[e] = accS[e] * Float32(scale_log2)
                for h in cutlass.range_constexpr(2):
                    mloc = cute.arch.fmax(x[h], x[h + 2])
                    for off in cutlass.range_constexpr(3):
                        mloc = cute.arch.fmax(mloc, cute.arch.shuffle_sync_bfly(mloc,
                                                                                offset=4 << off))
                    if lane < 4:
                        red[warp, 2 * lane + h] = mloc
                cute.arch.barrier(barrier_id=1, number_of_threads=THREADS)
                for h in cutlass.range_constexpr(2):
                    col = 2 * (lane % 4) + h
                    bmax = cute.arch.fmax(cute.arch.fmax(red[0, col], red[1, col]),
                                          cute.arch.fmax(red[2, col], red[3, col]))
                    m_new = cute.arch.fmax(m_run[h], bmax)
                    corr = cute.math.exp2(m_run[h] - m_new, fastmath=True)
                    m_run[h] = m_new
                    l_run[h] = l_run[h] * corr
                    for e in cutlass.range_constexpr(cute.size(accO) // 2):
                        accO[2 * e + h] = accO[2 * e + h] * corr
                # P [head, key] in bf16 (the row sums take the rounded values the PV chain sums)
                for e in cutlass.range_constexpr(4):
                    key, head = tScS[e]
                    p = cute.math.exp2(x[e] - m_run[e % 2], fastmath=True).to(BFloat16)
                    sP[head, key] = p
                    l_run[e % 2] = l_run[e % 2] + p.to(Float32)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=2, number_of_threads=THREADS)
                # O^T += V^T P^T
                cute.nvgpu.warpgroup.fence()
                for kb in cutlass.range_constexpr(cute.size(tOrV, mode=[2])):
                    cute.gemm(mma_o, accO, tOrV[(None, None, kb, blk)], tOrP[(None, None, kb)],
                              accO)
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
            t1 = cute.arch.globaltimer()

            # the row sums: the column's 8 lanes, then the 4 warps
            cute.arch.barrier(barrier_id=1, number_of_threads=THREADS)
            for h in cutlass.range_constexpr(2):
                lsum = l_run[h]
                for off in cutlass.range_constexpr(3):
                    lsum = lsum + cute.arch.shuffle_sync_bfly(lsum, offset=4 << off)
                if lane < 4:
                    red[warp, 2 * lane + h] = lsum
            cute.arch.barrier(barrier_id=2, number_of_threads=THREADS)
            for h in cutlass.range_constexpr(2):
                col = 2 * (lane % 4) + h
                l_run[h] = red[0, col] + red[1, col] + red[2, col] + red[3, col]
                if tidx < 4:
                    stats[col, 0] = m_run[h]
                    stats[col, 1] = l_run[h]
            for e in cutlass.range_constexpr(cute.size(accO)):
                dim, head = tOcO[e]
                o_out[head, dim] = accO[e] / l_run[e % 2]
            if tidx == 0:
                timing[0] = t1 - t0

    return SwappedDecode


def compile_ptx(resident: int) -> str:
    """The probe's PTX for sm_90a, compiled with fake tensors (no GPU needed)."""
    from cutlass.cute.runtime import make_fake_compact_tensor

    k = make_fake_compact_tensor(BFloat16, (resident * KEYS, D), stride_order=(1, 0))
    v = make_fake_compact_tensor(BFloat16, (resident * KEYS, D), stride_order=(1, 0))
    q = make_fake_compact_tensor(BFloat16, (HEADS, D), stride_order=(1, 0))
    s = make_fake_compact_tensor(Float32, (KEYS, HEADS), stride_order=(1, 0))
    o = make_fake_compact_tensor(Float32, (HEADS, D), stride_order=(1, 0))
    stats = make_fake_compact_tensor(Float32, (HEADS, 2), stride_order=(1, 0))
    timing = make_fake_compact_tensor(Int64, (1,))
    comp = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN](
        build(resident)(), q, k, v, s, o, stats, timing, Int32(16), drv.CUstream(0))
    return comp.__ptx__


def wgmma_modes(ptx: str) -> dict:
    """{(shape, tnspA, tnspB): count} of the PTX's wgmma instructions (the last two immediates:
    A and B transposed; the O^T chain reads the V block M-major, tnspA 1)."""
    modes = {}
    for m in re.finditer(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)[^;]*?(\d+),\s*(\d+);",
                         ptx):
        key = (m.group(1), int(m.group(2)), int(m.group(3)))
        modes[key] = modes.get(key, 0) + 1
    return modes


def run(nblocks: int, resident: int, reps: int) -> bool:
    import torch
    from cutlass.cute.runtime import from_dlpack

    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(HEADS, D, device=dev).to(torch.bfloat16)
    k = torch.randn(resident * KEYS, D, device=dev).to(torch.bfloat16)
    v = torch.randn(resident * KEYS, D, device=dev).to(torch.bfloat16)
    s = torch.full((KEYS, HEADS), float("nan"), device=dev)        # poisoned
    o = torch.full((HEADS, D), float("nan"), device=dev)
    stats = torch.full((HEADS, 2), float("nan"), device=dev)
    timing = torch.zeros(1, dtype=torch.int64, device=dev)
    args = [from_dlpack(t, assumed_align=16) for t in (q, k, v, s, o, stats, timing)]
    cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
    fn = cute.compile(build(resident)(), *args, Int32(nblocks), cs)
    fn(*args, Int32(nblocks), cs)
    torch.cuda.synchronize()
    # the walked key sequence: block i is resident block i % R
    idx = torch.cat([torch.arange(KEYS, device=dev) + (i % resident) * KEYS
                     for i in range(nblocks)])
    ks, vs = k[idx].float(), v[idx].float()
    x_ref = (q.float() @ ks.T) * (LOG2E / D ** 0.5)                # [head, key], log2 units
    m_ref = x_ref.max(1).values
    p_ref = torch.exp2(x_ref - m_ref[:, None])
    o_ref = (p_ref @ vs) / p_ref.sum(1, keepdim=True)
    s0_ref = k[:KEYS].float() @ q.float().T                        # block 0's S^T [key, head]
    errs = {
        "S^T block 0": ((s - s0_ref).abs().max() / s0_ref.abs().max()).item(),
        "max": (stats[:, 0] - m_ref).abs().max().item(),
        "sum": ((stats[:, 1] - p_ref.sum(1)).abs() / p_ref.sum(1)).max().item(),
        "O": ((o - o_ref).abs().max() / o_ref.abs().max()).item(),
    }
    ok = (all(e < 1e-2 for e in errs.values()) and bool(torch.isfinite(o).all())
          and bool(torch.isfinite(s).all()))
    ns = []
    for _ in range(reps):
        fn(*args, Int32(nblocks), cs)
        torch.cuda.synchronize()
        ns.append(int(timing.item()) / nblocks)
    ns.sort()
    print(f"swapped decode probe: {nblocks} blocks of {KEYS} keys ({resident} resident), "
          f"{HEADS} heads x {D}: errors " + ", ".join(f"{n} {e:.2e}" for n, e in errs.items())
          + f" -> {'ok' if ok else 'FAILED'}; chain {ns[len(ns) // 2]:.0f} ns a block "
          f"(median of {reps}; today's decode unit: ~1100 in the step, ~700 of it math)")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile-only", action="store_true",
                    help="compile for sm_90a with fake tensors (no GPU needed)")
    ap.add_argument("--blocks", type=int, default=16, help="key blocks walked (16: 1024 keys)")
    ap.add_argument("--resident", type=int, default=4, choices=(1, 2, 3, 4),
                    help="distinct key blocks in shared memory (32 KiB each)")
    ap.add_argument("--reps", type=int, default=21, help="timed launches")
    a = ap.parse_args()
    if a.blocks < 1:
        ap.error("--blocks must be >= 1")
    if a.compile_only:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tests"))
        from _compile_gate import ptxas_report
        ptx = compile_ptx(a.resident)
        modes = wgmma_modes(ptx)
        print("wgmma (shape, tnspA, tnspB): count", modes)
        rep = ptxas_report(ptx, os.path.join(os.environ.get("TMPDIR", "/tmp"), "mk_swapped_probe"))
        print("ptxas:", " | ".join(ln.strip() for ln in rep.splitlines() if "registers" in ln
                                    or "spill" in ln))
        sys.exit(0 if modes.get(("m64n8k16", 1, 0)) and modes.get(("m64n8k16", 0, 0)) else 1)
    sys.exit(0 if run(a.blocks, a.resident, a.reps) else 1)


if __name__ == "__main__":
    main()
