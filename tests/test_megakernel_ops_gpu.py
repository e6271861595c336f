"""GPU tests of the megakernel's model-step opcodes beyond rows + GEMM (H100/H200):
EMBED and LM_NORM (mk/instructions/_gather_kernel.py), ATTENTION / ATTN_REDUCE dispatched through
the controller ring (mk/instructions/_attention_kernel.py), and a one-layer TP=1 model step with
every opcode in one launch against mk.vm on the same inputs (logits and the KV cache).

Problems come from mk.plan (the attention cases: bench/attention.py's make_problem); outputs are
poisoned with NaN before each run. `pytest -m gpu tests/test_megakernel_ops_gpu.py`; skips cleanly
without a Hopper GPU."""

from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch

from mk.instructions.base import Buf
from mk.ir import MAX_WAITS, NO_COUNTER, W_OPCODE, W_SIGNAL, W_SIGNAL_COUNT, W_WAIT0, Op

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")]

if HOPPER:  # on a Hopper machine a missing CuTe DSL is an error, not a skip
    import mk.megakernel as M

TIMEOUT_S = float(os.environ.get("MK_TEST_TIMEOUT_S", 2.0))
META_CAPACITY = 1 << 14        # fixed-capacity metadata tensor, rewritten per launch


def _no_waits(instrs: torch.Tensor) -> torch.Tensor:
    """The instructions with their counter waits removed (run without their producers)."""
    s = instrs.clone()
    for i in range(MAX_WAITS):
        s[:, W_WAIT0 + 2 * i] = NO_COUNTER
        s[:, W_WAIT0 + 2 * i + 1] = 0
    return s


def _of(instrs: torch.Tensor, *ops) -> torch.Tensor:
    keep = torch.zeros(len(instrs), dtype=torch.bool)
    for op in ops:
        keep |= instrs[:, W_OPCODE] == int(op)
    return instrs[keep].contiguous()


def _meta_dev(meta_tensor: torch.Tensor) -> torch.Tensor:
    """The metadata in a fixed-capacity device tensor (the caller rewrites its prefix)."""
    assert meta_tensor.numel() <= META_CAPACITY
    m = torch.full((META_CAPACITY,), -7, dtype=torch.int32, device="cuda")
    m[:meta_tensor.numel()].copy_(meta_tensor)
    return m


def _run(mk, stream, meta_page_size=None):
    mk.launch(mk.prepare(stream, meta_page_size), check=False)
    mk.wait(max(30.0, 4 * TIMEOUT_S))
    mk.check()
    torch.cuda.synchronize()


class _State:
    """The faces' execution state on CPU tensors."""

    def __init__(self, bufs, meta, weights=None):
        self.bufs, self.meta, self.weights, self.rank, self.tp = bufs, meta, weights, 0, 1

    def buf(self, i, rank=None):
        return self.bufs[int(i)]


def _faces(stream, st):
    from mk.instructions.base import family_of
    from mk.ir import deserialize
    for ins in deserialize(stream):
        family_of(ins.opcode).run_torch(ins, st)


# ------------------------------------------------------------------------------ EMBED + LM_NORM
def _small_model(**kw):
    from mk.config import ModelConfig
    base = dict(hidden_size=1024, intermediate_size=512, num_layers=2, num_heads=8,
                num_kv_heads=2, head_dim=128, vocab_size=1000)
    base.update(kw)
    return ModelConfig(**base)


