"""bench/schedsim.py: the schedule model on hand-made streams whose spans follow from its rules."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from mk.ir import INSTR_WORDS, MAX_WAITS, NO_COUNTER, W_OPCODE, W_SIGNAL, W_SIGNAL_COUNT, W_WAIT0, Op

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import schedsim  # noqa: E402


def stream(*instrs):
    """(op, waits [(counter, target)], signal counter or None) -> words."""
    w = np.zeros((len(instrs), INSTR_WORDS), np.int32)
    w[:, W_WAIT0:W_WAIT0 + 2 * MAX_WAITS] = NO_COUNTER
    w[:, W_SIGNAL] = NO_COUNTER
    for i, (op, waits, signal) in enumerate(instrs):
        w[i, W_OPCODE] = int(op)
        for j, (c, t) in enumerate(waits):
            w[i, W_WAIT0 + 2 * j], w[i, W_WAIT0 + 2 * j + 1] = c, t
        if signal is not None:
            w[i, W_SIGNAL], w[i, W_SIGNAL_COUNT] = signal, 1
    return w


DUR = {Op.GATE_UP: 10.0, Op.DOWN: 4.0, Op.RMSNORM: 1.0}


def test_chain_and_parallel_tiles():
    """Two GATE_UP tiles on two SMs in parallel, a DOWN waiting for both: each claim takes
    0.5 us, so 0.5 + 10 + 4; on one SM the three run in turn: 0.5 + 10 + 10 + 4."""
    w = stream((Op.GATE_UP, [], 0), (Op.GATE_UP, [], 0), (Op.DOWN, [(0, 2)], None))
    r = schedsim.simulate(w, DUR, num_sms=2, claim_after_loads=False)
    assert r["span_us"] == pytest.approx(14.5)
    assert r["busy_us"] == {"GATE_UP": 20.0, "DOWN": 4.0}
    assert r["utilisation"] == pytest.approx(24.0 / (2 * 14.5))
    r1 = schedsim.simulate(w, DUR, num_sms=1, claim_after_loads=False)
    assert r1["span_us"] == pytest.approx(24.5)


def test_claim_after_loads_leaves_the_next_tile_to_an_idle_sm():
    """GATE_UP on SM 0, a 1 us norm on SM 1, another GATE_UP: with the slot-free claim SM 0
    claims it at 0.5 us (it was first in SM order) and runs it after its first, ending at 20.5;
    claimed after loads (90% of a tile), SM 0 cannot claim before 9.5 and SM 1 takes it at 0.6,
    ending at 11.5."""
    w = stream((Op.GATE_UP, [], None), (Op.RMSNORM, [], None), (Op.GATE_UP, [], None))
    free = schedsim.simulate(w, DUR, num_sms=2, claim_after_loads=False)
    after = schedsim.simulate(w, DUR, num_sms=2, claim_after_loads=True)
    assert free["span_us"] == pytest.approx(20.5)
    assert after["span_us"] == pytest.approx(11.5)


def test_wait_on_a_counter_no_earlier_ticket_reaches():
    w = stream((Op.RMSNORM, [(3, 1)], None))
    with pytest.raises(ValueError, match="never reach"):
        schedsim.simulate(w, DUR, num_sms=1)


def test_epilogue_wait_bounds_the_tiles_end_not_its_start():
    """PlanConfig.norm_fold=2's epilogue wait: a GATE_UP tile whose epilogue waits for a norm
    that ends late starts at once (its other waits are met) and ends EPI_FRAC of its run after
    the norm: norm (waiting for a 30 us DOWN) ends at 31.5; the tile started at 0.6 would end
    at 10.6, so it ends at 31.5 + 0.5. Without the word it ends at 10.6."""
    from mk.instructions import _common as mc
    dur = {**DUR, Op.DOWN: 30.0}
    w = stream((Op.DOWN, [], 0), (Op.RMSNORM, [(0, 1)], 1), (Op.GATE_UP, [], None))
    plain = schedsim.simulate(w, dur, num_sms=3, claim_after_loads=False)
    assert plain["span_us"] == pytest.approx(31.5)
    w[2, mc.A_EPI_WAIT], w[2, mc.A_EPI_TARGET] = 1 + 1, 1
    r = schedsim.simulate(w, dur, num_sms=3, claim_after_loads=False)
    assert r["span_us"] == pytest.approx(31.5 + schedsim.EPI_FRAC * 10.0)


def test_plan_words_take_the_backends_default_plan_and_mixed_points():
    """The model plans a point as launch/bench.py's megakernel runs it: the backend's default
    plan (norm_fold=4: at 300 decode tokens GATE_UP does not split, its tiles scale their rows
    from ROW_PART and no norm is planned; norm_fold=2 over it: the epilogue wait on the MLP norm;
    norm_fold=0: neither), and a mixed point (decodes + one prompt) as that many more token rows
    than its decodes alone."""
    from mk.instructions._common import A_EPI_WAIT, ROW_PARTS, epilogue_wait_words
    from mk.ir import W_OPCODE
    default = schedsim.plan_words(300, 64)
    nf2 = schedsim.plan_words(300, 64, "norm_fold=2")
    plain = schedsim.plan_words(300, 64, "norm_fold=0")
    waits = [sum(1 for t in range(len(w)) if epilogue_wait_words(w[t]))
             for w in (default, nf2, plain)]
    assert waits[0] == 0 and waits[1] > 0 and waits[2] == 0, waits
    gate_up = default[default[:, W_OPCODE] == int(Op.GATE_UP)]
    assert len(gate_up) and (gate_up[:, A_EPI_WAIT] == ROW_PARTS).all()
    assert not (default[:, W_OPCODE] == int(Op.RMSNORM)).any()
    decode = schedsim.plan_words(8, 64)
    mixed = schedsim.plan_words(8, 64, prefill=100)
    attn = [int((w[:, W_OPCODE] == int(Op.ATTENTION)).sum()) for w in (decode, mixed)]
    assert len(mixed) > len(decode) and attn[1] > attn[0], (len(decode), len(mixed), attn)
    assert schedsim.point_label(dict(batch=256, prefill=1024)) == "256+1024"
    assert schedsim.point_label(dict(batch=64, prefill=0)) == "64"


def test_journaled_runs_are_replanned_with_their_own_default_plan(tmp_path):
    """A journal JSON is replanned under the default plan its run had: bench.py records it
    ("default_plan", since session 50); older JSONs ran norm_fold=2's; a field today's default
    sets that the run's did not (attn_lpt, session 56; attn_chunk_splits, session 58;
    attn_chunk_reduce, session 59) at PlanConfig's own value."""
    base = {"command": "python launch/bench.py --plan raster_blocks=4", "points": []}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(base))
    s50 = tmp_path / "s50.json"
    s50.write_text(json.dumps(dict(base, default_plan={"split_k": 0, "norm_fold": 4})))
    s56 = tmp_path / "s56.json"
    s56.write_text(json.dumps(dict(base, default_plan={"split_k": 0, "norm_fold": 4,
                                                       "attn_lpt": 1})))
    s58 = tmp_path / "s58.json"
    s58.write_text(json.dumps(dict(base, default_plan={"split_k": 0, "norm_fold": 4,
                                                       "attn_lpt": 1, "attn_chunk_splits": 1})))
    new = tmp_path / "new.json"
    new.write_text(json.dumps(dict(base, default_plan={"split_k": 0, "norm_fold": 4,
                                                       "attn_lpt": 1, "attn_chunk_splits": 1,
                                                       "attn_chunk_reduce": 1})))
    assert (schedsim._journaled_points(f"{old}::x=1")[0]
            == "attn_lpt=0,attn_chunk_splits=0,attn_chunk_reduce=0,norm_fold=2,raster_blocks=4,x=1")
    assert (schedsim._journaled_points(str(s50))[0]
            == "attn_lpt=0,attn_chunk_splits=0,attn_chunk_reduce=0,norm_fold=4,raster_blocks=4")
    assert (schedsim._journaled_points(str(s56))[0]
            == "attn_chunk_splits=0,attn_chunk_reduce=0,norm_fold=4,attn_lpt=1,raster_blocks=4")
    assert (schedsim._journaled_points(str(s58))[0]
            == "attn_chunk_reduce=0,norm_fold=4,attn_lpt=1,attn_chunk_splits=1,raster_blocks=4")
    assert (schedsim._journaled_points(str(new))[0] == "norm_fold=4,attn_lpt=1,attn_chunk_splits=1,"
                                                       "attn_chunk_reduce=1,raster_blocks=4")


