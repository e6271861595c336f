"""The CPU interpreter against the reference model (mk.reference).

float32: logits bitwise equal to the reference when the step is one token block and no KV split
(same op order); otherwise within 2e-5 (see EXACTNESS below). bfloat16: identical greedy tokens over
a generation. Mixed prefill + decode batches (prefill chunks at start_pos > 0, decodes long enough to
split the KV range), three models, TP 1, 2, 4, 8 simulated, queue and random modes, several seeds.

EXACTNESS: (1) torch's CPU sgemm picks its kernel and blocking by the shape (gemv at M=1, other
tails for small M), so an 8-row GEMM tile does not always sum its dot products in the order of the
reference's full-batch matmul (bfloat16 GEMM tiles were bitwise equal in every probe); (2) split-KV
attention is another algorithm (per-split softmax, log-sum-exp combine); (3) at TP > 1 the reference
here is the unsharded TP 1 model, and partial sums of TP shards are added in another order.
Measured differences: <= 3.3e-7 on logits of magnitude ~1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import GQA_LLAMA3, TIED_HEADDIM, TINY_MHA, make_hf_checkpoint
from mk.batch import SeqChunk, StepBatch
from mk.config import KernelConfig, ParallelConfig
from mk.ir import ARG0, NO_COUNTER, W_LAYER, W_OPCODE, W_ROW0, W_ROWS, W_SIGNAL, W_WAIT0, Op
from mk.instructions.base import Buf
from mk.plan import PlanConfig
from mk.reference import PagedKVCache, ReferenceModel
from mk.vm import VM, VMError, VMStall
from mk.weights import load_rank_weights

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"TINY_MHA": TINY_MHA, "GQA_LLAMA3": GQA_LLAMA3, "TIED_HEADDIM": TIED_HEADDIM}
KERNEL = KernelConfig(token_block=8, page_size=4, max_batch_tokens=48, max_seqs=8, max_context=64,
                      num_kv_pages=96)
CFG = PlanConfig(kv_split=8, qkv_tile=16, o_tile=16, mlp_tile=32, down_tile=16, lm_tile=64)
PROMPT_SEED = 12  # prompts whose reference tokens are the same in float32 and bfloat16
PAGES = 16      # page-table length of each sequence (pages i*16 .. i*16+15, shuffled)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vm-ckpt")
    cache = {}

    def get(name, sharp=False):
        if (name, sharp) not in cache:
            extra = {"initializer_range": 0.25} if sharp else {}
            cache[name, sharp] = make_hf_checkpoint(root, seed=3, **MODELS[name], **extra)[0]
        return cache[name, sharp]
    return get


_WEIGHTS: dict = {}


def weights(ckpt, tp, dtype):
    key = (str(ckpt), tp, dtype)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = [load_rank_weights(ckpt, ParallelConfig(tp, r), dtype=dtype, progress=False)
                         for r in range(tp)]
    return _WEIGHTS[key]


def page_table(i):
    g = torch.Generator().manual_seed(100 + i)
    return (i * PAGES + torch.randperm(PAGES, generator=g)).tolist()


def mixed_steps(vocab):
    """Three steps: prefills; a decode + a prefill continuation (start_pos 11) + a new prefill;
    decodes (contexts up to 29 > kv_split 8: split attention)."""
    g = torch.Generator().manual_seed(7)
    toks = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()  # noqa: E731
    return [
        StepBatch([SeqChunk(toks(19), 0, page_table(0)), SeqChunk(toks(11), 0, page_table(1)),
                   SeqChunk(toks(5), 0, page_table(2))]),
        StepBatch([SeqChunk(toks(1), 19, page_table(0)), SeqChunk(toks(9), 11, page_table(1)),
                   SeqChunk(toks(1), 5, page_table(2)), SeqChunk(toks(6), 0, page_table(3))]),
        StepBatch([SeqChunk(toks(1), 20, page_table(0)), SeqChunk(toks(1), 20, page_table(1)),
                   SeqChunk(toks(1), 6, page_table(2)), SeqChunk(toks(1), 6, page_table(3))]),
    ]


def reference(w1, kernel=KERNEL):
    return ReferenceModel(w1, PagedKVCache.for_weights(w1, kernel.kv_pages, kernel.page_size))


CASES = [(m, tp, mode) for m in MODELS for tp in (1, 2, 4, 8) for mode in ("queue", "random")
         if MODELS[m]["num_attention_heads"] % tp == 0]


@pytest.mark.parametrize("name,tp,mode", CASES)
def test_float32_matches_reference(checkpoints, name, tp, mode):
    ck = checkpoints(name)
    ref = reference(weights(ck, 1, torch.float32)[0])
    vm = VM(weights(ck, tp, torch.float32), KERNEL, CFG)
    seed = hash((name, tp)) % 1000
    for i, batch in enumerate(mixed_steps(MODELS[name]["vocab_size"])):
        want = ref.forward(batch)
        got = vm.step(batch, mode=mode, sms=4, seed=seed + i)
        assert got.shape == want.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5, msg=f"step {i}")
    # the VM's KV cache holds what the reference's holds (rank 0's heads)
    k, v = vm.kv_cache(0)
    hkv = k.shape[3]
    kv0 = ParallelConfig(tp, 0).kv_head_start(weights(ck, 1, torch.float32)[0].config)
    for s in mixed_steps(MODELS[name]["vocab_size"])[2].seqs:
        slots = ref.cache.slots(s.pages, 0, s.end_pos)
        rk = ref.cache.k.flatten(1, 2)[:, slots, kv0:kv0 + hkv]
        torch.testing.assert_close(k.flatten(1, 2)[:, slots], rk, rtol=2e-5, atol=2e-5)
        rv = ref.cache.v.flatten(1, 2)[:, slots, kv0:kv0 + hkv]
        torch.testing.assert_close(v.flatten(1, 2)[:, slots], rv, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_interleavings_seeds(checkpoints, seed):
    """Random interleavings of the op-major stream, with the norms cut into row groups of 1 to 4
    rows (PlanConfig.norm_rows), equal the reference."""
    ck = checkpoints("GQA_LLAMA3")
    ref = reference(weights(ck, 1, torch.float32)[0])
    vm = VM(weights(ck, 4, torch.float32), KERNEL,
            PlanConfig(**{**CFG.__dict__, "policy": "op_major", "norm_rows": 1 + seed}))
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        torch.testing.assert_close(vm.step(batch, mode="random", sms=1 + seed * 3, seed=seed),
                                   ref.forward(batch), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["GQA_LLAMA3", "TIED_HEADDIM"])
def test_float32_bitwise_same_op_order(checkpoints, name):
    """One token block per step, whole-width GEMM tiles, no KV split: the VM runs the reference's
    ops in its order and float32 logits are bitwise equal. (Not TINY_MHA: there the VM's separate
    q / k / v section GEMMs, N = 64 each, are summed by MKL otherwise than the reference's single
    N = 192 qkv GEMM: 6.7e-8 off from the second step on.)"""
    kernel = KernelConfig(token_block=64, page_size=4, max_batch_tokens=48, max_seqs=8,
                          max_context=64, num_kv_pages=96)
    ck = checkpoints(name)
    w1 = weights(ck, 1, torch.float32)
    ref = reference(w1[0], kernel)
    vm = VM(w1, kernel, PlanConfig(kv_split=64, qkv_tile=4096, o_tile=4096, mlp_tile=4096,
                                   down_tile=4096, lm_tile=4096))
    for batch in mixed_steps(MODELS[name]["vocab_size"]):
        assert torch.equal(vm.step(batch, mode="random", seed=1), ref.forward(batch))


def greedy(step, prompts, new_tokens, chunk):
    """Greedy generation with chunked prefill: each step holds a decode token of every running
    sequence and the next prefill chunk (<= chunk tokens) of every prefilling one."""
    cached = [0] * len(prompts)
    out = [[] for _ in prompts]
    while any(len(o) < new_tokens for o in out):
        seqs, idx = [], []
        for i, p in enumerate(prompts):
            if len(out[i]) >= new_tokens:
                continue
            if cached[i] < len(p):
                toks = p[cached[i]:cached[i] + chunk]
            else:
                toks = [out[i][-1]]
            seqs.append(SeqChunk(toks, cached[i], page_table(i)))
            idx.append(i)
        logits = step(StepBatch(seqs))
        for j, (i, s) in enumerate(zip(idx, seqs)):
            cached[i] = s.end_pos
            if cached[i] >= len(prompts[i]):
                out[i].append(int(logits[j].argmax()))
    return out


@pytest.mark.parametrize("name,tp,mode", [("TINY_MHA", 1, "queue"), ("TINY_MHA", 4, "random"),
                                          ("TINY_MHA", 2, "queue"), ("GQA_LLAMA3", 2, "random"),
                                          ("GQA_LLAMA3", 8, "queue"), ("TIED_HEADDIM", 4, "random"),
                                          ("TIED_HEADDIM", 1, "random")])
def test_bf16_greedy_tokens_match(checkpoints, name, tp, mode):
    """12 greedy tokens of 3 prompts, chunked prefill (9-token chunks) + decode, KV splits of 8,
    against the TP 1 reference. HF's default init (std 0.02): with a much sharper init (0.25) the
    reference's own float32 and bfloat16 generations part after a few tokens, so no other op order
    can be held to the same tokens there; see the bitwise test below for that case. Likewise the
    prompts are ones where the reference's float32 and bfloat16 tokens agree (asserted): at a
    near-tie (top-2 margin 0.02) the VM's float32 split-KV softmax may side with the float32
    reference against the bfloat16 one (seen with other prompts on TINY_MHA)."""
    ck = checkpoints(name)
    V = MODELS[name]["vocab_size"]
    g = torch.Generator().manual_seed(PROMPT_SEED)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (13, 4, 21)]
    want = greedy(reference(weights(ck, 1, torch.bfloat16)[0]).forward, prompts, 12, chunk=9)
    # well-posed: the reference's own tokens do not hang on its precision (no near-tie flips)
    assert want == greedy(reference(weights(ck, 1, torch.float32)[0]).forward, prompts, 12, chunk=9)
    vm = VM(weights(ck, tp, torch.bfloat16), KERNEL, CFG)
    calls = iter(range(1000))
    got = greedy(lambda b: vm.step(b, mode=mode, seed=next(calls)), prompts, 12, chunk=9)
    assert got == want


@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_bitwise_without_split_sharp_model(checkpoints, name):
    """TP 1, 8-token blocks and 16-column tiles, no KV split, a sharp (chaotic) model: bfloat16 GEMM
    tiles round like the full GEMMs, so logits are bitwise equal and greedy tokens identical."""
    ck = checkpoints(name, sharp=True)
    w = weights(ck, 1, torch.bfloat16)
    ref = reference(w[0])
    vm = VM(w, KERNEL, PlanConfig(**{**CFG.__dict__, "kv_split": 64}))
    for batch in mixed_steps(MODELS[name]["vocab_size"]):
        assert torch.equal(vm.step(batch, mode="random", seed=5), ref.forward(batch))
    V = MODELS[name]["vocab_size"]
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (13, 4, 21)]
    ref = reference(w[0])
    vm = VM(w, KERNEL, PlanConfig(**{**CFG.__dict__, "kv_split": 64}))
    assert greedy(vm.step, prompts, 12, chunk=9) == greedy(ref.forward, prompts, 12, chunk=9)


# The interpreter catches broken streams ---------------------------------------------------------
def _drop_waits(op):
    def hook(rank, instrs):
        sel = instrs[:, W_OPCODE] == int(op)
        for i in range(4):
            instrs[sel, W_WAIT0 + 2 * i] = NO_COUNTER
        return instrs
    return hook


def test_random_mode_exposes_missing_dependency(checkpoints):
    ck = checkpoints("GQA_LLAMA3")
    ref = reference(weights(ck, 1, torch.float32)[0])
    batch = mixed_steps(GQA_LLAMA3["vocab_size"])[0]
    want = ref.forward(batch)
    vm = VM(weights(ck, 2, torch.float32), KERNEL, CFG)
    wrong = 0
    for seed in range(3):
        got = vm.step(batch, mode="random", sms=16, seed=seed, stream_hook=_drop_waits(Op.GATE_UP))
        wrong += not torch.allclose(got, want, rtol=2e-5, atol=2e-5)
    assert wrong >= 1


def test_stall_names_the_stuck_counter(checkpoints):
    ck = checkpoints("TINY_MHA")
    vm = VM(weights(ck, 2, torch.float32), KERNEL, CFG)

    targets = []

    def hook(rank, instrs):
        sel = (instrs[:, W_OPCODE] == int(Op.GATE_UP)).nonzero()[0, 0]
        targets.append(int(instrs[sel, W_WAIT0 + 1]))    # the norm's row groups of that block
        instrs[sel, W_WAIT0 + 1] += 1
        return instrs
    for mode in ("queue", "random"):
        with pytest.raises(VMStall, match=r"GATE_UP layer 0 .*layer 0 NM\[0\] \(c\d+\) = "
                                          r"(\d+) \(target (\d+)\)") as err:
            vm.step(mixed_steps(256)[0], mode=mode, stream_hook=hook)
        n = targets[-1]
        assert f"= {n} (target {n + 1})" in str(err.value)


def test_counters_must_end_on_target(checkpoints):
    ck = checkpoints("TINY_MHA")
    vm = VM(weights(ck, 1, torch.float32), KERNEL, CFG)

    def hook(rank, instrs):
        instrs[instrs[:, W_OPCODE] == int(Op.LM_HEAD), W_SIGNAL] = NO_COUNTER
        return instrs
    with pytest.raises(VMError, match="LM_HEAD done"):
        vm.step(mixed_steps(256)[0], stream_hook=hook)


def test_buffers_and_weights_checked(checkpoints):
    ck = checkpoints("TINY_MHA")
    with pytest.raises(ValueError, match="give all 2 ranks"):
        VM(weights(ck, 2, torch.float32)[:1] * 3, KERNEL, CFG)


# The engine backend and the launcher --------------------------------------------------------------
def test_engine_vm_backend_generates_like_reference(checkpoints):
    from mk.engine import Engine, available_backends
    assert "vm" in available_backends()
    ck = checkpoints("GQA_LLAMA3", sharp=True)
    w = weights(ck, 1, torch.bfloat16)[0]
    kernel = KernelConfig(token_block=8, page_size=4, max_batch_tokens=16, max_seqs=4,
                          max_context=64, num_kv_pages=64)
    prompts = [[1, 15, 27, 3, 99, 42, 7, 8, 9, 10, 11], [1, 100, 5]]
    want = Engine(w, backend="reference", kernel=kernel).generate(prompts, max_new_tokens=6,
                                                                  max_tokens_per_step=9)
    got = Engine(w, backend="vm", kernel=kernel).generate(prompts, max_new_tokens=6,
                                                          max_tokens_per_step=9)
    assert got == want


def _generate(backend, extra=(), torchrun=0, env_extra=None):
    env = {**os.environ, "MK_NO_PROGRESS": "1", "MK_VM_MODE": "random", **(env_extra or {})}
    cmd = [sys.executable]
    if torchrun:
        cmd += ["-m", "torch.distributed.run", "--nproc-per-node", str(torchrun), "--master-port",
                str(29500 + os.getpid() % 1000)]
    cmd += [str(ROOT / "launch" / "generate.py"), "--backend", backend, "--json",
            "--max-new-tokens", "4", "--num-kv-pages", "64", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])["tokens"]


def test_launch_generate_backend_vm(tmp_path):
    env = {"MK_CACHE_DIR": str(tmp_path)}
    assert _generate("vm", env_extra=env) == _generate("reference", env_extra=env)


def test_launch_generate_backend_vm_torchrun(tmp_path):
    env = {"MK_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    assert _generate("vm", torchrun=2, env_extra=env) == _generate("reference", env_extra=env)


@pytest.mark.parametrize("seed", [0, 1])
def test_spread_kv_splits_match_reference(checkpoints, seed):
    """Decode steps with their keys spread over small splits (PlanConfig.kv_split_min, a 16-SM
    budget) in random interleavings equal the reference."""
    ck = checkpoints("GQA_LLAMA3")
    ref = reference(weights(ck, 1, torch.float32)[0])
    vm = VM(weights(ck, 2, torch.float32), KERNEL,
            PlanConfig(**{**CFG.__dict__, "kv_split": 16, "kv_split_min": 4, "num_sms": 16}))
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        torch.testing.assert_close(vm.step(batch, mode="random", sms=5, seed=seed + i),
                                   ref.forward(batch), rtol=2e-5, atol=2e-5)


def test_l2_prefetch_instructions_change_nothing(checkpoints):
    """Plans with L2_PREFETCH instructions (PlanConfig.l2_prefetch_mib) give bitwise the logits of
    plans without them, in random interleavings too: the instructions have no effect on the
    interpreter's state (their face only checks their words)."""
    ck = checkpoints("GQA_LLAMA3")
    w = weights(ck, 1, torch.float32)
    plain = VM(w, KERNEL, CFG)
    pref = VM(w, KERNEL, PlanConfig(**{**CFG.__dict__, "l2_prefetch_mib": 1}))
    n_prefetch = 0
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        n_prefetch += int((pref.plan(batch).instrs[:, W_OPCODE]
                           == int(Op.L2_PREFETCH)).sum())
        assert torch.equal(pref.step(batch, mode="random", sms=5, seed=i),
                           plain.step(batch, mode="random", sms=5, seed=i))
    assert n_prefetch > 0


