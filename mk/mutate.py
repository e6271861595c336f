"""Adversarial plans for the static verifier (mk.verify), and a small executor to judge them.

Used by tests/test_verify.py and bench/verify_mutations.py. Three parts:

* `build_plan`: valid multi-layer plans from row instructions (RMSNORM, COPY, RESIDUAL_ADD, NOOP) plus
  a test-only cross-rank copy (TEST_PEER_COPY, opcode 1001, registered here and nowhere else): per
  layer and token block, each rank normalises its rows, all-gathers column tiles into a gather
  buffer (double-buffered across layers) with PEER signals, adds them into the residual stream and
  joins a per-block barrier with an ALL signal. Queue orders are random topological orders.
* mutation classes (`MUTATIONS`): each `fn(plan, rng) -> Mutant | None` breaks one thing.
* `Executor`: runs a plan's torch semantics (`family_of(op).run_torch`) on K virtual SMs per rank
  taking instructions in queue order, honouring waits, with reads and writes of one instruction as
  separate steps, in priority-driven interleavings (random priorities, or chosen instructions
  delayed as long as possible). `judge` runs a mutant in up to `budget` interleavings and reports
  whether one stalls or ends with outputs different from the unmutated plan's.

A mutant is *equivalent* when no interleaving tried (the queue-order serial run, runs that delay the
instructions the mutation touched and the ones the verifier names, random ones) shows a stall or a
wrong output. The mutation classes are built to break synchronisation, not to compute something
else: storage renames (alias, reuse early) are only generated when the moved value gets a
conflicting access that no wait chain orders, and never move a value that is a plan output.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from mk.instructions.base import (Accesses, Buf, InstructionFamily, NormWeight, Region, family_of,
                                  register)
from mk.instructions.rows import A_DST, A_SRC, rows_instruction
from mk.ir import (ARG0, MAX_WAITS, NO_COUNTER, NUM_ARGS, W_OPCODE, W_SIGNAL, W_SIGNAL_COUNT,
                   W_SIGNAL_RANK, W_SIGNAL_SCOPE, W_WAIT0, Instruction, Op, SignalScope, serialize)

_FAMILIES: dict[int, InstructionFamily] = {}


def _family(op: int) -> InstructionFamily:
    f = _FAMILIES.get(op)
    if f is None:
        f = _FAMILIES[op] = family_of(op)
    return f


# ------------------------------------------------------------------------------------------------
# A test-only cross-rank copy
# ------------------------------------------------------------------------------------------------

TEST_PEER_COPY = 1001
A_DST_RANK = ARG0 + 3
GATHER2 = 90         # a second gather buffer (double buffering across layers), test-only id
FORK = 91            # a second branch of each layer (see build_plan), test-only id


@register
class _PeerCopyFamily(InstructionFamily):
    """TEST_PEER_COPY: dst rows on rank ARG0+3 <- src rows of this rank (same rows and columns)."""

    opcodes = (TEST_PEER_COPY,)
    opcode_names = {TEST_PEER_COPY: "TEST_PEER_COPY"}

    def accesses(self, instr: Instruction, rank: int) -> Accesses:
        r0, r1 = instr.row0, instr.row0 + instr.rows
        c0, c1 = instr.col0, instr.col0 + instr.cols
        a = instr.args
        return Accesses((Region(a[A_SRC - ARG0], r0, r1, c0, c1, rank),),
                        (Region(a[A_DST - ARG0], r0, r1, c0, c1, a[A_DST_RANK - ARG0]),))

    def run_torch(self, instr: Instruction, state) -> None:
        r0, r1 = instr.row0, instr.row0 + instr.rows
        c0, c1 = instr.col0, instr.col0 + instr.cols
        a = instr.args
        src = state.buf(a[A_SRC - ARG0])[r0:r1, c0:c1]
        state.buf(a[A_DST - ARG0], rank=a[A_DST_RANK - ARG0])[r0:r1, c0:c1].copy_(src)


def peer_copy(src: int, dst: int, dst_rank: int, row0, rows, col0, cols, layer=0, **header):
    args = [0] * NUM_ARGS
    args[A_SRC - ARG0], args[A_DST - ARG0], args[A_DST_RANK - ARG0] = int(src), int(dst), dst_rank
    return Instruction(opcode=TEST_PEER_COPY, layer=layer, row0=row0, rows=rows, col0=col0, cols=cols,
                       args=args, **header)


# ------------------------------------------------------------------------------------------------
# Valid plans
# ------------------------------------------------------------------------------------------------

OUTPUTS = (int(Buf.HIDDEN), int(Buf.NORMED))
BUFFERS = (int(Buf.HIDDEN), int(Buf.NORMED), int(Buf.SCRATCH), GATHER2, FORK)


@dataclass
class Plan:
    streams: list[np.ndarray]       # int32 [N_r, 32] per rank
    num_counters: int
    T: int
    H: int
    layers: int
    desc: str = ""

    @property
    def tp(self) -> int:
        return len(self.streams)

    def tensors(self) -> list[torch.Tensor]:
        return [torch.from_numpy(np.ascontiguousarray(s)) for s in self.streams]

    def copy(self) -> "Plan":
        return Plan([s.copy() for s in self.streams], self.num_counters, self.T, self.H, self.layers,
                    self.desc)


def _split(total: int, parts: int, rng) -> list[tuple[int, int]]:
    cuts = sorted(rng.choice(np.arange(1, total), size=parts - 1, replace=False).tolist()) \
        if parts > 1 else []
    b = [0] + cuts + [total]
    return [(b[k], b[k + 1] - b[k]) for k in range(parts)]


def build_plan(tp: int = 1, T: int = 12, H: int = 8, layers: int = 2, blocks: int = 2,
               tiles: int | None = None, seed: int = 0, order: str = "random",
               fork: bool = True) -> Plan:
    """A valid plan (see the module doc). tiles: column tiles per block (default tp), >= tp.
    fork: a second branch per layer, live at the same time as the gather: FORK <- old residual,
    residual += gathered, FORK += residual, residual += FORK (3h + 2g: every reordering of two
    dependent steps shows in the output, and FORK never ends up equal to the residual)."""
    rng = np.random.default_rng(seed)
    tiles = tiles or tp
    assert tiles >= tp and H >= tiles and T >= blocks
    row_blocks = _split(T, blocks, rng)
    col_tiles = _split(H, tiles, rng)
    counters: dict[tuple, int] = {}

    def ctr(*key):
        return counters.setdefault(key, len(counters))

    instrs: list[list[Instruction]] = [[] for _ in range(tp)]
    for l in range(layers):
        gather = int(Buf.SCRATCH) if l % 2 == 0 else GATHER2
        nw = NormWeight.ATTN if l % 2 == 0 else NormWeight.MLP
        for b, (r0, nr) in enumerate(row_blocks):
            for r in range(tp):
                waits = [(ctr("rdone", l - 1, b), tp)] if l else []
                instrs[r].append(rows_instruction(
                    Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, r0, nr, 0, H, layer=l, norm_weight=nw,
                    waits=waits, signal=ctr("norm", l, b)))
                for j, (c0, nc) in enumerate(col_tiles):
                    if j % tp != r:
                        continue
                    for s in range(tp):
                        hdr = dict(waits=[(ctr("norm", l, b), 1)], signal=ctr("gather", l, b))
                        if s == r:
                            instrs[r].append(rows_instruction(Op.COPY, Buf.NORMED, gather, r0, nr, c0,
                                                              nc, layer=l, **hdr))
                        else:
                            instrs[r].append(peer_copy(Buf.NORMED, gather, s, r0, nr, c0, nc, layer=l,
                                                       signal_scope=SignalScope.PEER,
                                                       signal_rank=s, **hdr))
                if fork:    # FORK <- old residual, before the gathered tiles are added to it
                    for j, (c0, nc) in enumerate(col_tiles):
                        # layer 0 reads the step's input: no wait (every wait of these plans
                        # is needed, so that lowering any target is a real bug)
                        instrs[r].append(rows_instruction(
                            Op.COPY, Buf.HIDDEN, FORK, r0, nr, c0, nc, layer=l,
                            waits=[(ctr("norm", l, b), 1)] if l else [], signal=ctr("fork", l, b)))
                for j, (c0, nc) in enumerate(col_tiles):
                    waits = [(ctr("gather", l, b), tiles)]
                    if fork:
                        waits.append((ctr("fork", l, b), tiles))
                    instrs[r].append(rows_instruction(
                        Op.RESIDUAL_ADD, gather, Buf.HIDDEN, r0, nr, c0, nc, layer=l,
                        waits=waits, signal=ctr("radd", l, b)))
                last = "radd"
                if fork:    # FORK += new residual; residual += FORK
                    for j, (c0, nc) in enumerate(col_tiles):
                        instrs[r].append(rows_instruction(
                            Op.RESIDUAL_ADD, Buf.HIDDEN, FORK, r0, nr, c0, nc, layer=l,
                            waits=[(ctr("radd", l, b), tiles)], signal=ctr("radd2", l, b)))
                    for j, (c0, nc) in enumerate(col_tiles):
                        instrs[r].append(rows_instruction(
                            Op.RESIDUAL_ADD, FORK, Buf.HIDDEN, r0, nr, c0, nc, layer=l,
                            waits=[(ctr("radd2", l, b), tiles)], signal=ctr("radd3", l, b)))
                    last = "radd3"
                instrs[r].append(rows_instruction(
                    Op.NOOP, Buf.HIDDEN, Buf.HIDDEN, r0, nr, 0, 0, layer=l,
                    waits=[(ctr(last, l, b), tiles)], signal=ctr("rdone", l, b),
                    signal_scope=SignalScope.ALL))
    for b, (r0, nr) in enumerate(row_blocks):
        for r in range(tp):
            instrs[r].append(rows_instruction(
                Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, r0, nr, 0, H, layer=layers - 1,
                norm_weight=NormWeight.FINAL, waits=[(ctr("rdone", layers - 1, b), tp)]))
    streams = [serialize(x).numpy() for x in instrs]
    plan = Plan(streams, len(counters), T, H, layers,
                f"tp={tp} T={T} H={H} layers={layers} blocks={blocks} tiles={tiles} seed={seed}")
    if order == "random":
        plan = _random_topological_order(plan, rng)
    return plan


def _signal_targets(w, r: int, tp: int):
    if w[W_SIGNAL] == NO_COUNTER:
        return []
    scope = int(w[W_SIGNAL_SCOPE])
    if scope == SignalScope.LOCAL:
        return [r]
    if scope == SignalScope.PEER:
        return [int(w[W_SIGNAL_RANK])]
    return list(range(tp))


def _gids(plan: Plan):
    base = np.cumsum([0] + [len(s) for s in plan.streams]).tolist()
    locs = [(r, i) for r, s in enumerate(plan.streams) for i in range(len(s))]
    return base, locs


def _waits(w):
    return [(int(w[W_WAIT0 + 2 * k]), int(w[W_WAIT0 + 2 * k + 1])) for k in range(MAX_WAITS)
            if w[W_WAIT0 + 2 * k] != NO_COUNTER]


def _random_topological_order(plan: Plan, rng) -> Plan:
    """Shuffle each rank's queue into the projection of one random global topological order."""
    base, locs = _gids(plan)
    N = len(locs)
    sig: dict[tuple[int, int], list[int]] = {}
    for g, (r, i) in enumerate(locs):
        for dr in _signal_targets(plan.streams[r][i], r, plan.tp):
            sig.setdefault((dr, int(plan.streams[r][i][W_SIGNAL])), []).append(g)
    indeg = [0] * N
    succ: list[list[int]] = [[] for _ in range(N)]
    for g, (r, i) in enumerate(locs):
        for c, _t in _waits(plan.streams[r][i]):
            for s in sig.get((r, c), []):
                succ[s].append(g)
                indeg[g] += 1
    ready = [g for g in range(N) if indeg[g] == 0]
    order = []
    while ready:
        g = ready.pop(int(rng.integers(len(ready))))
        order.append(g)
        for s in succ[g]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    assert len(order) == N, "the plan's dependency graph has a cycle"
    per_rank = [[] for _ in range(plan.tp)]
    for g in order:
        r, i = locs[g]
        per_rank[r].append(plan.streams[r][i])
    out = plan.copy()
    out.streams = [np.stack(x).astype(np.int32) for x in per_rank]
    return out


