"""Static checks of a serialized plan, before anything runs.

Input: one int32 [N_r, 32] instruction stream per rank (the TP size is the number of streams) and the
size of each rank's counter array. The checks, in order:

1. format       every word the controller reads is in range: known opcode, counter ids in
                [0, num_counters) or NO_COUNTER, a signal scope, a peer rank, a positive signal count,
                a positive wait target, non-negative row/column extents.
2. counters     for each (rank, counter), every wait target equals the counter's initial value plus
                the total of the signals it receives in the step (exact targets: a target below the
                total gives no happens-before with the late signalers, one above never completes),
                and that total fits an int32.
3. deadlock     each rank's controllers take instructions in queue order and every CTA is resident.
                The plan is deadlock-free for any number of CTAs (down to one per rank) iff there is a
                global order, consistent with every rank's queue order, in which each wait (c, t) of
                rank r is met by signals to r's counter c from instructions earlier in that order.
                Counters only grow, so advancing any rank whose next instruction can run never hurts:
                the greedy simulation finds such an order or proves none exists.
4. races        happens-before = the transitive closure of signaler -> waiter edges (a wait (c, t) is
                ordered after a signaler of c when the other signals cannot reach t without it; with
                exact targets that is every signaler). Queue order gives no ordering between CTAs.
                Two accesses of different instructions to overlapping regions (same buffer, same
                rank, overlapping rows and columns), at least one a write, must be ordered, in the
                direction of the plan's sequential semantics (the order of check 3). Buffers reused
                across layers are conflicting accesses like any other.

`check(streams, num_counters)` returns every finding; `verify(...)` raises PlanError naming the
instructions (rank, index, opcode, layer) and the region or counter.

Cost: the races are checked against the nearest conflicting accesses only (per elementary cell of
each buffer, the last write and the reads since), with happens-before sets as Python-int bitsets
built in schedule order; a 50k-instruction plan checks in seconds.

CLI: python -m mk.verify plan.pt [--num-counters N]
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import inspect
import sys
from dataclasses import dataclass

import numpy as np
import torch

from mk.instructions._common import epilogue_wait_words
from mk.instructions.base import Buf, Region, family_of
from mk.ir import (INSTR_WORDS, MAX_WAITS, NO_COUNTER, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0,
                   W_ROWS, W_SIGNAL, W_SIGNAL_COUNT, W_SIGNAL_RANK, W_SIGNAL_SCOPE, W_WAIT0,
                   Instruction, Op, SignalScope)

INT32_MAX = 2**31 - 1


class PlanError(ValueError):
    """A plan the verifier refuses; the message names the instructions and the region or counter."""

    def __init__(self, message: str, findings: list["Finding"] | None = None):
        super().__init__(message)
        self.findings = findings or []


@dataclass(frozen=True)
class Finding:
    """One problem. kind: format | counter | overflow | deadlock | race.

    instrs: the instructions involved as (rank, index in that rank's stream); for a race the earlier
    access first. counter: (rank, counter id) for counter, overflow and deadlock findings.
    region: for a race, the overlap of the two accesses.
    """

    kind: str
    message: str
    instrs: tuple[tuple[int, int], ...] = ()
    counter: tuple[int, int] | None = None
    region: Region | None = None
    detail: str = ""    # race: raw | war | waw; counter: below | above | unsignalled

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


# ------------------------------------------------------------------------------------------------
# Naming
# ------------------------------------------------------------------------------------------------

def op_name(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        try:
            fam = family_of(opcode)
            name = getattr(fam, "opcode_names", {}).get(int(opcode))
            return name or f"op{opcode}"
        except ValueError:
            return f"op{opcode}"


def buf_name(buf: int) -> str:
    try:
        return Buf(buf).name
    except ValueError:
        return f"buf{buf}"


def region_str(reg: Region) -> str:
    return (f"{buf_name(reg.buf)} on rank {reg.rank} rows [{reg.row0}, {reg.row1}) "
            f"cols [{reg.col0}, {reg.col1})")


def _intersect(a: Region, b: Region) -> Region:
    return Region(a.buf, max(a.row0, b.row0), min(a.row1, b.row1), max(a.col0, b.col0),
                  min(a.col1, b.col1), a.rank)


# ------------------------------------------------------------------------------------------------
# The plan, decoded once
# ------------------------------------------------------------------------------------------------

class _Plan:
    def __init__(self, streams, num_counters: int, initial):
        if isinstance(streams, (torch.Tensor, np.ndarray)) and np.ndim(streams) == 2:
            streams = [streams]
        self.words: list[np.ndarray] = []
        for r, s in enumerate(streams):
            a = s.detach().cpu().numpy() if isinstance(s, torch.Tensor) else np.asarray(s)
            if a.ndim != 2 or a.shape[1] != INSTR_WORDS:
                raise PlanError(f"rank {r}: an instruction stream is [N, {INSTR_WORDS}], got "
                                f"shape {list(a.shape)}")
            if isinstance(s, torch.Tensor) and s.dtype != torch.int32:
                raise PlanError(f"rank {r}: an instruction stream is int32, got {s.dtype}")
            self.words.append(a.astype(np.int64))
        self.tp = len(self.words)
        if self.tp == 0:
            raise PlanError("a plan needs at least one rank's stream")
        self.num_counters = int(num_counters)
        self.n = [len(w) for w in self.words]
        self.base = np.cumsum([0] + self.n).tolist()     # gid = base[rank] + index
        self.N = self.base[-1]
        all_w = np.concatenate(self.words) if self.N else np.zeros((0, INSTR_WORDS), np.int64)
        self.all = all_w.tolist()        # python ints: fast scalar access in the loops below
        self.rank_of = np.repeat(np.arange(self.tp), self.n).tolist()
        if initial is None:
            self.initial = np.zeros((self.tp, self.num_counters), np.int64)
        else:
            ini = np.asarray(initial, dtype=np.int64)
            if ini.ndim == 1:
                ini = np.broadcast_to(ini, (self.tp, len(ini)))
            if ini.shape != (self.tp, self.num_counters):
                raise PlanError(f"initial counter values must be [{self.tp}, {self.num_counters}], "
                                f"got {list(ini.shape)}")
            self.initial = ini.copy()
        self.initial = self.initial.tolist()

    def loc(self, gid: int) -> tuple[int, int]:
        r = int(self.rank_of[gid])
        return r, gid - self.base[r]

    def name(self, gid: int) -> str:
        r, i = self.loc(gid)
        w = self.all[gid]
        r0, c0 = int(w[W_ROW0]), int(w[W_COL0])
        return (f"rank {r} #{i} {op_name(int(w[W_OPCODE]))} layer {int(w[W_LAYER])} "
                f"rows [{r0}, {r0 + int(w[W_ROWS])}) cols [{c0}, {c0 + int(w[W_COLS])})")

    def waits(self, gid: int):
        """Every wait of the instruction: its W_WAIT words' and its epilogue wait (an unsplit
        folded GEMM tile's, mk.instructions._common.epilogue_wait: for the counters and the
        deadlock check a wait like the others, since the tile holds its CTA while it waits)."""
        return self.early_waits(gid) + self.epilogue_waits(gid)

    def early_waits(self, gid: int):
        """The waits met before the instruction starts (its W_WAIT words)."""
        w = self.all[gid]
        return [(int(w[W_WAIT0 + 2 * k]), int(w[W_WAIT0 + 2 * k + 1])) for k in range(MAX_WAITS)
                if w[W_WAIT0 + 2 * k] != NO_COUNTER]

    def epilogue_waits(self, gid: int):
        e = epilogue_wait_words(self.all[gid])
        return [e] if e is not None else []

    def signal_ranks(self, gid: int) -> list[int]:
        w = self.all[gid]
        if w[W_SIGNAL] == NO_COUNTER:
            return []
        scope = int(w[W_SIGNAL_SCOPE])
        if scope == SignalScope.LOCAL:
            return [int(self.rank_of[gid])]
        if scope == SignalScope.PEER:
            return [int(w[W_SIGNAL_RANK])]
        return list(range(self.tp))


# ------------------------------------------------------------------------------------------------
# 1. format
# ------------------------------------------------------------------------------------------------

def _check_format(p: _Plan) -> list[Finding]:
    out = []
    nc = p.num_counters

    def bad(gid, what):
        out.append(Finding("format", f"{p.name(gid)}: {what}", (p.loc(gid),)))

    known: dict[int, bool] = {}
    for gid in range(p.N):
        w = p.all[gid]
        op = int(w[W_OPCODE])
        if op not in known:
            try:
                family_of(op)
                known[op] = True
            except ValueError:
                known[op] = False
        if not known[op]:
            bad(gid, f"unknown opcode {op}")
        if w[W_ROWS] < 0 or w[W_COLS] < 0 or w[W_ROW0] < 0 or w[W_COL0] < 0:
            bad(gid, "negative row/column start or extent")
        for k in range(MAX_WAITS):
            c, t = int(w[W_WAIT0 + 2 * k]), int(w[W_WAIT0 + 2 * k + 1])
            if c == NO_COUNTER:
                continue
            if not 0 <= c < nc:
                bad(gid, f"wait {k} on counter {c}, outside the {nc} counters")
            elif t <= 0:
                bad(gid, f"wait {k} on counter {c} with target {t}: a wait that orders nothing")
        for c, t in p.epilogue_waits(gid):
            if not 0 <= c < nc:
                bad(gid, f"epilogue wait on counter {c}, outside the {nc} counters")
            elif t <= 0:
                bad(gid, f"epilogue wait on counter {c} with target {t}: a wait that orders "
                         f"nothing")
        s = int(w[W_SIGNAL])
        if s != NO_COUNTER:
            if not 0 <= s < nc:
                bad(gid, f"signals counter {s}, outside the {nc} counters")
            scope = int(w[W_SIGNAL_SCOPE])
            if scope not in (SignalScope.LOCAL, SignalScope.PEER, SignalScope.ALL):
                bad(gid, f"unknown signal scope {scope}")
            elif scope == SignalScope.PEER and not 0 <= w[W_SIGNAL_RANK] < p.tp:
                bad(gid, f"signals peer rank {int(w[W_SIGNAL_RANK])} of a TP-{p.tp} plan")
            if w[W_SIGNAL_COUNT] <= 0:
                bad(gid, f"signal count {int(w[W_SIGNAL_COUNT])}: counters must only grow")
    return out


# ------------------------------------------------------------------------------------------------
# 2. counters
# ------------------------------------------------------------------------------------------------

def _signal_tables(p: _Plan):
    """(rank, counter) -> [(gid, count)] of the instructions that signal it, and the totals."""
    signalers: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for gid in range(p.N):
        w = p.all[gid]
        if w[W_SIGNAL] == NO_COUNTER:
            continue
        c, cnt = int(w[W_SIGNAL]), int(w[W_SIGNAL_COUNT])
        for dr in p.signal_ranks(gid):
            signalers.setdefault((dr, c), []).append((gid, cnt))
    totals = {k: int(p.initial[k[0]][k[1]]) + sum(cnt for _, cnt in v) for k, v in signalers.items()}
    return signalers, totals


def _check_counters(p: _Plan, signalers, totals) -> list[Finding]:
    out = []
    for (r, c), tot in totals.items():
        if tot > INT32_MAX:
            out.append(Finding(
                "overflow", f"counter {c} of rank {r} reaches {tot} (initial {int(p.initial[r][c])} + "
                f"{len(signalers[(r, c)])} signals), past the int32 range",
                tuple(p.loc(g) for g, _ in signalers[(r, c)][:4]), (r, c)))
    for gid in range(p.N):
        r = int(p.rank_of[gid])
        for c, t in p.waits(gid):
            key = (r, c)
            tot = totals.get(key)
            ini = int(p.initial[r][c])
            if tot is None:
                out.append(Finding(
                    "counter", f"{p.name(gid)} waits for counter {c} of rank {r} to reach {t}, but no "
                    f"instruction signals that counter (initial value {ini})",
                    (p.loc(gid),), key, detail="unsignalled"))
                continue
            if t == tot:
                continue
            n_sig = len(signalers[key])
            if len(out) > 200:
                continue
            sig = ", ".join(p.name(g) for g, _ in signalers[key][:3]) + (", ..." if n_sig > 3 else "")
            if t < tot:
                out.append(Finding(
                    "counter", f"{p.name(gid)} waits for counter {c} of rank {r} to reach {t}, below "
                    f"the {tot} it reaches (initial {ini} + {n_sig} signals from {sig}): the waiter "
                    f"is not ordered after the late signalers",
                    (p.loc(gid),), key, detail="below"))
            else:
                out.append(Finding(
                    "counter", f"{p.name(gid)} waits for counter {c} of rank {r} to reach {t}, above "
                    f"the {tot} it can reach (initial {ini} + {n_sig} signals from {sig}): it would "
                    f"wait forever", (p.loc(gid),), key, detail="above"))
    return out


# ------------------------------------------------------------------------------------------------
# 3. deadlock: the greedy global schedule
# ------------------------------------------------------------------------------------------------

def _schedule(p: _Plan, signalers):
    """Greedy global order. Returns (order of gids, pointer per rank, counter values)."""
    value = {}
    ptr = [0] * p.tp
    order: list[int] = []
    waits = [p.waits(g) for g in range(p.N)]
    sig = []
    for g in range(p.N):
        w = p.all[g]
        if w[W_SIGNAL] == NO_COUNTER:
            sig.append(())
        else:
            c, cnt = int(w[W_SIGNAL]), int(w[W_SIGNAL_COUNT])
            sig.append(tuple(((dr, c), cnt) for dr in p.signal_ranks(g)))

    def val(r, c):
        v = value.get((r, c))
        return int(p.initial[r][c]) if v is None else v

    progress = True
    while progress:
        progress = False
        for r in range(p.tp):
            base, n = p.base[r], p.n[r]
            i = ptr[r]
            while i < n:
                g = base + i
                if any(val(r, c) < t for c, t in waits[g]):
                    break
                for key, cnt in sig[g]:
                    value[key] = val(*key) + cnt
                order.append(g)
                i += 1
                progress = True
            ptr[r] = i
    return order, ptr, val, waits


def _check_deadlock(p: _Plan, signalers, ptr, val, waits, scheduled) -> list[Finding]:
    out = []
    stuck = [r for r in range(p.tp) if ptr[r] < p.n[r]]
    if not stuck:
        return out
    lines = []
    involved = []
    counter = None
    for r in stuck:
        g = p.base[r] + ptr[r]
        involved.append(p.loc(g))
        for c, t in waits[g]:
            v = val(r, c)
            if v >= t:
                continue
            counter = counter or (r, c)
            pend = [s for s, _ in signalers.get((r, c), []) if s not in scheduled]
            later_same = [s for s in pend if p.rank_of[s] == r]
            desc = ", ".join(p.name(s) for s in pend[:3]) + (", ..." if len(pend) > 3 else "")
            why = (f"the missing signals come from {desc}" if pend else
                   "no remaining instruction signals it")
            if later_same:
                why += f" ({len(later_same)} of them later in rank {r}'s own queue)"
            lines.append(f"{p.name(g)} waits for counter {c} of rank {r} to reach {t}; it stays at "
                         f"{v}: {why}")
    done = len(scheduled)
    out.append(Finding(
        "deadlock", f"deadlock after {done} of {p.N} instructions: no rank's next instruction can "
        f"start: " + "; ".join(lines), tuple(involved), counter))
    return out


# ------------------------------------------------------------------------------------------------
# 4. happens-before and races
# ------------------------------------------------------------------------------------------------

def _full_order(p: _Plan, order, signalers, totals, waits):
    """The schedule, then (after a deadlock) the rest in a topological order of the happens-before
    graph, cycles broken by queue position, so that the race check still sees every instruction."""
    if len(order) == p.N:
        return order
    done = set(order)
    rest = [g for g in range(p.N) if g not in done]
    rest_set = set(rest)
    succ: dict[int, list[int]] = {}
    indeg = {}
    for g in rest:
        r = int(p.rank_of[g])
        d = 0
        for c, t in waits[g]:
            for s in _guaranteed(signalers.get((r, c), []), totals.get((r, c), 0), t):
                if s in rest_set and s != g:
                    succ.setdefault(s, []).append(g)
                    d += 1
        indeg[g] = d
    key = lambda g: (p.loc(g)[1], p.loc(g)[0])  # noqa: E731
    heap = [(key(g), g) for g in rest if indeg[g] == 0]
    heapq.heapify(heap)
    remaining = set(rest)
    out = list(order)
    while remaining:
        if not heap:
            g = min(remaining, key=key)
        else:
            _, g = heapq.heappop(heap)
            if g not in remaining:
                continue
        remaining.discard(g)
        out.append(g)
        for s in succ.get(g, []):
            indeg[s] -= 1
            if indeg[s] == 0 and s in remaining:
                heapq.heappush(heap, (key(s), s))
    return out


def _guaranteed(sigs, total, target):
    """Signalers of a counter that a wait for `target` is ordered after: those without which the
    other signals (and the initial value) cannot reach the target."""
    slack = total - target
    return [g for g, cnt in sigs if cnt > slack]


class _Cells:
    """Elementary cells of one (buffer, rank): the grid cut by every access's row/col bounds."""

    __slots__ = ("rb", "cb", "last", "readers")

    def __init__(self, rows: set, cols: set):
        self.rb = sorted(rows)
        self.cb = sorted(cols)
        self.last: dict[tuple[int, int], int] = {}
        self.readers: dict[tuple[int, int], list[int]] = {}

    def cells(self, reg: Region):
        i0, i1 = bisect.bisect_left(self.rb, reg.row0), bisect.bisect_left(self.rb, reg.row1)
        j0, j1 = bisect.bisect_left(self.cb, reg.col0), bisect.bisect_left(self.cb, reg.col1)
        return [(i, j) for i in range(i0, i1) for j in range(j0, j1)]


