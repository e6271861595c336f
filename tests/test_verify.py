"""The static schedule verifier (mk.verify): it accepts every valid plan (hand-built row plans at TP
1-4, the planner's plans over batch shapes, TP sizes, tile sizes and queue policies) and rejects
mutated ones; each rejection is real (a run in the executor stalls or ends wrong), each accepted
mutant is equivalent (no run tried shows a difference). See mk/mutate.py for the mutation classes
and for how equivalence is decided.
"""

from __future__ import annotations

import collections
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mk import mutate as M
from mk.instructions.base import Buf, NormWeight
from mk.instructions.rows import rows_instruction
from mk.ir import ARG0, W_OPCODE, W_WAIT0, Op, SignalScope, serialize
from mk.verify import PlanError, check, main, schedule, verify


def _s(*instrs):
    return serialize(list(instrs))


def copy(src, dst, row0=0, rows=4, col0=0, cols=8, **hdr):
    return rows_instruction(Op.COPY, src, dst, row0, rows, col0, cols, **hdr)


def kinds(findings):
    return sorted({(f.kind, f.detail) for f in findings})


# ------------------------------------------------------------------------------------------------
# Small hand-written plans: each check, and what the messages name
# ------------------------------------------------------------------------------------------------

def test_chain_accepted_and_schedule():
    s = _s(copy(Buf.HIDDEN, Buf.NORMED, signal=0),
           copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 1)], signal=1),
           rows_instruction(Op.RESIDUAL_ADD, Buf.SCRATCH, Buf.HIDDEN, 0, 4, 0, 8, waits=[(1, 1)]))
    verify([s], 2)
    verify(s, 2)        # a single tensor is TP 1
    assert schedule([s], 2) == [(0, 0), (0, 1), (0, 2)]


def test_read_after_write_race_names_both_and_region():
    s = _s(copy(Buf.HIDDEN, Buf.NORMED, signal=0),
           copy(Buf.NORMED, Buf.SCRATCH, row0=2, rows=4, col0=3, cols=2))   # no wait
    with pytest.raises(PlanError) as e:
        verify([s], 1)
    msg = str(e.value)
    assert "read-after-write race" in msg
    assert "rank 0 #1 COPY layer 0" in msg and "rank 0 #0 COPY layer 0" in msg
    assert "NORMED on rank 0 rows [2, 4) cols [3, 5)" in msg
    f = e.value.findings[0]
    assert f.instrs == ((0, 0), (0, 1)) and f.region.row0 == 2 and f.region.col1 == 5


def test_write_after_read_race_buffer_reused_across_layers():
    # layer 0 reads NORMED; layer 1's norm rewrites it, ordered only after the layer-0 writer
    s = _s(rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, 0, 4, 0, 8, layer=0, signal=0),
           copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 1)], layer=0),
           rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, 0, 4, 0, 8, layer=1,
                            norm_weight=NormWeight.MLP, waits=[(0, 1)]))
    f = check([s], 1)
    assert kinds(f) == [("race", "war")]
    assert "rank 0 #2 RMSNORM layer 1" in f[0].message and "still read by rank 0 #1 COPY" in f[0].message


def test_write_after_write_race():
    s = _s(copy(Buf.HIDDEN, Buf.SCRATCH), copy(Buf.NORMED, Buf.SCRATCH, row0=3, rows=2))
    assert kinds(check([s], 1)) == [("race", "waw")]


def test_transitive_order_is_enough_queue_order_is_not():
    a = copy(Buf.HIDDEN, Buf.NORMED, signal=0)
    b = rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, waits=[(0, 1)], signal=1)
    c = copy(Buf.NORMED, Buf.SCRATCH, waits=[(1, 1)])
    verify([_s(a, b, c)], 2)
    # the same queue without the NOOP's signal: c runs after a in the queue, but on another CTA
    c2 = copy(Buf.NORMED, Buf.SCRATCH)
    assert kinds(check([_s(a, c2)], 2)) == [("race", "raw")]


