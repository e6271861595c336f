"""Where the host's time in one megakernel launch goes (GPU; not a timed test).

Session 61's generation job (bench/generate_overlap.py) spent 0.34 ms of host time in each
Megakernel.launch, on the critical path between two steps (the device waits for the launch),
where the launch's arguments are cached (bench/host_step.py: 0.003 ms) and a CPU build of a
31-argument CuTe DSL function marshals its arguments in ~15 us. This times, on the GPU host, each
part of a launch of one prepared step of the tiny head_dim-128 model (the same 39 kernel
parameters as the 70B rank's), the device idle between reps (synchronised outside the timing):

    full     Megakernel.launch(handle, check=False)
    args     Megakernel._args (the cached DLPack views, the Int32 / stream wrappers)
    marshal  the compiled function's generate_execution_args (arguments -> C pointers)
    submit   the compiled function's run_compiled_program (the host stub: cudaLaunchKernelEx)
    cached   run_compiled_program of arguments marshalled once (what a launch could cost)
    torch    an empty-ish torch kernel (x.add_(1) on 1 element): the CUDA launch floor

Medians and p90 of --reps, in us, then the full launch under cProfile (the 15 functions with
the most own time); --out writes the JSON.

    python bench/launch_host.py --out bench/results/launch_host.json     # Hopper GPU, ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]


def timed_us(fn, reps: int, sync) -> list[float]:
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    sync()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=200, help="timed launches of each part (200)")
    p.add_argument("--tokens", type=int, default=16, help="the prepared step's prompt tokens")
    p.add_argument("--out", help="write the JSON report here")
    args = p.parse_args(argv)
    if args.reps < 1 or args.tokens < 1:
        p.error("--reps and --tokens must be >= 1")
    import torch

    from mk import megakernel as mkk
    try:
        mkk.require_gpu("bench/launch_host.py", hint="")
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from mk.batch import SeqChunk, StepBatch
    from mk.engine import Engine
    from mk.provenance import run_record
    from mk.tiny import TINY_HD128_CONFIG, tiny_checkpoint

    engine = Engine.from_pretrained(tiny_checkpoint(config=TINY_HD128_CONFIG),
                                    backend="megakernel", dtype=torch.bfloat16, device="cuda",
                                    progress=False, max_seqs=16, max_context=1024)
    backend = engine.backend
    pages = list(range(-(-args.tokens // engine.kernel.page_size)))
    batch = StepBatch([SeqChunk(list(range(3, 3 + args.tokens)), 0, pages)])
    mk, handle, _ = backend.prepare(batch)          # compiles the class on first use
    mk.launch(handle, check=True)                   # the compiled variant held, probe made
    s, n, n_ctr = handle
    comp, cs = mk._ensure_compiled(s, n_ctr)
    launch_args = mk._args(s, n_ctr, cs, n)
    exe, keep = comp.generate_execution_args(*launch_args)
    x = torch.zeros(1, device="cuda")
    sync = torch.cuda.synchronize

    def submit():
        marshalled, adapted = comp.generate_execution_args(*launch_args)
        comp.run_compiled_program(marshalled)   # `adapted` holds what the C pointers point at
        del adapted

    parts = {
        "full": lambda: mk.launch(handle, check=False),
        "args": lambda: mk._args(s, n_ctr, cs, n),
        "marshal": lambda: comp.generate_execution_args(*launch_args),
        "submit": submit,
        "cached": lambda: comp.run_compiled_program(exe),
        "torch": lambda: x.add_(1),
    }
    for fn in parts.values():               # warm every path once
        fn()
    sync()
    res = {}
    for name, fn in parts.items():
        us = timed_us(fn, args.reps, sync)
        res[name] = dict(median_us=round(statistics.median(us), 2),
                         p90_us=round(sorted(us)[int(0.9 * (len(us) - 1))], 2))
    # "submit" marshals too (its arguments must live through the call): its own part
    res["submit"]["own_median_us"] = round(res["submit"]["median_us"]
                                           - res["marshal"]["median_us"], 2)
    # where a full launch's Python time goes, function by function (cProfile's own times)
    import cProfile
    import pstats
    prof = cProfile.Profile()
    for _ in range(min(args.reps, 100)):
        sync()
        prof.enable()
        mk.launch(handle, check=False)
        prof.disable()
    sync()
    st = pstats.Stats(prof)
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:15]
    profile = [dict(function=f"{os.path.basename(f)}:{line}:{name}", calls=nc,
                    own_us_a_launch=round(tt / min(args.reps, 100) * 1e6, 2),
                    cum_us_a_launch=round(ct / min(args.reps, 100) * 1e6, 2))
               for (f, line, name), (_, nc, tt, ct, _) in top]
    mk.wait(mk.hang_s)
    mk.check()                              # every launch above ended cleanly
    del keep
    for name, r in res.items():
        print(f"{name:8s} median {r['median_us']:9.2f} us   p90 {r['p90_us']:9.2f} us", flush=True)
    print("full launch under cProfile, us a launch (own / cumulative):")
    for row in profile:
        print(f"  {row['own_us_a_launch']:8.2f} {row['cum_us_a_launch']:8.2f}  {row['function']}")
    if args.out:
        report = dict(benchmark="host time of one megakernel launch, by part "
                                "(bench/launch_host.py)",
                      **run_record(__file__, argv, device=torch.cuda.get_device_name()),
                      reps=args.reps, tokens=args.tokens, kernel_parameters=len(launch_args),
                      parts=res, profile=profile)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
