"""mk's reference model against Hugging Face transformers' LlamaForCausalLM (eager attention).

Random checkpoints written by transformers, loaded by mk's loader. Greedy, 32 new tokens, four
prompts of different lengths generated in one batch by mk (continuous batching with chunked
prefill), one at a time by HF (no padding). float32: identical tokens, logits within 1e-4.
bfloat16: logits within BF16_REL_TOL of the logit scale at every step (teacher-forced on HF's
tokens, so that a divergence after a near-tie does not cascade), identical tokens wherever HF's
top-two logits are further apart than that tolerance, and free-running tokens identical up to the
first such near-tie.
"""

from __future__ import annotations

import pytest
import torch

from conftest import NAMED_CONFIGS, make_hf_checkpoint
from mk.batch import SeqChunk, StepBatch
from mk.engine import Engine

NEW_TOKENS = 32
PROMPTS = [[3, 17, 45, 2, 99, 120], [7], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23],
           [200, 201, 5]]
FP32_ATOL = 1e-4
# bfloat16 keeps an 8-bit significand: one rounding moves a value by up to 2^-9 ~ 0.2 % of itself.
# A logit goes through ~10 rounded operations per layer; an implementation that is correct but
# orders its sums or roundings differently from HF drifts by a few bf16 ulps of the logit scale,
# ~1-2 %. A real bug (wrong RoPE, mask, head mapping, norm) moves logits by the order of the scale
# itself. So: |mk - hf| <= BF16_REL_TOL * max|hf logits| per step, and a step whose top-two HF
# logits are closer than that is a near-tie where the argmax may legitimately differ.
# (The reference mirrors HF's op order and, measured, matches HF bf16 bit for bit; the bound is
# for the contract, not for slack.)
BF16_REL_TOL = 0.02


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """HF greedy tokens and the float32 logits [n, V] each token was chosen from."""
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, pad_token_id=0, eos_token_id=None,
                         output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    assert len(tokens) == n
    return tokens, torch.cat(out.logits).float()


def teacher_forced_logits(engine: Engine, prompts, forced: list[list[int]], n: int) -> torch.Tensor:
    """mk logits [num_prompts, n, V]: step 0 prefills every prompt in one batch, step t decodes
    forced[i][t-1] for every sequence (a batch mixing sequences of different lengths)."""
    for i, p in enumerate(prompts):
        engine.pages.allocate(("tf", i), len(p) + n)
    out = []
    try:
        for t in range(n):
            if t == 0:
                chunks = [SeqChunk(list(p), 0, engine.pages.pages(("tf", i)))
                          for i, p in enumerate(prompts)]
            else:
                chunks = [SeqChunk([forced[i][t - 1]], len(p) + t - 1, engine.pages.pages(("tf", i)))
                          for i, p in enumerate(prompts)]
            out.append(engine.step(StepBatch(chunks)))
    finally:
        for i in range(len(prompts)):
            engine.pages.free(("tf", i))
    return torch.stack(out, dim=1)


def load_hf(ckpt, dtype):
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager").eval()


@pytest.fixture(scope="module", params=list(NAMED_CONFIGS))
def checkpoint(request, tmp_path_factory):
    ckpt, _ = make_hf_checkpoint(tmp_path_factory.mktemp(request.param), **NAMED_CONFIGS[request.param])
    return ckpt


@torch.inference_mode()
def test_float32_tokens_identical(checkpoint):
    hf = load_hf(checkpoint, torch.float32)
    ref = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    engine = Engine.from_pretrained(checkpoint, dtype=torch.float32, device="cpu", page_size=4,
                                    num_kv_pages=256, progress=False)
    # 8 tokens per step: the 13-token prompt is prefilled in chunks (start_pos > 0) while the other
    # sequences already decode.
    outs = engine.generate(PROMPTS, max_new_tokens=NEW_TOKENS, ignore_eos=True, max_tokens_per_step=8)
    for i, (o, (tokens, _)) in enumerate(zip(outs, ref)):
        assert o == tokens, f"prompt {i}: mk {o} != HF {tokens}"
    assert engine.pages.free_pages == engine.pages.num_pages
    logits = teacher_forced_logits(engine, PROMPTS, [t for t, _ in ref], NEW_TOKENS)
    for i, (_, hl) in enumerate(ref):
        torch.testing.assert_close(logits[i], hl, atol=FP32_ATOL, rtol=0)


@torch.inference_mode()
def test_bfloat16_tracks_hf(checkpoint):
    hf = load_hf(checkpoint, torch.bfloat16)
    ref = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    engine = Engine.from_pretrained(checkpoint, dtype=torch.bfloat16, device="cpu", page_size=4,
                                    num_kv_pages=256, progress=False)
    logits = teacher_forced_logits(engine, PROMPTS, [t for t, _ in ref], NEW_TOKENS)
    first_tie = []
    for i, (tokens, hl) in enumerate(ref):
        first_tie.append(NEW_TOKENS)
        for t in range(NEW_TOKENS):
            tol = BF16_REL_TOL * float(hl[t].abs().max())
            diff = float((logits[i, t] - hl[t]).abs().max())
            assert diff <= tol, f"prompt {i} step {t}: max |mk - HF| logit {diff:.4g} > {tol:.4g}"
            top2 = hl[t].topk(2).values
            if float(top2[0] - top2[1]) <= tol:
                first_tie[i] = min(first_tie[i], t)
                continue
            assert int(logits[i, t].argmax()) == tokens[t], f"prompt {i} step {t}: argmax differs"
    outs = engine.generate(PROMPTS, max_new_tokens=NEW_TOKENS, ignore_eos=True, max_tokens_per_step=8)
    for i, (o, (tokens, _)) in enumerate(zip(outs, ref)):
        n = first_tie[i]
        assert o[:n] == tokens[:n], f"prompt {i}: tokens differ before the first near-tie (step {n})"
