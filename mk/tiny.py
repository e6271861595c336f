"""The embedded default model: a tiny random Llama checkpoint in Hugging Face format.

    tiny_checkpoint(seed=0, cache_dir=None, config=TINY_CONFIG) -> Path
    (config=TINY_HD128_CONFIG: the same kind of model with head_dim 128, which the megakernel's
    GPU bodies need; `default_model_config(backend)` picks it for --backend megakernel)

writes (once, then reuses) config.json + model.safetensors (+ generation_config.json) of a small
GQA Llama with llama3 RoPE scaling, deterministic from `seed`, with mk's own code (no
transformers). Any HF Llama loader, mk.weights included, reads it like a real checkpoint.

Cache: `<root>/tiny-<seed>-<hash>` where root is `cache_dir`, else $MK_CACHE_DIR, else
~/.cache/mk, and hash covers the configuration and the generator version. The directory is
written to a temporary sibling and renamed into place, so concurrent ranks of one torchrun job
never see a half-written checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from dataclasses import replace

from mk.config import ModelConfig, RopeConfig, cache_root

# Bump when the weights produced for a given (config, seed) change, so stale caches are not reused.
_GENERATOR_VERSION = 1

TINY_CONFIG = ModelConfig(
    hidden_size=256,
    intermediate_size=512,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    head_dim=32,
    vocab_size=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope=RopeConfig(theta=500000.0, scaling_type="llama3", factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=512),
    max_position_embeddings=4096,
    bos_token_id=1,
    eos_token_id=(2,),
)

# The tiny model with the shapes the megakernel's GPU bodies support (head_dim 128, GEMM widths
# multiples of 64): the default model of `--backend megakernel` and of the GPU parity tests.
TINY_HD128_CONFIG = replace(TINY_CONFIG, hidden_size=512, intermediate_size=1024, num_heads=4,
                            num_kv_heads=2, head_dim=128, vocab_size=1024)

# Initialisation, chosen so that greedy generation is varied (measured with transformers: with every
# linear at std 0.02 the random model repeats a handful of tokens; with these it does not):
EMBED_STD = 1.0        # token embeddings: the residual stream starts at unit scale
INIT_GAIN = 1.0        # linear layers: std = INIT_GAIN / sqrt(fan_in), outputs ~ unit scale
LM_HEAD_GAIN = 2.0     # lm_head: logits of std ~2, so top-1 / top-2 gaps are not tiny
NORM_STD = 0.1         # norm weights are 1 + NORM_STD * N(0, 1): ~1, but not all equal


def config_hash(config: ModelConfig = TINY_CONFIG) -> str:
    blob = json.dumps({"config": config.to_hf_dict(), "v": _GENERATOR_VERSION,
                       "init": [EMBED_STD, INIT_GAIN, LM_HEAD_GAIN, NORM_STD]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_state_dict(config: ModelConfig = TINY_CONFIG, seed: int = 0) -> dict[str, torch.Tensor]:
    """The random weights, HF names, bfloat16, deterministic from `seed` (CPU generator)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    H, D, I, V = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    hq, hkv = config.num_heads, config.num_kv_heads

    def normal(*shape, std=None):
        if std is None:
            std = INIT_GAIN / shape[-1] ** 0.5       # shape = [out, in]
        return (torch.randn(*shape, generator=g, dtype=torch.float32) * std).to(torch.bfloat16)

    def norm():
        return (1.0 + NORM_STD * torch.randn(H, generator=g, dtype=torch.float32)).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": normal(V, H, std=EMBED_STD)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm()
        sd[p + "self_attn.q_proj.weight"] = normal(hq * D, H)
        sd[p + "self_attn.k_proj.weight"] = normal(hkv * D, H)
        sd[p + "self_attn.v_proj.weight"] = normal(hkv * D, H)
        sd[p + "self_attn.o_proj.weight"] = normal(H, hq * D)
        sd[p + "post_attention_layernorm.weight"] = norm()
        sd[p + "mlp.gate_proj.weight"] = normal(I, H)
        sd[p + "mlp.up_proj.weight"] = normal(I, H)
        sd[p + "mlp.down_proj.weight"] = normal(H, I)
    sd["model.norm.weight"] = norm()
    if not config.tie_word_embeddings:
        sd["lm_head.weight"] = normal(V, H, std=LM_HEAD_GAIN / H ** 0.5)
    return sd


def write_checkpoint(directory: str | Path, config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> None:
    """config.json + model.safetensors (+ generation_config.json) into an existing directory."""
    directory = Path(directory)
    cfg = config.to_hf_dict()
    cfg["dtype"] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen = {}
    if config.bos_token_id is not None:
        gen["bos_token_id"] = config.bos_token_id
    if config.eos_token_id:
        gen["eos_token_id"] = cfg["eos_token_id"]
    (directory / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})


def tiny_checkpoint(seed: int = 0, cache_dir: str | Path | None = None, *,
                    config: ModelConfig = TINY_CONFIG) -> Path:
    """Path of the tiny random checkpoint for `seed`, writing it first if it is not cached."""
    root = Path(cache_dir) if cache_dir else cache_root()
    final = root / f"tiny-{seed}-{config_hash(config)}"
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        write_checkpoint(tmp, config, tiny_state_dict(config, seed))
        try:
            os.rename(tmp, final)          # atomic; fails if another process got there first
        except OSError:
            if not (final / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_model_config(backend: str = "reference") -> ModelConfig:
    """The tiny model a backend runs when no checkpoint is given."""
    return TINY_HD128_CONFIG if backend == "megakernel" else TINY_CONFIG