def test_deadlock_names_instruction_counter_value_target():
    s = _s(copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 1)], layer=3),   # waits on a later producer
           copy(Buf.HIDDEN, Buf.NORMED, signal=0))
    f = check([s], 1)
    dl = [x for x in f if x.kind == "deadlock"]
    assert dl and dl[0].instrs == ((0, 0),) and dl[0].counter == (0, 0)
    assert ("rank 0 #0 COPY layer 3" in dl[0].message and "counter 0 of rank 0 to reach 1" in dl[0].message
            and "stays at 0" in dl[0].message and "later in rank 0's own queue" in dl[0].message)
    with pytest.raises(PlanError, match="deadlock"):
        schedule([s], 1)


def test_cross_rank_cycle_is_a_deadlock():
    # rank 0 waits for rank 1's signal before signalling rank 1, and vice versa
    r0 = _s(rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, waits=[(0, 1)]),
            rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, signal=0, signal_scope=SignalScope.PEER,
                             signal_rank=1))
    r1 = _s(rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, waits=[(0, 1)]),
            rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, signal=0, signal_scope=SignalScope.PEER,
                             signal_rank=0))
    f = check([r0, r1], 1)
    assert [x.kind for x in f] == ["deadlock"] and set(f[0].instrs) == {(0, 0), (1, 0)}
    # swapped on one rank: rank 1 signals first, then everything runs
    verify([r0, _s(*serialize_rows(r1)[::-1])], 1)


def serialize_rows(stream):
    from mk.ir import deserialize
    return deserialize(stream)


def test_counter_targets_exact():
    w = copy(Buf.HIDDEN, Buf.NORMED, cols=4, signal=0)
    w2 = copy(Buf.HIDDEN, Buf.NORMED, col0=4, cols=4, signal=0)
    lo = _s(w, w2, copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 1)]))
    f = check([lo], 1)
    assert ("counter", "below") in kinds(f)
    assert "to reach 1, below the 2 it reaches" in [x for x in f if x.kind == "counter"][0].message
    hi = _s(w, w2, copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 3)]))
    assert {("counter", "above"), ("deadlock", "")} <= set(kinds(check([hi], 1)))
    never = _s(copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 1)]))
    assert ("counter", "unsignalled") in kinds(check([never], 1))
    # monotonic counters: the step starts at 10, targets are 10 + signals
    mono = _s(w, w2, copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 12)]))
    verify([mono], 1, initial=[[10]])
    assert check([mono], 1)


def test_overflow_and_format():
    big = copy(Buf.HIDDEN, Buf.NORMED, cols=4, signal=0, signal_count=2**31 - 1)
    s = _s(big, copy(Buf.HIDDEN, Buf.NORMED, col0=4, cols=4, signal=0),
           copy(Buf.NORMED, Buf.SCRATCH, waits=[(0, 2**31 - 1)]))
    assert "overflow" in {f.kind for f in check([s], 1)}
    bad = [copy(Buf.HIDDEN, Buf.NORMED, waits=[(5, 1)]),
           copy(Buf.HIDDEN, Buf.NORMED, signal=7),
           copy(Buf.HIDDEN, Buf.NORMED, signal=0, signal_scope=SignalScope.PEER, signal_rank=2),
           copy(Buf.HIDDEN, Buf.NORMED, signal=0, signal_count=0),
           copy(Buf.HIDDEN, Buf.NORMED, signal=0, signal_scope=5)]
    for ins in bad:
        f = check([_s(ins)], 2)
        assert [x.kind for x in f] == ["format"], f
    from mk.ir import INSTR_WORDS
    junk = torch.zeros(1, INSTR_WORDS, dtype=torch.int32)
    junk[0, 0] = 999
    assert "unknown opcode 999" in check([junk], 1)[0].message
    with pytest.raises(PlanError, match="int32"):
        check([torch.zeros(1, INSTR_WORDS, dtype=torch.int64)], 1)


