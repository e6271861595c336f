"""The planner: exact counter targets, topological queue order, tiling, TP symmetry, errors."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest
import torch

from mk.batch import SeqChunk, StepBatch
from mk.config import KernelConfig, ModelConfig, ParallelConfig
from mk.ir import (MAX_WAITS, NO_COUNTER, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0, W_ROWS,
                   W_SIGNAL, W_SIGNAL_COUNT, W_SIGNAL_RANK, W_SIGNAL_SCOPE, W_WAIT0, Op,
                   SignalScope)
from mk.plan import POLICIES, PlanConfig, Planner, _gemm_k, build_meta, plan_step

MODEL = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=3, num_heads=8, num_kv_heads=2,
                    head_dim=8, vocab_size=256)
KERNEL = KernelConfig(token_block=8, page_size=4, max_batch_tokens=96, max_seqs=8, max_context=128,
                      num_kv_pages=200)
CFG = PlanConfig(kv_split=16, o_tile=8, down_tile=8, mlp_tile=16, lm_tile=32, qkv_tile=8)


def mixed_batch():
    """Prefill from 0 over several blocks, a prefill chunk at start_pos > 0, decodes with long
    contexts (split KV), a short decode."""
    return StepBatch([
        SeqChunk(list(range(1, 20)), 0, list(range(0, 5))),
        SeqChunk([3], 40, list(range(20, 31))),
        SeqChunk(list(range(30, 52)), 9, list(range(40, 48))),
        SeqChunk([7], 2, [60]),
        SeqChunk(list(range(5, 13)), 33, list(range(70, 81))),
    ])


def waits_of(w):
    return [(int(w[W_WAIT0 + 2 * i]), int(w[W_WAIT0 + 2 * i + 1])) for i in range(MAX_WAITS)
            if w[W_WAIT0 + 2 * i] != NO_COUNTER]


def receivers(w, rank, n):
    scope = int(w[W_SIGNAL_SCOPE])
    if scope == SignalScope.LOCAL:
        return [rank]
    if scope == SignalScope.PEER:
        return [int(w[W_SIGNAL_RANK])]
    return list(range(n))


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("policy", POLICIES)
def test_targets_exact_and_order_topological(tp, policy, split_k):
    cfg = PlanConfig(**{**CFG.__dict__, "policy": policy, "split_k": split_k, "splitk_align": 8})
    plans = [plan_step(mixed_batch(), MODEL, ParallelConfig(tp, r), KERNEL, cfg) for r in range(tp)]
    streams = [p.instrs.numpy() for p in plans]
    # final counter values when every rank runs its stream
    final = np.zeros((tp, plans[0].num_counters), np.int64)
    # producers[rank][counter]: queue indices (in the producer's stream) of its signals
    last_producer = np.full((tp, plans[0].num_counters), -1, np.int64)
    for p, s in enumerate(streams):
        for i, w in enumerate(s):
            if w[W_SIGNAL] == NO_COUNTER:
                continue
            for q in receivers(w, p, tp):
                final[q, w[W_SIGNAL]] += w[W_SIGNAL_COUNT]
                last_producer[q, w[W_SIGNAL]] = max(last_producer[q, w[W_SIGNAL]], i)
    for r, (plan, s) in enumerate(zip(plans, streams)):
        assert np.array_equal(final[r], plan.targets.numpy()), f"rank {r} targets"
        for i, w in enumerate(s):
            for c, t in waits_of(w):
                assert t == final[r, c], (f"rank {r} instr {i} waits {plan.describe_counter(c)} >= "
                                          f"{t}, counter ends at {final[r, c]}")
                # the ranks' streams have one structure: index order is a global topological order
                assert last_producer[r, c] < i, f"rank {r} instr {i} waits on a later producer"


def test_ranks_differ_only_in_reduce_slice():
    plans = [plan_step(mixed_batch(), MODEL, ParallelConfig(4, r), KERNEL, CFG) for r in range(4)]
    base = plans[0].instrs
    red = base[:, W_OPCODE] == int(Op.TP_REDUCE)
    assert red.any()
    for r, p in enumerate(plans):
        assert torch.equal(p.instrs[~red], base[~red])
        assert (p.instrs[red, W_COL0] == r * MODEL.hidden_size // 4).all()
        assert torch.equal(plans[0].for_rank(r).instrs, p.instrs)


@pytest.mark.parametrize("split_k", [1, 0])
def test_layers_are_one_template(split_k):
    cfg = PlanConfig(**{**CFG.__dict__, "split_k": split_k, "splitk_align": 8})
    plan = plan_step(mixed_batch(), MODEL, ParallelConfig(2, 0), KERNEL, cfg)
    assert (split_k == 0) == bool((plan.instrs[:, W_OPCODE] == Op.SPLITK_REDUCE).any())
    s = plan.instrs.numpy()
    layers = [s[s[:, W_LAYER] == layer] for layer in range(MODEL.num_layers)]
    body = [x[~np.isin(x[:, W_OPCODE], [Op.EMBED, Op.LM_NORM, Op.LM_HEAD])] for x in layers]
    body[0] = body[0][~((body[0][:, W_OPCODE] == Op.TP_REDUCE) & (body[0][:, W_SIGNAL] < plan.layout["cpl"]))]
    cpl = plan.layout["cpl"]
    for layer in range(1, MODEL.num_layers):
        a, b = body[0].copy(), body[layer].copy()
        assert a.shape == b.shape
        for wd in [W_WAIT0 + 2 * i for i in range(MAX_WAITS)] + [W_SIGNAL]:
            has = a[:, wd] != NO_COUNTER
            assert (b[has, wd] - a[has, wd] == layer * cpl).all()
            a[has, wd] = b[has, wd]
        a[:, W_LAYER] = layer
        assert np.array_equal(a, b)


def test_policies_same_instructions_different_order():
    seen = {}
    for policy in POLICIES:
        p = plan_step(mixed_batch(), MODEL, ParallelConfig(2, 0), KERNEL,
                      PlanConfig(**{**CFG.__dict__, "policy": policy}))
        seen[policy] = p.instrs
    rows = {k: sorted(map(tuple, v.tolist())) for k, v in seen.items()}
    assert rows["op_major"] == rows["block_major"] == rows["interleave"]
    assert not torch.equal(seen["op_major"], seen["interleave"])
    # interleave: attention (memory-bound) sits between GEMM tiles of other blocks
    ops = seen["interleave"][:, W_OPCODE].tolist()
    first_attn = ops.index(Op.ATTENTION)
    assert Op.QKV_ROPE in ops[first_attn:first_attn + 40]


@pytest.mark.parametrize("raster", [2, 3, 8])     # 8: the default
@pytest.mark.parametrize("tp", [1, 2])
def test_raster_blocks_reorders_gemm_tiles_only(tp, raster):
    """op_major with raster_blocks: the same instructions; within each run of `raster` token
    blocks a GEMM's tiles go column tile by column tile (each column's blocks together), every
    other instruction keeps op_major's place; the verifier accepts the plans (targets, order,
    races)."""
    from mk.verify import check
    base_cfg = PlanConfig(**{**CFG.__dict__, "policy": "op_major", "split_k": 3, "splitk_align": 8,
                             "raster_blocks": 1})
    cfg = PlanConfig(**{**base_cfg.__dict__, "raster_blocks": raster})
    base = plan_step(mixed_batch(), MODEL, ParallelConfig(tp, 0), KERNEL, base_cfg).instrs.numpy()
    plans = [plan_step(mixed_batch(), MODEL, ParallelConfig(tp, r), KERNEL, cfg) for r in range(tp)]
    got = plans[0].instrs.numpy()
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, base.tolist()))
    assert not np.array_equal(got, base)
    gemm_ops = [int(o) for o in (Op.QKV_ROPE, Op.O_PROJ, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)]
    gemm, base_gemm = np.isin(got[:, W_OPCODE], gemm_ops), np.isin(base[:, W_OPCODE], gemm_ops)
    assert np.array_equal(got[~gemm], base[~base_gemm])
    layer0 = got[(got[:, W_LAYER] == 0) & (got[:, W_OPCODE] == int(Op.GATE_UP))]
    blocks = layer0[:, W_ROW0] // KERNEL.token_block
    assert len(np.unique(blocks)) > 1
    for grp in np.unique(blocks // raster):
        run = layer0[blocks // raster == grp]
        # column tiles in order, each column's tiles of all the run's blocks together (split
        # tiles: split 0 of each block, then split 1, ...)
        assert (np.diff(run[:, W_COL0]) >= 0).all()
        run_blocks = set(np.unique(blocks[blocks // raster == grp]).tolist())
        for c in np.unique(run[:, W_COL0]):
            assert set((run[run[:, W_COL0] == c, W_ROW0] // KERNEL.token_block).tolist()) == run_blocks
    assert check([p.instrs for p in plans], plans[0].num_counters, meta=plans[0].meta) == []
    with pytest.raises(ValueError, match="raster_blocks"):
        PlanConfig(raster_blocks=0)


def tiles_cover(plan, op, width):
    s = plan.instrs.numpy()
    s = s[(s[:, W_OPCODE] == op) & (s[:, W_LAYER] == 0)]
    cover = collections.Counter()
    for w in s:
        for r in range(w[W_ROW0], w[W_ROW0] + w[W_ROWS]):
            for c in range(w[W_COL0], w[W_COL0] + w[W_COLS]):
                cover[r, c] += 1
    T = plan.meta.num_tokens
    return cover == collections.Counter({(r, c): 1 for r in range(T) for c in range(width)})


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tiles_cover_outputs_once(tp):
    par = ParallelConfig(tp, 0)
    plan = plan_step(mixed_batch(), MODEL, par, KERNEL, CFG)
    H, D = MODEL.hidden_size, MODEL.head_dim
    qkv_w = (par.heads_local(MODEL) + 2 * par.kv_heads_local(MODEL)) * D
    assert tiles_cover(plan, Op.QKV_ROPE, qkv_w)
    assert tiles_cover(plan, Op.O_PROJ, H)
    assert tiles_cover(plan, Op.DOWN, H)
    assert tiles_cover(plan, Op.GATE_UP, par.intermediate_local(MODEL))
    s = plan.instrs.numpy()
    for op in (Op.O_PROJ, Op.DOWN, Op.EMBED):
        t = s[s[:, W_OPCODE] == op]
        sl = H // tp
        assert (t[:, W_COL0] // sl == (t[:, W_COL0] + t[:, W_COLS] - 1) // sl).all(), "tile straddles ranks"
        if tp > 1:
            assert (t[:, W_SIGNAL_RANK] == t[:, W_COL0] // sl).all()


def test_attention_segments_and_splits():
    plan = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, CFG)
    from mk.instructions import attention as at
    ins = [i for i in plan.instructions() if i.opcode == Op.ATTENTION and i.layer == 0]
    a = lambda i, w: i.args[w - at.A_SEQ]  # noqa: E731
    # every (row, kv head) is covered by splits that tile [0, pos+1) exactly
    seen = collections.defaultdict(list)
    for i in ins:
        for r in range(i.rows):
            pos = a(i, at.A_POS0) + r
            for h in range(i.col0, i.col0 + i.cols):
                lo, hi = a(i, at.A_KV0), min(a(i, at.A_KV1), pos + 1)
                if hi > lo:
                    seen[i.row0 + r, h].append((lo, hi))
    pos = plan.meta.positions.tolist()
    for (row, h), ranges in seen.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == pos[row] + 1
        assert all(x[1] == y[0] for x, y in zip(ranges, ranges[1:]))
    assert len(seen) == plan.meta.num_tokens * ParallelConfig(1, 0).kv_heads_local(MODEL)
    nred = sum(1 for i in plan.instructions() if i.opcode == Op.ATTN_REDUCE and i.layer == 0)
    assert nred > 0, "long contexts must be split"
    nj = sum(1 for i in plan.instructions() if i.opcode == Op.NOOP and i.layer == 0)
    B = KERNEL.token_block
    r0, n = plan.meta.seq_row0, plan.meta.seq_rows
    assert nj == int(((r0 + n - 1) // B - r0 // B).sum()) == 6   # one join per extra block spanned


def test_attention_new0_is_the_sequences_first_new_position():
    """A_NEW0 = the sequence's start position in this step, for every segment of it: keys before
    it predate the step (the loader's early loads read them before the waits), keys in
    [new0, pos0) of a later segment are this step's rows of the sequence's earlier segments."""
    plan = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, CFG)
    from mk.instructions import attention as at
    a = lambda i, w: i.args[w - at.A_SEQ]  # noqa: E731
    starts = {s: c.start_pos for s, c in enumerate(mixed_batch().seqs)}
    later_segments = 0
    for i in (i for i in plan.instructions() if i.opcode == Op.ATTENTION):
        new0, pos0 = a(i, at.A_NEW0), a(i, at.A_POS0)
        assert new0 == starts[a(i, at.A_SEQ)] <= pos0
        later_segments += pos0 > new0
    assert later_segments > 0, "the batch has sequences spanning several blocks"


@pytest.mark.parametrize("split_k", [1, 0])
def test_l2_prefetch_instructions(split_k):
    """PlanConfig.l2_prefetch_mib: per layer, L2_PREFETCH instructions without waits or signal,
    queued after the layer's attention and before its O_PROJ; they cover O_PROJ's weight rows
    once per K slice, then GATE_UP's, within the budget; the counter targets are those of the
    plan without them; none when the attention instructions fill the SMs, or when off. (Queue
    order, default policy: after all of the layer's attention, before the last block's O_PROJ.)"""
    from mk.instructions import prefetch as pf
    from mk.ir import W_COL0, W_COLS
    base = dict(CFG.__dict__, split_k=split_k, splitk_align=8)
    plain = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, PlanConfig(**base))
    p = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL,
                  PlanConfig(**{**base, "l2_prefetch_mib": 1}))
    assert torch.equal(p.targets, plain.targets)
    s = p.instrs.numpy()
    ops = s[:, W_OPCODE]
    pre = ops == int(Op.L2_PREFETCH)
    assert pre.any() and not (plain.instrs[:, W_OPCODE] == int(Op.L2_PREFETCH)).any()
    assert (s[pre][:, W_SIGNAL] == NO_COUNTER).all()
    assert (s[pre][:, W_WAIT0:W_WAIT0 + 2 * MAX_WAITS:2] == NO_COUNTER).all()
    H, I = MODEL.hidden_size, MODEL.intermediate_size
    O_K = MODEL.num_heads * MODEL.head_dim
    for layer in range(MODEL.num_layers):
        mine = np.flatnonzero(pre & (s[:, W_LAYER] == layer))
        attn = np.flatnonzero(((ops == int(Op.ATTENTION)) | (ops == int(Op.ATTN_REDUCE)))
                              & (s[:, W_LAYER] == layer))
        o = np.flatnonzero((ops == int(Op.O_PROJ)) & (s[:, W_LAYER] == layer))
        assert attn.max() < mine.min() and mine.max() < o.max()
        rows = collections.Counter()
        nbytes = 0
        for w in s[mine]:
            k0, k1 = int(w[pf.A_K0]), int(w[pf.A_K1])
            for r in range(int(w[W_COL0]), int(w[W_COL0] + w[W_COLS])):
                rows[int(w[pf.A_WOP]), r, k0] += 1
            nbytes += 2 * int(w[W_COLS]) * (k1 - k0)
        assert nbytes <= 1 << 20
        o_rows = {r for (op, r, _), n in rows.items() if op == int(Op.O_PROJ)}
        assert o_rows == set(range(H)) and set(rows.values()) == {1}
        assert all(r < 2 * I for (op, r, _) in rows if op == int(Op.GATE_UP))
        assert all(int(w[pf.A_K1]) <= (O_K if w[pf.A_WOP] == int(Op.O_PROJ) else H)
                   for w in s[mine])
    full = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL,
                     PlanConfig(**{**base, "l2_prefetch_mib": 1, "num_sms": 4}))
    assert not (full.instrs[:, W_OPCODE] == int(Op.L2_PREFETCH)).any()


@pytest.mark.parametrize("split_k", [1, 0])
def test_l2_prefetch_skips_the_early_loaded_columns(split_k):
    """l2_prefetch_skip / l2_prefetch_o_proj: no O_PROJ rows when it is 0, and each GATE_UP K
    slice's columns from its first + skip on (never the first skip columns, never past the
    slice), every row once per slice; the counter targets unchanged."""
    from mk.instructions import prefetch as pf
    from mk.ir import W_COL0, W_COLS
    base = dict(CFG.__dict__, split_k=split_k, splitk_align=8, l2_prefetch_mib=1,
                l2_prefetch_o_proj=0)
    skip = 16

    def prefetches(**kw):
        p = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL,
                      PlanConfig(**{**base, **kw}))
        s = p.instrs.numpy()
        return p, s[s[:, W_OPCODE] == int(Op.L2_PREFETCH)]

    plain, unskipped = prefetches()
    p, pre = prefetches(l2_prefetch_skip=skip)
    assert torch.equal(p.targets, plain.targets)
    assert len(pre) and (pre[:, pf.A_WOP] == int(Op.GATE_UP)).all()
    assert (unskipped[:, pf.A_WOP] == int(Op.GATE_UP)).all()
    H, I = MODEL.hidden_size, MODEL.intermediate_size
    starts = sorted({int(k) for k in unskipped[:, pf.A_K0]})    # the K slices' first columns
    ends = dict(zip(starts, starts[1:] + [H]))
    assert (len(starts) == 1) == (split_k == 1) and starts[0] == 0   # split: several slices
    for layer in range(MODEL.num_layers):
        rows = collections.Counter()
        for w in pre[pre[:, W_LAYER] == layer]:
            k0, k1 = int(w[pf.A_K0]), int(w[pf.A_K1])
            assert k0 - skip in ends and k0 < k1 <= ends[k0 - skip]
            for r in range(int(w[W_COL0]), int(w[W_COL0] + w[W_COLS])):
                rows[r, k0] += 1
        assert {r for r, _ in rows} == set(range(2 * I)) and set(rows.values()) == {1}
        assert {k for _, k in rows} == {k + skip for k in starts}
    with pytest.raises(ValueError, match="l2_prefetch_skip"):
        PlanConfig(l2_prefetch_skip=12)
    with pytest.raises(ValueError, match="l2_prefetch_o_proj"):
        PlanConfig(l2_prefetch_o_proj=2)


# uneven: split_uneven_max_tokens with 12 SMs and K slices of 8 columns (O_PROJ / GATE_UP's 8
# tiles in 6 + 2 chunks, DOWN's in 11 + 5); attn_chunk_rows on (its chunks are 32-token tiles,
# longer than any segment of 8-token blocks: one chunk each, the unchunked words)
UNEVEN = dict(splitk_align=8, num_sms=12, split_fill_max_tokens=4096,
              split_uneven_max_tokens=4096, split_uneven_min_tokens=0, attn_chunk_rows=1,
              attn_pair=0)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("split_k,l2,spread,pair,extra", [
    (1, 0, False, 0, {}), (0, 1, False, 0, {}), (0, 0, True, 0, {}), (1, 0, False, 2, {}),
    (0, 0, False, 0, UNEVEN)], ids=["plain", "l2", "spread", "pair", "uneven"])
def test_planner_fast_path_equals_plan_step(policy, split_k, l2, spread, pair, extra):
    """Planner's fast path (a batch with the previous plan's structure: only the attention's
    position words change) gives plan_step's stream, targets and metadata bitwise, over a run of
    decode steps that crosses KV-split boundaries, drops and adds sequences and mixes in prefill
    chunks (each of which takes the full plan); spread: decode keys spread over 24 SMs in splits
    of a size that grows with the contexts (kv_split_min); pair: decode units paired
    (attn_pair, the second unit's position words move too; kv_split 64, so that the decodes
    stay direct for a while); extra: more PlanConfig fields (uneven split-K slices)."""
    cfg = PlanConfig(**{**CFG.__dict__, "policy": policy, "split_k": split_k, "splitk_align": 8,
                        "l2_prefetch_mib": l2,
                        **(dict(kv_split=32, kv_split_min=4, num_sms=24) if spread else {}),
                        **(dict(kv_split=64, attn_pair=pair) if pair else {}), **extra})
    planner = _fast_path_run(cfg, spread, pair, uneven=bool(extra))
    assert planner.fast_plans >= (12 if spread else 20), planner.fast_plans


@pytest.mark.parametrize("pair", [0, 2])
def test_planner_fast_path_with_attn_lpt(pair):
    """The fast path under PlanConfig.attn_lpt (a step's attention ordered by estimated cost where
    it has prompt chunks): plan_step's stream bitwise in every step. Decode-only steps keep the
    block order, so the fast path as without it; in steps with a prompt chunk, a step that moves
    an instruction's cost (a unit reads one more 64-key block; kv_split 128, so no split moves
    with it) takes the full plan, the others the fast one."""
    cfg = PlanConfig(**{**CFG.__dict__, "split_k": 0, "splitk_align": 8, "kv_split": 128,
                        "attn_pair": pair})
    lpt_cfg = PlanConfig(**{**cfg.__dict__, "attn_lpt": 1})
    assert (_fast_path_run(lpt_cfg, False, pair, uneven=False).fast_plans
            == _fast_path_run(cfg, False, pair, uneven=False).fast_plans)
    plain = _fast_path_run(cfg, False, pair, uneven=False, prompt_steps=True).fast_plans
    lpt = _fast_path_run(lpt_cfg, False, pair, uneven=False, prompt_steps=True).fast_plans
    assert 10 <= lpt < plain, (lpt, plain)


@pytest.mark.parametrize("lpt,chunk_splits,chunk_reduce", [(0, 0, 0), (1, 0, 0), (0, 1, 0),
                                                          (0, 1, 1), (2, 1, 1)])
def test_planner_fast_path_with_chunked_prompts(lpt, chunk_splits, chunk_reduce):
    """A step whose prompt segments are cut into row chunks (attn_chunk_rows; 64-row token
    blocks, 32-row chunks at 4 q heads per KV head) and the next steps of the same structure:
    the fast path sizes the splits and the chunks' A_KV1 by the whole segment, as plan_step
    (it took each chunk for a segment before session 56: other splits, each chunk's own end);
    chunk_splits: the segments split over KV (contexts over 256) chunked too; chunk_reduce:
    their ATTN_REDUCE per chunk."""
    from mk.instructions import attention as at
    kernel = KernelConfig(token_block=64, page_size=4, max_batch_tokens=256, max_seqs=8,
                          max_context=512, num_kv_pages=400)
    cfg = PlanConfig(**{**CFG.__dict__, "kv_split": 256, "attn_chunk_rows": 1, "attn_lpt": lpt,
                        "num_sms": 24, "attn_chunk_splits": chunk_splits,
                        "attn_chunk_reduce": chunk_reduce})
    planner = Planner(MODEL, ParallelConfig(1, 0), kernel, cfg)
    chunked = split_chunks = 0
    for step in range(4):
        batch = StepBatch([SeqChunk([5], 40 + step, list(range(0, 60))),
                           SeqChunk([6], 9 + step, list(range(60, 120))),
                           SeqChunk(list(range(1, 97)), 96 * step, list(range(120, 250)))])
        got = planner.plan(batch)
        want = plan_step(batch, MODEL, ParallelConfig(1, 0), kernel, cfg)
        assert torch.equal(got.instrs, want.instrs), step
        a = want.instrs.numpy()
        a = a[a[:, W_OPCODE] == int(Op.ATTENTION)]
        chunked += int(((a[:, W_ROWS] > 1) & (a[:, W_ROWS] < 64)
                        & (a[:, at.A_KV1] > a[:, at.A_POS0] + a[:, W_ROWS])).sum())
        # (the prompt's segments are 62 and 34 rows: whole, or chunks of at most 32)
        split_chunks += int(((a[:, at.A_MODE] == at.MODE_PARTIAL) & (a[:, W_ROWS] > 1)
                             & (a[:, W_ROWS] <= 32)).sum())
    assert chunked
    assert bool(split_chunks) == bool(chunk_splits)
    reduces = want.instrs.numpy()
    reduces = reduces[reduces[:, W_OPCODE] == int(Op.ATTN_REDUCE)]
    # the 130-row prompt's split segments: one reduce each, or one per chunk of at most 32 rows
    assert (reduces[:, W_ROWS].max() <= 32) == bool(chunk_reduce)
    # with attn_lpt the chunks' costs move every step (a full plan each); without it at least
    # one step keeps the structure and the splits
    assert (planner.fast_plans == 0) == bool(lpt), planner.fast_plans


def _fast_path_run(cfg: PlanConfig, spread: bool, pair: int, uneven: bool,
                   prompt_steps: bool = False) -> Planner:
    """40 steps of test_planner_fast_path_equals_plan_step's run through a Planner, each checked
    against plan_step (prompt_steps: each with 2 tokens of one more sequence's prompt instead of
    two steps with an 11-token one); returns the planner."""
    from mk.instructions import attention as at
    spread_sizes = set()
    planner = Planner(MODEL, ParallelConfig(1, 0), KERNEL, cfg)
    rng = np.random.default_rng(7)
    device_copy, held = None, None       # what a backend keeps: a copy and its plan's serial
    seqs = {0: 3, 1: 14, 2: 30, 3: 47}          # sequence -> cached tokens
    pages = {i: list(range(30 * i, 30 * i + 30)) for i in range(6)}
    fast_before = 0
    n_pairs = 0
    uneven_seen = False
    for step in range(40):
        chunks = [SeqChunk([int(rng.integers(1, 200))], n, pages[i]) for i, n in seqs.items()]
        if prompt_steps:
            # a prompt of 2 tokens a step (the structure stays)
            chunks.append(SeqChunk([3, 4], 5 + 2 * step, pages[5]))
        elif step in (9, 25):
            chunks.append(SeqChunk(list(range(1, 12)), 5, pages[5]))       # a prefill chunk
        batch = StepBatch(chunks)
        got = planner.plan(batch)
        want = plan_step(batch, MODEL, ParallelConfig(1, 0), KERNEL, cfg)
        assert torch.equal(got.instrs, want.instrs), step
        if uneven:
            ks = _gemm_k(MODEL, ParallelConfig(1, 0))
            for name, (t, ns) in want.layout["splitk"].items():
                u = cfg.uneven_split(want.meta.num_tokens, t, ks[Op[name]])
                uneven_seen |= u is not None and u[0] == ns
        a = want.instrs[want.instrs[:, W_OPCODE] == int(Op.ATTENTION)]
        n_pairs += int((a[:, at.A_MODE] == at.MODE_PAIR).sum())
        spread_sizes.update(set(a[:, at.A_KV0][a[:, at.A_KV0] % cfg.kv_split != 0].tolist()))
        assert torch.equal(got.targets, want.targets) and torch.equal(got.meta.tensor,
                                                                      want.meta.tensor)
        # a backend's copy of the stream follows through StreamAdvance alone while it can
        if got.advance is not None and held == got.serial:
            got.advance.apply(device_copy)
        else:
            assert got.advance is None or held != got.serial
            device_copy, held = got.instrs.clone(), got.serial
        assert torch.equal(device_copy, want.instrs), step
        for i in seqs:
            seqs[i] += 1
        if step == 15:
            seqs.pop(1)                             # a sequence finishes
        if step == 30:
            seqs[4] = 9                             # one joins
    # (4 sequences cross a 16-key split boundary every 16 steps each, prefill / joins / drops
    # change the structure: 24 of the 40 steps here; page-table lengths do not, as build_meta
    # keeps each table whole)
    assert bool(spread_sizes) == spread, spread_sizes       # splits not at kv_split multiples
    assert (n_pairs > 0) == bool(pair), n_pairs
    assert uneven_seen == uneven
    slow = Planner(MODEL, ParallelConfig(1, 0), KERNEL, cfg, fast_path=False)
    slow.plan(batch)
    slow.plan(batch)
    assert slow.fast_plans == 0
    return planner


def test_meta_layout():
    b = mixed_batch()
    meta = build_meta(b, KERNEL)
    assert meta.tokens.tolist() == b.token_ids().tolist()
    assert meta.positions.tolist() == b.positions().tolist()
    ps = KERNEL.page_size
    slots = [s.pages[p // ps] * ps + p % ps for s in b.seqs for p in range(s.start_pos, s.end_pos)]
    assert meta.kv_slots.tolist() == slots
    assert meta.last_rows.tolist() == b.last_token_rows().tolist()


def test_planner_reuses_arena():
    pl = Planner(MODEL, ParallelConfig(2, 1), KERNEL, CFG)
    a = pl.plan(mixed_batch())
    ref = plan_step(mixed_batch(), MODEL, ParallelConfig(2, 1), KERNEL, CFG)
    assert torch.equal(a.instrs, ref.instrs) and torch.equal(a.targets, ref.targets)


def test_refuses_bad_batches():
    ok = SeqChunk([1, 2], 0, [0])
    with pytest.raises(ValueError, match="over the maximum 96"):
        plan_step(StepBatch([SeqChunk([1] * 97, 0, list(range(25)))]), MODEL, kernel=KERNEL)
    with pytest.raises(ValueError, match="needs 2 KV pages"):
        plan_step(StepBatch([ok, SeqChunk([1], 4, [3])]), MODEL, kernel=KERNEL)
    with pytest.raises(ValueError, match="KV page id 500"):
        plan_step(StepBatch([ok, SeqChunk([1], 0, [500])]), MODEL, kernel=KERNEL)
    with pytest.raises(ValueError, match="no new tokens"):
        plan_step(StepBatch([ok, SeqChunk([], 0, [1])]), MODEL, kernel=KERNEL)
    with pytest.raises(ValueError, match="context 129"):
        plan_step(StepBatch([SeqChunk([1], 128, list(range(33)))]), MODEL, kernel=KERNEL)
    with pytest.raises(ValueError, match="ATTN_PARTIAL"):
        plan_step(StepBatch([SeqChunk([1] * 40, 60, list(range(25)))]), MODEL, kernel=KERNEL,
                  cfg=PlanConfig(kv_split=4, partial_rows=64))
    with pytest.raises(ValueError, match="unknown queue policy"):
        PlanConfig(policy="fastest")


def test_plan_config_validation():
    """Explicit tile values are checked once, at the edge, with the field named."""
    for kw in ({"qkv_tile": 0}, {"o_tile": -8}, {"mlp_tile": 1.5}, {"token_block": 0},
               {"lm_tile": True}, {"kv_split": None}):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=f"PlanConfig.{name} must be a positive integer"):
            PlanConfig(**kw)
    for name in ("fold_o_reduce", "fold_down_reduce"):
        for v in (2, -1):
            with pytest.raises(ValueError, match=f"PlanConfig.{name} must be 0 or 1"):
                PlanConfig(**{name: v})
    for name, values, bad in (("attn_lpt", (0, 1, 2), (3, -1, True)),
                              ("attn_chunk_splits", (0, 1), (2, -1)),
                              ("attn_chunk_reduce", (0, 1), (2, True))):
        for v in bad:
            with pytest.raises(ValueError,
                               match=re.escape(f"PlanConfig.{name} must be one of {values}")):
                PlanConfig(**{name: v})
    for v in (5, -1, True):
        with pytest.raises(ValueError, match=r"PlanConfig.norm_fold must be 0 \(off\).* or 4"):
            PlanConfig(norm_fold=v)
    bad = PlanConfig(qkv_tile=12)                       # head_dim 8: 1.5 heads
    with pytest.raises(ValueError, match="qkv_tile=12 is not a multiple of head_dim 8"):
        Planner(MODEL, ParallelConfig(1, 0), KERNEL, bad)
    with pytest.raises(ValueError, match="whole heads"):
        plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, bad)
    # below one head: the minimum, one head per tile
    plan = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, PlanConfig(qkv_tile=4))
    assert plan.tiles.qkv == 8
    s = plan.instrs.numpy()
    assert (s[s[:, W_OPCODE] == Op.QKV_ROPE, W_COLS] == 8).all()


def test_default_tiles_from_the_table_and_overrides():
    """No explicit widths: the tile table's for the step's M class (token block capped by
    KernelConfig.token_block); explicit values win, token_block included."""
    plan = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, PlanConfig(kv_split=16))
    t = plan.tiles
    assert (t.token_block, t.lm_block) == (KERNEL.token_block, KERNEL.token_block)
    # M = 51: class 0 (GATE_UP on 112-row B pages: 56 output columns, gu_m128n56 since session
    # 71; O_PROJ / DOWN on m64n64)
    assert (t.o, t.down, t.mlp, t.lm, t.qkv) == (64, 64, 56, 128, 128)
    assert plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, CFG).tiles.qkv == 8
    big = KernelConfig(**{**KERNEL.__dict__, "token_block": 128})
    assert plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), big).tiles.token_block == 64
    cfg = PlanConfig(**{**CFG.__dict__, "token_block": 16})
    plan = plan_step(mixed_batch(), MODEL, ParallelConfig(2, 0), big, cfg)
    assert plan.tiles.token_block == 16 and plan.for_rank(1).tiles == plan.tiles
    s = plan.instrs.numpy()
    qkv = s[(s[:, W_OPCODE] == Op.QKV_ROPE) & (s[:, W_LAYER] == 0)]
    assert (qkv[:, W_ROW0] % 16 == 0).all() and qkv[:, W_ROWS].max() == 16
    norms = s[(s[:, W_OPCODE] == Op.RMSNORM) & (s[:, W_LAYER] == 0)]      # norm_rows 8 groups
    assert (norms[:, W_ROW0] // 16 == (norms[:, W_ROW0] + norms[:, W_ROWS] - 1) // 16).all()


@pytest.mark.parametrize("norm_rows", [1, 3, 8, 64])
def test_norms_cut_into_row_groups_that_signal_their_block(norm_rows):
    """RMSNORM / LM_NORM run as row groups of at most norm_rows rows (never across a token block):
    per layer and norm the groups cover every row once, and the QKV / GATE_UP tiles of a block
    wait for as many signals as the block has groups; LM_NORM groups cover every sequence once
    and LM_HEAD waits for all of them; mk.verify finds no race, deadlock or wrong target (the
    interpreter runs such plans in tests/test_vm.py's random interleavings)."""
    from mk.ir import W_SIGNAL, W_WAIT0
    # small_norm_max_tokens 0: norm_rows in every step (the small-step rule has its own test)
    cfg = PlanConfig(**{**CFG.__dict__, "norm_rows": norm_rows, "small_norm_max_tokens": 0})
    batch = mixed_batch()
    plan = plan_step(batch, MODEL, ParallelConfig(1, 0), KERNEL, cfg)
    s = plan.instrs.numpy()
    T, B = batch.num_tokens, plan.tiles.token_block
    for layer in (0, MODEL.num_layers - 1):
        norms = s[(s[:, W_OPCODE] == Op.RMSNORM) & (s[:, W_LAYER] == layer)]
        assert norms[:, W_ROWS].max() <= norm_rows
        assert (norms[:, W_ROW0] // B == (norms[:, W_ROW0] + norms[:, W_ROWS] - 1) // B).all()
        for sig in np.unique(norms[:, W_SIGNAL]):
            grp = norms[norms[:, W_SIGNAL] == sig]
            covered = np.concatenate([np.arange(r0, r0 + n) for r0, n in grp[:, [W_ROW0, W_ROWS]]])
            assert np.array_equal(np.sort(covered), np.arange(covered.min(), covered.max() + 1))
            waiters = s[(s[:, W_WAIT0] == sig)]
            assert len(waiters) and (waiters[:, W_WAIT0 + 1] == len(grp)).all()
        rows = np.concatenate([np.arange(r0, r0 + n) for r0, n in norms[:, [W_ROW0, W_ROWS]]])
        assert np.array_equal(np.sort(rows), np.repeat(np.arange(T), 2))   # attn norm + mlp norm
    lmn = s[s[:, W_OPCODE] == Op.LM_NORM]
    assert lmn[:, W_ROWS].max() <= norm_rows and lmn[:, W_ROWS].sum() == len(batch.seqs)
    lmh = s[s[:, W_OPCODE] == Op.LM_HEAD]
    assert (lmh[:, W_WAIT0 + 1] == len(lmn)).all()
    from mk.verify import check
    assert check([plan.instrs], plan.num_counters, meta=plan.meta) == []


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_static_verifier_accepts_plans(tp):
    """mk.verify (exact targets, no deadlock, no race from the families' accesses) on every policy;
    and it does see the races when the attention's join waits are dropped."""
    from mk.ir import W_OPCODE, W_WAIT0
    from mk.verify import check
    for policy in POLICIES:
        for l2 in (0, 1):
            cfg = PlanConfig(**{**CFG.__dict__, "policy": policy, "l2_prefetch_mib": l2})
            plans = [plan_step(mixed_batch(), MODEL, ParallelConfig(tp, r), KERNEL, cfg)
                     for r in range(tp)]
            assert check([p.instrs for p in plans], plans[0].num_counters,
                         meta=plans[0].meta) == []
    broken = []
    for p in plans:
        s = p.instrs.clone()
        sel = s[:, W_OPCODE] == int(Op.ATTENTION)
        s[sel, W_WAIT0 + 2], s[sel, W_WAIT0 + 3] = NO_COUNTER, 0
        broken.append(s)
    found = check(broken, plans[0].num_counters, meta=plans[0].meta)
    assert any("race" in str(f) and "K_CACHE" in str(f) for f in found)


@pytest.mark.parametrize("split_k", [1, 0, 4])
def test_layers_are_the_template_shifted_so_representative_rows_cover_the_stream(split_k):
    """What StepPlan.representative_rows (the megakernel backend's host check of 1/40 of the rows)
    relies on: every layer's rows are the template's plus l in the layer word and l * cpl in
    each counter word that is not NO_COUNTER (with fold_down_reduce, the default, layer 0's
    attention norms have their fold words cleared: the template is layer 1 shifted back), and
    the representative rows are the prelude, the first and last layers and the final rows."""
    from mk.instructions import rows as rw
    from mk.instructions.base import NormWeight
    from mk.plan import COUNTER_WORDS
    cfg = PlanConfig(**{**CFG.__dict__, "split_k": split_k, "splitk_align": 8, "num_sms": 16})
    for batch in (mixed_batch(), StepBatch([SeqChunk([3], 40, list(range(12)))])):
        plan = plan_step(batch, MODEL, ParallelConfig(1, 0), KERNEL, cfg)
        t, L, cpl = plan.layout["template"], MODEL.num_layers, plan.layout["cpl"]
        pre, m = t["prelude"], t["per_layer"]
        s = plan.instrs.numpy().astype(np.int64)
        assert pre + L * m + t["final"] == len(s)
        second = s[pre + m:pre + 2 * m]
        live = {wd: second[:, wd] != NO_COUNTER for wd in COUNTER_WORDS}
        attn_norm = (second[:, W_OPCODE] == Op.RMSNORM) & (second[:, rw.A_NORM_WEIGHT]
                                                           == NormWeight.ATTN)
        for layer in range(L):
            want = second.copy()
            want[:, W_LAYER] += layer - 1
            for wd in COUNTER_WORDS:
                want[live[wd], wd] += (layer - 1) * cpl
            if layer == 0:
                want[attn_norm, rw.A_RED_NSPLIT] = 0
                want[attn_norm, rw.A_RED_STRIDE] = 0
            assert np.array_equal(s[pre + layer * m:pre + (layer + 1) * m], want), layer
        rows = plan.representative_rows().numpy()
        assert np.array_equal(rows, np.r_[np.arange(pre + m), np.arange(pre + (L - 1) * m, len(s))])


def test_spread_kv_splits_fill_the_sms_at_small_batch():
    """PlanConfig.kv_split_min: a step with fewer attention instructions than num_sms cuts its
    decode segments' keys into one smaller split size (a multiple of kv_split_min, at least it,
    at most kv_split) so that they about fill the SMs; prefill segments keep kv_split; a step
    that fills the SMs already, or kv_split_min 0, plans as before. The plans verify clean."""
    from mk.instructions import attention as at
    from mk.verify import check
    base = PlanConfig(**{**CFG.__dict__, "kv_split": 32})
    spread = PlanConfig(**{**base.__dict__, "kv_split_min": 8, "num_sms": 24})
    decode = StepBatch([SeqChunk([3], 120, list(range(0, 31))), SeqChunk([4], 60, list(range(40, 56)))])

    def attn(plan):
        s = plan.instrs.numpy()
        return s[(s[:, W_OPCODE] == Op.ATTENTION) & (s[:, W_LAYER] == 0)]
    a0 = attn(plan_step(decode, MODEL, ParallelConfig(1, 0), KERNEL, base))
    p1 = plan_step(decode, MODEL, ParallelConfig(1, 0), KERNEL, spread)
    a1 = attn(p1)
    assert len(a0) < len(a1) <= spread.num_sms
    widths = a1[:, at.A_KV1] - a1[:, at.A_KV0]
    size = int(widths.max())
    assert size % spread.kv_split_min == 0 and spread.kv_split_min <= size <= spread.kv_split
    assert (a1[:, at.A_KV0] % size == 0).all()
    for seq in np.unique(a1[:, at.A_SEQ]):     # each (sequence, KV group)'s keys covered once
        for g in np.unique(a1[:, W_COL0]):
            sel = (a1[:, at.A_SEQ] == seq) & (a1[:, W_COL0] == g)
            kv = a1[sel][:, [at.A_KV0, at.A_KV1]]
            assert kv[0, 0] == 0 and (kv[1:, 0] == kv[:-1, 1]).all()
    assert check([p1.instrs], p1.num_counters, meta=p1.meta) == []
    # the mixed batch: prefill segments keep kv_split
    pm = plan_step(mixed_batch(), MODEL, ParallelConfig(1, 0), KERNEL, spread)
    am = attn(pm)
    pre = am[am[:, W_ROWS] > 1]
    assert ((pre[:, at.A_KV1] - pre[:, at.A_KV0]) <= spread.kv_split).all()
    assert check([pm.instrs], pm.num_counters, meta=pm.meta) == []
    # enough instructions already: unchanged
    full = PlanConfig(**{**spread.__dict__, "num_sms": 2})
    assert np.array_equal(attn(plan_step(decode, MODEL, ParallelConfig(1, 0), KERNEL, full)), a0)
    # a kv_split_min at or over kv_split never spreads
    over = PlanConfig(**{**spread.__dict__, "kv_split_min": 64})
    assert np.array_equal(attn(plan_step(decode, MODEL, ParallelConfig(1, 0), KERNEL, over)), a0)
    for bad in (dict(kv_split_min=-1), dict(kv_spread_min_splits=0), dict(kv_split_min=True)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PlanConfig(**bad)


def test_attention_pairs():
    """PlanConfig.attn_pair: decode units (one-row direct segments) of one token block and KV
    group paired in one MODE_PAIR instruction, contexts sorted and paired neighbour with
    neighbour; the pair signals the block's ATTN counter twice (targets unchanged), every
    decode row is written once (the family's accesses), and the plans verify clean. Auto (1)
    pairs only what takes the instructions down to num_sms; 0 never pairs."""
    from mk.instructions import attention as at
    from mk.instructions.base import Buf
    from mk.verify import check
    # 12 decodes over two token blocks of 8 rows, a prefill chunk, a split decode (ctx > 16)
    ctx = [5, 9, 3, 12, 7, 2, 11, 4, 6, 10, 8, 1]
    batch = StepBatch([SeqChunk([3], c, list(range(10 * i, 10 * i + 10)))
                       for i, c in enumerate(ctx)]
                      + [SeqChunk(list(range(1, 6)), 2, list(range(150, 155))),
                         SeqChunk([4], 40, list(range(160, 171)))])

    kernel = KernelConfig(**{**KERNEL.__dict__, "max_seqs": 16})

    def attn(cfg):
        p = plan_step(batch, MODEL, ParallelConfig(1, 0), kernel, cfg)
        s = p.instrs.numpy()
        return p, s[(s[:, W_OPCODE] == Op.ATTENTION) & (s[:, W_LAYER] == 0)]
    p0, a0 = attn(CFG)
    p2, a2 = attn(PlanConfig(**{**CFG.__dict__, "attn_pair": 2}))
    assert not (a0[:, at.A_MODE] == at.MODE_PAIR).any()
    pr = a2[a2[:, at.A_MODE] == at.MODE_PAIR]
    ngrp = MODEL.num_kv_heads       # attn_kv_heads 1: an instruction per KV head
    # block 0: 8 decodes -> 4 pairs; block 1: 4 decodes -> 2 pairs (the prefill and the split
    # decode stay single); per KV group
    assert len(pr) == 6 * ngrp and len(a2) == len(a0) - len(pr)
    assert (pr[:, 17] == 2).all() and (a2[a2[:, at.A_MODE] != at.MODE_PAIR][:, 17] == 1).all()
    assert torch.equal(p0.targets, p2.targets)
    B = 8
    assert (pr[:, W_ROW0] // B == pr[:, at.A_ROW0_B] // B).all()     # same block
    pos = {r: c for r, c in enumerate(ctx)}
    a_ctx = np.array([pos[r] for r in pr[:, W_ROW0]])
    b_ctx = np.array([pos[r] for r in pr[:, at.A_ROW0_B]])
    assert (pr[:, at.A_POS0] == a_ctx).all() and (pr[:, at.A_POS0_B] == b_ctx).all()
    assert (pr[:, at.A_NEW0_B] == b_ctx).all() and (pr[:, at.A_KV0] == 0).all()
    # neighbours by context: block 0's contexts sorted 2 3 4 5 7 9 11 12 pair as (2,3) (4,5) ..
    pairs0 = sorted(tuple(sorted(x)) for x in zip(a_ctx[pr[:, W_COL0] == 0],
                                                   b_ctx[pr[:, W_COL0] == 0]))
    assert pairs0 == [(1, 6), (2, 3), (4, 5), (7, 9), (8, 10), (11, 12)]
    # every ATTN_OUT row of a decode written exactly once per KV group
    out_rows = collections.Counter()
    for i in np.flatnonzero(p2.instrs.numpy()[:, W_LAYER] == 0):
        if p2.instrs[i, W_OPCODE] == int(Op.ATTENTION):
            for r in p2.accesses(int(i)).writes:
                if r.buf == Buf.ATTN_OUT:
                    for row in range(r.row0, r.row1):
                        out_rows[row, r.col0] += 1
    assert all(out_rows[r, c] == 1 for r in range(12) for c in {k[1] for k in out_rows})
    assert check([p2.instrs], p2.num_counters, meta=p2.meta) == []
    # auto: just enough pairs to get down to num_sms instructions
    n0 = len(a0)
    _, a1 = attn(PlanConfig(**{**CFG.__dict__, "attn_pair": 1, "num_sms": n0 - 3}))
    assert len(a1) == n0 - 3
    _, a1 = attn(PlanConfig(**{**CFG.__dict__, "attn_pair": 1, "num_sms": n0}))
    assert len(a1) == n0
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match="attn_pair"):
            PlanConfig(attn_pair=bad)
    # units of more q heads than a warpgroup's rows are never paired
    wide = ModelConfig(hidden_size=1024, intermediate_size=128, num_layers=1, num_heads=128,
                       num_kv_heads=1, head_dim=8, vocab_size=256)
    pw = plan_step(batch, wide, ParallelConfig(1, 0), kernel, PlanConfig(**{**CFG.__dict__,
                                                                            "attn_pair": 2}))
    assert not (pw.instrs[:, at.A_MODE][pw.instrs[:, W_OPCODE] == int(Op.ATTENTION)]
                == at.MODE_PAIR).any()


def test_spread_kv_splits_need_enough_splits():
    """kv_spread_min_splits: the spread size applies only when the longest decode context then
    has that many splits or more (fewer lost at 70B TP8: each split's ATTN_REDUCE costs more than
    the shorter attention saves); the default at 70B TP8 shapes spreads B=1..32 at ctx 1024 and
    not B=48 / 64 (session 9's measurements)."""
    cfg = PlanConfig(kv_split=1024, kv_split_min=64, num_sms=132)
    assert (cfg.kv_split_min, cfg.kv_spread_min_splits) == (PlanConfig().kv_split_min,
                                                            PlanConfig().kv_spread_min_splits)
    for batch, want in ((1, 64), (16, 128), (32, 256), (48, 1024), (64, 1024)):
        rows, ctx = np.ones(batch, np.int64), np.full(batch, 1024, np.int64)
        assert (cfg.spread_kv_splits(rows, ctx, 1) == want).all(), batch
    # a short context: 1 sequence of 200 keys would get splits of 64, only 4 of them: no spread
    assert cfg.spread_kv_splits(np.ones(1, np.int64), np.array([200]), 1)[0] == 1024
    assert cfg.spread_kv_splits(np.ones(1, np.int64), np.array([256]), 1)[0] == 64
    two = PlanConfig(kv_split=1024, kv_split_min=64, num_sms=132, kv_spread_min_splits=2)
    assert (two.spread_kv_splits(np.ones(64, np.int64), np.full(64, 1024), 1) == 512).all()


@pytest.mark.parametrize("rows", [[3, 4, 5, 6], [2, 5, 9]])
def test_stream_advance_writes_its_block_in_every_layer(rows):
    """StreamAdvance (the fast path's rewrite): rows j of each layer's template get the block in
    words word0.. (a slice for a run of rows, an index otherwise), on a host array and on a torch
    stream alike; nothing else changes."""
    from mk.ir import INSTR_WORDS
    from mk.plan import StreamAdvance
    rng = np.random.default_rng(3)
    pre, L, m = 2, 3, 11
    stream = rng.integers(0, 1000, (pre + L * m + 4, INSTR_WORDS)).astype(np.int32)
    block = rng.integers(0, 1000, (len(rows), 5)).astype(np.int32)
    adv = StreamAdvance(pre, L, m, np.array(rows), 20, block)
    assert isinstance(adv.j, slice) == (rows == list(range(rows[0], rows[-1] + 1)))
    want = stream.copy()
    for layer in range(L):
        for i, r in enumerate(rows):
            want[pre + layer * m + r, 20:25] = block[i]
    host, dev = stream.copy(), torch.from_numpy(stream.copy())
    adv.apply_host(host)
    adv.apply(dev)
    assert np.array_equal(host, want) and np.array_equal(dev.numpy(), want)


def test_plan_overrides_take_the_policy_by_name():
    """--plan's FIELD=VALUE list: integers, and the queue policy by name (so a command line can
    A/B the queue order); split_k has its own flag; bad names and values are refused."""
    from mk.plan import parse_plan_overrides
    assert parse_plan_overrides("policy=op_major, norm_rows=2") == dict(policy="op_major",
                                                                         norm_rows=2)
    for text, message in (("policy=random", "unknown queue policy"),
                          ("split_k=2", "not FIELD=VALUE"), ("norm_rows=two", "not an integer")):
        with pytest.raises(ValueError, match=message):
            parse_plan_overrides(text)


def test_row_part_lies_in_its_reserved_rows():
    """PlanConfig.norm_fold=4's ROW_PART on the GPU (mk.instructions._common.row_part_offset)
    lies in the SPLITK rows splitk_shape reserves for it, past every split partial's row and
    before ROW_SCALE's last T floats, every row 16-byte aligned, for token counts that are and
    are not multiples of 4 or of the width."""
    from mk.config import KernelConfig, ModelConfig, ParallelConfig
    from mk.instructions import _common as mc
    from mk.plan import row_scale_rows, splitk_shape
    for hidden, inter in ((512, 1024), (8192, 3584)):
        model = ModelConfig(hidden_size=hidden, intermediate_size=inter, num_layers=2,
                            num_heads=hidden // 128, num_kv_heads=1, head_dim=128,
                            vocab_size=1024)
        for T in (1, 3, 100, 257, 4096):
            kernel = KernelConfig(max_batch_tokens=T, max_seqs=min(T, 8), max_context=256,
                                  page_size=16)
            cfg = PlanConfig(split_k=0, norm_fold=4)
            rows, width = splitk_shape(cfg, kernel, model, ParallelConfig())
            base, _ = splitk_shape(PlanConfig(split_k=0, norm_fold=2), kernel, model,
                                   ParallelConfig())
            partial_rows = base - row_scale_rows(T, width)   # the split partials' rows
            ld = mc.row_part_ld(hidden)
            first = mc.row_part_offset(rows * width, T, ld)
            assert first % 4 == 0 and ld % 4 == 0, (hidden, T)
            assert first >= partial_rows * width, (hidden, T, first, partial_rows)
            assert first + T * ld <= rows * width - T, (hidden, T)


def lpt_batch():
    """A prompt over several blocks (its later chunks see more keys), decodes of short and long
    contexts (one split over KV), a prefill chunk at start_pos > 0."""
    return StepBatch([
        SeqChunk([7], 2, [60]),
        SeqChunk([3], 40, list(range(20, 31))),
        SeqChunk([4], 12, list(range(100, 104))),
        SeqChunk(list(range(1, 40)), 0, list(range(0, 10))),
        SeqChunk(list(range(5, 13)), 33, list(range(70, 81))),
    ])


@pytest.mark.parametrize("raster,pair,lpt", [(8, 2, 1), (1, 0, 1), (2, 2, 1), (8, 2, 2),
                                             (1, 0, 2)])
@pytest.mark.parametrize("tp", [1, 2])
def test_attn_lpt_queues_a_layers_attention_longest_first(tp, raster, pair, lpt):
    """PlanConfig.attn_lpt: the same instructions as op_major; each layer's ATTENTION
    instructions in one run, the prompt chunks (rows > 1) first, the decode units in
    non-increasing estimated cost (attention.est_cost_ns), the chunks too with attn_lpt 1 and
    in op_major's order with 2, ties in op_major's order; every other instruction where
    op_major puts it; the verifier accepts the plans (targets, topological order, races)."""
    from mk.instructions import attention as at
    from mk.verify import check
    base_cfg = PlanConfig(**{**CFG.__dict__, "policy": "op_major", "split_k": 3, "splitk_align": 8,
                             "raster_blocks": raster, "attn_pair": pair, "attn_chunk_rows": 4})
    cfg = PlanConfig(**{**base_cfg.__dict__, "attn_lpt": lpt})
    base = plan_step(lpt_batch(), MODEL, ParallelConfig(tp, 0), KERNEL, base_cfg).instrs.numpy()
    plans = [plan_step(lpt_batch(), MODEL, ParallelConfig(tp, r), KERNEL, cfg) for r in range(tp)]
    got = plans[0].instrs.numpy()
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, base.tolist()))
    is_attn = got[:, W_OPCODE] == int(Op.ATTENTION)
    assert np.array_equal(is_attn, base[:, W_OPCODE] == int(Op.ATTENTION))
    assert np.array_equal(got[~is_attn], base[~is_attn])
    for layer in range(MODEL.num_layers):
        rows = np.flatnonzero(is_attn & (got[:, W_LAYER] == layer))
        assert (np.diff(rows) == 1).all()
        a = got[rows].astype(np.int64)
        cost = at.est_cost_ns(a[:, at.A_MODE], a[:, W_ROWS], a[:, at.A_QPK], a[:, at.A_POS0],
                              a[:, at.A_KV0], a[:, at.A_KV1], a[:, at.A_POS0_B])
        prompt = a[:, W_ROWS] > 1
        assert prompt.any() and not prompt[np.argmin(prompt):].any()   # the prompt's first
        b = base[rows].tolist()
        for kind in ((prompt, ~prompt) if lpt == 1 else (~prompt,)):
            assert (np.diff(cost[kind]) <= 0).all(), cost
        if lpt == 2:        # the chunks as op_major queues them
            assert a[prompt].tolist() == [w for w in b if w in a[prompt].tolist()]
        # ties keep op_major's order
        for key in set(zip(cost.tolist(), prompt.tolist())):
            same = a[(cost == key[0]) & (prompt == key[1])].tolist()
            assert same == [w for w in b if w in same]
    assert not np.array_equal(got, base)
    assert check([p.instrs for p in plans], plans[0].num_counters, meta=plans[0].meta) == []


def test_attn_lpt_2_keeps_the_chunks_in_block_order():
    """attn_lpt 2 queues a long prompt's chunks (one per 8-token block and KV head) as op_major
    does, the first rows' first, where 1 queues those that read a second 64-key block (rows 64
    on) first; both then the decode units, longest first."""
    from mk.instructions import attention as at
    batch = StepBatch([SeqChunk(list(range(1, 91)), 0, list(range(0, 23))),
                       SeqChunk([5], 3, [30]), SeqChunk([6], 70, list(range(40, 58)))])
    words = {}
    for lpt in (0, 1, 2):
        cfg = PlanConfig(**{**CFG.__dict__, "kv_split": 128, "attn_chunk_rows": 8,
                            "attn_lpt": lpt})
        w = plan_step(batch, MODEL, ParallelConfig(), KERNEL, cfg).instrs.numpy()
        a = w[(w[:, W_OPCODE] == int(Op.ATTENTION)) & (w[:, W_LAYER] == 0)]
        words[lpt] = [(int(r[W_ROWS]), int(r[at.A_POS0])) for r in a]
    chunks = [(min(8, 90 - p), p) for p in range(0, 90, 8) for _ in range(2)]
    decodes = [(1, 70)] * 2 + [(1, 3)] * 2
    assert words[0] == chunks + decodes[2:] + decodes[:2]
    assert words[1] == chunks[16:] + chunks[:16] + decodes
    assert words[2] == chunks + decodes


def test_attn_lpt_keeps_a_decode_step():
    """A step without prompt chunks keeps op_major's order (contexts of 3 to 38 keys)."""
    batch = StepBatch([SeqChunk([i + 1], 3 + 5 * i, list(range(10 * i, 10 * i + 10)))
                       for i in range(8)])
    want = plan_step(batch, MODEL, ParallelConfig(), KERNEL, CFG).instrs
    got = plan_step(batch, MODEL, ParallelConfig(), KERNEL,
                    PlanConfig(**{**CFG.__dict__, "attn_lpt": 1})).instrs
    assert torch.equal(got, want)


def test_attn_lpt_cost_estimate():
    """est_cost_ns: 64-key blocks a unit reads (causal: below pos0 + rows), per M tile for a
    prompt chunk, a pair by its longer unit."""
    from mk.instructions import attention as at
    pair, unit, tile = at.COST_NS_PAIR_BLOCK, at.COST_NS_UNIT_BLOCK, at.COST_NS_TILE_BLOCK
    got = at.est_cost_ns(mode=[at.MODE_DIRECT, at.MODE_DIRECT, at.MODE_PAIR, at.MODE_PARTIAL,
                               at.MODE_DIRECT],
                         rows=[1, 16, 1, 1, 32], qpk=8, pos0=[129, 100, 10, 500, 0],
                         kv0=[0, 0, 0, 256, 0], kv1=[130, 200, 11, 512, 200],
                         pos0_b=[0, 0, 200, 0, 0])
    assert got.tolist() == [3 * unit, 2 * tile, 4 * pair, 4 * unit, 2 * 1 * tile]


def test_attn_lpt_needs_op_major():
    with pytest.raises(ValueError, match="attn_lpt"):
        PlanConfig(policy="interleave", attn_lpt=1)
    with pytest.raises(ValueError, match="attn_lpt=2 orders op_major's queue only"):
        PlanConfig(policy="block_major", attn_lpt=2)
    with pytest.raises(ValueError, match="attn_lpt"):
        PlanConfig(attn_lpt=3)


@pytest.mark.parametrize("split_k,fold_d", [(1, 0), (0, 1), (0, 0)])
def test_device_stream_builds_the_layers_from_three(split_k, fold_d):
    """StepPlan.device_stream (what the megakernel backend uploads for a step the fast path cannot
    take) is the stream itself, from the prelude, three layers and the final rows: full plans
    of decode and mixed steps (fold_down_reduce: layer 0 differs from the rule), the fast
    path's plans of the steps after them, and a stream that breaks the rule (uploaded whole);
    a model of fewer than four layers uploads it whole."""
    import dataclasses
    model = dataclasses.replace(MODEL, num_layers=7)
    cfg = PlanConfig(**{**CFG.__dict__, "split_k": split_k, "splitk_align": 8, "num_sms": 16,
                        "fold_down_reduce": fold_d, "norm_fold": 2 if fold_d else 0})
    planner = Planner(model, ParallelConfig(1, 0), KERNEL, cfg)
    fast = []
    for step in range(6):
        seqs = [SeqChunk([3], 40 + step, list(range(12))),
                SeqChunk([4], 9 + step, list(range(12, 20)))]
        if step % 3 == 0:
            seqs.append(SeqChunk(list(range(1, 30)), 0, list(range(20, 28))))
        plan = planner.plan(StepBatch(seqs))
        got = plan.device_stream("cpu")
        assert torch.equal(got, plan.instrs), step
        fast.append(plan.advance is not None)
    assert any(fast) and not all(fast)              # fast-path plans among the full ones
    t = plan.layout["template"]
    broken = dataclasses.replace(plan, instrs=plan.instrs.clone())
    broken.instrs[t["prelude"] + 6 * t["per_layer"], W_LAYER] += 1
    assert torch.equal(broken.device_stream("cpu"), broken.instrs)
    small = plan_step(StepBatch([SeqChunk([3], 40, list(range(12)))]), MODEL,
                      ParallelConfig(1, 0), KERNEL, PlanConfig(**{**CFG.__dict__, "num_sms": 16}))
    assert MODEL.num_layers < 4 and torch.equal(small.device_stream("cpu"), small.instrs)