def _takes_meta(fam) -> bool:
    try:
        return len(inspect.signature(fam.accesses).parameters) >= 3
    except (TypeError, ValueError):
        return False


def _accesses(p: _Plan, meta):
    fams = {}
    acc = []
    for gid in range(p.N):
        w = p.all[gid]
        op = int(w[W_OPCODE])
        fam = fams.get(op)
        if fam is None:
            f = family_of(op)
            fam = fams[op] = (f, _takes_meta(f))
        ins = Instruction.decode(w)
        rank = int(p.rank_of[gid])
        a = fam[0].accesses(ins, rank, meta) if fam[1] else fam[0].accesses(ins, rank)
        acc.append(([r for r in a.reads if _nonempty(r)], [r for r in a.writes if _nonempty(r)],
                    frozenset(r for r in a.late if _nonempty(r))))
    return acc


def _nonempty(r: Region) -> bool:
    return r.row1 > r.row0 and r.col1 > r.col0


def _check_races(p: _Plan, order, signalers, totals, waits, max_races: int,
                 meta=None) -> list[Finding]:
    acc = _accesses(p, meta)
    # grids
    bounds: dict[tuple[int, int], tuple[set, set]] = {}
    for reads, writes, _late in acc:
        for reg in (*reads, *writes):
            rows, cols = bounds.setdefault((reg.buf, reg.rank), (set(), set()))
            rows.update((reg.row0, reg.row1))
            cols.update((reg.col0, reg.col1))
    grids = {k: _Cells(*v) for k, v in bounds.items()}

    # happens-before sets, built in `order` (a topological order of the signal -> wait edges)
    pos = {g: k for k, g in enumerate(order)}
    last_wait_pos: dict[tuple[int, int], int] = {}
    multi = set()           # signalers whose own set must be kept (signal count > 1)
    partial_waits = False
    for g in range(p.N):
        r = int(p.rank_of[g])
        for c, t in waits[g]:
            key = (r, c)
            last_wait_pos[key] = max(last_wait_pos.get(key, -1), pos[g])
            if key in totals and t < totals[key]:
                partial_waits = True
    if partial_waits:
        for g in range(p.N):
            if p.all[g][W_SIGNAL] != NO_COUNTER and p.all[g][W_SIGNAL_COUNT] > 1:
                multi.add(g)
    counter_anc: dict[tuple[int, int], int] = {}
    kept: dict[int, int] = {}
    # region accesses per gid (needed later for messages)
    found: dict[tuple[int, int, str], Finding] = {}
    out: list[Finding] = []

    def report(kind, a, b, ra: Region, rb: Region):
        k = (a, b, kind)
        if k in found or len(out) >= max_races:
            return
        reg = _intersect(ra, rb)
        what = {"raw": f"reads {region_str(reg)} written by",
                "war": f"writes {region_str(reg)} still read by",
                "waw": f"writes {region_str(reg)} also written by"}[kind]
        label = {"raw": "read-after-write", "war": "write-after-read", "waw": "write-after-write"}
        f = Finding("race", f"{label[kind]} race: {p.name(b)} {what} {p.name(a)}, with no chain of "
                    f"waits ordering it after that instruction", (p.loc(a), p.loc(b)), None, reg, kind)
        found[k] = f
        out.append(f)

    def ancestors(r, wl):
        anc = 0
        for c, t in wl:
            key = (r, c)
            sigs = signalers.get(key)
            if not sigs:
                continue
            tot = totals[key]
            if t >= tot or not partial_waits:
                anc |= counter_anc.get(key, 0)
            else:
                for s in _guaranteed(sigs, tot, t):
                    if s in kept:
                        anc |= kept[s]
        return anc

    # per cell: last write (gid, region) and reads since (list of (gid, region))
    for step, g in enumerate(order):
        r = int(p.rank_of[g])
        anc = ancestors(r, waits[g])
        reads, writes, late = acc[g]
        # an instruction with an epilogue wait makes its other reads before that wait: they are
        # ordered by its W_WAIT words alone (its late reads and its writes by every wait)
        anc_early = ancestors(r, p.early_waits(g)) if p.epilogue_waits(g) else anc
        if reads or writes:
            checked = set()
            for reg in reads:
                grid = grids[(reg.buf, reg.rank)]
                is_late = reg in late
                a_reg = anc if is_late else anc_early
                for cell in grid.cells(reg):
                    lw = grid.last.get(cell)
                    if lw is not None and lw[0] != g and (lw[0], "raw", is_late) not in checked:
                        checked.add((lw[0], "raw", is_late))
                        if not (a_reg >> lw[0]) & 1:
                            report("raw", lw[0], g, lw[1], reg)
                    grid.readers.setdefault(cell, []).append((g, reg))
            for reg in writes:
                grid = grids[(reg.buf, reg.rank)]
                for cell in grid.cells(reg):
                    lw = grid.last.get(cell)
                    if lw is not None and lw[0] != g and (lw[0], "waw") not in checked:
                        checked.add((lw[0], "waw"))
                        if not (anc >> lw[0]) & 1:
                            report("waw", lw[0], g, lw[1], reg)
                    for rd, rreg in grid.readers.get(cell, ()):
                        if rd != g and (rd, "war") not in checked:
                            checked.add((rd, "war"))
                            if not (anc >> rd) & 1:
                                report("war", rd, g, rreg, reg)
                    grid.last[cell] = (g, reg)
                    grid.readers[cell] = []
        mine = anc | (1 << g)
        w = p.all[g]
        if w[W_SIGNAL] != NO_COUNTER:
            c = int(w[W_SIGNAL])
            for dr in p.signal_ranks(g):
                counter_anc[(dr, c)] = counter_anc.get((dr, c), 0) | mine
            if g in multi:
                kept[g] = mine
        # free the sets of counters whose last waiter has been processed
        for c, _t in waits[g]:
            key = (r, c)
            if last_wait_pos.get(key) == step and not partial_waits:
                counter_anc.pop(key, None)
    return out


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------