def test_peer_write_race_and_fix():
    # rank 0 copies into rank 1's SCRATCH; rank 1 reads it. With a PEER signal + wait: fine.
    put = M.peer_copy(Buf.NORMED, Buf.SCRATCH, 1, 0, 4, 0, 8, signal=0,
                      signal_scope=SignalScope.PEER, signal_rank=1)
    use = copy(Buf.SCRATCH, Buf.HIDDEN, waits=[(0, 1)])
    verify([_s(put), _s(use)], 1)
    # signal to the wrong rank: rank 1 never gets it (deadlock); with no wait at all: a race
    # on rank 1's buffer
    put_local = M.peer_copy(Buf.NORMED, Buf.SCRATCH, 1, 0, 4, 0, 8, signal=0)
    assert "deadlock" in {f.kind for f in check([_s(put_local), _s(use)], 1)}
    f = check([_s(put), _s(copy(Buf.SCRATCH, Buf.HIDDEN))], 1)
    assert ("race", "raw") in kinds(f)
    assert "SCRATCH on rank 1" in [x for x in f if x.kind == "race"][0].message


def test_cli(tmp_path, capsys):
    p = M.build_plan(tp=2, seed=3)
    torch.save({"streams": p.tensors(), "num_counters": p.num_counters}, tmp_path / "ok.pt")
    assert main([str(tmp_path / "ok.pt")]) == 0
    assert "ok: 2 rank(s)" in capsys.readouterr().out
    m = M.m_drop_signal(p, np.random.default_rng(0))
    torch.save(m.plan.tensors(), tmp_path / "bad.pt")       # a bare list: counters inferred
    assert main([str(tmp_path / "bad.pt")]) == 1
    assert "REFUSED" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# Valid row plans, and 1,000+ mutants of them
# ------------------------------------------------------------------------------------------------

PLANS = M.valid_plans()


@pytest.mark.parametrize("k", range(len(PLANS)))
def test_valid_row_plans_accepted_and_deterministic(k):
    p = PLANS[k]
    assert check(p.tensors(), p.num_counters) == [], p.desc
    ex = M.Executor(p)
    status, ref = ex.run(K=1)
    assert status == "ok"
    rng = np.random.default_rng(k)
    for K in (None, 1, 2, 3):
        status, out = ex.run(K=K, rng=rng, switch_p=0.2)
        assert status == "ok" and M.same_outputs(out, ref), p.desc


def test_mutants_rejected_and_rejections_real(one_thread):
    """>= 1,000 mutants over 7 classes. Every mutant the executor can break is rejected; every
    rejected mutant is broken by the executor (stall or wrong output) in <= 50 interleavings;
    mutants no interleaving breaks are equivalent (and accepted)."""
    t0 = time.perf_counter()
    mutants = M.generate(PLANS, per_class=150, seed=0)
    assert len(mutants) >= 1000
    refs = {k: M.Executor(p).run(K=1)[1] for k, p in enumerate(PLANS)}
    table = collections.defaultdict(collections.Counter)
    bad = []
    for n, mut in enumerate(mutants):
        findings = check(mut.plan.tensors(), mut.plan.num_counters)
        v = M.judge(PLANS[mut.source], mut, findings, budget=50, seed=n, reference=refs[mut.source])
        row = table[mut.cls]
        row["generated"] += 1
        row["equivalent" if v.outcome == "same" else "bugs"] += 1
        row["rejected"] += bool(findings)
        if (v.outcome == "same") == bool(findings):
            bad.append(f"{mut.cls}: {mut.desc} -> {v.outcome}; "
                       f"{findings[0] if findings else 'accepted'}")
    print(f"\n{'class':22s} generated equivalent bugs rejected ({time.perf_counter() - t0:.1f} s)")
    for cls, row in table.items():
        print(f"{cls:22s} {row['generated']:9d} {row['equivalent']:10d} {row['bugs']:4d} "
              f"{row['rejected']:8d}")
    assert not bad, "\n".join(bad[:20])
    assert set(table) == set(M.MUTATIONS)
    for cls, row in table.items():
        assert row["generated"] >= 100 and row["bugs"] >= 0.9 * row["generated"], (cls, row)


