"""Megakernel journal -> Chrome/Perfetto trace JSON and a PNG timeline.

The journal (mk.megakernel, compiled with journal=True) holds per instruction ticket:
    sm, cta, opcode, t_fetch (ticket taken), t_ready (waits satisfied), t_end (signalled), ticket
in globaltimer nanoseconds, and per CTA: t_entry, t_exit, sm.

    python -m mk.trace journal.pt out.json out.png

CPU-only (no cutlass import). The PNG is drawn with matplotlib when it is installed, else with a
tiny built-in rasteriser (zlib + struct), so the timeline exists everywhere.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib

OP_NAMES = {0: "NOOP", 1: "COPY", 2: "RMSNORM", 3: "RESIDUAL_ADD"}
OP_COLORS = {0: (160, 160, 160), 1: (66, 133, 244), 2: (219, 68, 55), 3: (15, 157, 88)}
WAIT_COLOR = (251, 188, 5)


def _op_name(op: int) -> str:
    try:
        from mk.ir import Op
        return Op(op).name
    except Exception:  # noqa: BLE001
        return OP_NAMES.get(op, f"op{op}")


# journal words of the roles' times (mk.megakernel.J_LOAD0 .. J_STORE0; kept here so that this
# module never imports cutlass)
ROLE_WORDS = {"load0": 8, "load1": 9, "cons0": 10, "cons1": 11, "store0": 12, "cons1_wg1": 13,
              "store1": 14, "store_kv": 15, "store_epi": 7, "store_p0": 16, "free_p0": 17,
              "epi1": 18, "cons_epi0": 19, "epi_ready": 25}
# journal words that hold durations (ns summed by the instruction's roles, not times):
# mk.megakernel.J_LOAD_WAIT .. (ATTENTION's page and wgmma waits, a GEMM's operand and wgmma
# waits); by_opcode reports their medians
WAIT_WORDS = {"ld_wait": 20, "cons_wait": 21, "st_wait": 22, "mma_wait": 23, "softmax": 24}
# per-instruction intervals by_opcode reports (median over the opcode's instructions), each from
# the first event to the second: when it ran behind earlier work of its SM, when each role ran
ROLE_SPANS = {
    "load_late": ("ready", "load0"),     # waits met -> its loader starts (loader still busy)
    "load": ("load0", "load1"),          # the loader issuing its TMA (incl. waits for free pages)
    "cons_late": ("ready", "cons0"),     # waits met -> consumers start (previous instruction)
    "cons": ("cons0", "cons1"),          # the consumers' body
    "store_tail": ("cons1", "end"),      # consumers done -> stored and signalled
    "wg1_lag": ("cons1", "cons1_wg1"),   # warpgroup 1's end after warpgroup 0's (cons1)
    "store_body": ("cons1", "store1"),   # consumers done -> the storer's body done
    "signal": ("store1", "end"),         # the storer's barrier + fence + release of the signal
    # ATTENTION only (its storer's own stamps): the K/V pages all freed, the epilogue page done
    "kv_freed": ("cons1", "store_kv"),
    "epi_done": ("cons1", "store_epi"),
    "p0_store": ("store_epi", "store_p0"),
    "p0_free": ("store_p0", "free_p0"),
    "p1_wait": ("free_p0", "epi1"),
    "p1_rest": ("epi1", "store1"),
    # GEMM opcodes only: the consumers' epilogue (or partial stores) after the last wgmma
    "cons_epi": ("cons_epi0", "cons1"),
    # ... of which the wait for the epilogue pages (a RESIDUAL tile's residual loads)
    "epi_wait": ("cons_epi0", "epi_ready"),
}


# The GEMM K-step trace (mk.instructions._gemm_kernel: MK_GEMM_KTRACE, KT_BASE, KT_* words; the
# journal variant only): per K step of a tile, SM-clock cycles (clock64) of consumer thread 0
# before / after its operand wait and after the previous stage's wgmmas retired, of consumer
# thread 128 after its wait, and of the loader before the stage's first free-page wait / after its
# last TMA issue. Kept here so that this module never imports cutlass (tests check they agree).
KT_BASE = 32
KT_WORDS = 6
KT_C_WAIT, KT_C_FULL, KT_C_RET, KT_C1_FULL, KT_L_START, KT_L_ISSUE = range(6)
GEMM_OP_IDS = None      # resolved lazily from mk.ir (QKV_ROPE .. LM_HEAD)


def events(journal, jcta, n: int):
    """Normalised rows: dicts with sm, cta, op, ticket, fetch/ready/end in ns from the first entry."""
    # the journal's own words only: a K-step trace's (MK_GEMM_KTRACE, hundreds a row) are read by
    # gemm_ktrace, and as Python ints they would take gigabytes at B=1024
    rows = journal[:n]
    if hasattr(rows, "tolist"):
        rows = (rows[:, :KT_BASE] if getattr(rows, "ndim", 1) == 2 else rows).tolist()
    j = [list(map(int, r[:KT_BASE])) for r in rows]
    c = [list(map(int, r)) for r in (jcta.tolist() if hasattr(jcta, "tolist") else jcta)]
    starts = [r[0] for r in c if r[0] > 0]
    t0 = min(starts) if starts else min(r[3] for r in j if r[3] > 0)
    ev = []
    for r in j:
        sm, cta, op, tf, tr, te, tk = r[:7]
        if tf == 0:
            continue
        e = dict(sm=sm, cta=cta, op=op, ticket=tk, fetch=tf - t0, ready=tr - t0,
                 end=(te - t0) if te else tr - t0)
        # the roles' own times (journal rows of mk.megakernel.JOURNAL_WORDS words: J_LOAD0 ..)
        for name, word in ROLE_WORDS.items():
            if len(r) > word and r[word]:
                e[name] = r[word] - t0
        for name, word in WAIT_WORDS.items():
            if len(r) > word and r[word]:
                e[name] = r[word]
        ev.append(e)
    ctas = [dict(cta=i, sm=r[2], entry=r[0] - t0, exit=r[1] - t0) for i, r in enumerate(c) if r[0] > 0]
    return ev, ctas


def chrome_trace(journal, jcta, n: int) -> dict:
    """Chrome trace: one track per SM; 'wait' slices (ticket -> waits met) and instruction slices
    (waits met -> signalled), plus each CTA's life."""
    ev, ctas = events(journal, jcta, n)
    out = []
    for e in ev:
        if e["ready"] > e["fetch"]:
            out.append(dict(name="wait", cat="wait", ph="X", pid=0, tid=e["sm"], ts=e["fetch"] / 1e3,
                            dur=(e["ready"] - e["fetch"]) / 1e3, args=dict(ticket=e["ticket"])))
        out.append(dict(name=_op_name(e["op"]), cat="instr", ph="X", pid=0, tid=e["sm"],
                        ts=e["ready"] / 1e3, dur=max(e["end"] - e["ready"], 1) / 1e3,
                        args=dict(ticket=e["ticket"], cta=e["cta"])))
    for c in ctas:
        out.append(dict(name=f"CTA {c['cta']}", cat="cta", ph="X", pid=1, tid=c["sm"],
                        ts=c["entry"] / 1e3, dur=max(c["exit"] - c["entry"], 1) / 1e3))
    meta = [dict(name="process_name", ph="M", pid=0, args=dict(name="instructions by SM")),
            dict(name="process_name", ph="M", pid=1, args=dict(name="CTA lifetimes by SM"))]
    return {"traceEvents": meta + out, "displayTimeUnit": "ns"}