@pytest.mark.parametrize("tp", [1, 2])
def test_paired_decode_attention_changes_nothing(checkpoints, tp):
    """PlanConfig.attn_pair: plans with decode units paired into MODE_PAIR instructions give
    bitwise the logits of plans without pairs, in random interleavings too (the pair's face runs
    each unit as a direct instruction would)."""
    from mk.instructions import attention as at
    ck = checkpoints("GQA_LLAMA3")
    w = weights(ck, tp, torch.float32)
    cfg = PlanConfig(**{**CFG.__dict__, "kv_split": 64})
    plain = VM(w, KERNEL, cfg)
    paired = VM(w, KERNEL, PlanConfig(**{**cfg.__dict__, "attn_pair": 2}))
    n_pairs = 0
    steps = mixed_steps(GQA_LLAMA3["vocab_size"])
    g = torch.Generator().manual_seed(5)
    # and a step of six one-token chunks: the four sequences' next decodes and two new ones
    steps.append(StepBatch([SeqChunk([int(t)], n, page_table(i)) for i, (t, n) in enumerate(
        zip(torch.randint(0, GQA_LLAMA3["vocab_size"], (6,), generator=g).tolist(),
            (21, 21, 7, 7, 0, 0)))]))
    for i, batch in enumerate(steps):
        s = paired.plan(batch).instrs
        n_pairs += int(((s[:, W_OPCODE] == int(Op.ATTENTION))
                        & (s[:, at.A_MODE] == at.MODE_PAIR)).sum())
        # (rows past the step's sequences are NaN in both)
        torch.testing.assert_close(paired.step(batch, mode="random", sms=5, seed=i),
                                   plain.step(batch, mode="random", sms=5, seed=i),
                                   rtol=0, atol=0, equal_nan=True)
    assert n_pairs > 0