def test_gemm_tiles_follow_their_k_slice():
    """With base_k (the mean K of the tiles the durations were journaled on), a GATE_UP tile of
    half that K runs GEMM_FIXED_US + half the rest, one of twice it the fixed part + twice the
    rest; other opcodes and a call without base_k keep their opcode's duration."""
    from mk.instructions import matmul
    w = stream((Op.GATE_UP, [], None), (Op.GATE_UP, [], None), (Op.RMSNORM, [], None))
    w[0, matmul.A_K], w[1, matmul.A_K] = 2048, 8192
    assert schedsim.mean_k(w) == {Op.GATE_UP: 5120.0}
    dur = {Op.GATE_UP: 45.0, Op.RMSNORM: 3.0}
    fixed = schedsim.GEMM_FIXED_US
    got = schedsim.tile_durations(w, dur, {Op.GATE_UP: 4096.0})
    assert got == pytest.approx([fixed + (45 - fixed) / 2, fixed + 2 * (45 - fixed), 3.0])
    assert schedsim.tile_durations(w, dur) == pytest.approx([45.0, 45.0, 3.0])
    r = schedsim.simulate(w, dur, num_sms=3, claim_after_loads=False,
                          base_k={Op.GATE_UP: 4096.0}, detail=True)
    assert r["end"] - r["start"] == pytest.approx(got)
    assert sorted(r["sm"].tolist()) == [0, 1, 2]