def test_scale_50k_instructions():
    p = M.build_plan(tp=8, T=48, H=16, layers=13, blocks=12, tiles=8, fork=True, order="as built")
    n = sum(len(s) for s in p.streams)
    assert n >= 50_000
    t = time.perf_counter()
    assert check(p.tensors(), p.num_counters) == []
    assert time.perf_counter() - t < 10.0


# ------------------------------------------------------------------------------------------------
# The planner's plans: accepted over batch shapes, TP sizes, tile sizes, policies; mutants rejected,
# a sample judged by the real interpreter (mk.vm, random-interleaving mode)
# ------------------------------------------------------------------------------------------------

from mk.batch import SeqChunk, StepBatch  # noqa: E402
from mk.config import KernelConfig, ModelConfig, ParallelConfig  # noqa: E402
from mk.plan import POLICIES, PlanConfig, plan_step  # noqa: E402

P_MODEL = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                      num_kv_heads=2, head_dim=8, vocab_size=256)
P_KERNEL = KernelConfig(token_block=8, page_size=4, max_batch_tokens=96, max_seqs=8,
                        max_context=128, num_kv_pages=200)
P_CFGS = [PlanConfig(kv_split=16, o_tile=8, down_tile=8, mlp_tile=16, lm_tile=32, qkv_tile=8),
          PlanConfig(kv_split=64, o_tile=16, down_tile=8, mlp_tile=64, lm_tile=128, qkv_tile=16,
                     attn_kv_heads=2)]


def p_batches():
    return {
        "decode": StepBatch([SeqChunk([3 + i], 5 + 7 * i, list(range(12 * i, 12 * i + 12)))
                             for i in range(6)]),
        "prefill": StepBatch([SeqChunk(list(range(1, 30)), 0, list(range(0, 8)))]),
        "mixed": StepBatch([SeqChunk(list(range(1, 20)), 0, list(range(0, 5))),
                            SeqChunk([3], 40, list(range(20, 31))),
                            SeqChunk(list(range(30, 52)), 9, list(range(40, 48))),
                            SeqChunk([7], 2, [60]),
                            SeqChunk(list(range(5, 13)), 33, list(range(70, 81)))]),
        "one": StepBatch([SeqChunk([9], 0, [0])]),
    }


def planner_streams(batch, tp, cfg, model=P_MODEL, kernel=P_KERNEL):
    plans = [plan_step(batch, model, ParallelConfig(tp, r), kernel, cfg) for r in range(tp)]
    return [p.instrs for p in plans], plans[0]


SWEEP = [(b, tp, c, pol) for i, (b, tp) in enumerate((b, tp) for b in ("decode", "prefill", "mixed", "one")
                                                     for tp in (1, 2, 4, 8))
         for c, pol in [(i % 2, POLICIES[i % 3])]] + \
        [("mixed", 2, c, pol) for c in (0, 1) for pol in POLICIES]


@pytest.mark.parametrize("batch,tp,cfg,policy", SWEEP)
def test_planner_plans_accepted(batch, tp, cfg, policy):
    c = PlanConfig(**{**P_CFGS[cfg].__dict__, "policy": policy})
    streams, plan = planner_streams(p_batches()[batch], tp, c)
    findings = check(streams, plan.num_counters, meta=plan.meta)
    assert findings == [], "\n".join(str(f) for f in findings[:5])