# ------------------------------------------------------------------------------------------------
# An independent happens-before closure (for generating mutants and choosing delays)
# ------------------------------------------------------------------------------------------------

@dataclass
class _Graph:
    locs: list[tuple[int, int]]
    base: list[int]
    order: list[int]                # a topological order of the signal -> wait edges
    anc: list[int]                  # bitset of instructions ordered before (self included)
    signalers: dict[tuple[int, int], list[int]]

    def ordered(self, a: int, b: int) -> bool:
        return bool((self.anc[b] >> a) & 1) or bool((self.anc[a] >> b) & 1)


def hb_graph(plan: Plan) -> _Graph:
    base, locs = _gids(plan)
    N = len(locs)
    sig: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for g, (r, i) in enumerate(locs):
        w = plan.streams[r][i]
        for dr in _signal_targets(w, r, plan.tp):
            sig.setdefault((dr, int(w[W_SIGNAL])), []).append((g, int(w[W_SIGNAL_COUNT])))
    preds: list[set[int]] = [set() for _ in range(N)]
    for g, (r, i) in enumerate(locs):
        for c, t in _waits(plan.streams[r][i]):
            ss = sig.get((r, c), [])
            tot = sum(n for _, n in ss)
            preds[g].update(s for s, n in ss if n > tot - t and s != g)
    # Kahn, ties by queue position; cycles broken by queue position
    indeg = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in range(N)]
    for g in range(N):
        for s in preds[g]:
            succ[s].append(g)
    key = [(locs[g][1], locs[g][0]) for g in range(N)]
    heap = [(key[g], g) for g in range(N) if indeg[g] == 0]
    heapq.heapify(heap)
    done = [False] * N
    order = []
    while len(order) < N:
        if heap:
            _, g = heapq.heappop(heap)
            if done[g]:
                continue
        else:
            g = min((x for x in range(N) if not done[x]), key=lambda x: key[x])
        done[g] = True
        order.append(g)
        for s in succ[g]:
            indeg[s] -= 1
            if indeg[s] == 0 and not done[s]:
                heapq.heappush(heap, (key[s], s))
    anc = [0] * N
    for g in order:
        a = 1 << g
        for s in preds[g]:
            a |= anc[s]
        anc[g] = a
    return _Graph(locs, base, order, anc, {k: [g for g, _ in v] for k, v in sig.items()})