def _chunk_vms(checkpoints, tp, cfg_fields: dict, changed: dict, seed: int):
    """The attention-chunk tests' two VMs on GQA_LLAMA3 (float32, 64-row token blocks, kv_split
    64): one planned with cfg_fields, one with `changed` over them; and a token sampler (seeded)
    and the page table of sequence slot i."""
    w = weights(checkpoints("GQA_LLAMA3"), tp, torch.float32)
    kernel = KernelConfig(token_block=64, page_size=4, max_batch_tokens=192, max_seqs=8,
                          max_context=192, num_kv_pages=200)
    cfg = PlanConfig(**{**CFG.__dict__, "kv_split": 64, **cfg_fields})
    g = torch.Generator().manual_seed(seed)
    toks = lambda n: torch.randint(0, GQA_LLAMA3["vocab_size"], (n,), generator=g).tolist()  # noqa: E731
    table = lambda i: list(range(i * 48, (i + 1) * 48))       # noqa: E731
    return (VM(w, kernel, cfg), VM(w, kernel, PlanConfig(**{**cfg.__dict__, **changed})), toks,
            table)


@pytest.mark.parametrize("tp", [1, 2])
def test_prefill_attention_row_chunks_change_nothing(checkpoints, tp):
    """PlanConfig.attn_chunk_rows: a prefill segment's ATTENTION cut into row chunks of whole M
    tiles (GQA_LLAMA3: 4 q heads per KV head, 32-token tiles), longest chunk first, gives the
    logits of the unchunked plan in random interleavings, with prompts across token blocks
    (joins) and prompts split over KV (kv_split 64), which stay unchunked: a chunk of a 130-token
    prompt's first rows has no key of its second split (session 19: the GPU check failed on
    such a plan); mk.verify finds nothing in the chunked plans (TP 1)."""
    from mk.instructions import attention as at
    from mk.verify import check
    plain, chunked, toks, table = _chunk_vms(checkpoints, tp, {"attn_chunk_splits": 0},
                                             {"attn_chunk_rows": 20}, 11)
    assert chunked.plan_cfg.attn_chunk_for(4) == 32           # rounded up to one 32-token tile
    steps = [StepBatch([SeqChunk(toks(60), 0, table(0)), SeqChunk(toks(40), 0, table(1))]),
             StepBatch([SeqChunk(toks(1), 60, table(0)), SeqChunk(toks(90), 40, table(1)),
                        SeqChunk(toks(7), 0, table(2))]),
             StepBatch([SeqChunk(toks(130), 0, table(3)), SeqChunk(toks(50), 0, table(2))])]
    for i, batch in enumerate(steps):
        plan = chunked.plan(batch)
        s = plan.instrs.numpy()
        a = s[s[:, W_OPCODE] == int(Op.ATTENTION)]
        direct = a[a[:, at.A_MODE] == at.MODE_DIRECT]
        assert direct[:, W_ROWS].max() <= 32
        if i != 1:      # the 60-, 40- and 50-token prompts and the 130's first rows: chunked
            assert (direct[:, W_ROWS] == 32).sum() >= 2
        if i:           # sequence 1's 90 rows at 40..130, the 130-token prompt: split, whole
            p = plain.plan(batch).instrs.numpy()
            p = p[p[:, W_OPCODE] == int(Op.ATTENTION)]
            part = a[a[:, at.A_MODE] == at.MODE_PARTIAL]
            assert len(part) and sorted(part[:, W_ROWS].tolist()) == sorted(
                p[p[:, at.A_MODE] == at.MODE_PARTIAL][:, W_ROWS].tolist())
        if tp == 1:
            assert check([plan.instrs], plan.num_counters, meta=plan.meta) == []
        torch.testing.assert_close(chunked.step(batch, mode="random", sms=5, seed=i),
                                   plain.step(batch, mode="random", sms=5, seed=i),
                                   rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("tp,chunk_reduce", [(1, 0), (2, 0), (1, 1), (2, 1)])
def test_prefill_attention_chunks_of_split_segments_change_nothing(checkpoints, tp, chunk_reduce):
    """PlanConfig.attn_chunk_splits: a prefill segment split over KV (kv_split 64) is cut into
    row chunks too, each split of each chunk one ATTENTION instruction, the split's ATTN_REDUCE
    over all of them (attn_chunk_reduce: one ATTN_REDUCE per chunk over its splits, the partial
    rows chunk by chunk): the logits of the plan that keeps split segments whole, in random
    interleavings. A 64-token prompt at positions 10..73 makes a chunk (rows 10..41) with no key
    in the split [64, 74): it writes o = 0, lse = -inf, as the GPU body does; mk.verify finds
    nothing in the plans (TP 1)."""
    from mk.instructions import attention as at
    from mk.verify import check
    whole, chunked, toks, table = _chunk_vms(checkpoints, tp,
                                             {"attn_chunk_rows": 20, "attn_chunk_splits": 0},
                                             {"attn_chunk_splits": 1,
                                              "attn_chunk_reduce": chunk_reduce}, 12)
    steps = [StepBatch([SeqChunk(toks(10), 0, table(0)), SeqChunk(toks(40), 0, table(1))]),
             StepBatch([SeqChunk(toks(64), 10, table(0)), SeqChunk(toks(90), 40, table(1)),
                        SeqChunk(toks(7), 0, table(2))]),
             StepBatch([SeqChunk(toks(130), 0, table(3)), SeqChunk(toks(1), 74, table(0))])]
    empty = 0
    for i, batch in enumerate(steps):
        plan = chunked.plan(batch)
        s = plan.instrs.numpy()
        a = s[s[:, W_OPCODE] == int(Op.ATTENTION)]
        part = a[a[:, at.A_MODE] == at.MODE_PARTIAL]
        p = whole.plan(batch).instrs.numpy()
        p = p[(p[:, W_OPCODE] == int(Op.ATTENTION)) & (p[:, at.A_MODE] == at.MODE_PARTIAL)]
        if i:           # split prompt segments: more, shorter partial instructions, same rows
            assert len(part) > len(p) and part[:, W_ROWS].max() <= 32 < p[:, W_ROWS].max()
            assert part[:, W_ROWS].sum() == p[:, W_ROWS].sum()
            red = s[s[:, W_OPCODE] == int(Op.ATTN_REDUCE)]
            red_whole = whole.plan(batch).instrs.numpy()
            red_whole = red_whole[red_whole[:, W_OPCODE] == int(Op.ATTN_REDUCE)]
            assert red[:, W_ROWS].sum() == red_whole[:, W_ROWS].sum()
            # one reduce per chunk of each split segment's rows (of each layer)
            chunks = {tuple(r) for r in part[:, [W_LAYER, W_ROW0, W_ROWS]].tolist()}
            assert len(red) == (len(chunks) if chunk_reduce else len(red_whole))
        empty += int((part[:, at.A_POS0] + part[:, W_ROWS] <= part[:, at.A_KV0]).sum())
        if tp == 1:
            assert check([plan.instrs], plan.num_counters, meta=plan.meta) == []
        torch.testing.assert_close(chunked.step(batch, mode="random", sms=5, seed=i),
                                   whole.step(batch, mode="random", sms=5, seed=i),
                                   rtol=1e-6, atol=1e-6, equal_nan=True)
    assert empty        # the chunk of rows 10..41 against the split [64, 74)


@pytest.mark.parametrize("tp,folds", [(1, 1), (1, 0), (2, 1)])
def test_norm_fold_matches_reference(checkpoints, tp, folds):
    """PlanConfig.norm_fold with split QKV / gate-up tiles (split_k 2): the split tiles read the
    residual rows, the norms only write ROW_SCALE and the reduces scale by it. In float32 the
    logits are the reference's (on the unfolded weights) within 2e-5, in random interleavings
    (a missing wait on the row scale or on h would read the VM's NaN poison); with the O_PROJ /
    DOWN reduce folds on (folds=1: the norms that finish those reduces stay full RMSNORMs, run
    with the folded weights' unit norm weights) and off. Unfolded weights are refused."""
    from mk.instructions import rows as rw
    from mk.instructions import splitk as sk
    from mk.weights import fold_norms
    ck = checkpoints("GQA_LLAMA3")
    w = weights(ck, tp, torch.float32)
    ref = reference(weights(ck, 1, torch.float32)[0])
    cfg = PlanConfig(**{**CFG.__dict__, "split_k": 2, "norm_fold": 1, "fold_o_reduce": folds,
                        "fold_down_reduce": folds})
    with pytest.raises(ValueError, match="fold_norms"):
        VM(w, KERNEL, cfg)
    vm = VM([fold_norms(x) for x in w], KERNEL, cfg)
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        s = vm.plan(batch).instrs
        norms = s[:, W_OPCODE] == int(Op.RMSNORM)
        scaled = (s[:, W_OPCODE] == int(Op.SPLITK_REDUCE)) & (s[:, sk.A_ROW_SCALE] == 1)
        if folds and tp == 1:   # every norm finishes O_PROJ's or DOWN's reduce (or follows EMBED)
            assert (s[norms, rw.A_DST] == int(Buf.NORMED)).all() and not scaled.any()
        else:
            assert (s[norms, rw.A_DST] == int(Buf.ROW_SCALE)).all()
            assert set(s[scaled, sk.A_OP].tolist()) == {int(Op.QKV_ROPE), int(Op.GATE_UP)}
        got = vm.step(batch, mode="random", sms=5, seed=i)
        torch.testing.assert_close(got, ref.forward(batch), rtol=2e-5, atol=2e-5, msg=f"step {i}")


@pytest.mark.parametrize("name,tp,nf,split_k", [("GQA_LLAMA3", 1, 1, 2), ("TINY_MHA", 2, 1, 2),
                                               ("TIED_HEADDIM", 1, 1, 2), ("GQA_LLAMA3", 1, 2, 1),
                                               ("TINY_MHA", 2, 2, 1)])
def test_norm_fold_bf16_greedy_tokens_match(checkpoints, name, tp, nf, split_k):
    """PlanConfig.norm_fold in bfloat16 (folded weights rounded once, rows scaled in the split
    reduces (nf 1, split_k 2) or in the unsplit tiles' epilogues (nf 2, split_k 1), O_PROJ / DOWN
    reduce folds off so that every norm folds): the same 12 greedy tokens of the 3 prompts as
    the TP 1 reference on the checkpoint's own weights (the reference order HF matches); the
    fold is not bitwise that order, so tokens, not logits, are compared."""
    from mk.weights import fold_norms
    ck = checkpoints(name)
    V = MODELS[name]["vocab_size"]
    g = torch.Generator().manual_seed(PROMPT_SEED)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (13, 4, 21)]
    want = greedy(reference(weights(ck, 1, torch.bfloat16)[0]).forward, prompts, 12, chunk=9)
    # K slices of 16: the 64- and 96-wide models split too
    cfg = PlanConfig(**{**CFG.__dict__, "split_k": split_k, "splitk_align": 16, "norm_fold": nf,
                        "fold_o_reduce": 0, "fold_down_reduce": 0})
    vm = VM([fold_norms(w) for w in weights(ck, tp, torch.bfloat16)], KERNEL, cfg)
    calls = iter(range(1000))
    row_scaled = []

    def step(b):
        s = vm.plan(b).instrs
        row_scaled.append(int(((s[:, W_OPCODE] == int(Op.RMSNORM))
                               & (s[:, ARG0 + 1] == int(Buf.ROW_SCALE))).sum()))
        return vm.step(b, mode="random", seed=next(calls))
    got = greedy(step, prompts, 12, chunk=9)
    assert got == want and all(row_scaled), row_scaled