def check(streams, num_counters: int, *, meta=None, initial=None,
          max_races: int = 1000) -> list[Finding]:
    """Every finding of the checks above (empty for a plan that is safe to run).

    streams: one int32 [N_r, 32] tensor (or array) per rank, or a single tensor for TP 1.
    num_counters: the size of each rank's counter array.
    meta: the step's metadata (mk.plan.StepMeta), passed to the families whose accesses depend on
    it (attention reads KV pages through the page tables, ...).
    initial: optional [tp, num_counters] counter values at the start of the step (monotonic
    counters); zeros by default.
    """
    p = _Plan(streams, num_counters, initial)
    findings = _check_format(p)
    if findings:
        return findings   # the rest reads these words: stop at malformed ones
    signalers, totals = _signal_tables(p)
    findings += _check_counters(p, signalers, totals)
    order, ptr, val, waits = _schedule(p, signalers)
    findings += _check_deadlock(p, signalers, ptr, val, waits, set(order))
    full = _full_order(p, order, signalers, totals, waits)
    findings += _check_races(p, full, signalers, totals, waits, max_races, meta)
    return findings


def verify(streams, num_counters: int, *, meta=None, initial=None) -> None:
    """Raise PlanError if the plan can deadlock, race, or miscount; return None if it is safe."""
    findings = check(streams, num_counters, meta=meta, initial=initial, max_races=50)
    if findings:
        head = "\n  ".join(str(f) for f in findings[:10])
        more = f"\n  ... and {len(findings) - 10} more" if len(findings) > 10 else ""
        raise PlanError(f"the plan is refused ({len(findings)} finding"
                        f"{'s' if len(findings) != 1 else ''}):\n  {head}{more}", findings)


