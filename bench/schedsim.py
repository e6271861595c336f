"""A CPU model of the megakernel's schedule: how long a step's plan takes on N SMs, given how long
each instruction runs. For screening plan changes (tiles, split factors, queue order) before they
cost GPU time; a model, not a measurement: check its rank order against journaled runs first
(`--validate`).

The model: tickets are claimed in queue order, each by the SM whose controller can claim first.
An SM holds at most NISLOTS claimed and unfinished instructions and runs them one after another;
with claim after loads (the megakernel's M classes above 64 tokens) it claims its next ticket only
once the instruction before it has issued its loads, modelled as `load_frac` of its run. An
instruction runs from max(its SM's previous end, its waits met) for its opcode's duration;
its signal adds its count to its counter at its end. Waits only name counters of earlier
tickets (the planner's queue order guarantees it), so one pass in ticket order computes every
time.

Durations: per opcode, the mean run of a journaled `launch/bench.py --journal` run (its JSON's
points[i].results.megakernel.journal.ops[op]: own_mean_us where the journal has it, since
session 16: counted from the later of ready and the end of the instruction before it on its SM;
before that mean_us, ready -> signalled, which counts the overlap with the instruction before),
or given.

How far to trust it (session 16, each run simulated with its own journal's durations and its
tree's tiles and defaults; journal span = the measured step with the journal on, ms):

| run | B | journal | simulated |
|---|---:|---:|---:|
| tiles256_none (gu_m128, the tile then) | 256 | 19.93 | 20.01 |
| tiles256_gu (gu_m128n64, now the default) | 256 | 18.58 | 18.64 |
| tiles256_od (O_PROJ / DOWN on m128n128) | 256 | 20.35 | 20.20 |
| tiles256_both | 256 | 19.25 | 18.93 |
| planab_od2 (O_PROJ / DOWN split, folded) | 256 | 23.54 | 22.44 |
| pair_off / pair_on (session 15) | 256 | 21.69 / 19.78 | 21.60 / 19.95 |
| pair_off / pair_on (session 15) | 1024 | 64.87 / 59.95 | 70.75 / 63.96 |
| l2skip_base (slot-free claim) | 1 / 64 | 8.67 / 10.17 | 12.42 / 15.30 |
| planab_base (session 17, interleave) | 256 / 1024 | 18.49 / 56.44 | 18.19 / 54.59 |
| planab_opm (session 17, op_major) | 256 / 1024 | 18.06 / 50.53 | 17.16 / 48.91 |

Session 48 (shares_3474b9c_2026-12-05_s48_h100.json, H100): journal / simulated B=1024 45.39 /
46.03, B=4096 133.23 / 132.88, and the mixed step (256 decodes + a 1024-token prompt, modelled
since session 48) 47.92 / 47.10. Since session 49 a GEMM tile's duration follows its K slice
(GEMM_FIXED_US, base_k): B=1024, whose QKV_ROPE splits unevenly (86 + 42 K steps), 44.67; the
others unchanged. Session 58 (planab_{base,cs}_{p4096,m2048}_e582f5e_*_s58_h100.json, H100):
journal / simulated, a 4096-token prompt step 142.03 / 142.23, with attn_chunk_splits 131.53 /
130.18; 256 decodes + a 2048-token prompt 91.39 / 93.39 and 74.96 / 76.98; predicted from the
journals without it (--predict --plans attn_chunk_splits=1) -10.1% and -21.2% against the
journals' -7.4% and -18.0% (before ATTENTION / ATTN_REDUCE durations were scaled by the
journaled stream's mean work, OP_WORK: +27%). The timed steps ran 4-8% over the journal spans. Until session 48 the model
planned with PlanConfig's own norm_fold=0, not the backend's default plan (norm_fold=2 since
session 41): the row-scale norms then stood before their GEMMs instead of beside them.

The defaults changed during session 17 (op_major, raster_blocks 8, split_fill_max_tokens 64,
GATE_UP@1024 gu_m128; the two rows above were simulated with their runs' own, as below): an
older JSON needs its tree's defaults after its path, e.g.
`tiles256_gu_2026-11-30_s16.json:GATE_UP@1024=gu_m128n64:policy=interleave,raster_blocks=1,
split_fill_max_tokens=0`. The model has no L2 or HBM: it cannot rank raster_blocks or tile
shapes by their memory traffic.

At B=256 within 5% and in the measured order but for od / none (0.4 ms apart both ways); at
B=1024 7-9% long, in order. At B <= 64 it is 40-50% long: there consecutive instructions of an
SM overlap (the next one's weights load while the current one computes, and its `ready` comes
before the previous end), and the journal's mean runs count that overlap; own_mean_us
(journals of session 16's later commits on) does not, and should bring the small batches closer:
not yet validated. It knows nothing of contention: an opcode runs as long as it did
in the journaled order, whatever runs beside it.

    python bench/schedsim.py --validate \\
        bench/results/planab_opm_2026-11-30_s17.json:GATE_UP@1024=gu_m128n64:raster_blocks=1 \\
        bench/results/planab_base_2026-11-30_s17.json:GATE_UP@1024=gu_m128n64:policy=interleave
      each JSON's own plan simulated with its own journal's durations: simulated vs measured
    python bench/schedsim.py --predict bench/results/planab_opm_2026-11-30_s17.json \\
        --plans policy=interleave split_fill_max_tokens=256
      its points under other plans, with its durations
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mk.instructions import attention as at_words  # noqa: E402
from mk.instructions import matmul as mm_words  # noqa: E402
from mk.instructions import qkv as qkv_words  # noqa: E402
from mk.instructions._common import epilogue_wait_words  # noqa: E402
from mk.ir import (MAX_WAITS, NO_COUNTER, W_OPCODE, W_ROWS, W_SIGNAL, W_SIGNAL_COUNT,  # noqa: E402
                   W_WAIT0, Op)
from mk.plan import TILE_FIELDS  # noqa: E402
# the part of a GEMM tile's run after its epilogue wait (its epilogue; bench/E2E_NOTES.md's
# journals: cons_epi 2-6 us of 50-110 us tiles)
EPI_FRAC = 0.05

# a GEMM tile's duration follows its K slice (the K word: a split tile's slice width) beyond
# a fixed part (its epilogue, its first stage's wait, its once-per-tile code): session 46's
# journal (bench/GEMM_NOTES.md) has O_PROJ 14.8 us a tile for 16 K steps of ~0.57 us, GATE_UP
# 89.4 for 128. A plan that splits an opcode its journal ran whole (or the other way round) is
# timed from that opcode's mean K in the journaled plan (simulate's base_k)
GEMM_FIXED_US = 5.0
K_WORD = {Op.QKV_ROPE: qkv_words.A_K, Op.O_PROJ: mm_words.A_K, Op.GATE_UP: mm_words.A_K,
          Op.DOWN: mm_words.A_K, Op.LM_HEAD: mm_words.A_K}

NISLOTS = 4
# fraction of a run after which an instruction's loader has issued its last load: GEMM tiles and
# attention stream operands until near their end (a ring of a few stages), the rows instructions
# load at once
LOAD_FRAC = {Op.QKV_ROPE: 0.85, Op.O_PROJ: 0.85, Op.GATE_UP: 0.9, Op.DOWN: 0.9,
             Op.LM_HEAD: 0.9, Op.ATTENTION: 0.8}
DEFAULT_LOAD_FRAC = 0.1


def mean_k(words: np.ndarray) -> dict:
    """{Op: mean K word of its tiles} of the GEMM opcodes in a stream."""
    ops = words[:, W_OPCODE]
    return {op: float(words[ops == int(op), kw].mean())
            for op, kw in K_WORD.items() if (ops == int(op)).any()}


def attn_costs(words: np.ndarray) -> np.ndarray:
    """attention.est_cost_ns of ATTENTION instruction words."""
    a = words.astype(np.int64)
    return at_words.est_cost_ns(a[:, at_words.A_MODE], a[:, W_ROWS], a[:, at_words.A_QPK],
                                a[:, at_words.A_POS0], a[:, at_words.A_KV0],
                                a[:, at_words.A_KV1], a[:, at_words.A_POS0_B])


def reduce_work(words: np.ndarray) -> np.ndarray:
    """The partial rows ATTN_REDUCE instruction words read: rows x splits (session 58's
    journals: ~0.24 us per row and split, 128-row reduces of 2 and of ~3 splits alike)."""
    return words[:, W_ROWS].astype(np.int64) * words[:, at_words.A_NSPLIT]


# opcodes whose instructions differ in size within a stream: a duration per unit of this work
OP_WORK = {Op.ATTENTION: attn_costs, Op.ATTN_REDUCE: reduce_work}


def mean_work(words: np.ndarray) -> dict:
    """{Op: mean OP_WORK of its instructions} of a stream (ops it has, with work)."""
    ops = words[:, W_OPCODE]
    out = {}
    for op, work in OP_WORK.items():
        sel = ops == int(op)
        if sel.any() and work(words[sel]).mean() > 0:
            out[op] = float(work(words[sel]).mean())
    return out


def tile_durations(words: np.ndarray, durations: dict, base_k: dict | None = None,
                   base_work: dict | None = None) -> np.ndarray:
    """Each ticket's duration (us): its opcode's (1 us if missing); with base_k ({Op: mean K
    of the tiles the durations were measured on}) a GEMM tile's beyond GEMM_FIXED_US scaled
    by its own K word over that mean. An ATTENTION / ATTN_REDUCE instruction's follows its
    OP_WORK: the opcode's duration times its work over base_work's (mean_work of the journaled
    stream), or without it over this stream's own mean (a stream of the journaled one's
    instructions, reordered)."""
    ops = words[:, W_OPCODE].astype(np.int64)
    dur = np.array([durations.get(Op(int(o)), 1.0) for o in ops])
    for op, work in OP_WORK.items():
        sel = ops == int(op)
        if not sel.any() or op not in durations:
            continue
        # Over the journaled stream's mean, not this one's: a plan that cuts the attention into
        # more, shorter instructions (attn_chunk_splits) kept the journaled mean per instruction
        # before session 58 and was predicted +27% where its journal showed -7% (own time per
        # 128-row x 64-key block ~2.6 us in both plans' journals: no per-instruction fixed part
        # to model)
        w = work(words[sel])
        norm = (base_work or {}).get(op) or (w.mean() if w.mean() > 0 else None)
        if norm:
            dur[sel] = durations[op] * w / norm
    for op, k0 in (base_k or {}).items():
        sel = ops == int(op)
        if not sel.any() or op not in durations:
            continue
        d = durations[op]
        fixed = min(GEMM_FIXED_US, d)
        dur[sel] = fixed + (d - fixed) * words[sel, K_WORD[op]] / k0
    return dur


def simulate(words: np.ndarray, durations: dict, num_sms: int = 132, nislots: int = NISLOTS,
             claim_after_loads: bool = True, claim_us: float = 0.5,
             base_k: dict | None = None, detail: bool = False,
             base_work: dict | None = None) -> dict:
    """Span (us) of a stream of instruction words [n, INSTR_WORDS] and the per-opcode busy time.
    durations: {Op: us}; an opcode missing from it runs 1 us; base_k, base_work: see
    tile_durations. A claim takes claim_us (the controller's atomic and word fetch) before the
    instruction can start or the SM claim again; SMs that can claim at the same time take
    tickets in SM order. detail: also each ticket's start, end and SM (arrays)."""
    n = len(words)
    ops = words[:, W_OPCODE].astype(np.int64)
    waits = words[:, W_WAIT0:W_WAIT0 + 2 * MAX_WAITS].astype(np.int64)
    # an unsplit folded GEMM tile's epilogue wait (PlanConfig.norm_fold=2): it runs from its
    # other waits, and ends no earlier than EPI_FRAC of its run after that wait is met
    epi = [epilogue_wait_words(words[t]) for t in range(n)]
    sig = words[:, W_SIGNAL].astype(np.int64)
    cnt = np.maximum(words[:, W_SIGNAL_COUNT].astype(np.int64), 1)
    dur = tile_durations(words, durations, base_k, base_work)
    load_frac = np.array([LOAD_FRAC.get(Op(int(o)), DEFAULT_LOAD_FRAC) for o in ops])
    # per counter: the (end time, count) of its signals so far, in ticket order
    signals: dict[int, list] = {}
    end = np.zeros(n)
    start = np.zeros(n)
    on_sm = np.zeros(n, np.int64)
    # per SM: the end times of its unfinished instructions (the ring), its last instruction's end
    # and its loads-issued time; a heap of (time the SM's controller can claim, sm)
    ring = [[] for _ in range(num_sms)]
    sm_free = np.zeros(num_sms)
    loads_done = np.zeros(num_sms)
    claim_heap = [(0.0, s) for s in range(num_sms)]
    busy: dict[str, float] = {}
    def met_at(t, c, target):
        total, when = 0, None
        for e, k in sorted(signals.get(int(c), [])):
            total += k
            if total >= target:
                when = e
                break
        if when is None:
            raise ValueError(f"ticket {t} waits on counter {c} for {target}, which earlier "
                             f"tickets never reach")
        return when

    for t in range(n):
        claim_t, sm = heapq.heappop(claim_heap)
        met = 0.0
        for i in range(MAX_WAITS):
            c, target = waits[t, 2 * i], waits[t, 2 * i + 1]
            if c == NO_COUNTER or target <= 0:
                continue
            met = max(met, met_at(t, c, target))
        start[t] = max(claim_t + claim_us, met, sm_free[sm])
        on_sm[t] = sm
        end[t] = start[t] + dur[t]
        if epi[t] is not None:
            end[t] = max(end[t], met_at(t, *epi[t]) + EPI_FRAC * dur[t])
        sm_free[sm] = end[t]
        loads_done[sm] = start[t] + load_frac[t] * dur[t]
        if sig[t] != NO_COUNTER:
            signals.setdefault(int(sig[t]), []).append((end[t], int(cnt[t])))
        name = Op(int(ops[t])).name
        busy[name] = busy.get(name, 0.0) + dur[t]
        r = ring[sm]
        r.append(end[t])
        if len(r) > nislots:
            r.pop(0)
        # the next claim: a free ring slot (the oldest of nislots unfinished ends), and with
        # claim after loads this instruction's loads issued
        nxt = claim_t + claim_us
        if len(r) == nislots:
            nxt = max(nxt, r[0])
        if claim_after_loads:
            nxt = max(nxt, loads_done[sm])
        heapq.heappush(claim_heap, (nxt, sm))
    span = float(end.max()) if n else 0.0
    out = dict(span_us=span, busy_us=busy,
               utilisation=sum(busy.values()) / (num_sms * span) if span else 0.0)
    if detail:
        out.update(start=start, end=end, sm=on_sm)
    return out


def launch_bench():
    """launch/bench.py as a module of its own name (`import bench` may find this directory's
    package first, in a process that imported a bench.* module: the test suite)."""
    import importlib.util
    name = "mk_launch_bench"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "launch",
                                                                          "bench.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod            # dataclasses look their module up there
        spec.loader.exec_module(mod)
    return sys.modules[name]


def plan_words(batch: int, context: int, plan_text: str = "", shape: str = "70b-tp8",
               prefill: int = 0) -> np.ndarray:
    """The plan words of launch/bench.py's decode point (one rank's shard as a TP-1 model, the
    megakernel's KernelConfig there) under the backend's default plan (mk.megakernel_step's,
    norm_fold=4 since session 50; bench.py's) with plan_text over it (PlanConfig fields, as
    --plan takes them); prefill > 0: its mixed point (batch decodes + one prompt of prefill
    tokens)."""
    lb = launch_bench()
    from mk.config import ParallelConfig
    from mk.peers import shard_config
    from mk.megakernel_step import default_plan_config
    from mk.plan import parse_plan_overrides, plan_step
    cfg, tp = lb.SHAPES[shape]
    point = lb.Point("mixed" if prefill else "decode", batch, context, prefill)
    kernel = lb.megakernel_kernel_config(point)
    plan = plan_step(lb.megakernel_batch(point, kernel, [1] * point.tokens),
                     shard_config(cfg, ParallelConfig(tp_size=tp)), ParallelConfig(), kernel,
                     default_plan_config(split_k=0, **parse_plan_overrides(plan_text)))
    return plan.instrs.numpy()


SIM_IN_SUBPROCESS = r"""
import json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {root!r} + "/bench")
import schedsim as S
from mk.ir import Op
point = json.loads({point!r})
words = S.plan_words(point["batch"], point["context"], {plan!r}, prefill=point["prefill"])
base = words if {plan!r} == {base_plan!r} else S.plan_words(
    point["batch"], point["context"], {base_plan!r}, prefill=point["prefill"])
dur = {{Op[k]: v for k, v in json.loads({dur!r}).items()}}
# claim after loads above 64 tokens: mk.megakernel.CLAIM_AFTER_LOADS_MIN_M (that module needs cutlass)
print(json.dumps(S.simulate(words, dur,
                            claim_after_loads=point["batch"] + point["prefill"] > 64,
                            base_k=S.mean_k(base), base_work=S.mean_work(base))))
"""


# the backend's default plan of the runs before session 50 (JSONs without "default_plan")
PRE_S50_DEFAULT_PLAN = {"split_k": 0, "norm_fold": 2}


def _journaled_points(arg: str):
    """PATH[:MK_TILES[:PLAN]] -> (its JSON's --plan joined with PLAN, MK_TILES, and per
    journaled point (point, megakernel result, durations by opcode name))."""
    path, _, rest = arg.partition(":")
    tiles, _, extra = rest.partition(":")
    d = json.load(open(path))
    m = re.search(r"--plan (\S+)", d.get("command", ""))
    # the run's default plan (bench.py records it since session 50; before, norm_fold=2)
    ran = d.get("default_plan") or PRE_S50_DEFAULT_PLAN
    # a field today's default sets that the run's did not ran at PlanConfig's own default
    from mk.megakernel_step import DEFAULT_PLAN
    from mk.plan import PlanConfig
    ran = {**{k: getattr(PlanConfig(), k) for k in DEFAULT_PLAN if k not in ran}, **ran}
    default = ",".join(f"{k}={v}" for k, v in ran.items() if k != "split_k")
    plan_text = ",".join(filter(None, (default, m.group(1) if m else "", extra)))
    points = []
    for p in d["points"]:
        mk = p["results"].get("megakernel", {})
        if mk.get("journal"):
            points.append((p, mk, {k: v.get("own_mean_us", v["mean_us"])
                                   for k, v in mk["journal"]["ops"].items()}))
    # an opcode a point did not run (the mixed step's SPLITK_REDUCE, a plan that splits there)
    # takes the first other point's duration
    for _, _, dur in points:
        for _, _, other in points:
            for k, v in other.items():
                dur.setdefault(k, v)
    return plan_text, tiles, points


def _simulate_in(tiles: str, point: dict, plan_text: str, dur: dict,
                 base_plan: str | None = None) -> dict:
    """simulate() of a point's plan under MK_TILES=tiles (read at import: a subprocess), its
    GEMM tiles timed from the K of base_plan's (the journaled plan; default plan_text)."""
    code = SIM_IN_SUBPROCESS.format(root=ROOT, point=json.dumps(
        dict(batch=point["batch"], context=point["context"], prefill=point.get("prefill", 0))),
        plan=plan_text, base_plan=plan_text if base_plan is None else base_plan,
        dur=json.dumps(dur))
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, MK_TILES=tiles),
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def point_label(point: dict) -> str:
    """A bench point's batch as the tables print it: decodes, + the prompt's tokens of a mixed
    point."""
    return f"{point['batch']}+{point['prefill']}" if point.get("prefill") else str(point["batch"])