@pytest.mark.parametrize("tp,split_k", [(1, 1), (1, 2), (2, 1)])
def test_norm_fold_self_scaled_equals_norm_fold_2(checkpoints, tp, split_k):
    """PlanConfig.norm_fold=3: the unsplit QKV / gate-up tiles are marked self-scaled
    (A_EPI_WAIT = SELF_SCALE, no epilogue wait) and their norms are not planned at all (split_k
    1: no RMSNORM left); split ones keep norm_fold=2's row-scale norm and scaled reduce. The
    tiles' own statistic is the row-scale norm's expression over the same rows, so the logits
    are bitwise norm_fold=2's, and within 2e-5 of the reference, in random interleavings."""
    from mk.instructions import _common as mc
    from mk.weights import fold_norms
    ck = checkpoints("GQA_LLAMA3")
    w = [fold_norms(x) for x in weights(ck, tp, torch.float32)]
    ref = reference(weights(ck, 1, torch.float32)[0])
    base = {**CFG.__dict__, "split_k": split_k, "fold_o_reduce": 0, "fold_down_reduce": 0}
    vm2 = VM(w, KERNEL, PlanConfig(**{**base, "norm_fold": 2}))
    vm3 = VM(w, KERNEL, PlanConfig(**{**base, "norm_fold": 3}))
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        s2, s3 = vm2.plan(batch).instrs, vm3.plan(batch).instrs
        gemm = (s3[:, W_OPCODE] == int(Op.QKV_ROPE)) | (s3[:, W_OPCODE] == int(Op.GATE_UP))
        unsplit = gemm & (s3[:, mc.A_NSPLIT] < 2)
        assert unsplit.any() == (split_k == 1)
        assert (s3[unsplit, mc.A_EPI_WAIT] == mc.SELF_SCALE).all()
        assert (s3[gemm & ~unsplit, mc.A_EPI_WAIT] == 0).all()
        n2 = int((s2[:, W_OPCODE] == int(Op.RMSNORM)).sum())
        n3 = int((s3[:, W_OPCODE] == int(Op.RMSNORM)).sum())
        assert (n3 == 0) if split_k == 1 else (n3 == n2 > 0)
        got = vm3.step(batch, mode="random", sms=5, seed=i)
        torch.testing.assert_close(got, vm2.step(batch, mode="random", sms=3, seed=i + 7),
                                   rtol=0, atol=0, msg=f"step {i}")
        torch.testing.assert_close(got, ref.forward(batch), rtol=2e-5, atol=2e-5, msg=f"step {i}")


