"""Is RMSNorm folded into the next GEMM accurate enough? (CPU; a design probe for issue 6)

Why: in the decode step every layer runs two RMSNORM phases (before QKV and before gate/up), and
each costs a hop plus a small instruction on the critical path: 11.9 us of B=64's 114.7 us a
layer, 12.9 of B=256's 172.7 (bench/results/ab_2026-12-04_s37_summary.json, journal). Folding
the norm into the GEMM that follows removes the phase:

    RMSNorm(h) @ W^T = r * (h @ (W * g)^T),   r = rsqrt(mean(h^2) + eps) per row

with g (the norm's weight) multiplied into the weight's input columns once at load time
(W * g rounded to bf16), the GEMM run on the residual h itself, and each output row scaled by r
in float32 before the accumulator is rounded (the epilogue; a split-K reduce would scale the
summed partials, the splits also summing each row's h^2 over their K slice).

HF's order (mk.reference.rms_norm) rounds differently: x = bf16(h * r), then bf16(g * x), then
the GEMM. This probe runs both bf16 orders over the same random checkpoints and measures each
against the float32 model (teacher-forced on the float32 greedy tokens, so that one near-tie
does not cascade): the largest |logit - float32 logit| relative to the step's logit scale, and
how many greedy tokens differ where float32's top two are further apart than the bound the
parity test uses (tests/test_reference_hf.py's BF16_REL_TOL). The folded order is acceptable if
its error is of the reference's own size.

    python bench/probes/norm_fold_probe.py [--new-tokens 32] [--out bench/results/x.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tests"))

from mk.batch import StepBatch  # noqa: E402
import mk.engine  # noqa: E402
from mk.engine import Engine, register_backend  # noqa: E402
from mk.reference import PagedKVCache, ReferenceModel, rope_cos_sin  # noqa: E402
from test_reference_hf import PROMPTS, teacher_forced_logits  # noqa: E402

BF16_REL_TOL = 0.02     # tests/test_reference_hf.py's bound
# a wider model than the tests' (hidden 2048, head_dim 128, GQA 16:4, llama3 RoPE): longer dot
# products, where the folded weights' own rounding could add up differently
WIDE = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
            num_hidden_layers=4, vocab_size=2048, intermediate_size=5632,
            rope_theta=500000.0, max_position_embeddings=512, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})


def fold(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """W * g over W's input columns, in float32, rounded once to W's dtype."""
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype)


def normed_linear(h: torch.Tensor, folded: torch.Tensor, eps: float) -> torch.Tensor:
    """r * (h @ folded^T) with the float32 accumulator scaled before its one rounding, as a GEMM
    epilogue would."""
    hf = h.float()
    r = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return ((hf @ folded.float().t()) * r).to(h.dtype)


class FoldedReference(ReferenceModel):
    """mk.reference with every RMSNorm folded into the GEMM after it (QKV, gate/up, LM head)."""

    def __init__(self, weights, kv_cache, group=None):
        super().__init__(weights, kv_cache, group)
        w = self.w
        self.qkv_f = [fold(w.qkv[i], w.attn_norm[i]) for i in range(self.cfg.num_layers)]
        self.gate_up_f = [fold(w.gate_up[i], w.mlp_norm[i]) for i in range(self.cfg.num_layers)]
        self.lm_head_f = fold(w.lm_head, w.final_norm)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        assert self.tp == 1, "the probe runs one rank"
        batch.validate(self.cache.page_size, self.cache.num_pages)
        ids = batch.token_ids().to(self.device)
        positions = batch.positions().to(self.device)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        eps = self.cfg.rms_norm_eps
        h = self.embed(ids)
        for layer in range(self.cfg.num_layers):
            attn = self.attend(layer, normed_linear(h, self.qkv_f[layer], eps), batch, cos, sin)
            h = h + F.linear(attn, self.w.o[layer])
            gu = normed_linear(h, self.gate_up_f[layer], eps)
            i = gu.shape[-1] // 2
            h = h + F.linear(F.silu(gu[:, :i]) * gu[:, i:], self.w.down[layer])
        last = h[batch.last_token_rows().to(self.device)]
        return normed_linear(last, self.lm_head_f, eps).float()


class FoldedBackend:
    name = "norm_fold"

    def __init__(self, weights, kernel, group=None, *, owns_weights=False):
        self.kv_cache = PagedKVCache.for_weights(weights, kernel.kv_pages, kernel.page_size)
        self.model = FoldedReference(weights, self.kv_cache, group=group)

    def forward(self, batch: StepBatch) -> torch.Tensor:
        return self.model.forward(batch)


def make_engine(ckpt, backend: str, dtype, **kw) -> Engine:
    """Engine.from_pretrained; backend "norm_fold" is registered only while its engine is built,
    so that importing the probe (the tests do) leaves mk's backend list as it was."""
    if backend != "norm_fold":
        return Engine.from_pretrained(ckpt, backend=backend, dtype=dtype, **kw)
    register_backend("norm_fold")(FoldedBackend)
    try:
        return Engine.from_pretrained(ckpt, backend=backend, dtype=dtype, **kw)
    finally:
        mk.engine._BACKENDS.pop("norm_fold", None)


