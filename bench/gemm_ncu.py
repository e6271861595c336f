"""Where a GEMM instruction's time goes: one launch of mk's whole-matrix GEMM and one of cuBLAS
(torch.matmul, same shapes), each under Nsight Compute's speed-of-light and memory sections.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -f -o OUT \\
        python bench/gemm_ncu.py --ops GATE_UP,DOWN --m 4096
    ncu -i OUT.ncu-rep --page details --csv > OUT.csv
    python bench/gemm_ncu.py --summary OUT.csv       # the figures side by side
    ncu -i OUT.ncu-rep --page raw --csv > RAW.csv     # optional: every collected metric
    python bench/gemm_ncu.py --summary OUT.csv --raw RAW.csv   # + the tensor pipe, bytes, stalls
                                                      # and both kernels side by side (.gz read)

(`scripts/gpu_next.sh gemmncu` runs all of it, with the scheduler and warp-state sections.)

The question it answers (issue 5, M >= 1024): is mk's tile mainloop bound by the SMs' tensor
pipes, by L2 -> SM traffic (each CTA loads its own A and B tiles; cuBLAS shares them between the
two CTAs of a cluster by TMA multicast), or by DRAM. The profiled region holds exactly the two
launches per op (warm: each ran twice before), in the order mk, cuBLAS; the inputs are the ones
bench/gemm.py times (its plan, split-K as the step's planner cuts it).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# figures of the details page that answer the question (section, metric name as ncu prints it)
METRICS = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "L1/TEX Cache Throughput",
           "L2 Cache Throughput", "DRAM Throughput", "L2 Hit Rate", "Mem Busy", "Max Bandwidth",
           "Executed Ipc Active", "SM Busy", "Issue Slots Busy", "No Eligible",
           "Active Warps Per Scheduler", "Eligible Warps Per Scheduler",
           "Warp Cycles Per Issued Instruction")
# raw metrics (by name fragment) that split "the tensor pipe idles" into its causes: the pipe's
# own activity, the bytes L2 hands the SMs (no multicast in mk), DRAM, the issue slots
RAW_FRAGMENTS = ("gpu__time_duration.sum", "tensor_op", "lts__t_bytes.sum",
                 "lts__t_sectors_srcunit_tex", "xbar2l1tex", "dram__bytes_read.sum",
                 "smsp__issue_active", "smsp__inst_executed.sum", "sm__cycles_elapsed.avg")
STALL_PREFIX = "smsp__average_warps_issue_stalled_"


def profile(ops: list[str], m: int) -> None:
    import torch
    import gemm as G
    from mk.ir import Op

    for op in ops:
        if op == "QKV_ROPE":
            raise SystemExit("gemm_ncu.py: QKV_ROPE has its own problem builder; not covered")
        K, N, NO, src, dst = G.SHAPES[op]
        cfg = G.gk.choose_tile(Op[op], m)
        x, w, y = G.make_problem(op, m)
        y.nan_to_num_(0.0)
        lay = 0 if op == "LM_HEAD" else 1
        unsplit, nctr = G.plan_tiles(Op[op], cfg, m, NO, K, layer=lay, src=int(src),
                                     dst=int(dst))
        instrs, ns, sk = G.split_plan(op, m, unsplit, nctr, m + 64)
        h = G.MkGemm(Op[op], m)
        mk_launch = h.launcher(h.prepare(instrs, x, w, y, splitk=sk))
        cublas, _ = G.torch_fns(op, x, w, y, m)
        for _ in range(2):
            mk_launch()
            cublas()
        torch.cuda.synchronize()
        h.check()
        print(f"[gemm_ncu] {op} M={m}: mk tile {G.tile_name(cfg, ns)}, then cuBLAS", flush=True)
        torch.cuda.profiler.start()
        mk_launch()
        torch.cuda.synchronize()
        cublas()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        h.check()


def _open_text(path: str):
    """A CSV as text, gzipped (bench/results keeps them so) or not."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", newline="")
    return open(path, newline="")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


# bytes per unit of ncu's byte metrics
_BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
# the stall reasons the side-by-side table turns into warps per scheduler
SIDE_STALLS = ("gmma", "long_scoreboard", "barrier", "wait", "dispatch_stall", "mio_throttle")