@pytest.fixture(scope="module", params=[1, 2], ids=["unsplit", "split_k2"])
def tiny_vm(tmp_path_factory, request):
    from conftest import TINY_MHA, make_hf_checkpoint
    from mk.vm import VM
    from mk.weights import load_rank_weights
    ck = make_hf_checkpoint(tmp_path_factory.mktemp("verify-ckpt"), seed=3, **TINY_MHA)[0]
    kernel = KernelConfig(token_block=8, page_size=4, max_batch_tokens=48, max_seqs=8,
                          max_context=64, num_kv_pages=96)
    cfg = PlanConfig(kv_split=8, qkv_tile=16, o_tile=16, mlp_tile=32, down_tile=16, lm_tile=64,
                     split_k=request.param, splitk_align=8)
    w = [load_rank_weights(ck, ParallelConfig(2, r), dtype=torch.float32, progress=False)
         for r in range(2)]
    vm = VM(w, kernel, cfg)
    # the VM's buffers start as NaN and its KV cache persists: prefill the decode's context first
    vm.step(StepBatch([SeqChunk(list(range(20, 29)), 0, list(range(10, 14)))]))
    batch = StepBatch([SeqChunk(list(range(1, 12)), 0, list(range(0, 4))),
                       SeqChunk([5], 9, list(range(10, 14)))])
    return vm, batch


def _vm_outcome(vm, batch, streams, ref, seeds) -> str:
    """'stall' | 'wrong' | 'same' over the queue mode and random-interleaving runs."""
    from mk.vm import VMError
    hook = lambda r, instrs: streams[r].clone()  # noqa: E731
    for mode, seed in [("queue", 0)] + [("random", s) for s in seeds]:
        try:
            got = vm.step(batch, mode=mode, sms=[1, 64, 8, 3][seed % 4], seed=seed, stream_hook=hook)
        except VMError:
            return "stall"
        if not torch.allclose(got, ref, rtol=1e-4, atol=1e-4):
            return "wrong"
    return "same"


def test_planner_mutants_rejected_and_judged(tiny_vm, one_thread):
    """Mutants of a real TP-2 plan (the classes that apply to any family: the storage renames need
    row instructions' src/dst words). Every rejected mutant is broken (stall or different logits /
    residual / KV cache) by the executor of mk.mutate running the model families' torch faces in
    directed and random interleavings; every accepted one (redundant waits: an attention split
    that reads no key of an earlier block need not wait for the earlier blocks' join) runs the same
    in the executor and in the VM. A sample of the rejected ones also goes through mk.vm's
    random-interleaving mode, which breaks most of them (it executes whole instructions in a
    uniformly random ready order, so some interleavings are rare in it). Also on a split-K plan
    (split tiles, SPLITK_REDUCE, SK counters)."""
    vm, batch = tiny_vm
    base = vm.plan(batch)
    # the executor starts from the VM's state before this step: activations NaN, the KV cache
    # holding only the decode's context (stale reads of this step's keys read NaN)
    for r in range(2):
        vm.world[r].meta = base.for_rank(r).meta
        vm.world[r].reset_activations()
    outputs = (Buf.HIDDEN, Buf.LOGITS, Buf.K_CACHE, Buf.V_CACHE)
    P = M.Plan([base.for_rank(r).instrs.numpy().copy() for r in range(2)], base.num_counters, 0, 0, 0)
    ex0 = M.Executor(P, world={r: vm.world[r] for r in range(2)}, outputs=outputs)
    world = {r: SimpleNamespace(bufs={b: ex0.init[(r, b)] for (q, b) in ex0.init if q == r},
                                weights=vm.world[r].weights, meta=vm.world[r].meta)
             for r in range(2)}
    status, exec_ref = ex0.run(K=1)
    assert status == "ok"
    ref = vm.step(batch)
    assert torch.isfinite(ref).all()
    rng = np.random.default_rng(1)
    table = collections.defaultdict(collections.Counter)
    sample, bad = [], []
    for cls in ("drop a wait", "lower a target", "raise a target", "move before producer",
                "drop a signal"):
        seen = set()
        for n in range(24):
            m = M.MUTATIONS[cls](P, rng)
            key = b"".join(s.tobytes() for s in m.plan.streams) if m else None
            if m is None or key in seen:
                continue
            seen.add(key)
            f = check(m.plan.tensors(), base.num_counters, meta=base.meta)
            v = M.judge(P, m, f, budget=30, seed=n, reference=exec_ref, world=world,
                        outputs=outputs)
            row = table[cls]
            row["generated"] += 1
            row["rejected"] += bool(f)
            row["equivalent"] += v.outcome == "same"
            if bool(f) == (v.outcome == "same"):
                bad.append(f"{cls}: {m.desc} -> executor {v.outcome}; "
                           f"{f[0] if f else 'accepted'}")
            if not f:
                out = _vm_outcome(vm, batch, m.plan.tensors(), ref, seeds=range(1, 7))
                if out != "same":
                    bad.append(f"accepted but the VM shows {out}: {cls}: {m.desc}")
            elif len([s for s in sample if s[0] == cls]) < 2:
                sample.append((cls, m))
    shown = [(cls, _vm_outcome(vm, batch, m.plan.tensors(), ref, seeds=range(1, 9)))
             for cls, m in sample]
    print(dict(table), shown)
    assert not bad, "\n".join(bad[:20])
    for cls, row in table.items():
        assert row["rejected"] >= 8, (cls, row)
    assert sum(out != "same" for _, out in shown) >= 0.7 * len(shown), shown


