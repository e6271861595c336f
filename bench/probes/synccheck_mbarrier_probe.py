"""Which mbarrier patterns does compute-sanitizer synccheck report as "Barrier error detected.
Missing wait."?

The megakernel's default build dies under synccheck with 8 such reports, always on the loader's
arrive on a page's `full` barrier (rk.grant_page, mk/instructions/_rows_kernel.py; the GEMM
mainloop's arrive_and_expect_tx, mk/instructions/_gemm_kernel.py). The PTX ISA's rule
("Phases of the mbarrier object"): for each phase, at least one test_wait / try_wait that returns
True must be performed before an arrive-on operation in the subsequent phase. The suspect in mk:
MK_GEMM_STAGE_FULL=stage (default), where a GEMM stage's B pages get a plain arrive on their own
`full` that no thread ever waits on (the consumers wait on the A page's barrier, which also takes
the B bytes), so the *next* arrive on that page's `full` is the first arrive after an unobserved
phase.

A tiny CuTe DSL kernel: warp 0 lane 0 produces, warp 1 consumes (every lane waits, lane 0
arrives); a ring of pages with full (count 1) / empty (count 1) barriers; no TMA (plain arrivals
stand in for arrive_and_expect_tx + bytes). Variants:

    ring       (a) the ordinary ring: producer waits empty, arrives full; consumer waits full,
               arrives empty. Expected clean.
    skipwait   (b) as ring, but in rounds r % 4 == 1 (every other use of slot 1) the consumer
               does not try_wait full[1]: it learns of the arrival through a named barrier
               (bar.arrive / bar.sync 1), reads, and arrives empty[1]. Expected: Missing wait at
               the producer's next arrive on full[1] (round r + 2).
    double     (c) the producer arrives full[0] (count 1) twice in a row, no wait between (the
               first arrive completes phase 0, the second is an arrive-on in phase 1); the
               consumer waits parity 1. Expected: Missing wait at the second arrive.
    twice      (c') full count 2, the producer arrives twice within one phase (an arrival
               count reached by one thread); consumer waits parity 0. Expected clean.
    stagefull  (d) mk's MK_GEMM_STAGE_FULL=stage pattern on a ring of NP = 3 pages, 2 ring
               positions a round (A at pg, B at pg + 1, so a page's role rotates: page 1 is B in
               round 0 and A in round 2): the producer waits empty of both pages, writes them,
               plain-arrives full[B] (nobody waits on it), then arrives full[A]; the consumer
               waits full[A] only, reads both pages, arrives empty on both. Expected: Missing wait
               at the producer's arrive on full[A] in round 2 (page 1) -- the mk signature.
    selfwait   (e) stagefull + the producer try_waits full[B] right after its own plain arrive
               (complete at once: count 1, no bytes on it). The one-line fix in load_b_pages.
               Expected clean if a wait by the arriving thread itself counts.
    conswait   (f) stagefull + consumer lane 0 alone also try_waits full[B] after full[A]
               (complete by then). The consumer-side fix. Expected clean.
    selftest   (g) stagefull + the producer's test_wait on full[B] right after its own plain
               arrive, its result not branched on (session 35's MK_OWN_PHASE_SEEN=test, which
               the megakernel's synccheck flagged: does a test_wait that is not waited for
               count, or did it run before the arrive landed?).
    constest   (h) conswait with a test_wait not branched on instead of the try_wait (session
               37's MK_OWN_PHASE_SEEN=consumer_test, removed). Expected clean if a passing
               test_wait counted as the phase's observation: it does not (session 38).

Usage, on a Hopper GPU (one process per variant: a synccheck report may end the kernel with
"unspecified launch failure", after which the process's CUDA context is unusable):

    for v in ring skipwait double twice stagefull selfwait conswait selftest constest; do
        compute-sanitizer --tool synccheck python3 bench/probes/synccheck_mbarrier_probe.py $v
    done
    python3 bench/probes/synccheck_mbarrier_probe.py --compile-only [variants]   # any machine

Result (H200, compute-sanitizer 2025.3.1, CUTE_DSL_LINEINFO=1, one process per variant):
    ring clean; skipwait Missing wait at the producer's arrive on full[1] (shared 0x408);
    double Missing wait at the second arrive (0x400); twice clean; stagefull Missing wait at the
    producer's arrive on full[A] of round 2 (0x408 = page 1, round 0's B page); selfwait clean;
    conswait clean. Every report ended the kernel ("unspecified launch failure"). The probe's
    full[0] sits at 0x400: dynamic shared memory starts after the 1 KiB the sm_90 reserves.
    selftest / constest (session 38, bench/results/synccheck_probe_4eee517_2026-12-04_s38.log):
    1 Missing wait each, as stagefull: a test_wait nothing waits for does not count as the
    phase's observation, even a whole stage after the arrival (constest). gemm's
    MK_OWN_PHASE_SEEN=consumer_test (= constest) was removed for it.

Each variant is one launch between '== probe <v> begin' / '== probe <v> end' markers with its own
kernel name (class SyncProbe_<variant>). Every wait is bounded (try_wait in a loop against a
globaltimer deadline); a wait that times out is recorded (first one wins) and printed at the end
marker as 'TIMEOUT <which> round r phase p', so no variant can hang the GPU.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
if "--compile-only" in sys.argv:    # before cutlass is imported: the DSL reads these once
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="synccheck_probe_"))

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32, Int64  # noqa: E402

VARIANTS = ("ring", "skipwait", "double", "twice", "stagefull", "selfwait", "conswait", "selftest",
            "constest")
ROUNDS = 8
NP = 3                       # pages of the stagefull ring (2 ring positions a round)
THREADS = 64                 # warp 0 producer, warp 1 consumer
TIMEOUT_NS = 2_000_000_000   # per wait (synccheck slows the kernel down a lot)
# state words: [0] timed-out flag, [1] which wait, [2] round, [3] phase
W_EMPTY, W_FULL, W_FULL_A, W_FULL_B, W_SELF = 1, 2, 3, 4, 5
WAIT_NAMES = {W_EMPTY: "producer empty", W_FULL: "consumer full", W_FULL_A: "consumer full[A]",
              W_FULL_B: "consumer full[B]", W_SELF: "producer full[B] (self)"}
STATE_WORDS = 4


@cute.jit
def stage_pages(r: Int32):
    """Round r's two ring positions 2r (A) and 2r + 1 (B): (page, parity) of each."""
    qa = 2 * r
    qb = qa + 1
    return qa % NP, (qa // NP) & 1, qb % NP, (qb // NP) & 1


@cute.jit
def bwait(bar: cute.Pointer, phase: Int32, state: cute.Tensor, which: cutlass.Constexpr,
          r: Int32):
    """mbarrier parity wait with a globaltimer deadline (as mk's rk.bounded_bar_wait): on timeout
    record (which, round, phase) once and return; never hangs."""
    if not cute.arch.mbarrier_try_wait(bar, phase):
        t0 = cute.arch.globaltimer()
        st = Int32(0)
        while st == 0:
            if cute.arch.mbarrier_try_wait(bar, phase):
                st = Int32(1)
            elif cute.arch.globaltimer() - t0 > Int64(TIMEOUT_NS):
                st = Int32(2)
        if st == 2:
            old = cute.arch.atomic_cas(state.iterator.llvm_ptr, cmp=Int32(0), val=Int32(1),
                                       sem="relaxed", scope="gpu")
            if old == 0:
                state[1] = Int32(which)
                state[2] = r
                state[3] = phase


class _SyncProbeBase:
    variant = "ring"

    @cute.jit
    def __call__(self, out: cute.Tensor, state: cute.Tensor, stream):
        @cute.struct
        class Storage:
            full: cute.struct.MemRange[cutlass.Int64, NP]
            empty: cute.struct.MemRange[cutlass.Int64, NP]
            buf: cute.struct.MemRange[cutlass.Int32, NP]
        self.storage = Storage
        self.kernel(out, state).launch(grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Tensor, state: cute.Tensor):
        V = self.variant
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        full = st.full.data_ptr()
        empty = st.empty.data_ptr()
        buf = st.buf.get_tensor(cute.make_layout(NP))
        if warp == 0:
            if lane == 0:
                for p in cutlass.range_constexpr(NP):
                    cute.arch.mbarrier_init(full + p, 2 if V == "twice" else 1)
                    cute.arch.mbarrier_init(empty + p, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if cutlass.const_expr(V in ("ring", "skipwait")):
            # ---------------------------------------------------------------- (a), (b)
            if warp == 0:
                for r in range(ROUNDS):
                    s = r % 2
                    ph = (r // 2) & 1
                    if lane == 0:
                        bwait(empty + s, ph ^ 1, state, W_EMPTY, r)
                        buf[s] = r * 10 + s
                        cute.arch.mbarrier_arrive(full + s)          # the flagged arrive in (b)
                    if cutlass.const_expr(V == "skipwait"):
                        if r % 4 == 1:
                            cute.arch.sync_warp()
                            cute.arch.barrier_arrive(barrier_id=1, number_of_threads=THREADS)
            elif warp == 1:
                for r in range(ROUNDS):
                    s = r % 2
                    ph = (r // 2) & 1
                    skip = cutlass.Boolean(False)
                    if cutlass.const_expr(V == "skipwait"):
                        skip = r % 4 == 1
                    if skip:
                        # the phase is complete (the producer arrived before its bar.arrive),
                        # but no thread try_waits on it
                        cute.arch.barrier(barrier_id=1, number_of_threads=THREADS)
                    else:
                        bwait(full + s, ph, state, W_FULL, r)
                    out[r, lane] = buf[s]
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(empty + s)
        elif cutlass.const_expr(V in ("double", "twice")):
            # ---------------------------------------------------------------- (c), (c')
            if warp == 0:
                if lane == 0:
                    buf[0] = Int32(7)
                    cute.arch.mbarrier_arrive(full)     # double: completes phase 0, unobserved
                    cute.arch.mbarrier_arrive(full)     # double: arrive-on in phase 1 (flagged)
            elif warp == 1:
                # double: phase 1 complete (barrier in phase 2); twice: phase 0 complete
                bwait(full, Int32(1 if V == "double" else 0), state, W_FULL, Int32(0))
                for r in cutlass.range_constexpr(ROUNDS):
                    out[r, lane] = buf[0]
        else:
            # ---------------------------------------------------------------- (d), (e), (f)
            if warp == 0:
                for r in range(ROUNDS):
                    pa, pha, pb, phb = stage_pages(r)
                    if lane == 0:
                        bwait(empty + pa, pha ^ 1, state, W_EMPTY, r)
                        bwait(empty + pb, phb ^ 1, state, W_EMPTY, r)
                        buf[pa] = r * 10 + 1
                        buf[pb] = r * 10 + 2
                        # the B page's own `full`: a plain arrive nobody waits on (load_b_pages)
                        cute.arch.mbarrier_arrive(full + pb)
                        if cutlass.const_expr(V == "selfwait"):
                            bwait(full + pb, phb, state, W_SELF, r)
                        if cutlass.const_expr(V == "selftest"):
                            cute.arch.mbarrier_test_wait(full + pb, phb)    # not branched on
                        # the A page's `full` (gemm_load's arrive_and_expect_tx; the flagged
                        # arrive in round 2: page 1 was round 0's B page)
                        cute.arch.mbarrier_arrive(full + pa)
            elif warp == 1:
                for r in range(ROUNDS):
                    pa, pha, pb, phb = stage_pages(r)
                    bwait(full + pa, pha, state, W_FULL_A, r)
                    if cutlass.const_expr(V == "conswait"):
                        if lane == 0:
                            bwait(full + pb, phb, state, W_FULL_B, r)
                    if cutlass.const_expr(V == "constest"):
                        if lane == 0:
                            cute.arch.mbarrier_test_wait(full + pb, phb)    # not branched on
                    out[r, lane] = buf[pa] * 100 + buf[pb]
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(empty + pa)
                        cute.arch.mbarrier_arrive(empty + pb)


def make_probe(variant: str):
    assert variant in VARIANTS, variant
    cls = type(f"SyncProbe_{variant}", (_SyncProbeBase,), {"variant": variant})
    cls.__qualname__ = cls.__name__
    return cls()


def expected(variant: str):
    import torch
    r = torch.arange(ROUNDS, dtype=torch.int32)[:, None].expand(ROUNDS, 32)
    if variant in ("ring", "skipwait"):
        return r * 10 + r % 2
    if variant in ("double", "twice"):
        return torch.full((ROUNDS, 32), 7, dtype=torch.int32)
    return (r * 10 + 1) * 100 + r * 10 + 2


def compile_ptx(variant: str) -> str:
    """The variant's PTX for sm_90a, compiled with fake tensors (no GPU needed)."""
    import cuda.bindings.driver as drv
    from cutlass.cute.runtime import make_fake_compact_tensor
    out = make_fake_compact_tensor(Int32, (ROUNDS, 32), stride_order=(1, 0))
    state = make_fake_compact_tensor(Int32, (STATE_WORDS,))
    return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX](
        make_probe(variant), out, state, drv.CUstream(0)).__ptx__


def run(variants=VARIANTS) -> dict:
    import torch
    import cuda.bindings.driver as drv
    from cutlass.cute.runtime import from_dlpack
    res = {}
    for v in variants:
        out = torch.full((ROUNDS, 32), -1, dtype=torch.int32, device="cuda")
        state = torch.zeros(STATE_WORDS, dtype=torch.int32, device="cuda")
        cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
        comp = cute.compile(make_probe(v), from_dlpack(out), from_dlpack(state), cs)
        print(f"== probe {v} begin", flush=True)
        try:
            comp(from_dlpack(out), from_dlpack(state), cs)
            torch.cuda.synchronize()
        except Exception as e:      # a synccheck report may end the kernel
            print(f"== probe {v} end: launch failed: {e!r}", flush=True)
            res[v] = dict(launch_failed=repr(e))
            continue
        ok = bool(torch.equal(out.cpu(), expected(v)))
        s = state.cpu().tolist()
        to = (f"TIMEOUT {WAIT_NAMES.get(s[1], s[1])} round {s[2]} phase {s[3]}" if s[0]
              else "no timeout")
        res[v] = dict(values_ok=ok, timeout=bool(s[0]), state=s)
        print(f"== probe {v} end: values {'ok' if ok else 'WRONG'}, {to}", flush=True)
    return res


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    vs = args or list(VARIANTS)
    if "--compile-only" in sys.argv:
        import re
        for v in vs:
            ptx = compile_ptx(v)
            ops = re.findall(r"mbarrier\.(arrive|try_wait|test_wait|init)[\w.:]*", ptx)
            counts = {k: ops.count(k) for k in sorted(set(ops))}
            nbar = len(re.findall(r"\bbar(?:rier)?(?:\.cta)?\.(?:sync|arrive)", ptx))
            print(f"{v}: compiled; mbarrier ops in the PTX {counts}, named-barrier ops {nbar}")
        sys.exit(0)
    print(run(vs))