def teacher_forced(engine: Engine, forced: list[list[int]], n: int) -> torch.Tensor:
    """Logits [prompts, n, V] of the parity test's prompts, teacher-forced on `forced`."""
    return teacher_forced_logits(engine, PROMPTS, forced, n)


def greedy_fp32(engine: Engine, n: int) -> list[list[int]]:
    return engine.generate(PROMPTS, max_new_tokens=n, ignore_eos=True)


def compare(truth: torch.Tensor, got: torch.Tensor) -> dict:
    """Largest |got - truth| over each step's logit scale; argmax differences where truth's top
    two are further apart than BF16_REL_TOL of the scale (not a near-tie)."""
    scale = truth.abs().amax(-1)
    rel = (got - truth).abs().amax(-1) / scale
    top2 = truth.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > BF16_REL_TOL * scale
    flips = (got.argmax(-1) != truth.argmax(-1)) & clear
    return dict(max_rel_err=float(rel.max()), mean_rel_err=float(rel.mean()),
                clear_steps=int(clear.sum()), argmax_flips_on_clear_steps=int(flips.sum()))


def main(argv=None) -> dict:
    from conftest import NAMED_CONFIGS, make_hf_checkpoint
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-wide", action="store_true", help="the tests' configurations only")
    args = ap.parse_args(argv)
    n = args.new_tokens
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        configs = dict(NAMED_CONFIGS)
        if not args.no_wide:
            configs["WIDE"] = WIDE
        for name, cfg in configs.items():
            for seed in (int(s) for s in args.seeds.split(",")):
                ckpt, _ = make_hf_checkpoint(Path(tmp) / f"{name}_{seed}", seed=seed, **cfg)
                kw = dict(device="cpu", page_size=4, num_kv_pages=256, progress=False)
                fp32 = make_engine(ckpt, "reference", torch.float32, **kw)
                forced = greedy_fp32(fp32, n)
                truth = teacher_forced(fp32, forced, n)
                row = {}
                for backend in ("reference", "norm_fold"):
                    eng = make_engine(ckpt, backend, torch.bfloat16, **kw)
                    row[backend] = compare(truth, teacher_forced(eng, forced, n))
                results[f"{name} seed {seed}"] = row
                print(f"{name:13s} seed {seed}: " + "  ".join(
                    f"{b}: max {r['max_rel_err']:.4f} mean {r['mean_rel_err']:.4f} flips "
                    f"{r['argmax_flips_on_clear_steps']}/{r['clear_steps']}"
                    for b, r in row.items()), flush=True)
    summary = {b: dict(max_rel_err=max(r[b]["max_rel_err"] for r in results.values()),
                       mean_rel_err=sum(r[b]["mean_rel_err"] for r in results.values())
                       / len(results),
                       flips=sum(r[b]["argmax_flips_on_clear_steps"] for r in results.values()),
                       clear_steps=sum(r[b]["clear_steps"] for r in results.values()))
               for b in ("reference", "norm_fold")}
    print("summary (bf16 vs float32, teacher-forced):", json.dumps(summary))
    if args.out:
        import datetime
        import subprocess
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
        Path(args.out).write_text(json.dumps(dict(
            probe="bench/probes/norm_fold_probe.py", date=datetime.date.today().isoformat(),
            git_commit=commit, device="cpu (float32 truth, bf16 models)",
            command="python " + " ".join(sys.argv),
            new_tokens=n, bound=BF16_REL_TOL, results=results, summary=summary), indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
