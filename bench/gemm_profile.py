"""Where a GEMM tile's time goes, through mk.megakernel on one GPU (bench/GEMM_NOTES.md).

    python bench/gemm_profile.py --jobs O_PROJ:4096:time:,O_PROJ:4096:time:nostore,...
    python bench/gemm_profile.py --jobs O_PROJ:4096:ncu: --ncu   # under ncu, see below

A job is OP:M:KIND:EXPERIMENT. EXPERIMENT is MK_GEMM_EXPERIMENT (gk.EXPERIMENT: parts of the
tile's work compiled out, e.g. "nostore", "noepi", "nob1"; "+" separates several) or "nosig"
(the plan carries no signals, so the storer skips its release) or "tile=NAME" (another
gk.TILES config for this opcode instead of the table's) or "batch" (MK_GEMM_EPI_BATCH=1) or
"ktrace=N" (MK_GEMM_KTRACE=N, journal jobs: the first N K steps of every tile stamped,
mk.trace.gemm_ktrace's per-K-step table: loads issued how early, in flight how long, the
consumers' waits, the tensor pipe's cycles per step) or "reglow=N" / "reghigh=N" (MK_REG_LOW /
MK_REG_HIGH: the setmaxnreg split; a variant with QKV_ROPE, as the step's, runs 80 / 208 where
one without runs 72 / 216); an unknown part is refused. KIND:
    time     median us of one whole-matrix launch, cold L2 (bench/gemm.py's rotation and timer)
    journal  the journal variant: per-CTA intervals between consecutive tile ends (= the service
             time of one tile at steady state), percentiles
    check    bench/gemm.py's correctness case (poisoned output vs the torch face)
    ncu      one launch between cudaProfilerStart/Stop (run the job under
             `ncu --profile-from-start off`)
    floor    as time, of a launch running the first tile alone (QKV_ROPE: unsplit): the
             launch, the roles' prologue and one tile's latency, the fixed part of a
             whole-matrix time (what a small M pays once per launch and the step once per step)
    launch   as time, of a launch of the same compiled variant running one NOOP: the launch and
             the roles' prologue and teardown alone (floor - launch = one tile's latency)
    empty    as time, of an empty CuTe DSL kernel with the megakernel's grid, block and shared
             memory (bench/_empty_kernel.py): what the GPU charges to start and retire the CTAs;
             launch - empty is the megakernel's own prologue, queue and teardown
The journal kind takes the flags "noop" (one NOOP, as kind launch) and "first" (the first tile
alone, as kind floor); it then also reports where the launch's time goes: the CTAs' start spread,
the first instruction's fetch / ready / end after the first CTA started, and the teardown (the
last CTA's exit after the last instruction's end).
Each job is its own process (one compiled variant per environment); the driver starts them all at
once (their compiles overlap) and a file lock lets one job at a time use the GPU. One JSON line per
job on stdout (prefix @@JOB) and in --out.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _jobs  # noqa: E402

LOCK = "/tmp/mk_gemm_gpu.lock"
# EXPERIMENT parts NAME=VALUE that set a compile-time switch of the GEMM bodies
KNOBS = {"ktrace": "MK_GEMM_KTRACE",
         "reglow": "MK_REG_LOW", "reghigh": "MK_REG_HIGH"}
EXPERIMENTS = ("nostore", "noepi", "nob1", "earlyfree")      # MK_GEMM_EXPERIMENT parts
FLAGS = ("nosig", "batch", "noop", "first")
KINDS = ("time", "floor", "launch", "empty", "check", "journal", "ncu")


def job_env(job: str) -> dict:
    """The environment changes of job OP:M:KIND:EXPERIMENT (module docstring); an EXPERIMENT part
    that is none of them is refused (a typo would time the default build under its name)."""
    parts = job.split(":")
    if len(parts) != 4:
        raise SystemExit(f"gemm_profile: job {job!r}: expected OP:M:KIND:EXPERIMENT")
    if parts[2] not in KINDS:
        raise SystemExit(f"gemm_profile: job {job!r}: unknown kind {parts[2]!r} "
                         f"({', '.join(KINDS)})")
    env = {"MK_GEMM_EXPERIMENT": ",".join(t for t in parts[3].split("+") if t in EXPERIMENTS)}
    for t in [t for t in parts[3].split("+") if t]:
        key, eq, val = t.partition("=")
        if eq and key in KNOBS:
            env[KNOBS[key]] = val
        elif t == "batch":
            env["MK_GEMM_EPI_BATCH"] = "1"
        elif not (t in EXPERIMENTS or t in FLAGS or (eq and key == "tile")):
            raise SystemExit(f"gemm_profile: job {job!r}: unknown experiment part {t!r} (known: "
                             f"{', '.join(EXPERIMENTS + FLAGS)}, tile=NAME, "
                             f"{', '.join(k + '=V' for k in KNOBS)})")
    return env


def gpu_lock():
    f = open(LOCK, "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def worker(job: str, reps: int) -> dict:
    import torch

    import bench.gemm as bg
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import Op
    op, m, kind, exp = job.split(":")
    m = int(m)
    tile = [t[5:] for t in exp.split("+") if t.startswith("tile=")]
    if tile:
        # another tile of the table for this (op, M) (megakernel.gemm_slots calls gk.choose_tile)
        table_choice = gk.choose_tile
        gk.choose_tile = lambda o, mm: (gk.TILES[tile[0]] if Op(o) == Op[op]
                                        else table_choice(o, mm))
    K, N, NO, src, dst = bg.SHAPES[op]
    cfg = gk.choose_tile(Op[op], m)
    lay = 0 if op == "LM_HEAD" else 1
    sig = None if "nosig" in exp else 0
    splitk = None
    if op == "QKV_ROPE":
        # QKV_ROPE's tiles carry their head sections and RoPE positions: bench.gemm's own plan
        unsplit, nctr = bg.plan_qkv(cfg, m, bg.QKV_SECTIONS, K, bg.HEAD_DIM, layer=lay,
                                    src=int(src), dst=int(dst))
        instrs = unsplit               # floor: its first whole tile
        if kind != "floor":
            instrs, _, splitk = bg.split_plan("QKV_ROPE", m, unsplit, nctr, m + 64)
    else:
        instrs, _ = bg.plan_tiles(Op[op], cfg, m, NO, K, layer=lay, src=int(src), dst=int(dst),
                                  signal_base=sig)
    flags = exp.split("+")
    if kind == "floor" or (kind == "journal" and "first" in flags):
        instrs = instrs[:1]
    elif kind == "launch" or (kind == "journal" and "noop" in flags):
        from mk.ir import Instruction, serialize
        instrs = serialize([Instruction(int(Op.NOOP))])
    out = dict(job=job, op=op, m=m, kind=kind, experiment=exp, tile=cfg.name,
               n_tiles=int(instrs.shape[0]), kt=K // gk.BK)
    if kind == "empty":
        import mk.megakernel as M
        from bench import _empty_kernel
        from mk.instructions import _rows_kernel as rk
        grid = torch.cuda.get_device_properties(0).multi_processor_count
        fn = _empty_kernel.launcher(grid, M.THREADS, M.NPAGES * rk.PAGE + 4096)
        fn()
        torch.cuda.synchronize()
        with gpu_lock():
            us, ts = bg.time_rotating([fn], reps)
        out.update(mk_us=us, min_us=ts[0], max_us=ts[-1], grid=grid)
        return out
    if kind == "check":
        with gpu_lock():
            c = bg.check_case(op, m, seed=m)
        out.update({k: c.get(k) for k in ("ok", "rel_err", "poison_intact", "finite", "tile")})
        return out
    if kind == "journal" and op == "QKV_ROPE":
        raise SystemExit("gemm_profile: journal jobs of QKV_ROPE are not built (its operands "
                         "need the KV cache and metadata); time it, or journal the whole step")
    if kind == "journal":
        import mk.megakernel as M
        x, w, y = bg.make_problem(op, m, seed=1)
        y.nan_to_num_(0.0)
        arena = torch.zeros(3, 64, 1024, dtype=torch.bfloat16, device="cuda")
        normw = torch.zeros(3, 1024, dtype=torch.bfloat16, device="cuda")
        mkk = M.Megakernel(arena, normw, 1, 1e-5, journal=True, verbose=False,
                           gemm={Op[op]: M.GemmOperands(x, w, y, int(src), int(dst))}, gemm_m=m)
        p = mkk.prepare(instrs)
        mkk.launch(p)                        # compile + warm
        with gpu_lock():
            torch.cuda.synchronize()
            mkk.launch(p)
            torch.cuda.synchronize()
        n = int(instrs.shape[0])
        jr, jc = mkk.journal_rows(n)
        cta, fetch, ready, end = (jr[:, M.J_CTA], jr[:, M.J_FETCH], jr[:, M.J_READY],
                                  jr[:, M.J_END])
        t0 = int(jc[:, 0].min())
        iv, first = [], []
        for c in range(mkk.grid):
            sel = (cta == c).nonzero().flatten()
            e = end[sel].sort().values
            if len(e):
                first.append(int(e[0]) - int(jc[c, 0]))
            iv += (e[1:] - e[:-1]).tolist()
        iv.sort()
        q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))] if v else None   # noqa: E731
        out.update(tile_interval_ns=dict(p10=q(iv, .1), p50=q(iv, .5), p90=q(iv, .9), n=len(iv)),
                   first_tile_end_ns=dict(p10=q(sorted(first), .1), p50=q(sorted(first), .5),
                                          p90=q(sorted(first), .9)),
                   kernel_ns=int(jc[:mkk.grid, 1].max()) - t0,
                   tail_ns=int(jc[:mkk.grid, 1].max()) - int(jc[:mkk.grid, 1].min()),
                   fetch_to_ready_ns_p50=float((ready - fetch).float().median()))
        # where a short launch's time goes (the first instruction, the CTAs' start and exit)
        i0 = int(fetch.argmin())
        out.update(cta_start_spread_ns=int(jc[:mkk.grid, 0].max()) - t0,
                   first_fetch_ns=int(fetch[i0]) - t0, first_ready_ns=int(ready[i0]) - t0,
                   first_end_ns=int(end[i0]) - t0,
                   teardown_ns=int(jc[:mkk.grid, 1].max()) - int(end.max()))
        if gk.KTRACE:
            import mk.trace as tr
            out["ktrace"] = tr.gemm_ktrace(jr, n, gk.KTRACE)
            print(tr.format_gemm_ktrace(out["ktrace"]), file=sys.stderr, flush=True)
        return out
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    wbytes = N * K * 2 * (1 if op == "LM_HEAD" else 2)
    R = min(16, max(2, math.ceil(3 * l2 / (wbytes + (m + 64) * (K * 2 + NO * 4)))))
    if kind == "ncu":
        R = 1
    # under ncu's instrumented replay a launch can take far longer than the page-wait timeout
    h = bg.MkGemm(Op[op], m, timeout_s=float(os.environ.get("MK_PROFILE_TIMEOUT_S", 2.0)))
    if op == "QKV_ROPE":
        qsets = [bg.make_qkv_problem(m, seed=100 + i) for i in range(R)]
        fns = [h.launcher(h.prepare(instrs, x, w, q, meta, invf, kv, splitk))
               for x, w, q, kv, meta, invf in qsets]
    else:
        sets = [bg.make_problem(op, m, seed=100 + i) for i in range(R)]
        for _, _, y in sets:
            y.nan_to_num_(0.0)
        fns = [h.launcher(h.prepare(instrs, x, w, y)) for x, w, y in sets]
    for f in fns:                            # compile + warm
        f()
    torch.cuda.synchronize()
    h.check()
    with gpu_lock():
        if kind == "ncu":
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            fns[0]()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        else:
            us, ts = bg.time_rotating(fns, reps)
            out.update(mk_us=us, min_us=ts[0], max_us=ts[-1], buffer_sets=R)
    h.check()
    return out


def record(results: list) -> dict:
    """The --out JSON: the jobs' results with where they came from (date, commit, device,
    command; each job's MK_GEMM_EXPERIMENT is in its "experiment")."""
    import datetime

    from mk.provenance import git_commit, knob_env
    try:
        import torch
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        device = "unknown"
    return dict(date=datetime.date.today().isoformat(), git_commit=git_commit(), device=device,
                command="python " + " ".join(sys.argv), env=knob_env(), jobs=results)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", required=True, help="comma-separated OP:M:KIND:EXPERIMENT")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    p.add_argument("--timeout", type=float, default=240.0)
    a = p.parse_args(argv)
    if a.worker:
        os.environ.setdefault("MK_GEMM_EXPERIMENT", "")
        r = worker(a.jobs, a.reps)
        print("@@JOB " + json.dumps(r), flush=True)
        return 0
    procs = []
    for job in [j for j in a.jobs.split(",") if j]:
        env = dict(os.environ, **job_env(job))
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), "--worker", "--jobs", job,
               "--reps", str(a.reps)]
        procs.append((job, _jobs.start(cmd, env)))
    results = []
    for job, txt in _jobs.collect(procs, a.timeout):
        got = [ln[6:] for ln in txt.splitlines() if ln.startswith("@@JOB ")]
        r = json.loads(got[0]) if got else dict(job=job, error=txt[-1500:])
        results.append(r)
        print(json.dumps(r), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(record(results), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