@pytest.mark.parametrize("tp,split_k", [(1, 1), (1, 2), (2, 1)])
def test_norm_fold_unsplit_matches_reference(checkpoints, tp, split_k):
    """PlanConfig.norm_fold=2: unsplit QKV / gate-up tiles (split_k 1: every one) read the
    residual rows, wait for h's writer only, and scale their rows by ROW_SCALE in the epilogue
    after an epilogue wait for the row-scale norm (A_EPI_WAIT); with split_k 2 the split tiles'
    reduces scale as under norm_fold=1. float32 logits within 2e-5 of the reference in random
    interleavings (the VM runs an instruction whole: its epilogue wait is one of its waits)."""
    from mk.instructions import _common as mc
    from mk.instructions import rows as rw
    from mk.instructions import splitk as sk
    from mk.weights import fold_norms
    ck = checkpoints("GQA_LLAMA3")
    w = weights(ck, tp, torch.float32)
    ref = reference(weights(ck, 1, torch.float32)[0])
    cfg = PlanConfig(**{**CFG.__dict__, "split_k": split_k, "norm_fold": 2,
                        "fold_o_reduce": 0, "fold_down_reduce": 0})
    vm = VM([fold_norms(x) for x in w], KERNEL, cfg)
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        s = vm.plan(batch).instrs
        norms = s[:, W_OPCODE] == int(Op.RMSNORM)
        assert (s[norms, rw.A_DST] == int(Buf.ROW_SCALE)).all()
        gemm = (s[:, W_OPCODE] == int(Op.QKV_ROPE)) | (s[:, W_OPCODE] == int(Op.GATE_UP))
        unsplit = gemm & (s[:, mc.A_NSPLIT] < 2)
        assert unsplit.any() == (split_k == 1)
        # every unsplit QKV / gate-up tile waits in its epilogue, no split one does
        assert ((s[gemm, mc.A_EPI_WAIT] > 0) == unsplit[gemm]).all()
        assert (s[unsplit, mc.A_EPI_TARGET] > 0).all()
        scaled = (s[:, W_OPCODE] == int(Op.SPLITK_REDUCE)) & (s[:, sk.A_ROW_SCALE] == 1)
        assert scaled.any() == (split_k == 2)
        got = vm.step(batch, mode="random", sms=5, seed=i)
        torch.testing.assert_close(got, ref.forward(batch), rtol=2e-5, atol=2e-5, msg=f"step {i}")


