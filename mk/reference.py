"""The plain torch Llama forward of one tensor-parallel rank: the oracle for every kernel.

Readable first, fast never. It mirrors Hugging Face transformers' `LlamaForCausalLM` (eager
attention) operation by operation, in the same order and the same dtypes, so that float32 results
match HF to the last bit or nearly, and bfloat16 results round the way HF's do:

- RMSNorm in float32, cast back, then `weight * x` in the model dtype;
- RoPE inverse frequencies (llama3 scaling included) in float32, cos/sin in float32 cast to the
  model dtype, `q * cos + rotate_half(q) * sin` in the model dtype;
- scores `(q @ k^T) * head_dim**-0.5` in the model dtype, softmax in float32 cast back;
- logits in the model dtype, returned as float32.

Tensor parallelism is Megatron's (see mk.config.ParallelConfig): each rank holds its q heads, its
KV heads (or a replica of the one its q heads use), its slice of the MLP and of the vocabulary.
Communication: one all-reduce for the embedding (vocab-sharded lookup), one after the o-projection
and one after the down-projection of every layer, one all-gather of the logits. With `group=None`
and no initialized process group (or a world of one) nothing is communicated.

This module depends on nothing it judges: only torch, mk.config, mk.batch and mk.weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mk.batch import StepBatch
from mk.config import ModelConfig, RopeConfig
from mk.weights import RankWeights


# KV cache ------------------------------------------------------------------------------------------
class PagedKVCache:
    """K and V of every layer in fixed-size pages: k, v are [L, num_pages, page_size, kv_heads, D].

    A sequence's page table (SeqChunk.pages) lists its pages in position order: position p lives in
    page `pages[p // page_size]`, slot `p % page_size`. Pages need not be contiguous nor ordered.
    The cache is allocated with torch.empty: a slot holds garbage until written, and only written
    slots (positions below a sequence's end) are ever read.
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.bfloat16, device="cpu"):
        if min(num_layers, num_pages, page_size, kv_heads, head_dim) <= 0:
            raise ValueError("PagedKVCache sizes must be positive, got "
                             f"layers={num_layers} pages={num_pages} page_size={page_size} "
                             f"kv_heads={kv_heads} head_dim={head_dim}")
        shape = (num_layers, num_pages, page_size, kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @classmethod
    def for_weights(cls, weights: RankWeights, num_pages: int, page_size: int,
                    device=None) -> "PagedKVCache":
        """A cache shaped for this rank's shard of the model (its local KV heads)."""
        cfg, par = weights.config, weights.parallel
        return cls(cfg.num_layers, num_pages, page_size, par.kv_heads_local(cfg), cfg.head_dim,
                   dtype=weights.dtype, device=weights.qkv.device if device is None else device)

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def num_pages(self) -> int:
        return self.k.shape[1]

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    def slots(self, pages: list[int], start: int, stop: int) -> torch.Tensor:
        """Flat slot indices (page * page_size + offset) of positions [start, stop)."""
        pos = torch.arange(start, stop)
        table = torch.as_tensor(pages, dtype=torch.long)
        if stop > 0 and (stop - 1) // self.page_size >= len(pages):
            raise ValueError(f"page table of {len(pages)} pages cannot hold position {stop - 1} "
                             f"(page size {self.page_size})")
        return (table[pos // self.page_size] * self.page_size + pos % self.page_size).to(self.k.device)

    def append(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v [T, kv_heads, D] into the given flat slots of `layer`."""
        flat_k = self.k[layer].view(-1, *self.k.shape[3:])
        flat_v = self.v[layer].view(-1, *self.v.shape[3:])
        flat_k[slots] = k.to(self.k.dtype)
        flat_v[slots] = v.to(self.v.dtype)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [len(slots), kv_heads, D] of `layer` at the given flat slots."""
        flat_k = self.k[layer].view(-1, *self.k.shape[3:])
        flat_v = self.v[layer].view(-1, *self.v.shape[3:])
        return flat_k[slots], flat_v[slots]


# Building blocks (HF order of operations) ---------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: variance in float32, normalized x cast back, then weight * x."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] in float32, llama3 scaling applied (as in transformers)."""
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(
        dtype=torch.float) / head_dim))
    if rope.scaling_type is None:
        return inv_freq
    if rope.scaling_type != "llama3":
        raise ValueError(f"unsupported RoPE scaling {rope.scaling_type!r}")
    factor = rope.factor
    low_freq_factor, high_freq_factor = rope.low_freq_factor, rope.high_freq_factor
    old_context_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # wavelength above low_freq_wavelen: divide by factor; below high_freq_wavelen: keep;
    # in between: interpolate smoothly.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] for the given positions: float32 math, cast to dtype."""
    freqs = positions[:, None].float() * inv_freq.to(device=positions.device, dtype=torch.float)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos, sin [T, D]."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return (x * cos) + (rotate_half(x) * sin)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start_pos: int,
                     scaling: float) -> torch.Tensor:
    """Attention of one sequence's new tokens over its whole context, HF eager style.

    q [T, hq, D] at positions start_pos .. start_pos+T-1; k, v [C, hkv, D] at positions 0 .. C-1
    (C = start_pos + T). Query head h reads KV head h // (hq / hkv). Returns [T, hq * D].
    """
    T, hq, D = q.shape
    C, hkv, _ = k.shape
    groups = hq // hkv
    qh = q.transpose(0, 1)                                            # [hq, T, D]
    kh = k.transpose(0, 1).repeat_interleave(groups, dim=0)           # [hq, C, D]
    vh = v.transpose(0, 1).repeat_interleave(groups, dim=0)
    scores = torch.matmul(qh, kh.transpose(1, 2)) * scaling           # [hq, T, C]
    if T > 1:
        qpos = torch.arange(start_pos, start_pos + T, device=q.device)[:, None]
        kpos = torch.arange(C, device=q.device)[None, :]
        mask = torch.zeros(T, C, dtype=scores.dtype, device=q.device)
        mask.masked_fill_(kpos > qpos, torch.finfo(scores.dtype).min)
        scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs, vh)                                     # [hq, T, D]
    return out.transpose(0, 1).reshape(T, hq * D)


