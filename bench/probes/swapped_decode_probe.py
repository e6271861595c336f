"""Can the decode attention run with the keys on wgmma's M (the "swapped formulation")?

bench/ATTENTION_NOTES.md session 30: a decode unit has qpk = 8 query rows, and today's
S = Q K^T runs as m64n64k16 (56 of 64 rows padding) with the whole softmax on warp 0. Swapped:

    S^T = K Q^T   A = the K block in shared memory (M = 64 keys, K = 128 dims, K-major: the
                  bytes of a K page as the loader lands them), B = Q (N = 8 heads, K-major)
    O^T = V^T P^T A = the V block read M-major (M = 128 dims, K = 64 keys: the bytes of a V page),
                  B = P^T (N = 8 heads, K = 64 keys, K-major: P written [head, key] by the threads)

both m64n8k16 chains, the accumulators 4 (S^T) and 8 (O^T) floats a thread over all four warps.
This probe is one warpgroup, one CTA, one 64-key block: it checks the operand modes and layouts
(the part a wrong guess makes silently wrong), not speed. The softmax between the two chains is
the plain one (per-head max and sum through shared memory); the shuffle / cross-warp version is
the megakernel's job.

    python bench/probes/swapped_decode_probe.py            # on a Hopper GPU: run, compare to torch
    CUTE_DSL_ARCH=sm_90a python bench/probes/swapped_decode_probe.py --compile-only   # any machine

--compile-only compiles with fake tensors, prints the wgmma instructions of the PTX and ptxas's
register / spill line. Session 30 compiled it on the CPU; it has not run on a GPU yet.
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
from cutlass import BFloat16, Float32  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402
import cuda.bindings.driver as drv  # noqa: E402

KEYS = 64       # one key block (a ring block of the decode attention)
HEADS = 8       # qpk: query heads per KV head at Llama-70B TP8 (wgmma N: a multiple of 8)
D = 128         # head_dim
THREADS = 128   # one warpgroup


def build():
    K_, MN_ = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN

    class SwappedDecode:
        def _build(self):
            # S^T (64 keys x 8 heads) over K = 128 dims; O^T (128 dims x 8 heads) over K = 64 keys
            self.mma_s = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, K_, K_, Float32,
                                                           (1, 1, 1), (64, HEADS))
            self.mma_o = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, MN_, K_, Float32,
                                                           (1, 1, 1), (64, HEADS))
            row, col = LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR
            # the K block as A (M = keys, K = dims), K-major; Q as B (N = heads, K = dims)
            self.sK_layout = cute.slice_(sm90_utils.make_smem_layout_a(
                row, (KEYS, HEADS, D), BFloat16, 1), (None, None, 0))
            self.sQ_layout = cute.slice_(sm90_utils.make_smem_layout_b(
                row, (KEYS, HEADS, D), BFloat16, 1), (None, None, 0))
            # the V block as A of O^T (M = dims, K = keys), M-major; P^T as B (N = heads, K = keys)
            self.sV_layout = cute.slice_(sm90_utils.make_smem_layout_a(
                col, (D, HEADS, KEYS), BFloat16, 1), (None, None, 0))
            self.sP_layout = cute.slice_(sm90_utils.make_smem_layout_b(
                row, (D, HEADS, KEYS), BFloat16, 1), (None, None, 0))

        @cute.jit
        def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_out: cute.Tensor,
                     o_out: cute.Tensor, stats: cute.Tensor, stream):
            @cute.struct
            class Storage:
                sK: cute.struct.Align[cute.struct.MemRange[BFloat16, KEYS * D], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[BFloat16, KEYS * D], 1024]
                sQ: cute.struct.Align[cute.struct.MemRange[BFloat16, HEADS * D], 1024]
                sP: cute.struct.Align[cute.struct.MemRange[BFloat16, HEADS * KEYS], 1024]
                sS: cute.struct.Align[cute.struct.MemRange[Float32, KEYS * HEADS], 16]
                mx: cute.struct.MemRange[Float32, HEADS]
            self.storage = Storage
            self._build()
            self.kernel(q, k, v, s_out, o_out, stats, self.mma_s, self.mma_o, self.sK_layout,
                        self.sV_layout, self.sQ_layout, self.sP_layout).launch(grid=[1, 1, 1],
                                                             block=[THREADS, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, s_out: cute.Tensor,
                   o_out: cute.Tensor, stats: cute.Tensor, mma_s: cute.TiledMma,
                   mma_o: cute.TiledMma, sK_layout: cute.ComposedLayout,
                   sV_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout,
                   sP_layout: cute.ComposedLayout):
            tidx, _, _ = cute.arch.thread_idx()
            smem = cutlass.memory.SmemAllocator()
            st = smem.allocate(self.storage)
            sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sP = st.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
            sS = st.sS.get_tensor(cute.make_layout((KEYS, HEADS), stride=(HEADS, 1)))
            mx = st.mx.get_tensor(cute.make_layout(HEADS))
            # the loader's part, plainly: K / V [key, dim], Q [head, dim] into the swizzled views
            # (sV is indexed (dim, key): the same bytes as a [key, dim] row-major page)
            for i in range(tidx, KEYS * D, THREADS):
                r = i // D
                c = i % D
                sK[r, c] = k[r, c]
                sV[c, r] = v[r, c]
            for i in range(tidx, HEADS * D, THREADS):
                sQ[i // D, i % D] = q[i // D, i % D]
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()

            # S^T = K Q^T
            thr_s = mma_s.get_slice(tidx)
            tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK))
            tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ))
            accS = thr_s.make_fragment_C(thr_s.partition_shape_C((KEYS, HEADS)))
            mma_s.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
            cute.nvgpu.warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tSrK, mode=[2])):
                cute.gemm(mma_s, accS, tSrK[(None, None, kb)], tSrQ[(None, None, kb)], accS)
                mma_s.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(0)

            # scores out (the check's S^T) and into shared memory for the plain softmax
            tScS = thr_s.partition_C(cute.make_identity_tensor((KEYS, HEADS)))
            for e in cutlass.range_constexpr(cute.size(accS)):
                key, head = tScS[e]
                s_out[key, head] = accS[e]
                sS[key, head] = accS[e]
            cute.arch.sync_threads()
            if tidx < HEADS:
                m = Float32(-3.0e38)
                for j in range(KEYS):
                    m = cute.arch.fmax(m, sS[j, tidx])
                mx[tidx] = m
                stats[tidx, 0] = m
            cute.arch.sync_threads()
            # P [head, key] = exp(S - max) in bf16; its row sums for the check
            for e in cutlass.range_constexpr(cute.size(accS)):
                key, head = tScS[e]
                p = cute.math.exp(accS[e] - mx[head], fastmath=True)
                sP[head, key] = p.to(BFloat16)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            if tidx < HEADS:
                den = Float32(0.0)
                for j in range(KEYS):
                    den = den + sP[tidx, j].to(Float32)
                stats[tidx, 1] = den

            # O^T = V^T P^T
            thr_o = mma_o.get_slice(tidx)
            tOrV = thr_o.make_fragment_A(thr_o.partition_A(sV))
            tOrP = thr_o.make_fragment_B(thr_o.partition_B(sP))
            accO = thr_o.make_fragment_C(thr_o.partition_shape_C((D, HEADS)))
            mma_o.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
            cute.nvgpu.warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tOrV, mode=[2])):
                cute.gemm(mma_o, accO, tOrV[(None, None, kb)], tOrP[(None, None, kb)], accO)
                mma_o.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(0)
            tOcO = thr_o.partition_C(cute.make_identity_tensor((D, HEADS)))
            for e in cutlass.range_constexpr(cute.size(accO)):
                dim, head = tOcO[e]
                o_out[head, dim] = accO[e]

    return SwappedDecode


def compile_only():
    from cutlass.cute.runtime import make_fake_compact_tensor

    dump = os.environ.setdefault("CUTE_DSL_DUMP_DIR", "/tmp/mk_swapped_probe")
    os.makedirs(dump, exist_ok=True)
    k = make_fake_compact_tensor(BFloat16, (KEYS, D), stride_order=(1, 0))
    v = make_fake_compact_tensor(BFloat16, (KEYS, D), stride_order=(1, 0))
    q = make_fake_compact_tensor(BFloat16, (HEADS, D), stride_order=(1, 0))
    s = make_fake_compact_tensor(Float32, (KEYS, HEADS), stride_order=(1, 0))
    o = make_fake_compact_tensor(Float32, (HEADS, D), stride_order=(1, 0))
    stats = make_fake_compact_tensor(Float32, (HEADS, 2), stride_order=(1, 0))
    comp = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN](
        build()(), q, k, v, s, o, stats, drv.CUstream(0))
    ptx = comp.__ptx__
    wg = sorted(set(re.findall(r"wgmma\.mma_async[^ ]*", ptx)))
    print("wgmma in the PTX:", wg)
    # the last two immediates of each wgmma: A and B transposed (the O^T chain reads the V block
    # M-major: tnspA 1; the S^T chain reads K and Q K-major: 0, 0)
    modes = {}
    for m in re.finditer(r"wgmma\.mma_async[^;]*?(\d+),\s*(\d+);", ptx):
        modes[(m.group(1), m.group(2))] = modes.get((m.group(1), m.group(2)), 0) + 1
    print("wgmma (tnspA, tnspB): count", modes)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tests"))
    from _compile_gate import ptxas_report
    rep = ptxas_report(ptx, os.path.join(dump, "ptxas"))
    print("ptxas:", " | ".join(ln.strip() for ln in rep.splitlines() if "registers" in ln
                                or "spill" in ln))
    return wg


def run():
    import torch
    from cutlass.cute.runtime import from_dlpack

    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(HEADS, D, device=dev).to(torch.bfloat16)
    k = torch.randn(KEYS, D, device=dev).to(torch.bfloat16)
    v = torch.randn(KEYS, D, device=dev).to(torch.bfloat16)
    s = torch.full((KEYS, HEADS), float("nan"), device=dev)        # poisoned
    o = torch.full((HEADS, D), float("nan"), device=dev)
    stats = torch.full((HEADS, 2), float("nan"), device=dev)
    args = [from_dlpack(t, assumed_align=16) for t in (q, k, v, s, o, stats)]
    cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
    fn = cute.compile(build()(), *args, cs)
    fn(*args, cs)
    torch.cuda.synchronize()
    s_ref = (k.float() @ q.float().T)                              # S^T [key, head]
    m_ref = s_ref.max(0).values
    p_ref = torch.exp(s_ref - m_ref).to(torch.bfloat16)            # [key, head]
    o_ref = (p_ref.float().T @ v.float())                          # [head, dim], unnormalised
    errs = {
        "S^T": ((s - s_ref).abs().max() / s_ref.abs().max()).item(),
        "max": (stats[:, 0] - m_ref).abs().max().item(),
        "sum": ((stats[:, 1] - p_ref.float().sum(0)).abs().max() / p_ref.float().sum(0).max()).item(),
        "O^T": ((o - o_ref).abs().max() / o_ref.abs().max()).item(),
    }
    ok = all(e < 1e-2 for e in errs.values()) and torch.isfinite(o).all().item()
    print({k_: f"{e:.2e}" for k_, e in errs.items()}, "ok" if ok else "FAILED")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile-only", action="store_true",
                    help="compile for sm_90a with fake tensors (no GPU needed)")
    a = ap.parse_args()
    if a.compile_only:
        wg = compile_only()
        sys.exit(0 if any("m64n8k16" in w for w in wg) else 1)
    sys.exit(0 if run() else 1)


if __name__ == "__main__":
    main()