# ------------------------------------------------------------------------------------------------
# Executor
# ------------------------------------------------------------------------------------------------

class _State:
    def __init__(self, bufs, rank, weights, snapshot=False, meta=None, tp=1):
        self.bufs, self.rank, self.weights, self.snapshot = bufs, rank, weights, snapshot
        self.meta, self.tp = meta, tp
        self.cache: dict[tuple[int, int], torch.Tensor] = {}

    def buf(self, buf_id: int, rank: int | None = None):
        key = (self.rank if rank is None else int(rank), int(buf_id))
        if not self.snapshot:
            return self.bufs[key]
        t = self.cache.get(key)
        if t is None:
            t = self.cache[key] = self.bufs[key].clone()
        return t


def make_weights(layers: int, H: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(attn_norm=1 + torch.rand(layers, H, generator=g),
                           mlp_norm=1 + torch.rand(layers, H, generator=g),
                           final_norm=1 + torch.rand(H, generator=g),
                           config=SimpleNamespace(rms_norm_eps=1e-5))


class Executor:
    """Runs a plan with K virtual SMs per rank (None: one per instruction, all resident)."""

    def __init__(self, plan: Plan, seed: int = 0, world=None, outputs=OUTPUTS):
        """world: None for the row plans of this module (random buffers and norm weights), or
        rank -> a state with .bufs {buf: tensor}, .weights and .meta (e.g. mk.vm's RankState
        after reset_activations) for the planner's plans; outputs: the buffers compared."""
        self.plan = plan
        self.base, self.locs = _gids(plan)
        self.N = len(self.locs)
        self.outputs = tuple(outputs)
        if world is None:
            w = make_weights(plan.layers, plan.H, seed)
            self.weights = {r: w for r in range(plan.tp)}
            self.meta = None
            g = torch.Generator().manual_seed(seed + 1)
            self.init = {(r, b): torch.randn(plan.T, plan.H, generator=g)
                         for r in range(plan.tp) for b in BUFFERS}
        else:
            self.weights = {r: world[r].weights for r in range(plan.tp)}
            self.meta = world[0].meta
            self.init = {(r, int(b)): t.clone() for r in range(plan.tp) for b, t in world[r].bufs.items()}
        self.instrs, self.fams, self.writes, self.waits, self.sigs = [], [], [], [], []
        for r, i in self.locs:
            w = plan.streams[r][i]
            ins = Instruction.decode(w)
            fam = _family(ins.opcode)
            self.instrs.append(ins)
            self.fams.append(fam)
            self.writes.append(_accesses(fam, ins, r, self.meta).writes)
            self.waits.append(_waits(w))
            self.sigs.append([(dr, int(w[W_SIGNAL]), int(w[W_SIGNAL_COUNT]))
                              for dr in _signal_targets(w, r, plan.tp)])

    def run(self, K: int | None = None, prio=None, delay=(), rng=None, switch_p: float = 0.0):
        """One interleaving. Returns ("ok", outputs) or ("stall", description)."""
        rng = rng if rng is not None else np.random.default_rng(0)
        N, tp = self.N, self.plan.tp
        if prio is None:
            prio = rng.random(N)
        prio = np.asarray(prio, dtype=float).copy()
        for g in delay:
            prio[g] -= 1e9
        bufs = {k: v.clone() for k, v in self.init.items()}
        counters = [[0] * self.plan.num_counters for _ in range(tp)]
        nxt = [0] * tp
        n = [len(s) for s in self.plan.streams]
        free = [K if K else N + 1 for _ in range(tp)]
        heap: list = []
        blocked: dict[tuple[int, int], list[int]] = {}
        phase = [0] * N
        shadow = [None] * N
        seq = [0]
        done = [0]

        def push(g):
            seq[0] += 1
            heapq.heappush(heap, (-prio[g], seq[0], g))

        def try_ready(g):
            r = self.locs[g][0]
            for c, t in self.waits[g]:
                if counters[r][c] < t:
                    blocked.setdefault((r, c), []).append(g)
                    return
            push(g)

        def fetch(r):
            while free[r] > 0 and nxt[r] < n[r]:
                g = self.base[r] + nxt[r]
                nxt[r] += 1
                free[r] -= 1
                try_ready(g)

        for r in range(tp):
            fetch(r)
        while heap:
            _, _, g = heapq.heappop(heap)
            r = self.locs[g][0]
            if phase[g] == 0:           # read and compute
                st = _State(bufs, r, self.weights[r], snapshot=True, meta=self.meta, tp=tp)
                self.fams[g].run_torch(self.instrs[g], st)
                shadow[g] = st.cache
                phase[g] = 1
                if switch_p and rng.random() < switch_p:
                    prio[g] = rng.random() - (1e9 if g in delay else 0)
                push(g)
            elif phase[g] == 1:         # store
                for reg in self.writes[g]:
                    src = shadow[g][(reg.rank, reg.buf)]
                    bufs[(reg.rank, reg.buf)][reg.row0:reg.row1, reg.col0:reg.col1] = \
                        src[reg.row0:reg.row1, reg.col0:reg.col1]
                shadow[g] = None
                phase[g] = 2
                push(g)
            else:                       # signal, free the SM
                phase[g] = 3
                done[0] += 1
                for dr, c, cnt in self.sigs[g]:
                    counters[dr][c] += cnt
                    waiting = blocked.pop((dr, c), [])
                    for x in waiting:
                        try_ready(x)
                free[r] += 1
                fetch(r)
        if done[0] < N:
            stuck = [self.locs[g] for g in range(N) if phase[g] == 0 and
                     nxt[self.locs[g][0]] > self.locs[g][1]]
            return "stall", f"{N - done[0]} instructions never ran; waiting: {stuck[:4]}"
        return "ok", {(r, b): bufs[(r, b)] for r in range(tp) for b in self.outputs}


def same_outputs(a, b) -> bool:
    """Bitwise equal (NaN where the other has NaN: buffers may start as NaN)."""
    return all(torch.equal(a[k], b[k]) or
               (a[k].is_floating_point() and torch.allclose(a[k], b[k], rtol=0, atol=0, equal_nan=True))
               for k in a)


def _accesses(fam, ins, rank, meta):
    import inspect
    takes = _TAKES_META.get(type(fam))
    if takes is None:
        takes = _TAKES_META[type(fam)] = len(inspect.signature(fam.accesses).parameters) >= 3
    return fam.accesses(ins, rank, meta) if takes else fam.accesses(ins, rank)


_TAKES_META: dict = {}


# ------------------------------------------------------------------------------------------------
# Mutants
# ------------------------------------------------------------------------------------------------

@dataclass
class Mutant:
    cls: str
    plan: Plan
    desc: str
    hints: list[set[int]] = field(default_factory=list)   # instruction sets worth delaying (gids)


def _all_waits(plan: Plan):
    return [(r, i, k) for r, s in enumerate(plan.streams) for i in range(len(s))
            for k in range(MAX_WAITS) if s[i][W_WAIT0 + 2 * k] != NO_COUNTER]


def _name(plan: Plan, r: int, i: int) -> str:
    w = plan.streams[r][i]
    try:
        op = Op(int(w[W_OPCODE])).name
    except ValueError:
        op = "TEST_PEER_COPY"
    return f"rank {r} #{i} {op} layer {int(w[1])}"


def _signaler_hints(plan: Plan, G: _Graph, r: int, i: int, c: int) -> list[set[int]]:
    """Delay sets that let a waiter (r, i) overtake each signaler of its counter c."""
    w = G.base[r] + i
    out = []
    for s in G.signalers.get((r, c), []):
        out.append({s})
        out.append({x for x in range(len(G.locs)) if (G.anc[s] >> x) & 1 and not (G.anc[w] >> x) & 1})
    return out


def m_drop_wait(plan: Plan, rng) -> Mutant | None:
    ws = _all_waits(plan)
    r, i, k = ws[int(rng.integers(len(ws)))]
    m = plan.copy()
    c, t = int(m.streams[r][i][W_WAIT0 + 2 * k]), int(m.streams[r][i][W_WAIT0 + 2 * k + 1])
    m.streams[r][i][W_WAIT0 + 2 * k] = NO_COUNTER
    m.streams[r][i][W_WAIT0 + 2 * k + 1] = 0
    return Mutant("drop a wait", m, f"{_name(plan, r, i)}: dropped wait (counter {c}, target {t})",
                  _signaler_hints(plan, hb_graph(plan), r, i, c))


def m_lower_target(plan: Plan, rng) -> Mutant | None:
    ws = _all_waits(plan)
    r, i, k = ws[int(rng.integers(len(ws)))]
    m = plan.copy()
    c, t = int(m.streams[r][i][W_WAIT0 + 2 * k]), int(m.streams[r][i][W_WAIT0 + 2 * k + 1])
    nt = int(rng.integers(1, t)) if t > 1 else 0
    m.streams[r][i][W_WAIT0 + 2 * k + 1] = nt
    return Mutant("lower a target", m, f"{_name(plan, r, i)}: counter {c} target {t} -> {nt}",
                  _signaler_hints(plan, hb_graph(plan), r, i, c))


def _totals(plan: Plan):
    tot: dict[tuple[int, int], int] = {}
    for r, s in enumerate(plan.streams):
        for w in s:
            for dr in _signal_targets(w, r, plan.tp):
                key = (dr, int(w[W_SIGNAL]))
                tot[key] = tot.get(key, 0) + int(w[W_SIGNAL_COUNT])
    return tot


def m_raise_target(plan: Plan, rng) -> Mutant | None:
    ws = _all_waits(plan)
    r, i, k = ws[int(rng.integers(len(ws)))]
    m = plan.copy()
    c, t = int(m.streams[r][i][W_WAIT0 + 2 * k]), int(m.streams[r][i][W_WAIT0 + 2 * k + 1])
    nt = _totals(plan).get((r, c), 0) + int(rng.integers(1, 4))
    m.streams[r][i][W_WAIT0 + 2 * k + 1] = nt
    return Mutant("raise a target", m, f"{_name(plan, r, i)}: counter {c} target {t} -> {nt}")


def m_move_before_producer(plan: Plan, rng) -> Mutant | None:
    G = hb_graph(plan)
    cands = []
    for r, s in enumerate(plan.streams):
        for i in range(len(s)):
            for c, _t in _waits(s[i]):
                for p in G.signalers.get((r, c), []):
                    pr, pi = G.locs[p]
                    if pr == r and pi < i:
                        cands.append((r, i, pi, c))
                    elif pr != r:
                        cands.append((r, i, -1, c))
    if not cands:
        return None
    r, i, pi, c = cands[int(rng.integers(len(cands)))]
    if pi < 0:                      # producer on another rank: move the waiter earlier in its queue
        if i == 0:
            return None
        pi = int(rng.integers(0, i))
        what = f"to #{pi} (its producer of counter {c} is on another rank)"
    else:
        what = f"before its producer #{pi} of counter {c}"
    m = plan.copy()
    s = m.streams[r]
    row = s[i].copy()
    m.streams[r] = np.concatenate([s[:pi], row[None], s[pi:i], s[i + 1:]]).astype(np.int32)
    return Mutant("move before producer", m, f"{_name(plan, r, i)} moved {what}")


def m_drop_signal(plan: Plan, rng) -> Mutant | None:
    waited = {(r, c) for r, s in enumerate(plan.streams) for w in s for c, _ in _waits(w)}
    cands = [(r, i) for r, s in enumerate(plan.streams) for i in range(len(s))
             if any((dr, int(s[i][W_SIGNAL])) in waited
                    for dr in _signal_targets(s[i], r, plan.tp))]
    if not cands:
        return None
    r, i = cands[int(rng.integers(len(cands)))]
    m = plan.copy()
    w = m.streams[r][i]
    if w[W_SIGNAL_SCOPE] == SignalScope.ALL and plan.tp > 1 and rng.random() < 0.5:
        w[W_SIGNAL_SCOPE] = SignalScope.LOCAL
        what = "ALL signal narrowed to LOCAL (the peers' signals dropped)"
    else:
        what = f"dropped signal of counter {int(w[W_SIGNAL])}"
        w[W_SIGNAL] = NO_COUNTER
    return Mutant("drop a signal", m, f"{_name(plan, r, i)}: {what}")


# --- storage renames -----------------------------------------------------------------------------

def _value_groups(plan: Plan, G: _Graph):
    """Values of the plan's sequential semantics, as groups of producer writes and consumer reads
    (union of def -> use over unit cells), with the positions they live over."""
    N = len(G.locs)
    pos = {g: k for k, g in enumerate(G.order)}
    acc = []
    for r, i in G.locs:
        ins = Instruction.decode(plan.streams[r][i])
        a = _family(ins.opcode).accesses(ins, r)
        acc.append((ins, a))
    parent: dict = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    last: dict[tuple, int] = {}             # (rank, buf, row, col) -> def gid
    initial_readers = set()
    final_defs = set()
    for g in G.order:
        ins, a = acc[g]
        for k, reg in enumerate(a.reads):
            find(("r", g, k))
            for row in range(reg.row0, reg.row1):
                for col in range(reg.col0, reg.col1):
                    d = last.get((reg.rank, reg.buf, row, col))
                    if d is None:
                        initial_readers.add(("r", g, k))
                    else:
                        union(("w", d), ("r", g, k))
        for reg in a.writes:
            find(("w", g))
            for row in range(reg.row0, reg.row1):
                for col in range(reg.col0, reg.col1):
                    last[(reg.rank, reg.buf, row, col)] = g
    for (rank, buf, row, col), d in last.items():
        if buf in OUTPUTS:
            final_defs.add(d)
    groups: dict = {}
    for x in list(parent):
        groups.setdefault(find(x), []).append(x)
    out = []
    for members in groups.values():
        prods = [x[1] for x in members if x[0] == "w"]
        reads = [(x[1], x[2]) for x in members if x[0] == "r"]
        if not prods or not reads:
            continue
        ok = all(acc[p][0].opcode in (Op.COPY, Op.RMSNORM, TEST_PEER_COPY) for p in prods)
        ok = ok and all(k == 0 and acc[g][0].opcode != Op.NOOP for g, k in reads)
        ok = ok and not any(("r", g, k) in initial_readers for g, k in reads)
        ok = ok and not any(p in final_defs for p in prods)
        bufs = {acc[p][1].writes[0].buf for p in prods}
        if not ok or len(bufs) != 1:
            continue
        cells = set()
        for p in prods:
            reg = acc[p][1].writes[0]
            cells |= {(reg.rank, row, col) for row in range(reg.row0, reg.row1)
                      for col in range(reg.col0, reg.col1)}
        span = (min(pos[p] for p in prods), max(pos[g] for g, _ in reads))
        out.append(SimpleNamespace(prods=prods, reads=reads, buf=bufs.pop(), cells=cells, span=span))
    return out, acc, pos


def _rename(plan: Plan, G: _Graph, V, new_buf: int) -> Plan:
    m = plan.copy()
    for p in V.prods:
        r, i = G.locs[p]
        m.streams[r][i][A_DST] = new_buf
    for g, _k in V.reads:
        r, i = G.locs[g]
        m.streams[r][i][A_SRC] = new_buf
    return m


def _makes_self_copy(plan: Plan, G: _Graph, V, nb: int) -> bool:
    """Would the rename turn a copy into a same-rank copy of a region onto itself? Such a copy
    rewrites the bytes already there: a race on it is real but shows no wrong value, so these
    degenerate renames are not generated."""
    for p in V.prods:
        r, i = G.locs[p]
        w = plan.streams[r][i]
        if w[W_OPCODE] == Op.COPY and w[A_SRC] == nb:
            return True
    for g, _k in V.reads:
        r, i = G.locs[g]
        w = plan.streams[r][i]
        if w[W_OPCODE] == Op.COPY and w[A_DST] == nb:
            return True
        if w[W_OPCODE] == TEST_PEER_COPY and w[A_DST] == nb and w[A_DST_RANK] == r:
            return True
    return False


_CANDIDATES: dict = {}


def _storage_mutant(plan: Plan, rng, want: str) -> Mutant | None:
    key = (id(plan), want)
    if key not in _CANDIDATES or _CANDIDATES[key][0] is not plan:
        _CANDIDATES[key] = (plan, _storage_candidates(plan, want))
    G, pos, cands = _CANDIDATES[key][1]
    if not cands:
        return None
    V, nb, races = cands[int(rng.integers(len(cands)))]
    m = _rename(plan, G, V, nb)
    hints = []
    for a, b in races[:6]:
        first, second = (a, b) if pos[a] < pos[b] else (b, a)
        hints += [{first}, {second}]
    r, i = G.locs[V.prods[0]]
    cls = "alias two buffers" if want == "alias" else "reuse a buffer early"
    return Mutant(cls, m, f"value written by {_name(plan, r, i)} ({len(V.prods)} writers, "
                  f"{len(V.reads)} readers) moved from buf {V.buf} to buf {nb}", hints)


def _storage_candidates(plan: Plan, want: str):
    G = hb_graph(plan)
    groups, acc, pos = _value_groups(plan, G)
    # every access by cell, to find what the renamed value collides with
    by_cell: dict[tuple, list[tuple[int, str]]] = {}
    for g in range(len(G.locs)):
        _, a = acc[g]
        for kind, regs in (("r", a.reads), ("w", a.writes)):
            for reg in regs:
                for row in range(reg.row0, reg.row1):
                    for col in range(reg.col0, reg.col1):
                        by_cell.setdefault((reg.rank, reg.buf, row, col), []).append((g, kind))
    later_def = {}   # does a later write cover the cell (needed when moving into an output buffer)
    cands = []
    for V in groups:
        mine = set(V.prods) | {g for g, _ in V.reads}
        for nb in BUFFERS:
            if nb == V.buf or _makes_self_copy(plan, G, V, nb):
                continue
            races, overlap_live = [], False
            covered = True
            for (rank, row, col) in V.cells:
                others = [(g, k) for g, k in by_cell.get((rank, nb, row, col), []) if g not in mine]
                if nb in OUTPUTS:
                    key = (rank, nb, row, col)
                    if key not in later_def:
                        later_def[key] = [pos[g] for g, k in by_cell.get(key, []) if k == "w"]
                    if not any(p > V.span[1] for p in later_def[key]):
                        covered = False
                for g, k in others:
                    if V.span[0] <= pos[g] <= V.span[1]:
                        overlap_live = True
                    mine_acc = [(p, "w") for p in V.prods] + [(q, "r") for q, _ in V.reads]
                    for q, kq in mine_acc:
                        if (k == "w" or kq == "w") and not G.ordered(q, g):
                            races.append((q, g))
            if not covered or not races:
                continue
            if (want == "alias") == overlap_live:
                cands.append((V, nb, races))
    return G, pos, cands


def m_alias(plan: Plan, rng) -> Mutant | None:
    return _storage_mutant(plan, rng, "alias")


def m_reuse_early(plan: Plan, rng) -> Mutant | None:
    return _storage_mutant(plan, rng, "reuse")


MUTATIONS = {
    "drop a wait": m_drop_wait,
    "lower a target": m_lower_target,
    "raise a target": m_raise_target,
    "move before producer": m_move_before_producer,
    "alias two buffers": m_alias,
    "drop a signal": m_drop_signal,
    "reuse a buffer early": m_reuse_early,
}


def valid_plans(seeds: int = 3) -> list[Plan]:
    """The plans the mutants are made from: TP 1..4, several shapes and random queue orders."""
    shapes = [dict(tp=1, T=8, H=6, layers=3, blocks=2, tiles=2),
              dict(tp=1, T=10, H=8, layers=2, blocks=3, tiles=3),
              dict(tp=2, T=8, H=8, layers=2, blocks=2),
              dict(tp=2, T=12, H=8, layers=3, blocks=2, tiles=3),
              dict(tp=3, T=9, H=9, layers=2, blocks=2),
              dict(tp=4, T=8, H=8, layers=2, blocks=1)]
    return [build_plan(seed=s, **kw) for s in range(seeds) for kw in shapes]


def generate(plans: list[Plan], per_class: int, seed: int = 0) -> list[Mutant]:
    """`per_class` distinct mutants of each class, spread over the plans."""
    rng = np.random.default_rng(seed)
    out = []
    for cls, fn in MUTATIONS.items():
        seen = set()
        tries = 0
        while sum(1 for m in out if m.cls == cls) < per_class and tries < per_class * 20:
            tries += 1
            k = int(rng.integers(len(plans)))
            mut = fn(plans[k], rng)
            if mut is None:
                continue
            key = (k, b"".join(s.tobytes() for s in mut.plan.streams))
            if key in seen:
                continue
            seen.add(key)
            mut.source = k
            out.append(mut)
    return out


# ------------------------------------------------------------------------------------------------
# Judging a mutant in the executor
# ------------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    outcome: str        # "stall" | "wrong" | "same"
    runs: int
    how: str = ""


def _finding_hints(mut_plan: Plan, findings) -> list[tuple[int | None, set[int]]]:
    """(K, delay set) configurations aimed at what the verifier reports."""
    G = hb_graph(mut_plan)
    out: list[tuple[int | None, set[int]]] = []
    for f in findings[:6]:
        if f.kind == "race":
            (ra, ia), (rb, ib) = f.instrs
            a, b = G.base[ra] + ia, G.base[rb] + ib
            out.append((None, {a}))
            out.append((None, {x for x in range(len(G.locs))
                               if (G.anc[a] >> x) & 1 and not (G.anc[b] >> x) & 1}))
        elif f.kind in ("counter", "format") and f.detail in ("below", "") and f.counter:
            r, c = f.counter
            (wr, wi), = f.instrs[:1]
            for d in _signaler_hints(mut_plan, G, wr, wi, c):
                out.append((None, d))
        elif f.kind == "format" and f.instrs:
            r, i = f.instrs[0]
            w = mut_plan.streams[r][i]
            for k in range(MAX_WAITS):
                c = int(w[W_WAIT0 + 2 * k])
                if c != NO_COUNTER and w[W_WAIT0 + 2 * k + 1] <= 0:
                    for d in _signaler_hints(mut_plan, G, r, i, c):
                        out.append((None, d))
        else:
            out.append((1, set()))
    return out


def judge(original: Plan, mutant: Mutant, findings=(), budget: int = 50, seed: int = 0,
          reference=None, executor_seed: int = 0, **executor_kw) -> Verdict:
    """Run the mutant in up to `budget` interleavings; stop at the first stall or wrong output.
    executor_kw: world/outputs for the planner's plans (see Executor)."""
    rng = np.random.default_rng(seed)
    if reference is None:
        status, reference = Executor(original, executor_seed, **executor_kw).run(K=1)
        assert status == "ok", "the unmutated plan stalls"
    try:
        ex = Executor(mutant.plan, executor_seed, **executor_kw)
    except Exception as e:  # noqa: BLE001 - a mutant the executor cannot even decode
        return Verdict("stall", 0, f"undecodable: {e}")
    N = ex.N
    queue_prio = [-(i + 0.001 * r) for r, i in ex.locs]
    configs: list = [(1, set(), queue_prio)]
    configs += [(K, d, None) for K, d in _finding_hints(mutant.plan, findings)]
    configs += [(None, d, None) for d in mutant.hints]
    runs = 0
    k = 0
    while runs < budget:
        if k < len(configs):
            K, delay, prio = configs[k]
            k += 1
            switch = 0.0
        else:
            K = [1, 2, 4, None][int(rng.integers(4))]
            delay = {int(rng.integers(N))} if rng.random() < 0.7 else set()
            prio, switch = None, 0.1
        runs += 1
        status, out = ex.run(K=K, prio=prio, delay=delay, rng=rng, switch_p=switch)
        if status == "stall":
            return Verdict("stall", runs, f"K={K} delay={sorted(delay)[:4]}: {out}")
        if not same_outputs(out, reference):
            return Verdict("wrong", runs, f"K={K} delay={sorted(delay)[:4]}")
    return Verdict("same", runs)
