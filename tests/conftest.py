"""Shared test fixtures: random Hugging Face Llama checkpoints written by transformers.

    from conftest import TINY_MHA, GQA_LLAMA3, TIED_HEADDIM, make_hf_checkpoint
    ckpt_dir, hf_model = make_hf_checkpoint(tmp_path, **GQA_LLAMA3, shard=True)

or through the `hf_checkpoint` fixture (same signature, tmp_path already bound):

    def test_x(hf_checkpoint):
        ckpt_dir, hf_model = hf_checkpoint(**TIED_HEADDIM)

All three configurations divide by TP 1, 2, 4 and 8 (GQA_LLAMA3 and TIED_HEADDIM replicate KV heads
at TP 4 / 8 and TP 4 respectively; TIED_HEADDIM has 4 heads, so TP 8 does not apply to it).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

# Multi-head attention, the plainest Llama.
TINY_MHA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                vocab_size=256, intermediate_size=128, tie_word_embeddings=False)

# GQA with Llama 3.1-style RoPE scaling: 8 q heads, 2 KV heads (TP 4 and 8 replicate KV heads).
GQA_LLAMA3 = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=3,
                  vocab_size=320, intermediate_size=256, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                  max_position_embeddings=512, tie_word_embeddings=False)

# Tied embeddings and head_dim (32) != hidden_size / num_heads (24).
TIED_HEADDIM = dict(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    num_hidden_layers=2, vocab_size=256, intermediate_size=192,
                    tie_word_embeddings=True)

NAMED_CONFIGS = {"TINY_MHA": TINY_MHA, "GQA_LLAMA3": GQA_LLAMA3, "TIED_HEADDIM": TIED_HEADDIM}


def make_hf_checkpoint(tmp_path, shard: bool | int | str = False, seed: int = 0,
                       dtype: torch.dtype = torch.float32, **config_overrides):
    """Write a random LlamaForCausalLM with transformers into a fresh directory under tmp_path.

    config_overrides: LlamaConfig fields (defaults: TINY_MHA). shard: False for a single
    model.safetensors; True for several shards (max_shard_size 64KB); or a max_shard_size value.
    Norm weights are randomised around 1 (transformers initialises them to exactly 1, which would
    hide a mixed-up norm). Returns (checkpoint_dir, hf_model) with hf_model in eval mode, in `dtype`.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(TINY_MHA)
    cfg.update(config_overrides)
    cfg.setdefault("rms_norm_eps", 1e-5)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    model = model.to(dtype).eval()
    out = Path(tmp_path) / f"hf-ckpt-{seed}-{'sharded' if shard else 'single'}"
    n = 0
    while out.exists():
        n += 1
        out = out.with_name(f"{out.name.split('~')[0]}~{n}")
    max_shard = "64KB" if shard is True else (shard if shard else "50GB")
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard)
    return out, model


@pytest.fixture
def hf_checkpoint(tmp_path):
    """make_hf_checkpoint with tmp_path bound: hf_checkpoint(**GQA_LLAMA3, shard=True)."""
    return functools.partial(make_hf_checkpoint, tmp_path)


@pytest.fixture(autouse=True)
def _no_progress_bars(monkeypatch):
    monkeypatch.setenv("MK_NO_PROGRESS", "1")


@pytest.fixture
def one_thread():
    """torch on one CPU thread for the test (shared by the interpreter tests)."""
    # tiny matmuls: torch's thread pool only adds contention on a small shared CPU
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