@pytest.mark.parametrize("tp,split_k", [(1, 1), (1, 2), (2, 1)])
def test_norm_fold_row_parts_matches_reference(checkpoints, tp, split_k):
    """PlanConfig.norm_fold=4: at TP 1 with nothing split (split_k 1) every QKV / gate-up tile
    is scaled from ROW_PART (A_EPI_WAIT = ROW_PARTS, A_EPI_TARGET its set's first column: the
    attention set 0, the MLP set G), no norm is planned, and every h-writing tile (EMBED, O_PROJ,
    DOWN) fills the set of the GEMM after it (A_ROW_PART); where the GEMMs split (split_k 2)
    or at TP 2 (h from TP_REDUCE) it plans as norm_fold=2. float32 logits within 2e-5 of the
    reference in random interleavings. (16-column O_PROJ tiles, not on ROW_PART's 64-column
    groups: norm_fold=2's plan.)"""
    from mk.instructions import _common as mc
    from mk.weights import fold_norms
    ck = checkpoints("GQA_LLAMA3")
    w = [fold_norms(x) for x in weights(ck, tp, torch.float32)]
    ref = reference(weights(ck, 1, torch.float32)[0])
    H = GQA_LLAMA3["hidden_size"]
    G = mc.row_part_groups(H)
    # O_PROJ / DOWN tiles of 64 columns (two a row): they start on ROW_PART's column groups
    base = {**CFG.__dict__, "split_k": split_k, "fold_o_reduce": 0, "fold_down_reduce": 0,
            "o_tile": 64, "down_tile": 64}
    vm = VM(w, KERNEL, PlanConfig(**{**base, "norm_fold": 4}))
    row_parts = tp == 1 and split_k == 1
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        s = vm.plan(batch).instrs
        ops = s[:, W_OPCODE]
        marked = s[:, mc.A_EPI_WAIT] == mc.ROW_PARTS
        qkv, gu = ops == int(Op.QKV_ROPE), ops == int(Op.GATE_UP)
        if row_parts:
            assert marked[qkv].all() and marked[gu].all()
            assert (s[qkv, mc.A_EPI_TARGET] == mc.ROW_PART_ATTN * G).all()
            assert (s[gu, mc.A_EPI_TARGET] == mc.ROW_PART_MLP * G).all()
            assert not (ops == int(Op.RMSNORM)).any()
            for op, sset in ((Op.EMBED, mc.ROW_PART_ATTN), (Op.DOWN, mc.ROW_PART_ATTN),
                             (Op.O_PROJ, mc.ROW_PART_MLP)):
                assert (s[ops == int(op), mc.A_ROW_PART] == 1 + sset * G).all(), op
        else:
            writers = torch.isin(ops, torch.tensor([int(o) for o in mc.ROW_PART_WRITERS]))
            assert not marked.any() and not s[writers, mc.A_ROW_PART].any()
            assert (ops == int(Op.RMSNORM)).any()
        got = vm.step(batch, mode="random", sms=5, seed=i)
        torch.testing.assert_close(got, ref.forward(batch), rtol=2e-5, atol=2e-5, msg=f"step {i}")
    narrow = VM(w, KERNEL, PlanConfig(**{**base, "norm_fold": 4, "o_tile": 16}))
    s = narrow.plan(mixed_steps(GQA_LLAMA3["vocab_size"])[0]).instrs
    assert not ((s[:, W_OPCODE] == int(Op.GATE_UP)) & (s[:, mc.A_EPI_WAIT] == mc.ROW_PARTS)).any()
    assert ((s[:, W_OPCODE] == int(Op.QKV_ROPE)) & (s[:, mc.A_EPI_WAIT] == mc.ROW_PARTS)).any() \
        == row_parts