def validate(args: list[str]) -> list[dict]:
    """Each journaled bench JSON's points simulated with their own durations and plan: the
    command's --plan, and what the JSON does not record given after the path as
    PATH:MK_TILES:PLAN (the tile table of its tree, the defaults of its tree that differ from
    this one's)."""
    rows = []
    for arg in args:
        plan_text, tiles, points = _journaled_points(arg)
        for p, mk, dur in points:
            sim = _simulate_in(tiles, p, plan_text, dur)
            rows.append(dict(file=os.path.basename(arg.partition(":")[0]), batch=point_label(p),
                             measured_ms=mk["ms"], journal_span_ms=mk["journal"]["span_us"] / 1e3,
                             sim_ms=sim["span_us"] / 1e3, sim_util=round(sim["utilisation"], 3)))
    return rows


# PlanConfig fields whose effect goes mostly through L2 / HBM traffic, which the model does not
# have: it sees only their dependency side. Session 57 (H100, bench/results/planab_*_s57_h100_b):
# raster_blocks 4 / 2, predicted -2.2% / -3.1% at B=1024 and -1.6% / -1.8% on the mixed step,
# measured -0.5% / +3.3% and +1.6% / +6.2% (the journals: fewer idle SMs, as predicted, but
# GATE_UP tiles 93.1 -> 94.8 / 100.4 us and O_PROJ 15.4 -> 16.8 / 18.9 from the weights' lost L2
# reuse). predict() flags a variant that sets one of them
MEMORY_BLIND_FIELDS = ("raster_blocks",) + TILE_FIELDS