@pytest.mark.parametrize("batch,tp,folds,policy", [("mixed", 1, 1, "op_major"),
                                                    ("mixed", 1, 0, "interleave"),
                                                    ("decode", 2, 1, "block_major"),
                                                    ("prefill", 1, 0, "op_major")])
def test_norm_fold_plans_accepted(batch, tp, folds, policy):
    """PlanConfig.norm_fold's plans (every GEMM split in 2, K slices of 16): race-free and deadlock-free,
    ROW_SCALE's writes by the row-scale norms and reads by the scaled reduces included."""
    c = PlanConfig(**{**P_CFGS[0].__dict__, "policy": policy, "split_k": 2, "norm_fold": 1,
                      "splitk_align": 16,
                      "fold_o_reduce": folds, "fold_down_reduce": folds})
    streams, plan = planner_streams(p_batches()[batch], tp, c)
    s = streams[0]
    row_scale = (s[:, W_OPCODE] == int(Op.RMSNORM)) & (s[:, ARG0 + 1] == int(Buf.ROW_SCALE))
    # with the reduce folds on, at TP 1 every norm finishes a split reduce: none is folded
    assert row_scale.any() == (not folds or tp > 1)
    findings = check(streams, plan.num_counters, meta=plan.meta)
    assert findings == [], "\n".join(str(f) for f in findings[:5])


@pytest.mark.parametrize("batch,tp,split_k,policy", [("mixed", 1, 1, "op_major"),
                                                      ("mixed", 1, 2, "interleave"),
                                                      ("decode", 2, 1, "block_major"),
                                                      ("prefill", 1, 1, "op_major")])
def test_norm_fold_unsplit_plans_accepted(batch, tp, split_k, policy):
    """PlanConfig.norm_fold=2: the unsplit QKV / gate-up tiles' epilogue waits on the row-scale
    norms (A_EPI_WAIT) order their ROW_SCALE reads and their writes; their reads of h are ordered
    by their W_WAIT words (h's writer) alone. Race-free and deadlock-free in every layer (the
    layer template's copies shift the epilogue wait's counter too)."""
    from mk.instructions import _common as mc
    c = PlanConfig(**{**P_CFGS[0].__dict__, "policy": policy, "split_k": split_k,
                      "norm_fold": 2, "splitk_align": 16, "fold_o_reduce": 0,
                      "fold_down_reduce": 0})
    streams, plan = planner_streams(p_batches()[batch], tp, c)
    s = streams[0].numpy()
    tiles = np.isin(s[:, W_OPCODE], [int(Op.QKV_ROPE), int(Op.GATE_UP)]) & (s[:, mc.A_EPI_WAIT] > 0)
    assert tiles.any() == (split_k == 1)
    findings = check(streams, plan.num_counters, meta=plan.meta)
    assert findings == [], "\n".join(str(f) for f in findings[:5])