def test_predict_flags_the_fields_it_cannot_rank():
    """raster_blocks and the tile fields act through L2 / HBM traffic, which the model does not
    have (session 57: raster_blocks 4 / 2 predicted faster, measured slower): flagged, the
    queue-order fields not."""
    assert schedsim.memory_blind("raster_blocks=4") == ["raster_blocks"]
    assert schedsim.memory_blind("attn_lpt=0, mlp_tile=128,token_block=64") == ["mlp_tile",
                                                                                 "token_block"]
    assert schedsim.memory_blind("policy=interleave,attn_pair=2") == []
    assert schedsim.memory_blind("") == []


def test_attention_durations_follow_the_journaled_streams_work():
    """An ATTENTION instruction runs the opcode's journaled duration times its est_cost_ns over
    the journaled stream's mean cost (base_work): a plan that cuts one long prompt-chunk
    instruction into shorter ones gets shorter instructions, not the journaled mean each
    (session 58: attn_chunk_splits was predicted +27% that way, its journal showed -7%); an
    ATTN_REDUCE likewise by the partial rows it reads (rows x splits). Without base_work (a
    reordered stream) the stream's own mean is the base."""
    from mk.instructions import attention as at
    from mk.ir import W_ROWS

    def prompt_chunks(rows_each):
        w = stream(*[(Op.ATTENTION, [], None)] * len(rows_each)
                   + [(Op.ATTN_REDUCE, [], None)] * len(rows_each))
        for i, rows in enumerate(rows_each):
            w[i, W_ROWS], w[i, at.A_MODE], w[i, at.A_QPK] = rows, at.MODE_PARTIAL, 8
            w[i, at.A_POS0], w[i, at.A_KV0], w[i, at.A_KV1] = 2048, 1024, 2048
            w[len(rows_each) + i, W_ROWS], w[len(rows_each) + i, at.A_NSPLIT] = rows, 2
        return w

    whole, chunked = prompt_chunks([128]), prompt_chunks([16] * 8)
    base = schedsim.mean_work(whole)
    assert base == pytest.approx({Op.ATTENTION: 8 * 16 * at.COST_NS_TILE_BLOCK,  # 8 M tiles x 16
                                  Op.ATTN_REDUCE: 128 * 2})                   # key blocks
    dur = {Op.ATTENTION: 320.0, Op.ATTN_REDUCE: 90.0}
    assert schedsim.tile_durations(whole, dur, base_work=base) == pytest.approx([320.0, 90.0])
    assert (schedsim.tile_durations(chunked, dur, base_work=base)
            == pytest.approx([40.0] * 8 + [11.25] * 8))
    assert schedsim.tile_durations(chunked, dur) == pytest.approx([320.0] * 8 + [90.0] * 8)
    assert schedsim.mean_work(stream((Op.GATE_UP, [], None))) == {}