def side_by_side(names: list, units: list, kernels: list) -> list[tuple]:
    """The raw page's kernels as (figure, value per kernel) rows: what splits "mk's tile is slower"
    into the tensor pipe's busy and idle time, the bytes L2 hands the SMs, DRAM and where the
    warps wait. A figure whose metrics a kernel lacks is None for it.

    tensor busy / idle us: the tensor pipe's active share of the elapsed cycles times the
    duration, and the rest; L2 -> SM MB: the SMs' read sectors at L2 (32 bytes each); stalled
    warps per scheduler: warps stalled per issued instruction x issued instructions per active
    cycle (so a reason's share of the scheduler's warps at any moment)."""

    def col(val: dict, name: str):
        return _number(val.get(name, ""))

    vals = [dict(zip(names, k)) for k in kernels]
    unit = dict(zip(names, units))
    figs: list[tuple[str, list]] = []
    dur = [col(v, "gpu__time_duration.sum") for v in vals]
    figs.append(("duration us", dur))
    tp = [col(v, "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed")
          for v in vals]
    figs.append(("tensor pipe active % of elapsed", tp))
    busy = [None if d is None or t is None else d * t / 100 for d, t in zip(dur, tp)]
    figs.append(("tensor busy us", busy))
    figs.append(("tensor idle us", [None if d is None or b is None else d - b
                                    for d, b in zip(dur, busy)]))
    rd = [col(v, "lts__t_sectors_srcunit_tex_op_read.sum") for v in vals]
    figs.append(("L2 -> SM reads MB", [None if r is None else r * 32 / 1e6 for r in rd]))
    figs.append(("L2 SM-sector % of peak",
                 [col(v, "lts__t_sectors_srcunit_tex.sum.pct_of_peak_sustained_elapsed")
                  for v in vals]))
    scale = _BYTE_UNITS.get(unit.get("dram__bytes_read.sum", ""), None)
    figs.append(("DRAM reads MB", [None if scale is None or col(v, "dram__bytes_read.sum") is None
                                   else col(v, "dram__bytes_read.sum") * scale / 1e6
                                   for v in vals]))
    issue = [col(v, "smsp__issue_active.avg.per_cycle_active") for v in vals]
    figs.append(("issued per scheduler cycle", issue))
    for reason in SIDE_STALLS:
        r = [col(v, f"{STALL_PREFIX}{reason}_per_issue_active.ratio") for v in vals]
        figs.append((f"warps stalled on {reason}",
                     [None if a is None or i is None else a * i for a, i in zip(r, issue)]))
    return figs


def print_side_by_side(names: list, units: list, kernels: list) -> None:
    heads = [k[names.index("Kernel Name")][:18] if "Kernel Name" in names else "?"
             for k in kernels]
    print("== side by side" + "".join(f" | {h:>18s}" for h in heads)
          + (" | first / second" if len(kernels) == 2 else ""))
    for name, v in side_by_side(names, units, kernels):
        cells = "".join(" | " + (f"{x:18.3f}" if x is not None else f"{'-':>18s}") for x in v)
        ratio = ""
        if len(v) == 2 and v[0] is not None and v[1]:
            ratio = f" | {v[0] / v[1]:.2f}"
        print(f"   {name:32s}{cells}{ratio}")


def raw_summary(path: str) -> None:
    """ncu's raw page (a metric per column, a unit row, a row per kernel): RAW_FRAGMENTS' metrics
    and each kernel's six largest stall reasons (warps stalled per issued instruction), then the
    kernels side by side (side_by_side)."""
    with _open_text(path) as f:
        rows = [r for r in csv.reader(f)]
    hdr_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hdr_at is None or len(rows) < hdr_at + 3:
        print(f"gemm_ncu.py: {path} has no raw kernel rows", file=sys.stderr)
        return
    names, units = rows[hdr_at], rows[hdr_at + 1]
    for r in rows[hdr_at + 2:]:
        val = dict(zip(names, r))
        print(f"== raw: {val.get('ID', '?')} {val.get('Kernel Name', '')[:60]}")
        for i, n in enumerate(names):
            if any(fr in n for fr in RAW_FRAGMENTS) and i < len(r):
                print(f"   {n:72s} {r[i]} {units[i] if i < len(units) else ''}")
        stalls = []
        for i, n in enumerate(names):
            if n.startswith(STALL_PREFIX) and n.endswith("_per_issue_active.ratio") and i < len(r):
                try:
                    stalls.append((float(r[i].replace(",", "")), n[len(STALL_PREFIX):]))
                except ValueError:
                    pass
        for v, n in sorted(stalls, reverse=True)[:6]:
            print(f"   stalled {n:64s} {v:.3f}")
    print_side_by_side(names, units, rows[hdr_at + 2:])


def summary(path: str) -> int:
    """The details page's CSV: one row per (kernel, metric); prints METRICS per kernel."""
    with _open_text(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"gemm_ncu.py: {path} holds no rows", file=sys.stderr)
        return 1
    kernels: dict = {}
    for r in rows:
        key = (r.get("ID"), r.get("Kernel Name", "")[:60])
        if r.get("Metric Name") in METRICS:
            kernels.setdefault(key, {})[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}"
    for (kid, name), vals in kernels.items():
        print(f"== kernel {kid}: {name}")
        for k in METRICS:
            if k in vals:
                print(f"   {k:26s} {vals[k]}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="GATE_UP,DOWN")
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--summary", default=None, help="print the figures of an ncu details CSV")
    p.add_argument("--raw", default=None, help="with --summary: ncu's raw-page CSV as well")
    a = p.parse_args(argv)
    if a.summary:
        rc = summary(a.summary)
        if a.raw:
            raw_summary(a.raw)
        return rc
    profile([o.strip() for o in a.ops.split(",") if o.strip()], a.m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