@pytest.mark.parametrize("batch,tp,split_k,policy", [("mixed", 1, 1, "op_major"),
                                                      ("mixed", 1, 2, "interleave"),
                                                      ("decode", 2, 1, "block_major")])
def test_norm_fold_self_scaled_plans_accepted(batch, tp, split_k, policy):
    """PlanConfig.norm_fold=3: the self-scaled tiles read h after h's writer alone (no norm, no
    epilogue wait); with split_k 2 the row-scale norms and scaled reduces of norm_fold=2 stay.
    Race-free and deadlock-free in every layer."""
    from mk.instructions import _common as mc
    c = PlanConfig(**{**P_CFGS[0].__dict__, "policy": policy, "split_k": split_k,
                      "norm_fold": 3, "splitk_align": 16, "fold_o_reduce": 0,
                      "fold_down_reduce": 0})
    streams, plan = planner_streams(p_batches()[batch], tp, c)
    s = streams[0].numpy()
    own = np.isin(s[:, W_OPCODE], [int(Op.QKV_ROPE), int(Op.GATE_UP)]) & (
        s[:, mc.A_EPI_WAIT] == mc.SELF_SCALE)
    assert own.any() == (split_k == 1)
    assert ((s[:, W_OPCODE] == int(Op.RMSNORM)).any()) == (split_k == 2)
    findings = check(streams, plan.num_counters, meta=plan.meta)
    assert findings == [], "\n".join(str(f) for f in findings[:5])


def _unsplit_fold_stream():
    from mk.instructions import _common as mc
    c = PlanConfig(**{**P_CFGS[0].__dict__, "norm_fold": 2, "fold_o_reduce": 0,
                      "fold_down_reduce": 0})
    streams, plan = planner_streams(p_batches()["mixed"], 1, c)
    s = streams[0].clone()
    tiles = np.flatnonzero(((s[:, W_OPCODE] == int(Op.GATE_UP)) & (s[:, mc.A_EPI_WAIT] > 0)
                            & (s[:, 1] == 1)).numpy())
    return s, plan, int(tiles[0]), mc


def test_unsplit_fold_tile_reading_h_needs_its_own_wait():
    """A tile's reads of h come before its epilogue wait: with its W_WAIT on h's writer cleared,
    the norm its epilogue waits for (which did wait for h) orders only the late reads, so the
    verifier reports the read of HIDDEN."""
    s, plan, i, _ = _unsplit_fold_stream()
    s[i, W_WAIT0], s[i, W_WAIT0 + 1] = -1, 0
    f = check([s], plan.num_counters, meta=plan.meta)
    assert any(x.kind == "race" and "reads HIDDEN" in str(x) for x in f), [str(x) for x in f[:3]]


def test_unsplit_fold_tile_epilogue_wait_on_the_wrong_norm_races():
    """The epilogue wait pointed at the previous layer's MLP norm counter (its exact target: the
    counters check holds): the tile's ROW_SCALE read races with this layer's row-scale norm."""
    from mk.plan import PlanConfig as _PC  # noqa: F401
    s, plan, i, mc = _unsplit_fold_stream()
    cpl = plan.layout["cpl"]
    s[i, mc.A_EPI_WAIT] -= cpl
    f = check([s], plan.num_counters, meta=plan.meta)
    assert any(x.kind == "race" and "ROW_SCALE" in str(x) for x in f), [str(x) for x in f[:3]]


# hidden 128: two ROW_PART column groups a row, written by two 64-column O_PROJ / DOWN tiles
RP_MODEL = ModelConfig(hidden_size=128, intermediate_size=128, num_layers=2, num_heads=8,
                       num_kv_heads=2, head_dim=16, vocab_size=256)


