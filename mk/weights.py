"""Hugging Face Llama safetensors checkpoints -> one rank's weights, stacked per kind.

INTERFACE (fixed; the implementation below is being written):

    load_rank_weights(model_dir, parallel=ParallelConfig(), dtype=torch.bfloat16,
                      device="cpu", progress=True) -> RankWeights

RankWeights holds, for rank r of TP size n (Megatron layout, see ParallelConfig):
    config            ModelConfig
    parallel          ParallelConfig
    embed             [V/n, H]              rows [r*V/n, (r+1)*V/n) of embed_tokens
    lm_head           [V/n, H]              same rows of lm_head (or of embed_tokens when tied)
    attn_norm         [L, H]                input_layernorm
    mlp_norm          [L, H]                post_attention_layernorm
    final_norm        [H]
    qkv               [L, (hq + 2*hkv)*D, H]  q rows of this rank's hq heads, then k rows, then v
                                            rows of its hkv KV heads (hkv = 1 when replicated)
    o                 [L, H, hq*D]          o_proj input columns of this rank's q heads
    gate_up           [L, 2*I/n, H]         gate rows of this rank's slice, then up rows
    down              [L, H, I/n]           down_proj input columns of this rank's slice

Every tensor is contiguous, K-major (the last dim is the reduction dim), 16-byte aligned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mk.config import ModelConfig, ParallelConfig


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the tensor."""


@dataclass
class RankWeights:
    config: ModelConfig
    parallel: ParallelConfig
    embed: torch.Tensor
    lm_head: torch.Tensor
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    final_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.qkv.dtype


def load_rank_weights(model_dir, parallel: ParallelConfig = ParallelConfig(),
                      dtype: torch.dtype = torch.bfloat16, device="cpu",
                      progress: bool = True) -> RankWeights:
    raise NotImplementedError