def memory_blind(variant: str) -> list[str]:
    """The fields of a --plans variant (FIELD=VALUE,...) the model cannot rank (no L2)."""
    names = [part.partition("=")[0].strip() for part in variant.split(",") if part.strip()]
    return [n for n in names if n in MEMORY_BLIND_FIELDS]


def predict(arg: str, plans: list[str]) -> list[dict]:
    """A journaled run's points simulated with its durations under its own plan and each of
    `plans` (PlanConfig fields as --plan takes them, added to its own): the spans, and each
    variant's change against its own plan's simulated span; `blind`: the variant's fields
    whose memory traffic the model does not see (MEMORY_BLIND_FIELDS)."""
    plan_text, tiles, points = _journaled_points(arg)
    rows = []
    for p, mk, dur in points:
        base = _simulate_in(tiles, p, plan_text, dur)["span_us"]
        for variant in plans:
            sim = _simulate_in(tiles, p, ",".join(filter(None, (plan_text, variant))), dur,
                               plan_text)
            rows.append(dict(batch=point_label(p), plan=variant or "(its own)",
                             sim_ms=sim["span_us"] / 1e3,
                             change_pct=round(100 * (sim["span_us"] / base - 1), 1),
                             blind=memory_blind(variant)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--validate", nargs="+", metavar="JSON[:MK_TILES[:PLAN]]",
                      help="journaled launch/bench.py JSONs (with the MK_TILES they ran under and "
                           "plan fields whose defaults have changed since): simulate each point "
                           "with its own durations and plan, print simulated vs measured")
    mode.add_argument("--predict", metavar="JSON[:MK_TILES[:PLAN]]",
                      help="one journaled JSON: simulate its points under --plans with its "
                           "durations (an opcode's duration does not follow its tiles: change "
                           "plans that keep them, e.g. the queue policy)")
    ap.add_argument("--plans", nargs="+", default=["policy=op_major", "policy=block_major"],
                    metavar="PLAN", help="--predict's plan variants (FIELD=VALUE,...)")
    a = ap.parse_args(argv)
    if a.validate:
        rows = validate(a.validate)
        print(f"{'file':<40}{'batch':>10}{'measured ms':>13}{'journal ms':>12}{'sim ms':>9}"
              f"{'sim util':>10}")
        for r in rows:
            print(f"{r['file']:<40}{r['batch']:>10}{r['measured_ms']:>13.3f}"
                  f"{r['journal_span_ms']:>12.3f}{r['sim_ms']:>9.3f}{r['sim_util']:>10.3f}")
    else:
        print(f"{'batch':>10}  {'plan':<40}{'sim ms':>9}{'change':>9}")
        rows = predict(a.predict, [""] + a.plans)
        for r in rows:
            print(f"{r['batch']:>10}  {r['plan']:<40}{r['sim_ms']:>9.3f}{r['change_pct']:>+8.1f}%"
                  f"{'  *' if r['blind'] else ''}")
        blind = sorted({f for r in rows for f in r["blind"]})
        if blind:
            print(f"* {', '.join(blind)}: the model has no L2 / HBM, so it sees only the "
                  "dependency side of these (raster_blocks 4 / 2: predicted -1.6 .. -3.1%, "
                  "measured -0.5 .. +6.2%, session 57): rank them on the GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