def write_chrome_trace(path: str, journal, jcta, n: int) -> dict:
    tr = chrome_trace(journal, jcta, n)
    with open(path, "w") as f:
        json.dump(tr, f)
    return tr


def summary(journal, jcta, n: int) -> dict:
    """Figures read off the journal: launch-to-first-instruction, busy/wait fractions, hops."""
    ev, ctas = events(journal, jcta, n)
    if not ev:
        return {}
    first_ready = min(e["ready"] for e in ev)
    first_fetch = min(e["fetch"] for e in ev)
    span = max(e["end"] for e in ev) - min(c["entry"] for c in ctas) if ctas else 0
    busy = sum(e["end"] - e["ready"] for e in ev)
    wait = sum(e["ready"] - e["fetch"] for e in ev)
    by_ticket = sorted(ev, key=lambda e: e["ticket"])
    cross = sum(1 for a, b in zip(by_ticket, by_ticket[1:]) if a["sm"] != b["sm"])
    return dict(instructions=len(ev), ctas=len(ctas),
                first_cta_entry_to_first_fetch_ns=first_fetch,
                first_cta_entry_to_first_ready_ns=first_ready,
                last_cta_entry_ns=max(c["entry"] for c in ctas) if ctas else None,
                span_ns=span, busy_ns=busy, wait_ns=wait,
                consecutive_tickets_on_different_sm=cross / max(len(by_ticket) - 1, 1),
                sms_used=len({e["sm"] for e in ev}))