def test_norm_fold_row_parts_scale_split_reduces(checkpoints):
    """PlanConfig.norm_fold=4 where the QKV / gate-up GEMMs split but O_PROJ / DOWN do not
    (split_k 2 with splitk_max_tokens 1: only QKV_ROPE's and GATE_UP's own caps allow a split in
    steps of more than one token): their SPLITK_REDUCEs scale the rows from ROW_PART (row scale
    word 2, the set's first column in ARG0+11), no norm is planned; float32 logits within 2e-5
    of the reference in random interleavings."""
    from mk.instructions import _common as mc
    from mk.instructions import splitk as sk
    from mk.weights import fold_norms
    ck = checkpoints("GQA_LLAMA3")
    w = [fold_norms(x) for x in weights(ck, 1, torch.float32)]
    ref = reference(weights(ck, 1, torch.float32)[0])
    G = mc.row_part_groups(GQA_LLAMA3["hidden_size"])
    vm = VM(w, KERNEL, PlanConfig(**{**CFG.__dict__, "split_k": 2, "splitk_max_tokens": 1,
                                     "norm_fold": 4, "o_tile": 64, "down_tile": 64}))
    checked = 0
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        s = vm.plan(batch).instrs
        ops = s[:, W_OPCODE]
        red = ops == int(Op.SPLITK_REDUCE)
        if batch.num_tokens > 1:
            assert not (ops == int(Op.RMSNORM)).any()
            for op, base in ((Op.QKV_ROPE, mc.ROW_PART_ATTN * G), (Op.GATE_UP, mc.ROW_PART_MLP * G)):
                r = red & (s[:, sk.A_OP] == int(op))
                assert r.any(), op
                assert (s[r, sk.A_ROW_SCALE] == sk.FROM_ROW_PART).all()
                assert (s[r, sk.A_ROW_PART_COL] == base).all()
            checked += 1
        got = vm.step(batch, mode="random", sms=5, seed=i)
        torch.testing.assert_close(got, ref.forward(batch), rtol=2e-5, atol=2e-5, msg=f"step {i}")
    assert checked


@pytest.mark.parametrize("mode,lpt", [("queue", 1), ("random", 1), ("queue", 2), ("random", 2)])
def test_attn_lpt_queue_equals_the_reference(checkpoints, mode, lpt):
    """PlanConfig.attn_lpt (a layer's attention queued prompt chunks first, then decode units
    longest first; the chunks longest first too with 1, in block order with 2) runs the mixed
    steps to the reference's logits, in queue order on 3 SMs and in random interleavings."""
    ck = checkpoints("GQA_LLAMA3")
    ref = reference(weights(ck, 1, torch.float32)[0])
    vm = VM(weights(ck, 2, torch.float32), KERNEL, PlanConfig(**{**CFG.__dict__, "attn_lpt": lpt}))
    op_major = VM(weights(ck, 2, torch.float32), KERNEL, CFG)
    reordered = 0
    for i, batch in enumerate(mixed_steps(GQA_LLAMA3["vocab_size"])):
        reordered += not torch.equal(vm.plan(batch).instrs, op_major.plan(batch).instrs)
        torch.testing.assert_close(vm.step(batch, mode=mode, sms=3, seed=i), ref.forward(batch),
                                   rtol=2e-5, atol=2e-5)
    assert reordered
