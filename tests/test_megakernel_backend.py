"""`--backend megakernel` (mk.megakernel_step) on the CPU: clear errors, exit code 1, no traceback.

Without a GPU, launch/generate.py --backend megakernel stops at once with "needs a CUDA GPU"; a
model the GPU bodies cannot run is refused with the reason (the GPU runs are in
test_megakernel_step_gpu.py). The rows-only test mode is `python -m mk.megakernel selftest`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run_cpu(args, timeout=300):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT) + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def _has_cutlass():
    import importlib.util
    return importlib.util.find_spec("cutlass") is not None


def test_generate_backend_megakernel_without_gpu_fails_cleanly():
    r = _run_cpu(["launch/generate.py", "--backend", "megakernel", "--max-new-tokens", "2"])
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    if _has_cutlass():
        assert last.startswith("error: RuntimeError:") and "needs a CUDA GPU" in last, last
    else:   # the backend module cannot load: the engine says so
        assert last.startswith("error: ValueError:") and "unavailable" in last, last


def test_selftest_without_gpu_fails_cleanly():
    r = _run_cpu(["-m", "mk.megakernel", "selftest"], timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    msg = r.stderr.strip().splitlines()[-1]
    assert ("needs a CUDA GPU" in msg) if _has_cutlass() else ("CuTe DSL" in msg), msg


def test_selftest_usage():
    pytest.importorskip("cutlass")
    r = _run_cpu(["-m", "mk.megakernel"], timeout=120)
    assert r.returncode == 2 and "usage: python -m mk.megakernel selftest" in r.stderr


def test_unsupported_configurations_are_named():
    """mk.megakernel_step refuses what the GPU bodies cannot run, each reason in words."""
    pytest.importorskip("cutlass")
    import torch

    from mk.config import KernelConfig, ParallelConfig
    from mk.megakernel_step import unsupported_reasons
    from mk.plan import PlanConfig
    from mk.tiny import TINY_CONFIG, TINY_HD128_CONFIG
    assert unsupported_reasons(TINY_HD128_CONFIG, ParallelConfig(), KernelConfig()) == []
    why = unsupported_reasons(TINY_CONFIG, ParallelConfig(tp_size=2, rank=1),
                              KernelConfig(page_size=4), PlanConfig(kv_split=100, kv_split_min=50),
                              torch.float32)
    text = " | ".join(why)
    for needle in ("TP size 2", "float32", "head_dim 32", "page_size 4", "kv_split 100",
                   "kv_split_min 50"):
        assert needle in text, (needle, text)
    from dataclasses import replace

    from mk.tiles import NORM_MAX_HIDDEN
    wide = replace(TINY_HD128_CONFIG, hidden_size=2 * NORM_MAX_HIDDEN)
    assert any(f"hidden_size {2 * NORM_MAX_HIDDEN}" in w for w in
               unsupported_reasons(wide, ParallelConfig(), KernelConfig())), "RMSNORM's limit"
    # norm_fold=4's ROW_PART chunks (4 sums each): 320 columns run under norm_fold=2, not 4
    odd = replace(TINY_HD128_CONFIG, hidden_size=320)
    assert unsupported_reasons(odd, ParallelConfig(), KernelConfig(), PlanConfig(norm_fold=2)) == []
    assert any("norm_fold=4 with hidden_size 320" in w for w in
               unsupported_reasons(odd, ParallelConfig(), KernelConfig(), PlanConfig(norm_fold=4)))
    assert unsupported_reasons(TINY_HD128_CONFIG, ParallelConfig(), KernelConfig(),
                               PlanConfig(norm_fold=4)) == []


def test_meta_capacity_holds_the_largest_step():
    """The fixed-capacity metadata buffer holds build_meta of a batch at every compiled maximum."""
    pytest.importorskip("cutlass")
    from mk.batch import SeqChunk, StepBatch
    from mk.config import KernelConfig
    from mk.megakernel_step import meta_capacity
    from mk.plan import build_meta
    k = KernelConfig(max_batch_tokens=256, max_seqs=8, max_context=512, page_size=16)
    per_seq = k.max_context // k.page_size
    # max_seqs sequences at full context: 7 decode tokens + one 249-token prefill chunk
    seqs = [SeqChunk([1], k.max_context - 1, list(range(i * per_seq, (i + 1) * per_seq)))
            for i in range(k.max_seqs - 1)]
    last = k.max_batch_tokens - (k.max_seqs - 1)
    seqs.append(SeqChunk([1] * last, k.max_context - last,
                         list(range((k.max_seqs - 1) * per_seq, k.max_seqs * per_seq))))
    meta = build_meta(StepBatch(seqs), k)
    assert meta.tensor.numel() <= meta_capacity(k)


def test_backend_construction_refuses_unsupported_model(monkeypatch):
    """The GPU branch, simulated: the tiny head_dim-32 model is refused at construction with the
    reason, before any buffer is allocated (the GPU twin is in test_megakernel_step_gpu.py)."""
    pytest.importorskip("cutlass")
    import torch

    import mk.megakernel as M
    from mk.config import ParallelConfig
    from mk.megakernel_step import MegakernelStepBackend, UnsupportedModelError
    from mk.tiny import tiny_checkpoint
    from mk.weights import load_rank_weights
    monkeypatch.setattr(M, "require_gpu", lambda *a, **k: None)
    w = load_rank_weights(tiny_checkpoint(), ParallelConfig(), dtype=torch.bfloat16,
                          device=torch.device("cpu"), progress=False)
    from mk.engine import default_kernel_config
    with pytest.raises(UnsupportedModelError, match="head_dim 32"):
        MegakernelStepBackend(w, default_kernel_config(w.config))


def test_engine_megakernel_backend_is_the_step_backend_whatever_was_imported_first():
    """Importing mk.megakernel (the selftest's module) before the engine resolves
    `--backend megakernel` must not shadow the model step's backend: the engine builds
    MegakernelStepBackend (here refusing the tiny head_dim-32 model with its reason). A fresh
    interpreter, so that no other test has imported mk.megakernel_step already."""
    pytest.importorskip("cutlass")
    code = """
import torch
import mk.megakernel as M
M.require_gpu = lambda *a, **k: None
from mk.config import ParallelConfig
from mk.engine import create_backend, default_kernel_config
from mk.tiny import tiny_checkpoint
from mk.weights import load_rank_weights
w = load_rank_weights(tiny_checkpoint(), ParallelConfig(), dtype=torch.bfloat16,
                      device=torch.device("cpu"), progress=False)
try:
    create_backend("megakernel", w, default_kernel_config(w.config))
except Exception as e:
    print(type(e).__module__, type(e).__name__, e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mk.megakernel_step UnsupportedModelError" in r.stdout, r.stdout[-2000:]
    assert "head_dim 32" in r.stdout


def test_check_plan_refuses_rmsnorm_rows_wider_than_the_body():
    """RMSNORM's body holds a row of at most NORM_MAX_HIDDEN columns in its registers: a stream
    over wider rows is refused on the host, with the limit named."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.tiles import NORM_MAX_HIDDEN
    T = 16
    for H, ok in ((NORM_MAX_HIDDEN, True), (NORM_MAX_HIDDEN + 1024, False)):
        instrs, n_ctr = M.plan_layers(T, H, 1)
        if ok:
            M.check_plan(instrs, 4, T, H, n_ctr)
        else:
            with pytest.raises(ValueError, match=f"at most {NORM_MAX_HIDDEN}"):
                M.check_plan(instrs, 4, T, H, n_ctr)


def test_tile_table_overrides_are_validated():
    """MK_TILES (mk.tiles.table_overrides): entries replace the class's tile; a tile the opcode's
    body cannot run, an unknown opcode, class or tile is refused with the reason."""
    from mk.ir import Op
    from mk.tiles import CLASS_NAMES, TILE_TABLE, table_overrides
    t = table_overrides("GATE_UP@256=gu_m128, DOWN@max=m128n128")
    assert t[Op.GATE_UP][CLASS_NAMES.index("256")] == "gu_m128"
    assert t[Op.DOWN][CLASS_NAMES.index("max")] == "m128n128"
    assert t[Op.GATE_UP][CLASS_NAMES.index("128")] == TILE_TABLE[Op.GATE_UP][1]
    assert t[Op.QKV_ROPE] == TILE_TABLE[Op.QKV_ROPE]
    for bad, why in (("GATE_UP@256=m128n256", "gate/up"), ("QKV_ROPE@64=m64n128", "wgmma N"),
                     ("ATTENTION@64=m64n128", "tile table row"), ("DOWN@512=m64n128", "class"),
                     ("DOWN@64=m32n64", "unknown tile"), ("DOWN64", "OP@CLASS=TILE")):
        with pytest.raises(ValueError, match=why):
            table_overrides(bad)


def test_m128_tiles_at_batch_128_and_256_plan_and_pass_the_host_check():
    """The M <= 256 class runs on 128-row tiles (the default since session 7, bench/E2E_NOTES.md):
    the 70B TP8 rank's B = 128 and B = 256 decode steps plan with 128-row token blocks, split-K on
    the token GEMMs at B = 128 and at B = 256 on those whose own cap allows it (QKV_ROPE and
    GATE_UP since session 9: PlanConfig.splitk_token_cap; GATE_UP's 64-column tiles of session 16
    are too many to split at B = 256, O_PROJ / DOWN's 128 m128n64 tiles at B = 128 since session
    65), and pass the
    megakernel's host check (in a process of its own: the tile table is read at import, and
    MK_TILES is cleared)."""
    pytest.importorskip("cutlass")
    code = r'''
import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)
from host_step import rank_model, point_batch
import mk.megakernel as M
from mk.config import KernelConfig, ParallelConfig
from mk.ir import Op, W_OPCODE
from mk.megakernel_step import meta_operands
from mk.plan import SPLITK_OP_CAPS, PlanConfig, Planner
model, cfg = rank_model(), PlanConfig(split_k=0)
never = PlanConfig(split_k=1)
kernel = KernelConfig(page_size=16, max_seqs=4096, max_context=1024, max_batch_tokens=4096,
                      num_kv_pages=256 * 64)
for b in (128, 256):
    plan = Planner(model, ParallelConfig(), kernel, cfg).plan(point_batch(b, 1024, 0, 16))
    assert plan.tiles.token_block == 128, plan.tiles
    whole = Planner(model, ParallelConfig(), kernel, never).plan(point_batch(b, 1024, 0, 16))
    count = lambda p, op: int((p.instrs[:, W_OPCODE] == int(op)).sum())
    split = {op for op in SPLITK_OP_CAPS if count(plan, op) > count(whole, op)}
    want = {op for op in SPLITK_OP_CAPS if b <= cfg.splitk_token_cap(op)}
    if b == 256:        # GATE_UP's 112 tiles of 64 columns (session 16) do not split on 132 SMs
        want.discard(Op.GATE_UP)
    if b == 128:        # nor O_PROJ / DOWN's 128 tiles of 64 columns (m128n64, session 65)
        want -= {Op.O_PROJ, Op.DOWN}
    assert split == want and want, (b, split, want)
    assert (count(plan, Op.SPLITK_REDUCE) > 0) and count(whole, Op.SPLITK_REDUCE) == 0
    nbuf, T, H, kw = meta_operands(model, kernel, cfg, b)
    M.check_plan(plan.representative_stream(), nbuf, T, H, 1 << 22, **kw)
    print("ok", b, len(plan))
''' % (str(ROOT / "bench"), str(ROOT))
    env = {k: v for k, v in os.environ.items() if k != "MK_TILES"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.count("ok") == 2, r.stderr[-3000:]


def test_each_class_variant_compiles_the_split_code_its_plans_use():
    """A megakernel variant compiles the split-K tiles of only the opcodes its M class's plans may
    split (mk.megakernel_step.class_split_ops: the M1024 class QKV_ROPE alone, the largest none,
    with the default plan; ~10% of the class's SASS): the 70B TP8 rank's decode plans at the
    classes' edges, under the default plan and two with other caps, split only those opcodes and
    pass the host check against the variant's slots; a plan that splits an opcode the variant
    left out is refused by name (in a process of its own, MK_TILES cleared, as above)."""
    pytest.importorskip("cutlass")
    code = r'''
import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)
import numpy as np
from host_step import rank_model, point_batch
import mk.megakernel as M
from mk.config import KernelConfig, ParallelConfig
from mk.instructions import _common as mc
from mk.ir import Op, W_OPCODE
from mk.megakernel_step import class_split_ops, default_plan_config, meta_operands
from mk.plan import Planner
model = rank_model()
kernel = KernelConfig(page_size=16, max_seqs=4096, max_context=1024, max_batch_tokens=4096,
                      num_kv_pages=4096 * 16)
allops = {int(o) for o in M.SPLITK_OPS}
assert class_split_ops(default_plan_config(), 64) == allops
assert class_split_ops(default_plan_config(), 1024) == {int(Op.QKV_ROPE)}
assert class_split_ops(default_plan_config(), 4096) == set()
assert class_split_ops(default_plan_config(split_k=1), 1) == set()
for cfg in (default_plan_config(), default_plan_config(splitk_o_max_tokens=512),
            default_plan_config(split_k=2, splitk_qkv_max_tokens=2048)):
    for b in (1, 64, 65, 256, 257, 1024, 1025, 2048):
        s = Planner(model, ParallelConfig(), kernel, cfg).plan(point_batch(b, 256, 0, 16))
        stream = s.representative_stream()
        ops = s.instrs[:, W_OPCODE].numpy()
        nsplit = s.instrs[:, mc.A_NSPLIT].numpy()
        split = set(np.unique(ops[np.isin(ops, list(allops)) & (nsplit >= 2)]).tolist())
        assert split <= class_split_ops(cfg, b), (cfg, b, split)
        nbuf, T, H, kw = meta_operands(model, kernel, cfg, b)
        M.check_plan(stream, nbuf, T, H, 1 << 22, **kw)
        print("ok", b, sorted(split))
# a B=64 plan splits QKV_ROPE / GATE_UP: the variant without their split code refuses it
cfg = default_plan_config()
s = Planner(model, ParallelConfig(), kernel, cfg).plan(point_batch(64, 256, 0, 16))
nbuf, T, H, kw = meta_operands(model, kernel, cfg, 64)
kw["slots"] = M.gemm_slots(kw["gemm"], 64, split_ops=frozenset(), row_parts=True)
try:
    M.check_plan(s.representative_stream(), nbuf, T, H, 1 << 22, **kw)
except ValueError as e:
    assert "compiled without them" in str(e) and "split_ops" in str(e), e
    print("refused", e)
''' % (str(ROOT / "bench"), str(ROOT))
    env = {k: v for k, v in os.environ.items() if k != "MK_TILES"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("ok") == 24 and "refused" in r.stdout, r.stdout[-3000:]
    # the largest class's steps never split; the smallest's split QKV_ROPE and GATE_UP (O_PROJ /
    # DOWN whole on m64n64 since session 64), while its variant compiles every opcode's split code
    # (a plan with caps of 1 token splits them at B=1: class_split_ops asks the class's smallest)
    assert "ok 2048 []" in r.stdout and "ok 1 [9, 13]" in r.stdout, r.stdout


def test_class_split_ops_switch_restores_every_opcodes_split_code(monkeypatch):
    """MK_CLASS_SPLIT_OPS=0: no per-class restriction (None: every opcode's split code, the
    build before session 43); unset, the M1024 class of the default plan compiles QKV_ROPE's."""
    from mk.ir import Op
    from mk.megakernel_step import class_split_ops, default_plan_config
    monkeypatch.delenv("MK_CLASS_SPLIT_OPS", raising=False)
    assert class_split_ops(default_plan_config(), 1024) == {int(Op.QKV_ROPE)}
    monkeypatch.setenv("MK_CLASS_SPLIT_OPS", "0")
    assert class_split_ops(default_plan_config(), 1024) is None


def test_backend_prepare_rewrites_the_held_stream_for_fast_path_plans():
    """MegakernelStepBackend.prepare on the CPU (its GPU parts stubbed): the first plan and every
    plan of a new structure are checked and uploaded; a decode step of the held structure only
    rewrites the held copy (StreamAdvance), which then equals the plan's stream; another
    Megakernel (another M class) takes a full upload. Then the engine's overlapped steps through
    plan_step / run_step / finish: the same uploads and rewrites, the late decode tokens in the
    metadata, each launch finished before the next; then run ahead: each step queued behind the
    one in flight, its late tokens gathered from the step before's sampled tokens."""
    from collections import deque

    import torch

    from mk.batch import SeqChunk, StepBatch
    from mk.config import KernelConfig, ModelConfig, ParallelConfig
    from mk.instructions import _common as mc
    from mk.megakernel_step import LateTokens, MegakernelStepBackend
    from mk.plan import PlanConfig, Planner

    class FakeMegakernel:
        hang_s = 1.0

        def __init__(self):
            self.checked, self.launched, self.waited = 0, 0, 0
            self.fail_at, self.dropped = None, []

        def check_stream(self, checked, meta_page_size=None):
            self.checked += 1
            return 7

        def upload(self, stream, n_ctr):
            return stream.clone(), int(stream.shape[0]), n_ctr

        def launch(self, handle, check=True, record=False):
            assert not check and record
            self.launched += 1
            return ("record", self.launched)

        def finish_launch(self, rec, hang_s=None):
            assert rec == ("record", self.waited + 1)       # oldest first, each once
            self.waited += 1
            if self.waited == self.fail_at:
                raise RuntimeError("launch failed")

        def drop_launch(self, rec):
            self.dropped.append(rec)

    model = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=3, num_heads=8,
                        num_kv_heads=2, head_dim=8, vocab_size=256)
    kernel = KernelConfig(token_block=8, page_size=4, max_batch_tokens=96, max_seqs=8,
                          max_context=128, num_kv_pages=200)
    be = object.__new__(MegakernelStepBackend)
    be.kernel, be.device = kernel, torch.device("cpu")
    be.planner = Planner(model, ParallelConfig(), kernel, PlanConfig(kv_split=16, split_k=1))
    be.meta = torch.zeros(4096, dtype=torch.int32)
    be._held, be._handle, be.stream_uploads, be._in_flight = (None, 0), None, 0, deque()
    be.logits, be.steps = torch.zeros(8, 256), 0
    mks = {c: FakeMegakernel() for c in (0, 1)}
    be.megakernel_for = lambda num_tokens: mks[int(num_tokens > 4)]
    be._built_megakernel = be.megakernel_for
    pages = {i: list(range(30 * i, 30 * i + 30)) for i in range(6)}
    cached = {0: 3, 1: 20, 2: 41}
    for step in range(12):
        chunks = [SeqChunk([5], n, pages[i]) for i, n in cached.items()]
        if step == 6:
            chunks.append(SeqChunk(list(range(1, 9)), 0, pages[5]))   # another M class
        mk, handle, plan = be.prepare(StepBatch(chunks))
        assert torch.equal(handle[0], plan.instrs), step
        assert torch.equal(be.meta[:plan.meta.tensor.numel()], plan.meta.tensor)
        for i in cached:
            cached[i] += 1
    # steps 0, 6 and 7 (the other class and back) and every KV-split boundary crossing are full
    # uploads; the rest rewrote the held copy
    assert be.planner.fast_plans >= 5 and be.stream_uploads == 12 - be.planner.fast_plans
    assert sum(m.checked for m in mks.values()) == be.stream_uploads
    # the engine's overlapped steps: step n + 1 planned (checked, not uploaded) while step n is
    # in flight; run_step finishes step n first, then rewrites or uploads, with the late decode
    # tokens in the metadata's token rows
    uploads, fast = be.stream_uploads, be.planner.fast_plans
    # the other class's Megakernel "not built yet" at its first step here: plan_step leaves it
    # (and the check) to run_step
    built = {0}
    be._built_megakernel = lambda n: mks[int(n > 4)] if int(n > 4) in built else None
    for step in range(12):
        chunks = [SeqChunk([0], n, pages[i]) for i, n in cached.items()]
        if step == 3:
            chunks.append(SeqChunk(list(range(1, 9)), 0, pages[5]))
        prep = be.plan_step(StepBatch(chunks))
        assert [m for m, _ in be._in_flight] == ([] if step == 0 else [mk])
        assert (prep.megakernel is None) == (step == 3)
        before, checked = be.stream_uploads, sum(m.checked for m in mks.values())
        be.run_step(prep, {j: 100 + 10 * step + j for j in range(3)})
        built.add(int(prep.plan.meta.num_tokens > 4))
        mk = prep.megakernel
        if step == 3:       # built and checked in run_step, after the step in flight finished
            assert mk is mks[1] and sum(m.checked for m in mks.values()) == checked + 1
        assert [m for m, _ in be._in_flight] == [mk] and mk.waited == mk.launched - 1
        assert be.stream_uploads == before + (prep.n_ctr is not None or step == 3)
        assert torch.equal(be._handle[0], prep.plan.instrs), step
        tokens = be.meta[prep.plan.meta.word(mc.M_OFF_TOKENS):][:prep.plan.meta.num_tokens]
        assert tokens[[0, 1, 2]].tolist() == [100 + 10 * step + j for j in range(3)]
        for i in cached:
            cached[i] += 1
    be.finish()
    assert all(m.waited == m.launched for m in mks.values()) and not be._in_flight
    assert be.planner.fast_plans - fast >= 5
    assert be.stream_uploads - uploads == 12 - (be.planner.fast_plans - fast)
    # run ahead: each step queued behind the one in flight (never more than one left there),
    # its late tokens gathered from the step before's sampled tokens into the metadata
    mk = None
    for step in range(6):
        chunks = [SeqChunk([0], n, pages[i]) for i, n in cached.items()]
        prep = be.plan_step(StepBatch(chunks))
        sampled = torch.arange(7, dtype=torch.long) * 1000 + step
        late = LateTokens(sampled, {0: 6, 1: 0, 2: 3}) if step else None
        be.run_step(prep, late=late, ahead=True)
        mk = prep.megakernel
        assert [m for m, _ in be._in_flight] == [mk] * min(step + 1, 2)
        assert mk.waited == mk.launched - len(be._in_flight)
        tokens = be.meta[prep.plan.meta.word(mc.M_OFF_TOKENS):][:prep.plan.meta.num_tokens]
        if step:
            assert tokens[[0, 1, 2]].tolist() == [6000 + step, step, 3000 + step]
        for i in cached:
            cached[i] += 1
    be.finish(keep=1)
    assert len(be._in_flight) == 1 and mk.waited == mk.launched - 1
    be.finish()
    assert not be._in_flight and mk.waited == mk.launched
    # a launch that fails with another queued behind: the error raised, the one behind dropped
    # (not waited for: after a hang it would never end)
    for step in range(2):
        chunks = [SeqChunk([0], n, pages[i]) for i, n in cached.items()]
        be.run_step(be.plan_step(StepBatch(chunks)), ahead=True)
        for i in cached:
            cached[i] += 1
    mk.fail_at = mk.waited + 1
    with pytest.raises(RuntimeError, match="launch failed"):
        be.finish()
    assert not be._in_flight and mk.dropped == [("record", mk.launched)]


def test_two_layer_check_sizes_its_kernel_to_many_prompts():
    """64 one-token prompts (a step whose LM_HEAD has one full 64-row tile) are accepted, and
    the check's kernel then holds them and the late prefill chunk; a few keep CHECK_SEQS."""
    from mk.megakernel_step import (CHECK_SEQS, CHECK_TOKENS, check_prompt_lens, check_seqs,
                                    check_tokens)
    many = (1,) * 64
    check_prompt_lens(many, decode_steps=3)
    assert check_seqs(many) == 65 and check_seqs((1, 13, 64, 130)) == CHECK_SEQS
    # a first step above 1024 tokens (the M > 1024 class's variant) sizes the step tokens
    big = (500, 500, 130, 13, 1)
    check_prompt_lens(big, decode_steps=3)
    assert check_tokens(big) == 1144 and check_tokens((1, 13, 64, 130)) == CHECK_TOKENS


@pytest.mark.parametrize("argv,why", [
    (["--prompt-lens", "1,600"], "prompt lengths [1, 600]"),
    (["--prompt-lens", ",".join(["500"] * 5)], "at most 2048 together"),
    (["--prompt-lens", "1,x"], "is not N,N,..."),
    (["--prompt-lens", ","], "1 to 127 prompts"),
    (["--prompt-lens", ",".join(["1"] * 128)], "1 to 127 prompts"),
    (["--plan", "bogus=1"], "'bogus=1' is not FIELD=VALUE"),
])
def test_two_layer_check_refuses_bad_arguments_before_the_gpu(argv, why, capsys):
    """`python -m mk.megakernel_step check`: bad --prompt-lens / --plan exit 1 with the reason,
    on any machine (checked before the GPU is looked for)."""
    from mk.megakernel_step import _main
    assert _main(["check", *argv]) == 1
    assert why in capsys.readouterr().err


def test_default_plan_folds_the_norms_only_where_it_changes_the_plan():
    """The backend's default plan (mk.megakernel_step.DEFAULT_PLAN: norm_fold=4, timed in session
    49) on the 70B TP8 rank: at B=256 GATE_UP reads the residual rows h instead of the normed
    rows, its rows scaled from the ROW_PART sums O_PROJ's tiles leave (an epilogue wait on
    ROW_PARTS), and no RMSNORM is planned; up to 128 tokens (O_PROJ / DOWN whole on m64n64 since
    session 64, on m128n64 at 65..128 since session 65: before, those split there and the plan
    was the unfolded one) the split GATE_UP reads h too, its reduce scales the rows, and no
    RMSNORM is planned either.
    --plan / the backend's plan_cfg overrides win."""
    sys.path.insert(0, str(ROOT / "bench"))
    from host_step import point_batch, rank_model

    from mk.config import KernelConfig, ParallelConfig
    from mk.instructions import matmul as mm
    from mk.instructions._common import A_EPI_WAIT, ROW_PARTS
    from mk.instructions.base import Buf
    from mk.ir import W_OPCODE, Op
    from mk.megakernel_step import DEFAULT_PLAN, default_plan_config
    from mk.plan import PlanConfig, Planner

    model = rank_model()
    assert DEFAULT_PLAN["norm_fold"] == 4 and default_plan_config(model).norm_fold == 4
    assert default_plan_config(norm_fold=0, split_k=1) == PlanConfig(norm_fold=0, split_k=1,
                                                                       attn_lpt=2,
                                                                       attn_chunk_splits=1,
                                                                       attn_chunk_reduce=1)
    # attn_lpt orders op_major's queue: another policy turns it off unless it is given
    assert default_plan_config(policy="interleave").attn_lpt == 0
    with pytest.raises(ValueError, match="attn_lpt"):
        default_plan_config(policy="interleave", attn_lpt=1)
    kernel = KernelConfig(page_size=16, max_seqs=4096, max_context=1024, max_batch_tokens=4096,
                          num_kv_pages=256 * 64)
    unfolded = default_plan_config(norm_fold=0)
    for b in (1, 64, 128, 256):
        got, old = (Planner(model, ParallelConfig(), kernel, cfg, fast_path=False)
                    .plan(point_batch(b, 1024, 0, 16)).instrs
                    for cfg in (default_plan_config(model), unfolded))
        gate_up = got[got[:, W_OPCODE] == int(Op.GATE_UP)]
        gate_up_old = old[old[:, W_OPCODE] == int(Op.GATE_UP)]
        assert len(gate_up) == len(gate_up_old) > 0
        assert (gate_up[:, mm.A_SRC] == int(Buf.HIDDEN)).all()
        assert (gate_up_old[:, mm.A_SRC] == int(Buf.NORMED)).all()
        if b > 128:     # whole GATE_UP tiles wait for their rows' ROW_PART sums
            assert (gate_up[:, A_EPI_WAIT] == ROW_PARTS).all()
        assert (gate_up_old[:, A_EPI_WAIT] == 0).all()
        assert not (got[:, W_OPCODE] == int(Op.RMSNORM)).any()


def test_row_part_code_only_in_the_classes_whose_plans_use_it():
    """norm_fold=4's ROW_PART code is compiled into an M class's variant only where a step of
    the class may plan it (mk.megakernel_step.class_row_parts): in every class of the 70B rank
    (its M64 class since session 64: O_PROJ / DOWN whole on m64n64; its M128 class, new in
    session 65, on m128n64) but not with norm_fold=2, in every class with split-K never; and
    every planned step writes and reads ROW_PART, in a class that compiles it (until session 65
    the steps of 65..128 tokens did not: O_PROJ / DOWN split there on m128n128)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from host_step import point_batch, rank_model

    from mk.config import KernelConfig, ParallelConfig
    from mk.instructions._common import A_EPI_WAIT, A_ROW_PART, ROW_PARTS
    from mk.ir import W_OPCODE, Op
    from mk.megakernel_step import class_row_parts, default_plan_config
    from mk.plan import Planner

    model, par = rank_model(), ParallelConfig()
    kernel = KernelConfig(page_size=16, max_seqs=4096, max_context=1024, max_batch_tokens=4096,
                          num_kv_pages=512 * 64)
    cfg = default_plan_config(model)
    assert all(class_row_parts(cfg, model, par, kernel, m)
               for m in (1, 64, 65, 128, 129, 256, 1024, 4096))
    never = default_plan_config(model, split_k=1)
    assert all(class_row_parts(never, model, par, kernel, m) for m in (1, 64, 256, 4096))
    assert not class_row_parts(default_plan_config(model, norm_fold=2), model, par, kernel, 4096)
    writers = (int(Op.O_PROJ), int(Op.DOWN), int(Op.EMBED))
    for c in (cfg, never):
        planner = Planner(model, par, kernel, c, fast_path=False)
        for b in (1, 64, 65, 128, 129, 300):
            s = planner.plan(point_batch(b, 1024, 0, 16)).instrs
            ops = s[:, W_OPCODE]
            uses = bool(((s[:, A_EPI_WAIT] == ROW_PARTS)
                         & ((ops == int(Op.QKV_ROPE)) | (ops == int(Op.GATE_UP)))).any()
                        or ((s[:, A_ROW_PART] != 0)
                            & sum(ops == w for w in writers).bool()).any())
            assert uses, (c.split_k, b)
            assert class_row_parts(c, model, par, kernel, b), (c.split_k, b)


def test_default_plan_falls_back_where_the_hidden_size_does_not_allow_row_parts():
    """A model whose hidden size is not a multiple of ROW_PART_HIDDEN_ALIGN gets norm_fold=2 by
    default (it runs), while an explicit norm_fold=4 for it is refused with the reason."""
    from dataclasses import replace

    from mk.config import ParallelConfig
    from mk.engine import default_kernel_config
    from mk.megakernel_step import (FALLBACK_NORM_FOLD, ROW_PART_HIDDEN_ALIGN,
                                    default_plan_config, unsupported_reasons)
    from mk.tiny import TINY_CONFIG

    odd = replace(TINY_CONFIG, hidden_size=TINY_CONFIG.hidden_size + 64)
    assert odd.hidden_size % ROW_PART_HIDDEN_ALIGN
    assert default_plan_config(odd).norm_fold == FALLBACK_NORM_FOLD
    assert default_plan_config(TINY_CONFIG).norm_fold == 4
    assert default_plan_config(odd, norm_fold=4).norm_fold == 4
    kernel = default_kernel_config(odd, max_seqs=4, max_context=256, max_batch_tokens=256)
    assert not any("norm_fold" in w for w in unsupported_reasons(
        odd, ParallelConfig(), kernel, default_plan_config(odd)))
    assert any("norm_fold=4 with hidden_size" in w for w in unsupported_reasons(
        odd, ParallelConfig(), kernel, default_plan_config(odd, norm_fold=4)))


# the norm_fold host-check tests' script (run in a process of its own, MK_TILES cleared): each
# (batch, context) point of the 70B TP8 rank planned under a norm_fold value, `body` run per point
# with s (its stream), ops, kw (the operands of a variant built for it) and kw2 (of the default
# norm_fold=2 variant); `refused(bad_words, kw)` checks each (word, row, value, why) mutation is
# refused with `why` in the message, `refused_without(kw2, *needles)` the stream itself
HOST_CHECK_SCRIPT = r'''
import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)
import numpy as np
from host_step import rank_model, point_batch
import mk.megakernel as M
from mk.config import KernelConfig, ParallelConfig
from mk.instructions import _common as mc
from mk.instructions import matmul as mm
from mk.instructions import splitk as sk
from mk.ir import Op, W_COL0, W_OPCODE
from mk.megakernel_step import default_plan_config, meta_operands
from mk.plan import Planner
model = rank_model()

def refused(s, bad_words, kw):
    for word, row, value, why in bad_words:
        bad = s.clone()
        bad[row, word] = value
        try:
            M.check_plan(bad, nbuf, T, H, 1 << 22, **kw)
            raise SystemExit(f"accepted: {why}")
        except ValueError as e:
            assert why in str(e), e

def refused_without(s, kw2, *needles):
    try:
        M.check_plan(s, nbuf, T, H, 1 << 22, **kw2)
        raise SystemExit("accepted without the code")
    except ValueError as e:
        assert all(n in str(e) for n in needles), e

for b, ctx, split in %r:
    kernel = KernelConfig(page_size=16, max_seqs=4096, max_context=ctx, max_batch_tokens=4096,
                          num_kv_pages=b * (ctx // 16))
    cfg, nf2 = default_plan_config(norm_fold=%d), default_plan_config(norm_fold=2)
    plan = Planner(model, ParallelConfig(), kernel, cfg).plan(point_batch(b, ctx, 0, 16))
    s = plan.representative_stream()
    ops = s[:, W_OPCODE].numpy()
    nbuf, T, H, kw = meta_operands(model, kernel, cfg, b)
    M.check_plan(s, nbuf, T, H, 1 << 22, **kw)
    *_, kw2 = meta_operands(model, kernel, nf2, b)
%s
    print("ok", b)
'''


def run_host_check_script(norm_fold: int, body: str,
                          points=((4096, 256, 0), (1024, 1024, 1))) -> None:
    """HOST_CHECK_SCRIPT over points ((batch, context, whether QKV_ROPE splits there))."""
    pytest.importorskip("cutlass")
    code = HOST_CHECK_SCRIPT % (str(ROOT / "bench"), str(ROOT), tuple(points), norm_fold,
                                textwrap.indent(textwrap.dedent(body), "    "))
    env = {k: v for k, v in os.environ.items() if k != "MK_TILES"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.count("ok") == len(points), \
        r.stderr[-3000:] + r.stdout[-500:]


def test_self_scaled_tiles_need_their_slot_code():
    """PlanConfig.norm_fold=3 on the 70B TP8 rank: at B=4096 no norm is planned (QKV_ROPE and
    GATE_UP unsplit, each tile its rows' statistic), at B=1024 the attention norm stays (QKV
    splits) and the MLP norm goes; the plans pass the host check against a variant built with
    self_scale (GemmSlot.self_scale) and are refused by name against one without; a self-scaled
    tile whose K is not the hidden width, a split one and an O_PROJ tile marked self-scaled are
    refused."""
    run_host_check_script(3, """
        own = (s[:, mc.A_EPI_WAIT] == mc.SELF_SCALE).numpy()
        assert own[ops == int(Op.GATE_UP)].all() and own.any()
        assert (int((ops == int(Op.RMSNORM)).sum()) > 0) == bool(split), b
        refused_without(s, kw2, "computes its rows' statistic itself", "self_scale=True")
        i = int(np.flatnonzero(own & (ops == int(Op.GATE_UP)))[0])
        o = int(np.flatnonzero(ops == int(Op.O_PROJ))[0])
        refused(s, [(mm.A_K, i, H // 2, "hidden width"),
                    (mc.A_NSPLIT, i, 2, "split GEMM tile marked self-scaled"),
                    (mc.A_EPI_WAIT, o, mc.SELF_SCALE, "['O_PROJ'] tiles marked self-scaled")], kw)
    """)


def test_row_part_tiles_need_their_slot_code():
    """PlanConfig.norm_fold=4 on the 70B TP8 rank: no norm is planned at B=4096 (QKV_ROPE,
    GATE_UP, O_PROJ and DOWN unsplit: every QKV / gate-up tile scaled from ROW_PART, every
    O_PROJ / DOWN / EMBED tile writing it) nor at B=1024, where QKV_ROPE splits and its
    SPLITK_REDUCEs scale the rows from ROW_PART (row scale word FROM_ROW_PART). The plans pass
    the host check against a variant built with row_parts (GemmSlot.row_parts) and are refused
    by name against one without; a scaled tile whose K is not the hidden width or whose set lies
    outside ROW_PART, a writer whose columns miss the 64-column groups, a split one, and a
    FROM_ROW_PART reduce of O_PROJ or with its set outside ROW_PART are refused."""
    run_host_check_script(4, """
        scaled = (s[:, mc.A_EPI_WAIT] == mc.ROW_PARTS).numpy()
        words = s[:, mc.A_ROW_PART].numpy()
        assert scaled[ops == int(Op.GATE_UP)].all() and (words[ops == int(Op.O_PROJ)] > 0).all()
        assert (words[ops == int(Op.DOWN)] > 0).all() and (words[ops == int(Op.EMBED)] > 0).all()
        assert scaled[ops == int(Op.QKV_ROPE)].all() == (not split)
        red = (ops == int(Op.SPLITK_REDUCE)) & (s[:, sk.A_OP] == int(Op.QKV_ROPE)).numpy()
        assert red.any() == bool(split)
        assert (s[red, sk.A_ROW_SCALE] == sk.FROM_ROW_PART).all()
        assert not (ops == int(Op.RMSNORM)).any(), b
        refused_without(s, kw2, "row_parts=True", "PlanConfig.norm_fold=4")
        i = int(np.flatnonzero(scaled & (ops == int(Op.GATE_UP)))[0])
        o = int(np.flatnonzero(ops == int(Op.O_PROJ))[0])
        bad_words = [(mm.A_K, i, H // 2, "K = the hidden size"),
                     (mc.A_EPI_TARGET, i, 2 * H // 64, "inside ROW_PART"),
                     (mc.A_NSPLIT, i, 2, "split GEMM tile scaled from ROW_PART"),
                     (W_COL0, o, int(s[o, W_COL0]) + 8, "column groups"),
                     (mc.A_NSPLIT, o, 2, "unsplit O_PROJ / DOWN")]
        if red.any():
            q = int(np.flatnonzero(red)[0])
            bad_words += [(sk.A_ROW_PART_COL, q, 2 * H // 64, "inside ROW_PART"),
                          (sk.A_OP, q, int(Op.O_PROJ), "SPLITK_REDUCE scaled from ROW_PART"),
                          (sk.A_ROW_SCALE, q, 3, "row scale word")]
        refused(s, bad_words, kw)
    """)
