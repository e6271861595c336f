"""Which shared-memory hand-offs does compute-sanitizer racecheck understand?

A tiny CuTe DSL kernel: producer warps 0-1 (64 threads) write a 2-slot ring in shared memory with
plain st.shared, consumer warps 2-3 (64 threads) read it with ld.shared (each thread reads words
written by other threads and other warps); the slot is handed over and back (full / empty) by

    thread   mbarrier: every accessing thread arrives (count 64), waiters try_wait.parity
    warp     mbarrier: each warp __syncwarp, then its lane 0 arrives (count 2)
    group    mbarrier: bar.sync of the 64 threads (named barrier), then one thread arrives (count 1)
             -- the megakernel's original protocol
    named    no mbarrier: bar.arrive by the writers, bar.sync by the readers (one named barrier
             per slot and direction)
    chain    mbarrier, every thread arrives, but through a relay warp (writers -> relay -> readers):
             does racecheck follow a transitive chain of per-thread hand-offs?
    none     no hand-off at all (control: must be reported)

The mbarrier waits and arrivals are the megakernel's own helpers (rk.bounded_bar_wait,
rk.release). Usage, on a Hopper GPU:

    compute-sanitizer --tool racecheck python3 bench/probes/racecheck_mbarrier_probe.py [variants]

Each variant is launched once (ROUNDS hand-offs) and synchronised before the next, between
'== probe <v> begin' / '== probe <v> end' markers, so racecheck's reports fall between its markers;
every variant's kernel also has its own name (class Probe_<variant>).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32, Int64  # noqa: E402

from mk.instructions import _rows_kernel as rk  # noqa: E402

VARIANTS = ("thread", "warp", "group", "named", "chain", "none")
ROUNDS = 16
NW = 64            # words per slot = threads per side


class _ProbeBase:
    variant = "thread"
    mode = "thread"        # the rk.release mode of the mbarrier variants

    @cute.jit
    def __call__(self, out: cute.Tensor, state: cute.Tensor, stream):
        @cute.struct
        class Storage:
            full: cute.struct.MemRange[cutlass.Int64, 2]
            empty: cute.struct.MemRange[cutlass.Int64, 2]
            mid: cute.struct.MemRange[cutlass.Int64, 2]
            buf: cute.struct.MemRange[cutlass.Int32, 2 * NW]
        self.storage = Storage
        self.kernel(out, state).launch(grid=[1, 1, 1], block=[160, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Tensor, state: cute.Tensor):
        V = self.variant
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.storage)
        full = st.full.data_ptr()
        empty = st.empty.data_ptr()
        mid = st.mid.data_ptr()
        buf = st.buf.get_tensor(cute.make_layout(2 * NW))
        mode = self.mode
        share = rk.arrivals(mode, NW)
        timeout = Int64(2_000_000_000)
        if warp == 0:
            with cute.arch.elect_one():
                for s in cutlass.range_constexpr(2):
                    cute.arch.mbarrier_init(full + s, share)
                    cute.arch.mbarrier_init(empty + s, share)
                    cute.arch.mbarrier_init(mid + s, 32)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if warp < 2:
            # ---------------------------------------------------------------- producers
            p = tidx
            for r in range(ROUNDS):
                slot = r % 2
                ph = (r // 2) & 1
                if cutlass.const_expr(V == "named"):
                    if r >= 2:
                        cute.arch.barrier(barrier_id=3 + slot, number_of_threads=128)
                elif cutlass.const_expr(V != "none"):
                    rk.bounded_bar_wait(empty + slot, ph ^ 1, timeout, state, rk.ERR_PAGE_EMPTY,
                                        Int32(r))
                buf[slot * NW + p] = r * 1000 + p
                if cutlass.const_expr(V == "named"):
                    cute.arch.barrier_arrive(barrier_id=1 + slot, number_of_threads=128)
                elif cutlass.const_expr(V == "chain"):
                    rk.release(full + slot, NW, NW, p, 1, "thread")
                elif cutlass.const_expr(V != "none"):
                    rk.release(full + slot, share, NW, p, 1, mode)
        elif warp < 4:
            # ---------------------------------------------------------------- consumers
            c = tidx - 64
            for r in range(ROUNDS):
                slot = r % 2
                ph = (r // 2) & 1
                if cutlass.const_expr(V == "named"):
                    cute.arch.barrier(barrier_id=1 + slot, number_of_threads=128)
                elif cutlass.const_expr(V == "chain"):
                    rk.bounded_bar_wait(mid + slot, ph, timeout, state, rk.ERR_PAGE_FULL, Int32(r))
                elif cutlass.const_expr(V != "none"):
                    rk.bounded_bar_wait(full + slot, ph, timeout, state, rk.ERR_PAGE_FULL, Int32(r))
                # words written by another thread of another warp, and by the mirrored thread
                v = buf[slot * NW + (c + 37) % NW] + buf[slot * NW + (NW - 1 - c)]
                out[r, c] = v
                if cutlass.const_expr(V == "named"):
                    if r < ROUNDS - 2:
                        cute.arch.barrier_arrive(barrier_id=3 + slot, number_of_threads=128)
                elif cutlass.const_expr(V == "chain"):
                    rk.release(empty + slot, NW, NW, c, 2, "thread")
                elif cutlass.const_expr(V != "none"):
                    rk.release(empty + slot, share, NW, c, 2, mode)
        else:
            # ---------------------------------------------------------------- relay (chain)
            if cutlass.const_expr(V == "chain"):
                lane = tidx - 128
                for r in range(ROUNDS):
                    slot = r % 2
                    ph = (r // 2) & 1
                    rk.bounded_bar_wait(full + slot, ph, timeout, state, rk.ERR_PAGE_FULL, Int32(r))
                    rk.release(mid + slot, 32, 32, lane, 0, "thread")


def make_probe(variant: str):
    assert variant in VARIANTS, variant
    mode = variant if variant in ("warp", "group") else "thread"
    cls = type(f"Probe_{variant}", (_ProbeBase,), {"variant": variant, "mode": mode})
    cls.__qualname__ = cls.__name__
    return cls()


def expected():
    import torch
    r = torch.arange(ROUNDS, dtype=torch.int32)[:, None]
    c = torch.arange(NW, dtype=torch.int32)[None, :]
    return 2000 * r + (c + 37) % NW + (NW - 1 - c)


def run(variants=VARIANTS) -> dict:
    import torch
    from cutlass.cute.runtime import from_dlpack
    import cuda.bindings.driver as drv
    res = {}
    for v in variants:
        out = torch.full((ROUNDS, NW), -1, dtype=torch.int32, device="cuda")
        state = torch.zeros(rk.STATE_WORDS, dtype=torch.int32, device="cuda")
        cs = drv.CUstream(torch.cuda.current_stream().cuda_stream)
        comp = cute.compile(make_probe(v), from_dlpack(out), from_dlpack(state), cs)
        print(f"== probe {v} begin", flush=True)
        comp(from_dlpack(out), from_dlpack(state), cs)
        torch.cuda.synchronize()
        ok = bool(torch.equal(out.cpu(), expected()))
        err = int(state[rk.S_ERR_FLAG].item())
        res[v] = dict(values_ok=ok, wait_error=err)
        print(f"== probe {v} end: values {'ok' if ok else 'WRONG'}, wait errors {err}", flush=True)
    return res


if __name__ == "__main__":
    vs = sys.argv[1:] or list(VARIANTS)
    print(run(vs))
