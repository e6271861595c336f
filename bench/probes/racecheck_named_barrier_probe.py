"""Does compute-sanitizer racecheck credit a 256-thread named barrier when one of the two
warpgroups meeting there has synced alone on another named barrier before it?

Session 31's swapped decode chain (bench/ATTENTION_NOTES.md) made racecheck report RAW hazards on
RMSNORM's cross-warp partials: warp leaders of warpgroup 0 write their partial, barrier 1 (256
threads) is passed by both warpgroups, warpgroup 1 reads. The default build (0 hazards) runs the
same RMSNORM; what differs is that during a decode ATTENTION warpgroup 0 alone syncs on named
barrier 5 (128 threads) ~2 times a key block while warpgroup 1 idles. This kernel is that pattern
and nothing else: two warpgroups (256 threads), ROUNDS rounds of

    [extra syncs]   asym: warpgroup 0 syncs barrier 5 (128 threads) SYNCS times, warpgroup 1 not
                    sym:  warpgroup 0 syncs barrier 5, warpgroup 1 barrier 6, SYNCS times each
                    plain: none
    exchange        each warp's lane 0 writes one word into slot r % 2, barrier 1 (256 threads),
                    every thread reads the eight words (the RMSNORM pattern, two slots by parity)
    none            the exchange without barrier 1 (control: racecheck must report it)

    compute-sanitizer --tool racecheck python3 bench/probes/racecheck_named_barrier_probe.py [variants]
    python3 bench/probes/racecheck_named_barrier_probe.py --compile-only        # any machine

Each variant is one launch between '== probe <v> begin' / '== probe <v> end' markers (racecheck's
reports fall between them) with its own kernel name (class NamedProbe_<variant>). Expected if the
hypothesis holds: plain and sym clean, asym reported, none reported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
if "--compile-only" in sys.argv:    # before cutlass is imported: the DSL reads it once
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32  # noqa: E402

VARIANTS = ("plain", "asym", "sym", "none")
ROUNDS = 8
SYNCS = 6          # a decode unit's chain: ~2 syncs a key block
THREADS = 256
WARPS = THREADS // 32


class _NamedProbeBase:
    variant = "plain"

    @cute.jit
    def __call__(self, out: cute.Tensor, stream):
        @cute.struct
        class Storage:
            parts: cute.struct.MemRange[Int32, 2 * WARPS]
        self.storage = Storage
        self.kernel(out).launch(grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Tensor):
        V = self.variant
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        lane = tidx % 32
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        parts = st.parts.get_tensor(cute.make_layout(2 * WARPS))
        for r in range(ROUNDS):
            if cutlass.const_expr(V in ("asym", "sym")):
                for _ in cutlass.range_constexpr(SYNCS):
                    if wg == 0:
                        cute.arch.barrier(barrier_id=5, number_of_threads=128)
                    elif cutlass.const_expr(V == "sym"):
                        cute.arch.barrier(barrier_id=6, number_of_threads=128)
            slot = (r % 2) * WARPS
            if lane == 0:
                parts[slot + warp] = r * 100 + warp
            if cutlass.const_expr(V != "none"):
                cute.arch.barrier(barrier_id=1, number_of_threads=THREADS)
            tot = Int32(0)
            for w in cutlass.range_constexpr(WARPS):
                tot = tot + parts[slot + w]
            out[r, tidx] = tot


def make_probe(variant: str):
    assert variant in VARIANTS, variant
    cls = type(f"NamedProbe_{variant}", (_NamedProbeBase,), {"variant": variant})
    cls.__qualname__ = cls.__name__
    return cls()


def compile_ptx(variant: str) -> str:
    """The variant's PTX for sm_90a, compiled with a fake tensor (no GPU needed)."""
    import cuda.bindings.driver as drv
    from cutlass.cute.runtime import make_fake_compact_tensor
    out = make_fake_compact_tensor(Int32, (ROUNDS, THREADS), stride_order=(1, 0))
    return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX](
        make_probe(variant), out, drv.CUstream(0)).__ptx__


def run(variants=VARIANTS) -> dict:
    import torch
    import cuda.bindings.driver as drv
    from cutlass.cute.runtime import from_dlpack
    # round r: the eight warps' words r * 100 + w
    want = torch.tensor([[800 * r + sum(range(WARPS))] * THREADS for r in range(ROUNDS)],
                        dtype=torch.int32)
    res = {}
    for v in variants:
        out = torch.full((ROUNDS, THREADS), -1, dtype=torch.int32, device="cuda")
        cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
        comp = cute.compile(make_probe(v), from_dlpack(out), cs)
        print(f"== probe {v} begin", flush=True)
        comp(from_dlpack(out), cs)
        torch.cuda.synchronize()
        ok = bool(torch.equal(out.cpu(), want))
        res[v] = dict(values_ok=ok)
        print(f"== probe {v} end: values {'ok' if ok else 'WRONG'}", flush=True)
    return res


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--compile-only"]
    vs = args or list(VARIANTS)
    if "--compile-only" in sys.argv:
        import re
        for v in vs:
            ptx = compile_ptx(v)
            bars = re.findall(r"bar(?:rier)?\.sync(?:\.aligned)?\s+(\d+)(?:,\s*(\d+))?", ptx)
            print(v, "named barrier syncs in the PTX (id, threads):", sorted(set(bars)))
        sys.exit(0)
    print(run(vs))