def schedule(streams, num_counters: int, *, initial=None) -> list[tuple[int, int]]:
    """A deadlock-free global order of the plan as (rank, index) pairs (PlanError if none)."""
    p = _Plan(streams, num_counters, initial)
    f = _check_format(p)
    if f:
        raise PlanError(str(f[0]), f)
    signalers, _ = _signal_tables(p)
    order, ptr, val, waits = _schedule(p, signalers)
    dl = _check_deadlock(p, signalers, ptr, val, waits, set(order))
    if dl:
        raise PlanError(str(dl[0]), dl)
    return [p.loc(g) for g in order]


def _load(path: str):
    obj = torch.load(path, map_location="cpu", weights_only=False)
    num = None
    initial = None
    if isinstance(obj, dict):
        num = obj.get("num_counters")
        initial = obj.get("initial")
        obj = obj.get("streams", obj.get("stream"))
    if isinstance(obj, torch.Tensor):
        obj = [obj]
    return list(obj), num, initial


def _infer_num_counters(streams) -> int:
    m = -1
    for s in streams:
        a = np.asarray(s)
        if len(a):
            cols = [W_SIGNAL] + [W_WAIT0 + 2 * k for k in range(MAX_WAITS)]
            m = max(m, int(a[:, cols].max()))
    return m + 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mk.verify", description=__doc__.split("\n")[0])
    ap.add_argument("plan", help="torch.save'd list of int32 [N, 32] streams (one per rank), or a "
                                 "dict with 'streams', 'num_counters' and optional 'initial'")
    ap.add_argument("--num-counters", type=int, default=None)
    args = ap.parse_args(argv)
    streams, num, initial = _load(args.plan)
    num = args.num_counters or num or _infer_num_counters(streams)
    findings = check(streams, num, initial=initial)
    n = sum(len(s) for s in streams)
    if not findings:
        print(f"ok: {len(streams)} rank(s), {n} instructions, {num} counters per rank")
        return 0
    for f in findings:
        print(f)
    print(f"REFUSED: {len(findings)} finding(s) in {n} instructions")
    return 1


if __name__ == "__main__":
    sys.exit(main())