def by_opcode(journal, jcta, n: int, layer_of=None, name_of=None) -> dict:
    """Where a step's time goes, per opcode: instructions, busy time (ready -> signalled, summed
    over SMs, and its mean / max per instruction), wait time (ticket -> dependencies met), and the
    opcode's phase time: per layer, the span from its first instruction ready to its last one
    signalled, summed over layers (layer_of[ticket] -> layer; without it the whole step is one
    phase). Phases of different opcodes overlap where the dependency graph lets them, so the
    phase times add up to more than the step; the busy share says where the SMs spent it.
    own_mean_us: the mean run counted from the later of ready and the end of the instruction
    before it on its CTA (an instruction whose waits were met while its CTA still ran the one
    before, e.g. during early weight loads, is busy from ready but has the SM only from then):
    what an SM spends on it alone (bench/schedsim.py's durations).
    name_of[ticket]: the row's name instead of the opcode's (variant_names: one row per kind of
    an opcode's instructions)."""
    ev, ctas = events(journal, jcta, n)
    if not ev:
        return {}
    own, prev_end = {}, {}
    for e in sorted(ev, key=lambda e: (e["fetch"], e["ticket"])):
        start = max(e["ready"], prev_end.get(e["cta"], e["ready"]))
        own[e["ticket"]] = max(e["end"] - start, 0)
        prev_end[e["cta"]] = max(prev_end.get(e["cta"], e["end"]), e["end"])
    span = max(e["end"] for e in ev) - min(c["entry"] for c in ctas) if ctas else 0
    ops: dict[str, dict] = {}
    phases: dict[tuple[str, int], list[int]] = {}
    spans: dict[str, dict[str, list[int]]] = {}
    for e in ev:
        name = name_of[e["ticket"]] if name_of is not None else _op_name(e["op"])
        for role, (a, b) in ROLE_SPANS.items():
            if a in e and b in e:
                spans.setdefault(name, {}).setdefault(role, []).append(e[b] - e[a])
        for role in WAIT_WORDS:
            if role in e:
                spans.setdefault(name, {}).setdefault(role, []).append(e[role])
        d = ops.setdefault(name, dict(count=0, busy=0, wait=0, max=0, own=0))
        dur = e["end"] - e["ready"]
        d["count"] += 1
        d["busy"] += dur
        d["own"] += own[e["ticket"]]
        d["wait"] += e["ready"] - e["fetch"]
        d["max"] = max(d["max"], dur)
        layer = int(layer_of[e["ticket"]]) if layer_of is not None else 0
        ph = phases.setdefault((name, layer), [e["ready"], e["end"]])
        ph[0], ph[1] = min(ph[0], e["ready"]), max(ph[1], e["end"])
    total_busy = sum(d["busy"] for d in ops.values()) or 1
    out = {}
    for name, d in sorted(ops.items(), key=lambda kv: -kv[1]["busy"]):
        phase = sum(b - a for (nm, _), (a, b) in phases.items() if nm == name)
        out[name] = dict(count=d["count"], busy_us=round(d["busy"] / 1e3, 1),
                         busy_share=round(d["busy"] / total_busy, 3),
                         mean_us=round(d["busy"] / d["count"] / 1e3, 2),
                         own_mean_us=round(d["own"] / d["count"] / 1e3, 2),
                         max_us=round(d["max"] / 1e3, 2), wait_us=round(d["wait"] / 1e3, 1),
                         phase_us=round(phase / 1e3, 1))
        for role, v in spans.get(name, {}).items():
            out[name][role + "_us"] = round(sorted(v)[len(v) // 2] / 1e3, 2)
    return dict(span_us=round(span / 1e3, 1), sms=len({e["sm"] for e in ev}), ops=out)


# the opcodes whose W_ROW0 / W_ROWS are the step's token rows (LM_HEAD's are sequences)
TOKEN_ROW_OPS = ("QKV_ROPE", "O_PROJ", "GATE_UP", "DOWN", "ATTENTION")


def variant_names(instrs, prompt_rows=None) -> list:
    """Per ticket of a plan's instruction words (instrs [n, INSTR_WORDS]): its opcode's name, told
    apart where one opcode's instructions do different work, for by_opcode(name_of=...): a
    QKV_ROPE tile's section (QKV_ROPE.q / .k / .v), an ATTENTION's mode (ATTENTION.direct /
    .partial / .pair) and, when prompt_rows is given (prompt_rows[t]: token row t is a prompt
    token, not a decode one) and the step has both kinds, whether a token-row instruction's rows
    are /decode, /prompt or /both. Session 55: QKV_ROPE's epilogue ran 7.9 us a tile in the mixed
    step against 2.7 at B=4096, which the opcode's medians alone cannot place."""
    from mk.instructions import attention as at
    from mk.instructions import qkv as qk
    from mk.ir import W_OPCODE, W_ROW0, W_ROWS
    words = instrs.tolist() if hasattr(instrs, "tolist") else [list(w) for w in instrs]
    kinds = None
    if prompt_rows is not None:
        flags = [bool(f) for f in prompt_rows]
        if any(flags) and not all(flags):
            kinds = [0]             # prefix counts: prompt tokens among rows [0, t)
            for f in flags:
                kinds.append(kinds[-1] + f)
    sections = {qk.SEC_Q: "q", qk.SEC_K: "k", qk.SEC_V: "v"}
    modes = {at.MODE_DIRECT: "direct", at.MODE_PARTIAL: "partial", at.MODE_PAIR: "pair"}
    names = []
    for w in words:
        name = _op_name(w[W_OPCODE])
        if name == "QKV_ROPE":
            name += "." + sections.get(w[qk.A_SECTION], str(w[qk.A_SECTION]))
        elif name == "ATTENTION":
            name += "." + modes.get(w[at.A_MODE], str(w[at.A_MODE]))
        if kinds is not None and name.split(".")[0] in TOKEN_ROW_OPS and w[W_ROWS] > 0:
            lo = min(max(w[W_ROW0], 0), len(kinds) - 1)
            hi = min(lo + w[W_ROWS], len(kinds) - 1)
            prompt = kinds[hi] - kinds[lo]
            name += ("/decode" if prompt == 0 else "/prompt" if prompt == hi - lo else "/both")
        names.append(name)
    return names


def format_by_opcode(r: dict) -> str:
    """by_opcode's dict as a small fixed-width table."""
    if not r:
        return "(empty journal)"
    w = max([14] + [len(name) + 1 for name in r["ops"]])     # variant_names' rows run longer
    lines = [f"step span {r['span_us']:.1f} us on {r['sms']} SMs",
             f"{'opcode':<{w}}{'count':>7}{'busy us':>11}{'share':>7}{'mean us':>9}{'max us':>9}"
             f"{'phase us':>10}"]
    cols = list(ROLE_SPANS) + [k for k in WAIT_WORDS
                               if any(k + "_us" in d for d in r["ops"].values())]
    roles = any(k + "_us" in d for d in r["ops"].values() for k in ROLE_SPANS)
    if roles:
        lines[1] += "".join(f"{k:>11}" for k in cols)
    for name, d in r["ops"].items():
        line = (f"{name:<{w}}{d['count']:>7}{d['busy_us']:>11.1f}{d['busy_share']:>7.1%}"
                f"{d['mean_us']:>9.2f}{d['max_us']:>9.2f}{d['phase_us']:>10.1f}")
        if roles:
            line += "".join(f"{d.get(k + '_us', float('nan')):>11.2f}" for k in cols)
        lines.append(line)
    if roles:
        waits = ("; waits summed per instruction: ATTENTION's ld_wait the loader's for free "
                 "pages, cons_wait the consumers' for full ones, st_wait the storer's for done; "
                 "a GEMM's cons_wait its consumers' for full operand pages, mma_wait for the "
                 "previous K step's wgmmas") if len(cols) > len(ROLE_SPANS) else ""
        lines.append("(role columns: medians in us; " + ", ".join(
            f"{k} = {a} -> {b}" for k, (a, b) in ROLE_SPANS.items()) + waits + ")")
    return "\n".join(lines)


def _gemm_op_ids() -> set:
    global GEMM_OP_IDS
    if GEMM_OP_IDS is None:
        from mk.ir import Op
        GEMM_OP_IDS = {int(Op.QKV_ROPE), int(Op.O_PROJ), int(Op.GATE_UP), int(Op.DOWN),
                       int(Op.LM_HEAD)}
    return GEMM_OP_IDS


def gemm_ktrace(journal, n: int, ktrace: int, skip: int = 4, waited_cycles: int = 64,
                max_tiles: int = 4096) -> dict:
    """Where a GEMM tile's K steps go, per opcode, from the K-step trace (ktrace: the K steps the
    variant traced, MK_GEMM_KTRACE). Cycles (the SM clock; clock_ghz is its rate, from the tile's
    globaltimer stamps), over the steady-state steps of every tile (K step >= skip, as far as
    traced; at most max_tiles tiles an opcode, evenly spaced over the journal):
        step        consumer thread 0's cycles from one stage's retire to the next (C_RET[k] -
                    C_RET[k-1]): what a K step costs; the tensor pipe's own floor for the tile's
                    wgmmas is the lower bound
        cons_wait   its wait for the stage's operands (C_FULL - C_WAIT); waited: the share of
                    steps where that exceeded waited_cycles
        lead        C_WAIT - L_ISSUE: how long before the consumers wanted the stage the loader
                    had issued its last TMA (< 0: issued after they began to wait)
        flight      C_FULL - L_ISSUE over the waited steps: issue -> the consumers past the
                    stage's barrier, the TMA round trip when it is what they waited for
        loader      L_ISSUE - L_START: the loader's time on a stage (its waits for free pages)
        ahead       the tile's stages whose last TMA was issued when the consumers start to wait
                    for stage k, minus k: how far the loader ran ahead (the ring holds ~4
                    stages; steps within 4 of the tile's end left out)
        wg_skew     C1_FULL - C_FULL: warpgroup 1 past the barrier after warpgroup 0
    The loader's stamps of stages its early weight loads took are missing (0):
    those steps count only in the consumer columns, and as issued in `ahead`."""
    import numpy as np
    if ktrace <= 0:
        return {}
    rows = journal[:n]
    rows = rows.numpy() if hasattr(rows, "numpy") else np.asarray(rows, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[1] < KT_BASE + KT_WORDS * ktrace:
        return {}
    out: dict[str, dict] = {}
    gemm = np.isin(rows[:, 2], list(_gemm_op_ids())) & (rows[:, 3] != 0)
    for op in sorted(set(rows[gemm, 2].tolist())):
        sel = rows[gemm & (rows[:, 2] == op)]
        kt = sel[:, KT_BASE:KT_BASE + KT_WORDS * ktrace].reshape(len(sel), ktrace, KT_WORDS)
        steps = np.count_nonzero(kt[:, :, KT_C_WAIT], axis=1)
        keep = steps > skip
        sel, kt, steps = sel[keep], kt[keep], steps[keep]
        if len(sel) > max_tiles:
            idx = np.linspace(0, len(sel) - 1, max_tiles).round().astype(int)
            sel, kt, steps = sel[idx], kt[idx], steps[idx]
        if not len(sel):
            continue
        ks = np.arange(ktrace)
        steady = (ks[None, :] >= skip) & (ks[None, :] < steps[:, None])
        c_wait, c_full, c_ret = kt[:, :, KT_C_WAIT], kt[:, :, KT_C_FULL], kt[:, :, KT_C_RET]
        issued, l_start, c1 = kt[:, :, KT_L_ISSUE], kt[:, :, KT_L_START], kt[:, :, KT_C1_FULL]
        cw = c_full - c_wait
        step = np.zeros_like(c_ret)
        step[:, 1:] = c_ret[:, 1:] - c_ret[:, :-1]
        have_l = steady & (issued != 0)
        waited = cw > waited_cycles
        ahead = []
        near_end = steady & (ks[None, :] + 4 < steps[:, None])
        for t0 in range(0, len(sel), 256):          # [tiles, k, j] in chunks
            cmp = ((issued[t0:t0 + 256, None, :] < c_wait[t0:t0 + 256, :, None])
                   & (ks[None, None, :] < steps[t0:t0 + 256, None, None]))
            cnt = cmp.sum(axis=2) - ks[None, :]
            ahead.append(cnt[near_end[t0:t0 + 256]])
        ahead = np.concatenate(ahead)
        tile = c_ret[np.arange(len(sel)), steps - 1] - c_wait[:, 0]
        ns = sel[:, ROLE_WORDS["cons_epi0"]] - sel[:, ROLE_WORDS["cons0"]]
        whole = (steps < ktrace) & (ns > 0) & (tile > 0)   # the whole tile traced
        cols = dict(step=step[steady], cons_wait=cw[steady], lead=(c_wait - issued)[have_l],
                    flight=(c_full - issued)[have_l & waited], loader=(issued - l_start)[have_l],
                    ahead=ahead, wg_skew=(c1 - c_full)[steady & (c1 != 0)])
        d = dict(tiles=int(len(sel)), traced_steps_p50=int(np.median(steps)),
                 steady_steps=int(steady.sum()),
                 clock_ghz=(round(float(np.median(tile[whole] / ns[whole])), 3)
                            if whole.any() else None),
                 waited_share=round(float(waited[steady].mean()), 3))
        for key, v in cols.items():
            v = np.sort(v)
            d[key] = (dict(p10=int(v[int(.1 * len(v))]), p50=int(v[int(.5 * len(v))]),
                           p90=int(v[min(len(v) - 1, int(.9 * len(v)))]), n=int(len(v)))
                      if len(v) else None)
        d["cons_wait_share"] = round(float(cw[steady].sum() / max(step[steady].sum(), 1)), 3)
        out[_op_name(int(op))] = d
    return out


def format_gemm_ktrace(r: dict) -> str:
    """gemm_ktrace's dict as a table: median (p10 / p90) cycles per K step."""
    if not r:
        return "(no K-step trace: MK_GEMM_KTRACE=0, or no GEMM tile in the journal)"
    cols = ("step", "cons_wait", "lead", "flight", "loader", "ahead", "wg_skew")
    lines = [f"{'opcode':<10}{'tiles':>6}{'GHz':>6}{'waited':>8}{'wait/step':>10}"
             + "".join(f"{c:>20}" for c in cols)]
    for name, d in r.items():
        cells = []
        for c in cols:
            v = d.get(c)
            cells.append(f"{v['p50']} ({v['p10']}/{v['p90']})" if v else "-")
        ghz = f"{d['clock_ghz']:.2f}" if d.get("clock_ghz") else "-"
        lines.append(f"{name:<10}{d['tiles']:>6}{ghz:>6}{d['waited_share']:>8.1%}"
                     f"{d['cons_wait_share']:>10.1%}" + "".join(f"{x:>20}" for x in cells))
    lines.append("(cycles of the SM clock per steady-state K step, median (p10/p90); step = "
                 "retire to retire, cons_wait = consumers' operand wait, lead = loads issued "
                 "before they were wanted, flight = issue -> consumers past the barrier when "
                 "they waited, loader = its time per stage, ahead = stages issued beyond the "
                 "one waited for, wg_skew = warpgroup 1 after warpgroup 0)")
    return "\n".join(lines)


def critical_path(journal, jcta, n: int, instrs) -> dict:
    """The chain of instructions that set the step's end, walked back from the last signal. At
    each instruction the link is whichever of its two needs was met last: the producer whose
    signal completed its latest-met wait (a dependency hop), or the instruction before it on its
    CTA, whose end frees the SM's roles (a queue hop). Each link's time is split into the
    instruction's own run (ready -> signalled) and the gap before it (the producer's signal or
    the CTA's previous end -> ready: the hop's latency; negative where the instruction's waits
    were met while its CTA's previous one still ran, e.g. during early weight loads).
    A GEMM tile with an epilogue wait (PlanConfig.norm_fold=2: its rows scaled once the
    row-scale norm signalled) links to that norm instead (an epilogue hop) when the norm
    signalled after the tile's consumers reached their epilogue (journal word cons_epi0; ready
    where it is missing): the tile was held there, and only its run after the norm's signal is
    on the path. The hop's `held_us` sums how long the consumers waited for it.

    instrs: the step's words [n, INSTR_WORDS] (the journal's tickets index them). Per opcode on
    the path: count, run us, and the gaps before it by kind; per hop (producer opcode ->
    opcode): count and gap us; path_us = runs + gaps."""
    from mk.instructions._common import epilogue_wait_words
    from mk.ir import MAX_WAITS, NO_COUNTER, W_SIGNAL, W_SIGNAL_COUNT, W_WAIT0
    ev, ctas = events(journal, jcta, n)
    if not ev:
        return {}
    words = instrs.tolist() if hasattr(instrs, "tolist") else [list(r) for r in instrs]
    by_ticket = {e["ticket"]: e for e in ev}
    signals: dict[int, list] = {}
    for e in ev:
        w = words[e["ticket"]]
        if w[W_SIGNAL] != NO_COUNTER:
            signals.setdefault(w[W_SIGNAL], []).append((e["end"], max(w[W_SIGNAL_COUNT], 1),
                                                        e["ticket"]))
    for v in signals.values():
        v.sort()

    def producer(counter: int, target: int):
        """The instruction whose signal brought counter to target (None: not in the journal)."""
        total = 0
        for _, count, ticket in signals.get(counter, ()):
            total += count
            if total >= target:
                return by_ticket[ticket]
        return None

    prev_on_cta, last = {}, {}
    for e in sorted(ev, key=lambda e: (e["fetch"], e["ticket"])):
        prev_on_cta[e["ticket"]] = last.get(e["cta"])
        last[e["cta"]] = e
    entry = {c["cta"]: c["entry"] for c in ctas}
    ops: dict[str, dict] = {}
    hops: dict[str, dict] = {}
    cur = max(ev, key=lambda e: e["end"])
    end, steps = cur["end"], 0
    while cur is not None and steps <= len(ev):
        steps += 1
        w = words[cur["ticket"]]
        deps = [producer(w[W_WAIT0 + 2 * i], w[W_WAIT0 + 2 * i + 1]) for i in range(MAX_WAITS)
                if w[W_WAIT0 + 2 * i] != NO_COUNTER and w[W_WAIT0 + 2 * i + 1] > 0]
        deps = [d for d in deps if d is not None]
        dep = max(deps, key=lambda d: d["end"]) if deps else None
        prev = prev_on_cta[cur["ticket"]]
        if dep is not None and (prev is None or dep["end"] >= prev["end"]):
            kind, nxt, before = "dep", dep, dep["end"]
        else:
            kind, nxt = "queue", prev
            before = prev["end"] if prev is not None else entry.get(cur["cta"], cur["fetch"])
        run_from, held = cur["ready"], 0
        epi = epilogue_wait_words(w)
        norm = producer(*epi) if epi is not None else None
        if norm is not None and norm["end"] > cur.get("cons_epi0", cur["ready"]):
            # the tile's consumers waited at their epilogue for the norm's row scale
            kind, nxt, before = "epi", norm, norm["end"]
            run_from, held = norm["end"], norm["end"] - cur.get("cons_epi0", cur["ready"])
        name = _op_name(cur["op"])
        d = ops.setdefault(name, dict(count=0, run=0, dep_gap=0, queue_gap=0))
        d["count"] += 1
        d["run"] += cur["end"] - run_from
        if kind != "epi":
            d[kind + "_gap"] += cur["ready"] - before
        src = _op_name(nxt["op"]) if nxt is not None else "entry"
        h = hops.setdefault(f"{src} -> {name} ({kind})", dict(count=0, gap=0, held=0))
        h["count"] += 1
        h["gap"] += run_from - before
        h["held"] += held
        cur = nxt
    us = lambda ns: round(ns / 1e3, 1)  # noqa: E731
    path = sum(d["run"] + d["dep_gap"] + d["queue_gap"] for d in ops.values())
    return dict(span_us=us(end - min(entry.values(), default=0)), path_us=us(path),
                instructions=sum(d["count"] for d in ops.values()),
                ops={k: dict(count=d["count"], run_us=us(d["run"]), dep_gap_us=us(d["dep_gap"]),
                             queue_gap_us=us(d["queue_gap"]))
                     for k, d in sorted(ops.items(), key=lambda kv: -(kv[1]["run"]
                                                                     + kv[1]["dep_gap"]
                                                                     + kv[1]["queue_gap"]))},
                hops={k: dict(count=h["count"], gap_us=us(h["gap"]),
                              mean_gap_us=round(h["gap"] / h["count"] / 1e3, 2),
                              **({"held_us": us(h["held"])} if k.endswith("(epi)") else {}))
                      for k, h in sorted(hops.items(), key=lambda kv: -kv[1]["gap"])})


def format_critical_path(r: dict, per: int = 1, top: int = 12) -> str:
    """critical_path's dict as a small table (per: divide the sums by this, e.g. the layers)."""
    if not r:
        return "(empty journal)"
    unit = "us" if per == 1 else f"us / {per}"
    lines = [f"critical path {r['path_us']:.1f} us of the step's {r['span_us']:.1f} us, "
             f"{r['instructions']} instructions (sums in {unit})",
             f"  {'opcode':<14}{'count':>8}{'run':>9}{'dep gap':>9}{'queue gap':>10}{'share':>9}"]
    # (rows indented: scripts grep the by-opcode table's rows as "^OPCODE +digits"); share = run
    # + the gaps before it: the shares add up to the path, the runs alone overlap where an
    # instruction was handed over before the one it follows ended (negative queue gaps)
    for name, d in r["ops"].items():
        share = d["run_us"] + d["dep_gap_us"] + d["queue_gap_us"]
        lines.append(f"  {name:<14}{d['count'] / per:>8.1f}{d['run_us'] / per:>9.1f}"
                     f"{d['dep_gap_us'] / per:>9.1f}{d['queue_gap_us'] / per:>10.1f}"
                     f"{share / per:>9.1f}")
    lines.append(f"  {'hop':<48}{'count':>8}{'gap':>9}{'mean us':>9}")
    for name, h in list(r["hops"].items())[:top]:
        lines.append(f"  {name:<48}{h['count'] / per:>8.1f}{h['gap_us'] / per:>9.1f}"
                     f"{h['mean_gap_us']:>9.2f}"
                     + (f"  (held {h['held_us'] / per:.1f})" if "held_us" in h else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ PNG
def _png(path: str, w: int, h: int, pix: bytearray) -> None:
    raw = b"".join(b"\x00" + bytes(pix[y * w * 3:(y + 1) * w * 3]) for y in range(h))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _raster_timeline(path: str, ev, ctas, width: int = 1600) -> None:
    sms = sorted({e["sm"] for e in ev} | {c["sm"] for c in ctas})
    row = {s: i for i, s in enumerate(sms)}
    lane_h = 6
    top, left = 10, 10
    h = top * 2 + lane_h * len(sms)
    w = width
    tmax = max([e["end"] for e in ev] + [c["exit"] for c in ctas] + [1])
    pix = bytearray([255]) * (w * h * 3)

    def rect(x0, x1, y0, y1, col):
        x0 = max(left, min(w - 1, left + int(x0 * (w - 2 * left) / tmax)))
        x1 = max(x0 + 1, min(w - 1, left + int(x1 * (w - 2 * left) / tmax)))
        for y in range(y0, y1):
            base = (y * w) * 3
            for x in range(x0, x1):
                pix[base + 3 * x:base + 3 * x + 3] = bytes(col)
    for c in ctas:
        y = top + row[c["sm"]] * lane_h
        rect(c["entry"], c["exit"], y + lane_h - 1, y + lane_h, (200, 200, 200))
    for e in ev:
        y = top + row[e["sm"]] * lane_h
        if e["ready"] > e["fetch"]:
            rect(e["fetch"], e["ready"], y + 1, y + lane_h - 2, WAIT_COLOR)
        rect(e["ready"], e["end"], y, y + lane_h - 1, OP_COLORS.get(e["op"], (0, 0, 0)))
    _png(path, w, h, pix)


def draw_timeline(path: str, journal, jcta, n: int, title: str = "megakernel timeline") -> str:
    """PNG: one lane per SM; instruction bodies coloured by opcode, waits (ticket taken -> waits
    met) in amber, CTA lifetimes as a grey baseline. Returns the renderer used."""
    ev, ctas = events(journal, jcta, n)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        _raster_timeline(path, ev, ctas)
        return "builtin"
    sms = sorted({e["sm"] for e in ev} | {c["sm"] for c in ctas})
    row = {s: i for i, s in enumerate(sms)}
    fig, ax = plt.subplots(figsize=(16, max(4, len(sms) * 0.09)))
    for c in ctas:
        ax.broken_barh([(c["entry"] / 1e3, (c["exit"] - c["entry"]) / 1e3)], (row[c["sm"]] - 0.45, 0.1),
                       color="0.8")
    waits = [[] for _ in sms]
    bodies = {}
    for e in ev:
        if e["ready"] > e["fetch"]:
            waits[row[e["sm"]]].append((e["fetch"] / 1e3, (e["ready"] - e["fetch"]) / 1e3))
        bodies.setdefault(e["op"], [[] for _ in sms])[row[e["sm"]]].append(
            (e["ready"] / 1e3, max(e["end"] - e["ready"], 1) / 1e3))
    for i, segs in enumerate(waits):
        if segs:
            ax.broken_barh(segs, (i - 0.25, 0.5), color=tuple(c / 255 for c in WAIT_COLOR))
    for op, rows in bodies.items():
        col = tuple(c / 255 for c in OP_COLORS.get(op, (0, 0, 0)))
        for i, segs in enumerate(rows):
            if segs:
                ax.broken_barh(segs, (i - 0.35, 0.7), color=col)
    ax.set_xlabel("time since first CTA entry (us)")
    ax.set_ylabel("SM")
    ax.set_yticks(range(0, len(sms), max(1, len(sms) // 16)))
    ax.set_yticklabels([sms[i] for i in range(0, len(sms), max(1, len(sms) // 16))])
    ax.set_title(title)
    handles = [Patch(color=tuple(c / 255 for c in OP_COLORS[k]), label=_op_name(k)) for k in bodies
               if k in OP_COLORS] + [Patch(color=tuple(c / 255 for c in WAIT_COLOR), label="wait")]
    ax.legend(handles=handles, loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


def main(argv=None):
    import torch
    argv = argv or sys.argv[1:]
    if len(argv) < 2:
        print("usage: python -m mk.trace journal.pt out.json [out.png]")
        return 2
    d = torch.load(argv[0])
    write_chrome_trace(argv[1], d["journal"], d["jcta"], int(d["n"]))
    if len(argv) > 2:
        print("timeline drawn with", draw_timeline(argv[2], d["journal"], d["jcta"], int(d["n"])))
    print(json.dumps(summary(d["journal"], d["jcta"], int(d["n"])), indent=1))
    if "instrs" in d:
        print(format_critical_path(critical_path(d["journal"], d["jcta"], int(d["n"]), d["instrs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