def _plan(seqs, model, ps=16, kv_split=1024, seed=0):
    """A plan for sequences [(new tokens, start_pos)] with random token ids and shuffled pages."""
    import random

    from mk.batch import SeqChunk, StepBatch
    from mk.config import KernelConfig, ParallelConfig
    from mk.plan import PlanConfig, plan_step
    rng = random.Random(seed)
    T = sum(n for n, _ in seqs)
    ctx = max(n + s for n, s in seqs)
    npages = sum(-(-(n + s) // ps) for n, s in seqs) + 3
    kernel = KernelConfig(page_size=ps, max_batch_tokens=T, max_seqs=len(seqs),
                          max_context=ctx, num_kv_pages=npages)
    ids = list(range(npages))
    rng.shuffle(ids)
    chunks = []
    for n, s in seqs:
        need = -(-(n + s) // ps)
        chunks.append(SeqChunk(tokens=[rng.randrange(model.vocab_size) for _ in range(n)],
                               start_pos=s, pages=ids[:need]))
        ids = ids[need:]
    pcfg = PlanConfig(kv_split=kv_split)
    return plan_step(StepBatch(chunks), model, ParallelConfig(), kernel, pcfg), kernel, pcfg


def test_embed_and_lm_norm_match_the_faces():
    """EMBED tiles (the DOWN grid of a 3-sequence step) -> HIDDEN, then LM_NORM of each sequence's
    last row -> LAST_NORMED, in one launch (LM_NORM waits on the EMBED tiles' counter)."""
    model = _small_model()
    plan, kernel, _ = _plan([(37, 0), (1, 300), (90, 5)], model)
    H, T, S, V = model.hidden_size, plan.meta.num_tokens, plan.meta.num_seqs, model.vocab_size
    g = torch.Generator().manual_seed(1)
    table = torch.randn(V, H, generator=g).bfloat16()
    final = (1 + 0.1 * torch.randn(H, generator=g)).bfloat16()
    emb = _of(plan.instrs, Op.EMBED)
    lmn = _of(plan.instrs, Op.LM_NORM)
    # LM_NORM waits for every EMBED tile: they all signal one counter here
    emb[:, W_SIGNAL], emb[:, W_SIGNAL_COUNT] = 0, 1
    lmn = _no_waits(lmn)
    lmn[:, W_WAIT0], lmn[:, W_WAIT0 + 1] = 0, len(emb)
    lmn[:, W_SIGNAL] = 1
    stream = torch.cat([emb, lmn])
    assert len(emb) > 1 and len(lmn) >= 1

    w = types.SimpleNamespace(embed=table, final_norm=final,
                              config=types.SimpleNamespace(rms_norm_eps=1e-5))
    arena = torch.full((3, T, H), float("nan")).bfloat16()
    lastn = torch.full((S, H), float("nan")).bfloat16()
    st = _State({0: arena[0].clone(), 1: arena[1].clone(), 2: arena[2].clone(),
                 int(Buf.LAST_NORMED): lastn.clone()}, plan.meta, w)
    _faces(stream, st)

    normw = torch.zeros(3 * 1, H, dtype=torch.bfloat16)
    normw[2] = final
    ga, gl = arena.cuda(), lastn.cuda()
    mk = M.Megakernel(ga, normw.cuda(), 1, 1e-5, timeout_s=TIMEOUT_S,
                      meta=_meta_dev(plan.meta.tensor), embed=table.cuda(), last_normed=gl)
    _run(mk, stream)
    got_h = ga[0].cpu()
    assert torch.equal(got_h, st.bufs[0]), "EMBED rows differ from the table rows"
    assert torch.isnan(ga[1:].float()).all(), "EMBED wrote outside HIDDEN"
    got_l = gl.cpu().float()
    want_l = st.bufs[int(Buf.LAST_NORMED)].float()
    assert torch.isfinite(got_l).all()
    torch.testing.assert_close(got_l, want_l, rtol=2e-2, atol=2e-2)
    print(f"EMBED: {len(emb)} tiles bit-exact; LM_NORM: {len(lmn)} instructions, max |err| "
          f"{(got_l - want_l).abs().max().item():.3g}")
    assert int(mk.counters[0]) == 0, "the last CTA resets the counters"


def test_gather_check_plan_refusals():
    """EMBED with the SCATTER epilogue (TP > 1) and LM_NORM into another buffer are refused."""
    from mk.instructions import embed as em
    from mk.instructions import lm as lmn_mod
    from mk.instructions.matmul import Epi
    model = _small_model()
    plan, _, _ = _plan([(8, 0)], model)
    emb = _no_waits(_of(plan.instrs, Op.EMBED))
    lmn = _no_waits(_of(plan.instrs, Op.LM_NORM))
    H, T = model.hidden_size, plan.meta.num_tokens
    kw = dict(embed_shape=(model.vocab_size, H), last_normed_shape=(1, H))
    M.check_plan(torch.cat([emb, lmn]), 3, T, H, 1 << 16, **kw)
    bad = emb.clone()
    bad[:, em.A_EPI] = int(Epi.SCATTER)
    with pytest.raises(NotImplementedError, match="mk.comm"):
        M.check_plan(bad, 3, T, H, 1 << 16, **kw)
    bad = lmn.clone()
    bad[:, lmn_mod.A_DST] = int(Buf.NORMED)
    with pytest.raises(ValueError, match="LAST_NORMED"):
        M.check_plan(bad, 3, T, H, 1 << 16, **kw)
    with pytest.raises(NotImplementedError, match="embedding table"):
        M.check_plan(emb, 3, T, H, 1 << 16)


# ------------------------------------------------------------------------------ attention
ATTN_CASES = ["decode-varlen", "prefill-chunks", "decode-ctx512-b64"]


def _attn_arena():
    """(arena, norm table, layers, eps) of the attention-only launches: unused by the attention
    bodies, one shape for every case (the compiled variant is cached per arena shape)."""
    return (torch.zeros(3, 8, 1024, dtype=torch.bfloat16, device="cuda"),
            torch.ones(3, 1024, dtype=torch.bfloat16, device="cuda"), 1, 1e-5)


def _attn_case(name):
    from bench.attention import case_list
    return next(c for c in case_list(quick=True) if c["name"] == name)


@pytest.mark.parametrize("name", ATTN_CASES)
def test_attention_through_the_controller_ring(name):
    """ATTENTION (waits removed: no QKV here) then ATTN_REDUCE (waits kept: the SPLIT counters
    the attention instructions signal) in one megakernel launch, vs the torch faces."""
    from bench.attention import make_problem, oracle
    prob = make_problem(_attn_case(name), seed=3)
    want = oracle(prob)
    b = prob["bufs"]
    q, out, part, lse = (b[x].cuda() for x in (Buf.Q, Buf.ATTN_OUT, Buf.ATTN_PARTIAL,
                                                 Buf.ATTN_LSE))
    kv = torch.stack([b[Buf.K_CACHE], b[Buf.V_CACHE]]).cuda().contiguous()
    ps = prob["case"]["page_size"]
    mk = M.Megakernel(*_attn_arena(), timeout_s=TIMEOUT_S, meta=_meta_dev(prob["plan"].meta.tensor),
                      kv=kv, attn=M.AttnOperands(q, out, part, lse, ps))
    stream = torch.cat([_no_waits(prob["attn"]), prob["red"]])
    _run(mk, stream, meta_page_size=ps)
    got = out.cpu().float()
    ref = want[Buf.ATTN_OUT].float()
    rows = prob["T"]
    assert torch.isfinite(got[:rows]).all(), "ATTN_OUT rows not written (NaN poison left)"
    err = ((got[:rows] - ref[:rows]).norm() / ref[:rows].norm()).item()
    assert err < 2e-2, f"{name}: ATTN_OUT rel err {err:.3g}"
    print(f"{name}: {len(prob['attn'])} ATTENTION + {len(prob['red'])} ATTN_REDUCE, handoff "
          f"{mk.handoff}, ATTN_OUT rel err {err:.3g}")
    if len(prob["red"]):   # the split partials' log-sum-exps (NaN where no split wrote)
        torch.testing.assert_close(lse.cpu(), want[Buf.ATTN_LSE], rtol=1e-3, atol=1e-2,
                                   equal_nan=True)


def test_attention_refuses_a_wrong_meta_page_size():
    """The KV page size is compiled in: a step whose metadata says otherwise is refused on the
    host (when given) and by the kernel (MegakernelError, no hang)."""
    from bench.attention import make_problem
    from mk.instructions import _common as mc
    prob = make_problem(_attn_case("decode-varlen"), seed=1)
    b = prob["bufs"]
    q, out, part, lse = (b[x].cuda() for x in (Buf.Q, Buf.ATTN_OUT, Buf.ATTN_PARTIAL,
                                                 Buf.ATTN_LSE))
    kv = torch.stack([b[Buf.K_CACHE], b[Buf.V_CACHE]]).cuda().contiguous()
    meta = prob["plan"].meta.tensor.clone()
    meta[mc.M_PAGE_SIZE] = 32
    mk = M.Megakernel(*_attn_arena(), timeout_s=TIMEOUT_S, meta=_meta_dev(meta), kv=kv,
                      attn=M.AttnOperands(q, out, part, lse, 16))
    stream = _no_waits(prob["attn"])
    with pytest.raises(ValueError, match="page size"):
        mk.prepare(stream, meta_page_size=32)
    with pytest.raises(M.MegakernelError, match="metadata"):
        _run(mk, stream)


# ------------------------------------------------------------------------------ one model step
def _tiny_model():
    from mk.tiny import TINY_CONFIG
    # the GPU bodies need head_dim 128 (RoPE pairs in one wgmma chain, attention page geometry)
    return dataclasses.replace(TINY_CONFIG, head_dim=128, num_layers=1)


def test_one_layer_model_step_matches_the_vm():
    """A one-layer TP=1 step of the tiny model (head_dim 128) with every opcode (EMBED, RMSNORM,
    QKV_ROPE + KV append, ATTENTION with splits, ATTN_REDUCE, O_PROJ, GATE_UP, DOWN, LM_NORM,
    LM_HEAD) in one megakernel launch vs mk.vm on the same weights, batch and prior KV cache."""
    from mk.batch import SeqChunk, StepBatch
    from mk.config import KernelConfig, ParallelConfig
    from mk.instructions.qkv import inv_freq
    from mk.plan import PlanConfig
    from mk.tiny import tiny_checkpoint
    from mk.vm import VM
    from mk.weights import load_rank_weights

    model = _tiny_model()
    w = load_rank_weights(tiny_checkpoint(config=model), ParallelConfig(), dtype=torch.bfloat16,
                          device=torch.device("cpu"), progress=False)
    cfg = w.config
    ps = 16
    kernel = KernelConfig(page_size=ps, max_batch_tokens=128, max_seqs=4, max_context=1024,
                          num_kv_pages=64)
    pcfg = PlanConfig(kv_split=128)
    seqs = [(1, 300), (1, 40), (70, 0), (20, 130)]        # decode (split), decode, prefill, chunk
    pages = list(range(kernel.kv_pages))
    import random
    random.Random(0).shuffle(pages)
    chunks = []
    rng = random.Random(1)
    for n, s in seqs:
        need = -(-(n + s) // ps)
        chunks.append(SeqChunk(tokens=[rng.randrange(cfg.vocab_size) for _ in range(n)],
                               start_pos=s, pages=pages[:need]))
        pages = pages[need:]
    batch = StepBatch(chunks)

    vm = VM(w, kernel, pcfg)
    st = vm.world[0]
    g = torch.Generator().manual_seed(2)
    for bname in (Buf.K_CACHE, Buf.V_CACHE):      # the prior context (positions < start_pos)
        st.bufs[bname].copy_(torch.randn(st.bufs[bname].shape, generator=g).bfloat16())
    kv0 = torch.stack([st.bufs[Buf.K_CACHE].clone(), st.bufs[Buf.V_CACHE].clone()])
    want_logits = vm.step(batch)
    plan = vm.last_plan
    want_kv = torch.stack([st.bufs[Buf.K_CACHE], st.bufs[Buf.V_CACHE]])
    ops = set(plan.instrs[:, W_OPCODE].tolist())
    assert {int(o) for o in (Op.EMBED, Op.ATTENTION, Op.ATTN_REDUCE, Op.LM_NORM,
                             Op.QKV_ROPE, Op.LM_HEAD)} <= ops

    sh = vm.shapes
    dev = "cuda"

    def buf(b, dtype=torch.bfloat16):
        return torch.full(sh[b], float("nan"), dtype=dtype, device=dev)
    T, H = sh[Buf.HIDDEN]
    arena = torch.full((3, T, H), float("nan"), dtype=torch.bfloat16, device=dev)
    q, aout, mact, lastn = buf(Buf.Q), buf(Buf.ATTN_OUT), buf(Buf.MLP_ACT), buf(Buf.LAST_NORMED)
    part, lse = buf(Buf.ATTN_PARTIAL, torch.float32), buf(Buf.ATTN_LSE, torch.float32)
    logits = buf(Buf.LOGITS, torch.float32)
    kv = kv0.to(dev).contiguous()
    wd = {k: getattr(w, k).to(dev) for k in ("qkv", "o", "gate_up", "down", "lm_head", "embed")}
    G = M.GemmOperands
    gemm = {Op.QKV_ROPE: G(arena, wd["qkv"], q, 0, int(Buf.Q)),
            Op.O_PROJ: G(aout, wd["o"], arena, int(Buf.ATTN_OUT), 0),
            Op.GATE_UP: G(arena, wd["gate_up"], mact, 0, int(Buf.MLP_ACT)),
            Op.DOWN: G(mact, wd["down"], arena, int(Buf.MLP_ACT), 0),
            Op.LM_HEAD: G(lastn, wd["lm_head"], logits, int(Buf.LAST_NORMED), int(Buf.LOGITS))}
    mk = M.Megakernel(arena, M.norm_table(w).to(dev), cfg.num_layers, cfg.rms_norm_eps,
                      timeout_s=TIMEOUT_S, gemm=gemm, gemm_m=plan.meta.num_tokens,
                      meta=_meta_dev(plan.meta.tensor), inv_freq=inv_freq(cfg.head_dim, cfg.rope).float().to(dev),
                      kv=kv, attn=M.AttnOperands(q, aout, part, lse, ps), embed=wd["embed"],
                      last_normed=lastn)
    _run(mk, plan.instrs, meta_page_size=ps)
    S = plan.meta.num_seqs
    got = logits[:S].cpu()
    assert torch.isfinite(got).all(), "logits not written"
    err = ((got - want_logits).norm() / want_logits.norm()).item()
    assert err < 3e-2, f"logits rel err {err:.3g}"
    assert (got.argmax(-1) == want_logits.argmax(-1)).float().mean() >= 0.75
    gk = kv.cpu().float()
    wk = want_kv.float()
    fin = torch.isfinite(wk)
    assert torch.equal(torch.isfinite(gk), fin), "KV cache rows written differ"
    kerr = ((gk[fin] - wk[fin]).norm() / wk[fin].norm()).item()
    assert kerr < 1e-2, f"KV cache rel err {kerr:.3g}"
    print(f"one-layer step: {len(plan.instrs)} instructions, handoff {mk.handoff}, logits rel err "
          f"{err:.3g}, argmax agreement {(got.argmax(-1) == want_logits.argmax(-1)).float().mean():.2f}, "
          f"KV cache rel err {kerr:.3g}")