# The model ------------------------------------------------------------------------------------------
class ReferenceModel:
    """One rank's Llama forward over a StepBatch, with K/V kept in a PagedKVCache.

    forward(batch) -> logits [num_seqs, vocab_size] float32 of each sequence's last new token (the
    full vocabulary on every rank). It writes the batch's K/V into the cache: a sequence's earlier
    positions [0, start_pos) must have been written by earlier steps.
    """

    def __init__(self, weights: RankWeights, kv_cache: PagedKVCache, group=None):
        self.w = weights
        self.cfg: ModelConfig = weights.config
        self.par = weights.parallel
        self.cache = kv_cache
        self.group = group
        self.device = weights.qkv.device
        self.dtype = weights.dtype
        cfg, par = self.cfg, self.par
        self.hq = par.heads_local(cfg)
        self.hkv = par.kv_heads_local(cfg)
        self.vocab_local = par.vocab_local(cfg)
        self.vocab_start = par.rank * self.vocab_local
        self.scaling = cfg.head_dim ** -0.5
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope)
        if kv_cache.k.shape[0] != cfg.num_layers or kv_cache.k.shape[3:] != (self.hkv, cfg.head_dim):
            raise ValueError(f"KV cache shape {list(kv_cache.k.shape)} does not fit this rank's "
                             f"model ({cfg.num_layers} layers, {self.hkv} KV heads of {cfg.head_dim})")
        self.tp = par.tp_size
        if self.tp > 1:
            import torch.distributed as dist
            if not dist.is_available() or not dist.is_initialized():
                raise RuntimeError(f"TP size {self.tp} needs an initialized torch.distributed group")
            world = dist.get_world_size(group)
            if world != self.tp:
                raise RuntimeError(f"weights are sharded for TP {self.tp} but the process group has "
                                   f"{world} ranks")

    # communication --------------------------------------------------------------------------------
    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            import torch.distributed as dist
            dist.all_reduce(x, group=self.group)
        return x

    def _all_gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return logits
        import torch.distributed as dist
        parts = [torch.empty_like(logits) for _ in range(self.tp)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    # pieces ---------------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocab-sharded lookup: this rank's rows, zeros for the others, then all-reduce."""
        if self.tp == 1:
            return F.embedding(ids, self.w.embed)
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_local)
        x = F.embedding(local.clamp(0, self.vocab_local - 1), self.w.embed)
        x = x * mine[:, None].to(x.dtype)
        return self._all_reduce(x)

    def attention(self, layer: int, x: torch.Tensor, batch: StepBatch, positions: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = self.attend(layer, F.linear(x, self.w.qkv[layer]), batch, cos, sin)
        return self._all_reduce(F.linear(attn, self.w.o[layer]))

    def attend(self, layer: int, qkv: torch.Tensor, batch: StepBatch, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """The attention between the QKV and O projections: RoPE on q / k, k / v appended to the
        cache, causal attention of each sequence's rows over its cached keys."""
        D = self.cfg.head_dim
        q = qkv[:, : self.hq * D].view(-1, self.hq, D)
        k = qkv[:, self.hq * D: (self.hq + self.hkv) * D].view(-1, self.hkv, D)
        v = qkv[:, (self.hq + self.hkv) * D:].view(-1, self.hkv, D)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        outs, row = [], 0
        for s in batch.seqs:
            n = len(s.tokens)
            self.cache.append(layer, self.cache.slots(s.pages, s.start_pos, s.end_pos),
                              k[row:row + n], v[row:row + n])
            kc, vc = self.cache.gather(layer, self.cache.slots(s.pages, 0, s.end_pos))
            outs.append(causal_attention(q[row:row + n], kc, vc, s.start_pos, self.scaling))
            row += n
        return torch.cat(outs, dim=0)

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        gu = F.linear(x, self.w.gate_up[layer])
        i = gu.shape[-1] // 2
        h = F.silu(gu[:, :i]) * gu[:, i:]
        return self._all_reduce(F.linear(h, self.w.down[layer]))

    # forward --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        batch.validate(self.cache.page_size, self.cache.num_pages)
        ids = batch.token_ids().to(self.device)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size}), got "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        positions = batch.positions().to(self.device)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        eps = self.cfg.rms_norm_eps
        h = self.embed(ids)
        for layer in range(self.cfg.num_layers):
            residual = h
            x = rms_norm(h, self.w.attn_norm[layer], eps)
            h = residual + self.attention(layer, x, batch, positions, cos, sin)
            residual = h
            x = rms_norm(h, self.w.mlp_norm[layer], eps)
            h = residual + self.mlp(layer, x)
        last = h[batch.last_token_rows().to(self.device)]
        last = rms_norm(last, self.w.final_norm, eps)
        logits = F.linear(last, self.w.lm_head)
        return self._all_gather_vocab(logits).float()

    __call__ = forward