def _row_parts_streams(batch, policy, split_k=1):
    # split_k 2 with splitk_max_tokens 1: QKV_ROPE / GATE_UP split (their own caps), O_PROJ /
    # DOWN not (the writers stay whole)
    c = PlanConfig(**{**P_CFGS[0].__dict__, "policy": policy, "split_k": split_k,
                      "splitk_max_tokens": 1, "splitk_align": 16, "norm_fold": 4,
                      "qkv_tile": 16, "o_tile": 64, "down_tile": 64})
    return planner_streams(p_batches()[batch], 1, c, model=RP_MODEL)


@pytest.mark.parametrize("batch,policy,split_k", [("mixed", "op_major", 1),
                                                  ("prefill", "interleave", 1),
                                                  ("decode", "block_major", 1),
                                                  ("mixed", "op_major", 2)])
def test_norm_fold_row_parts_plans_accepted(batch, policy, split_k):
    """PlanConfig.norm_fold=4: the QKV / gate-up tiles (split_k 2: their SPLITK_REDUCEs) read
    the ROW_PART sums of the tiles that wrote their h (EMBED / DOWN, O_PROJ) after h's writer
    alone, with no norm planned; every layer's writers rewrite a set only after its last
    reader. Race-free and deadlock-free."""
    from mk.instructions import _common as mc
    from mk.instructions import splitk as sk
    streams, plan = _row_parts_streams(batch, policy, split_k)
    s = streams[0].numpy()
    gemm = np.isin(s[:, W_OPCODE], [int(Op.QKV_ROPE), int(Op.GATE_UP)])
    if split_k == 1:
        assert (s[gemm, mc.A_EPI_WAIT] == mc.ROW_PARTS).all()
    else:
        red = s[:, W_OPCODE] == int(Op.SPLITK_REDUCE)
        assert red.any() and (s[red, sk.A_ROW_SCALE] == sk.FROM_ROW_PART).all()
    assert not (s[:, W_OPCODE] == int(Op.RMSNORM)).any()
    findings = check(streams, plan.num_counters, meta=plan.meta)
    assert findings == [], "\n".join(str(f) for f in findings[:5])


def test_row_parts_reads_and_writes_are_declared():
    """The accesses the verifier orders: a gate-up tile scaled from ROW_PART reads its rows'
    whole MLP set (columns G .. 2G), an O_PROJ tile writing it its rows x the groups of its
    columns, a DOWN tile the attention set's (0 .. G); a gate-up tile whose wait on its block's
    O_PROJ tiles is cleared is reported."""
    from mk.instructions import _common as mc
    from mk.instructions.base import Buf, family_of
    from mk.ir import Instruction
    streams, plan = _row_parts_streams("mixed", "op_major")
    s = streams[0]
    G = mc.row_part_groups(RP_MODEL.hidden_size)

    def parts(i, kind):
        ins = Instruction.decode(s[i])
        a = family_of(ins.opcode).accesses(ins, 0, plan.meta)
        return ins, [(r.row0, r.row1, r.col0, r.col1) for r in getattr(a, kind)
                     if r.buf == Buf.ROW_PART]
    ops = s[:, W_OPCODE].numpy()
    gu = int(np.flatnonzero(ops == int(Op.GATE_UP))[0])
    ins, reads = parts(gu, "reads")
    assert reads == [(ins.row0, ins.row0 + ins.rows, G, 2 * G)]
    for op, base in ((Op.O_PROJ, G), (Op.DOWN, 0)):
        for i in np.flatnonzero(ops == int(op))[:2]:
            ins, writes = parts(int(i), "writes")
            c0 = base + ins.col0 // mc.ROW_PART_COLS
            assert writes == [(ins.row0, ins.row0 + ins.rows, c0, c0 + ins.cols // 64)], op
    bad = s.clone()
    i = int(np.flatnonzero((ops == int(Op.GATE_UP)) & (s[:, 1] == 1).numpy())[0])
    bad[i, W_WAIT0], bad[i, W_WAIT0 + 1] = -1, 0
    f = check([bad], plan.num_counters, meta=plan.meta)
    assert any(x.kind == "race" and "GATE_UP layer 1" in str(x) for x in f), [str(x) for x in f]
