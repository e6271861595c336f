"""PyTorch peers of one rank's step: the baselines launch/bench.py measures the megakernel against.

    peer = StepPeer(weights, decode=B, context=C, prefill=P)   # static shapes, buffers on device
    logits = peer.step()             # eager: [B + (1 if P else 0), vocab_local] in the model dtype
    peer.compile_layers(mode)        # torch.compile of the layer function (then CUDA-graph it)

What one step is (the same work the megakernel's step does for this rank, minus communication):
embedding of the step's tokens, every layer (RMSNorm, fused QKV projection, RoPE, K/V written to the
cache, attention over the cache, o-projection + residual, RMSNorm, fused gate/up projection,
SiLU * up, down-projection + residual), final RMSNorm and the LM head of each sequence's last token.
No sampling, and no tensor-parallel communication (no all-reduce after the o/down projections, no
all-gather of the logits): the peer times one rank's shard alone.

Written the way a good PyTorch decode step is written (gpt-fast style), not as a strawman:
- fused QKV and gate/up weights (RankWeights already stacks them), one cuBLAS GEMM each;
- K/V cache contiguous per sequence, [L, B, kv_heads, C, D] (heads first, so attention reads it in
  place), written with index_put_ at a position held in a device tensor (no host sync, graph-safe);
- decode attention through F.scaled_dot_product_attention (flash) with the GQA packing used by
  vLLM: the g = q_heads / kv_heads query heads of a KV head ride as g query rows of that head, so
  each KV head is loaded once for its whole group and no mask is needed;
- a prefill chunk (a new sequence, positions 0..P-1) attends causally with SDPA(is_causal,
  enable_gqa); its K/V are written to a cache of its own;
- RoPE cos/sin computed on the device from a positions tensor and device-resident inverse
  frequencies, so the whole step is capturable in one CUDA graph;
- per-layer argument tuples built once, so a step is a plain loop of 80 calls.
All sequences of the decode part sit at the same context length C (the benchmark's stated contexts):
the peer has no ragged-length path, which only flatters it.

Numerics follow mk.reference (HF order: RMSNorm in float32 cast back, RoPE in the model dtype,
softmax inside SDPA), so the logits match mk.reference.ReferenceModel to bf16 tolerance; launch/
bench.py checks that before it times anything (see check_against_reference).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from mk.batch import SeqChunk, StepBatch
from mk.config import ModelConfig, ParallelConfig
from mk.reference import rope_inv_freq
from mk.weights import RankWeights


# The layer: a pure function of tensors (+ constants bound by make_layer_fn), so that
# torch.compile sees one graph per shape and every layer reuses it. ---------------------------------
def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos, sin [T, D] (HF rotate_half layout)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def make_layer_fn(hq: int, hkv: int, head_dim: int, inter: int, eps: float, n_dec: int,
                  n_pre: int):
    """The layer of one step with n_dec decode tokens (one per sequence, at the position held in
    `slot`) followed by n_pre prefill tokens of one new sequence (positions 0..n_pre-1).

    layer(h, cos, sin, slot, attn_norm, mlp_norm, wqkv, wo, wgu, wd, kc, vc, kp, vp) -> h
      h [T, H]; cos, sin [T, D]; slot: long [1], the cache position of the decode tokens;
      kc, vc [n_dec, hkv, C, D] the decode sequences' cache of this layer (written at slot);
      kp, vp [1, hkv, n_pre, D] the prefill sequence's cache of this layer (or None).
    """
    D = head_dim
    g = hq // hkv
    q_end, k_end = hq * D, (hq + hkv) * D

    def layer(h, cos, sin, slot, attn_norm, mlp_norm, wqkv, wo, wgu, wd, kc, vc, kp, vp):
        T = h.shape[0]
        x = _rms_norm(h, attn_norm, eps)
        qkv = F.linear(x, wqkv)
        q = _rope(qkv[:, :q_end].view(T, hq, D), cos, sin)
        k = _rope(qkv[:, q_end:k_end].view(T, hkv, D), cos, sin)
        v = qkv[:, k_end:].view(T, hkv, D)
        parts = []
        if n_dec:
            # write the new K/V at `slot` of every decode sequence, then attend over [0, C)
            kc[:, :, slot] = k[:n_dec].unsqueeze(2)                    # index_put_, in place
            vc[:, :, slot] = v[:n_dec].unsqueeze(2)
            qd = q[:n_dec].reshape(n_dec, hkv, g, D)
            od = F.scaled_dot_product_attention(qd, kc, vc)            # [n_dec, hkv, g, D]
            parts.append(od.reshape(n_dec, hq * D))
        if n_pre:
            kpre = k[n_dec:].transpose(0, 1).unsqueeze(0)              # [1, hkv, P, D]
            vpre = v[n_dec:].transpose(0, 1).unsqueeze(0)
            kp.copy_(kpre)
            vp.copy_(vpre)
            qp = q[n_dec:].transpose(0, 1).unsqueeze(0)                # [1, hq, P, D]
            op = F.scaled_dot_product_attention(qp, kpre, vpre, is_causal=True,
                                                enable_gqa=hq != hkv)
            parts.append(op[0].transpose(0, 1).reshape(n_pre, hq * D))
        attn = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        h = h + F.linear(attn, wo)
        x = _rms_norm(h, mlp_norm, eps)
        gu = F.linear(x, wgu)
        h = h + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], wd)
        return h

    return layer


def random_kv_layers(g: torch.Generator, layers: int, seqs: int, kv_heads: int, context: int,
                     head_dim: int, dtype: torch.dtype):
    """The decode sequences' cached K and V, standard normal: (0 for K / 1 for V, layer,
    [seqs, kv_heads, context, head_dim]) one layer at a time, every K layer before the V ones,
    from generator g (on the device the tensors are made on). StepPeer's random cache, and the
    same values for the megakernel's paged cache (launch/bench.py), which cannot hold both at
    once at B=4096."""
    for which in (0, 1):
        for layer in range(layers):
            t = torch.empty(seqs, kv_heads, context, head_dim, dtype=dtype, device=g.device)
            yield which, layer, t.normal_(generator=g)


class StepPeer:
    """One rank's step in plain PyTorch with static shapes and device-resident inputs.

    decode sequences at context `context` (each step's token sits at position context-1, so the
    step reads `context` cached positions per sequence), plus optionally one prefill chunk of
    `prefill` tokens of a new sequence. Inputs live in static buffers (ids, positions, slot) so the
    step can be replayed from a CUDA graph; set_tokens() refills the ids between replays.
    """

    def __init__(self, weights: RankWeights, decode: int, context: int, prefill: int = 0,
                 kv_init: str = "random", seed: int = 0):
        if decode < 0 or prefill < 0 or decode + prefill == 0:
            raise ValueError(f"StepPeer needs decode tokens and/or a prefill chunk, got "
                             f"decode={decode} prefill={prefill}")
        if decode and context < 1:
            raise ValueError(f"decode context must be >= 1, got {context}")
        self.w = weights
        cfg, par = weights.config, weights.parallel
        self.cfg, self.par = cfg, par
        self.device = weights.qkv.device
        self.dtype = weights.dtype
        self.hq, self.hkv = par.heads_local(cfg), par.kv_heads_local(cfg)
        self.D = cfg.head_dim
        self.inter = weights.gate_up.shape[1] // 2
        self.vocab_local = weights.embed.shape[0]
        self.vocab_start = par.rank * self.vocab_local
        self.n_dec, self.n_pre, self.context = decode, prefill, context if decode else 0
        self.T = decode + prefill
        L, dev, dt = cfg.num_layers, self.device, self.dtype
        g = torch.Generator(device=dev).manual_seed(seed)
        shape_d = (L, decode, self.hkv, max(self.context, 1), self.D)
        self.kc = torch.empty(shape_d if decode else (L, 1, 1, 1, 1), dtype=dt, device=dev)
        self.vc = torch.empty_like(self.kc)
        self.kp = torch.empty((L, 1, self.hkv, prefill, self.D) if prefill else (L, 1, 1, 1, 1),
                              dtype=dt, device=dev)
        self.vp = torch.empty_like(self.kp)
        if kv_init == "random" and decode:
            for which, layer, kv in random_kv_layers(g, L, decode, self.hkv, self.context, self.D,
                                                    dt):
                (self.kc, self.vc)[which][layer].copy_(kv)
        elif kv_init == "zeros":
            for t in (self.kc, self.vc):
                t.zero_()
        pos = [self.context - 1] * decode + list(range(prefill))
        self.positions = torch.tensor(pos, dtype=torch.long, device=dev)
        self.slot = torch.tensor([max(self.context - 1, 0)], dtype=torch.long, device=dev)
        self.ids = torch.zeros(self.T, dtype=torch.long, device=dev)
        self.set_tokens(torch.randint(self.vocab_start, self.vocab_start + self.vocab_local,
                                      (self.T,), generator=g, device=dev))
        self.inv_freq = rope_inv_freq(self.D, cfg.rope).to(dev)
        # rows whose logits a step returns: every decode token, the last token of the prefill chunk
        rows = list(range(decode)) + ([decode + prefill - 1] if prefill else [])
        self.last_rows = torch.tensor(rows, dtype=torch.long, device=dev)
        self.all_rows_last = rows == list(range(self.T))
        self.layer_fn = make_layer_fn(self.hq, self.hkv, self.D, self.inter, cfg.rms_norm_eps,
                                      decode, prefill)
        self._fn = self.layer_fn
        w = weights
        self._largs = [
            (w.attn_norm[l], w.mlp_norm[l], w.qkv[l], w.o[l], w.gate_up[l], w.down[l],
             self.kc[l] if decode else None, self.vc[l] if decode else None,
             self.kp[l] if prefill else None, self.vp[l] if prefill else None)
            for l in range(L)]

    # inputs ---------------------------------------------------------------------------------------
    def set_tokens(self, ids: torch.Tensor) -> None:
        """Copy new token ids (global vocabulary ids of this rank's shard) into the static buffer."""
        self.ids.copy_(ids, non_blocking=True)

    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kc, self.vc, self.kp, self.vp))

    # the step ------------------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.par.tp_size == 1:
            return F.embedding(ids, self.w.embed)
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_local)
        x = F.embedding(local.clamp(0, self.vocab_local - 1), self.w.embed)
        return x * mine[:, None].to(x.dtype)

    def step(self) -> torch.Tensor:
        """One step; returns logits [rows, vocab_local] (model dtype) of each sequence's last token."""
        with torch.inference_mode():
            freqs = self.positions[:, None].float() * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
            h = self._embed(self.ids)
            fn, slot = self._fn, self.slot
            for a in self._largs:
                h = fn(h, cos, sin, slot, *a)
            last = h if self.all_rows_last else h.index_select(0, self.last_rows)
            x = _rms_norm(last, self.w.final_norm, self.cfg.rms_norm_eps)
            return F.linear(x, self.w.lm_head)

    __call__ = step

    def compile_layers(self, mode: str | None = "default") -> None:
        """Replace the layer function by torch.compile(layer, dynamic=False, mode=mode)."""
        _raise_recompile_limits()
        kw = {} if mode in (None, "default") else {"mode": mode}
        self._fn = torch.compile(self.layer_fn, dynamic=False, fullgraph=True, **kw)

    def eager_layers(self) -> None:
        self._fn = self.layer_fn


def _raise_recompile_limits(n: int = 256) -> None:
    """Every (batch, context) shape is a new static specialisation of the same code object."""
    import torch._dynamo.config as dc
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        try:
            if getattr(dc, name) < n:
                setattr(dc, name, n)
        except AttributeError:
            pass


# Synthetic weights ---------------------------------------------------------------------------------
def random_rank_weights(config: ModelConfig, parallel: ParallelConfig, device,
                        dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> RankWeights:
    """Random weights of rank `parallel.rank`'s shard, generated directly on `device`.

    Scaled like mk.tiny (linear std 1/sqrt(fan_in), embeddings std 1, norms ~1) so activations stay
    near unit scale through many layers and the logits are finite. Generated layer by layer into
    preallocated stacks (no full-size float32 temporaries), nothing written to disk.
    """
    parallel.validate_for(config)
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed * 1000003 + parallel.rank)
    L, H, D = config.num_layers, config.hidden_size, config.head_dim
    hq, hkv = parallel.heads_local(config), parallel.kv_heads_local(config)
    Il, Vl = parallel.intermediate_local(config), parallel.vocab_local(config)

    def normal_(t: torch.Tensor, std: float) -> torch.Tensor:
        return t.normal_(0.0, std, generator=g)

    def stack(n_out, n_in, fan_in):
        t = torch.empty((L, n_out, n_in), dtype=dtype, device=dev)
        for l in range(L):
            normal_(t[l], 1.0 / math.sqrt(fan_in))
        return t

    def norms(*shape):
        return normal_(torch.empty(shape, dtype=dtype, device=dev), 0.1).add_(1.0)

    return RankWeights(
        config=config, parallel=parallel,
        embed=normal_(torch.empty((Vl, H), dtype=dtype, device=dev), 1.0),
        lm_head=normal_(torch.empty((Vl, H), dtype=dtype, device=dev), 2.0 / math.sqrt(H)),
        attn_norm=norms(L, H), mlp_norm=norms(L, H), final_norm=norms(H),
        qkv=stack((hq + 2 * hkv) * D, H, H),
        o=stack(H, hq * D, config.num_heads * D),
        gate_up=stack(2 * Il, H, H),
        down=stack(H, Il, config.intermediate_size),
    )


def slice_layers(weights: RankWeights, n: int) -> RankWeights:
    """The first n layers of `weights` (copies, so the rest can be freed)."""
    if not 1 <= n <= weights.config.num_layers:
        raise ValueError(f"--layers {n}: the model has {weights.config.num_layers} layers")
    if n == weights.config.num_layers:
        return weights
    cut = {k: getattr(weights, k)[:n].clone() for k in
           ("attn_norm", "mlp_norm", "qkv", "o", "gate_up", "down")}
    return replace(weights, config=replace(weights.config, num_layers=n), **cut)


def shard_as_tp1(weights: RankWeights) -> RankWeights:
    """One rank's shard seen as a TP-1 model of the shard's shapes (its q / KV heads,
    intermediate and vocab slices): the rank's work without the tensor-parallel communication,
    for benchmarking one rank on one GPU (the same tensors, no copy)."""
    if weights.parallel.tp_size == 1:
        return weights
    return replace(weights, config=shard_config(weights.config, weights.parallel),
                   parallel=ParallelConfig())


def shard_config(cfg: ModelConfig, par: ParallelConfig) -> ModelConfig:
    """The ModelConfig of one rank's shard as a TP-1 model (shard_as_tp1's config)."""
    return replace(cfg, num_heads=par.heads_local(cfg), num_kv_heads=par.kv_heads_local(cfg),
                   intermediate_size=par.intermediate_local(cfg),
                   vocab_size=par.vocab_local(cfg), tie_word_embeddings=False)


# The correctness guard ------------------------------------------------------------------------------
def check_config(config: ModelConfig, parallel: ParallelConfig, layers: int = 2) -> ModelConfig:
    """A small TP-1 model whose per-rank attention structure (q heads, KV heads, head_dim, RoPE,
    eps) equals this rank's shard of `config`, so mk.reference runs it without a process group."""
    hq, hkv = parallel.heads_local(config), parallel.kv_heads_local(config)
    H = min(config.hidden_size, 512)
    return replace(config, hidden_size=H, intermediate_size=min(parallel.intermediate_local(config),
                                                                 2 * H),
                   num_layers=layers, num_heads=hq, num_kv_heads=hkv,
                   vocab_size=min(parallel.vocab_local(config), 1024), tie_word_embeddings=False)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_against_reference(weights: RankWeights, decode: int = 3, context: int = 37,
                            prefill: int = 19, tol: float = 2e-2, seed: int = 0) -> dict:
    """StepPeer vs mk.reference.ReferenceModel on `weights` (TP 1, a small model): the same prompts
    prefilled by the reference, its paged K/V copied into the peer's cache, then (a) a decode step
    of `decode` sequences at context `context` and (b) a mixed step (those sequences decoding one
    more token + a new prefill chunk of `prefill` tokens). Logits compared in float: relative
    Frobenius error < tol (bf16 tolerance) and the greedy token equal where the reference's top-2
    margin is clear. Returns a dict of figures with "ok"."""
    from mk.reference import PagedKVCache, ReferenceModel
    if weights.parallel.tp_size != 1:
        raise ValueError("check_against_reference needs TP-1 weights (see check_config)")
    cfg, dev = weights.config, weights.qkv.device
    page = 16
    pages_per = -(-(context + 2) // page)
    cache = PagedKVCache.for_weights(weights, (decode + 1) * pages_per + 1, page)
    ref = ReferenceModel(weights, cache)
    g = torch.Generator().manual_seed(seed)
    V = cfg.vocab_size
    tables = [list(range(i * pages_per, (i + 1) * pages_per)) for i in range(decode + 1)]
    prompts = [torch.randint(0, V, (context - 1,), generator=g).tolist() for _ in range(decode)]
    ref.forward(StepBatch([SeqChunk(p, 0, tables[i]) for i, p in enumerate(prompts)]))

    def load_cache(peer: StepPeer, upto: int) -> None:
        for b in range(decode):
            slots = cache.slots(tables[b], 0, upto)
            for l in range(cfg.num_layers):
                k, v = cache.gather(l, slots)                      # [upto, hkv, D]
                peer.kc[l, b, :, :upto] = k.transpose(0, 1)
                peer.vc[l, b, :, :upto] = v.transpose(0, 1)

    out = {"decode": decode, "context": context, "prefill": prefill, "tol": tol}
    # (a) decode at `context`
    new = torch.randint(0, V, (decode,), generator=g)
    peer = StepPeer(weights, decode=decode, context=context, kv_init="zeros")
    load_cache(peer, context - 1)
    peer.set_tokens(new.to(dev))
    got = peer.step().float()
    want = ref.forward(StepBatch([SeqChunk([int(new[b])], context - 1, tables[b])
                                  for b in range(decode)]))
    out["decode_rel_err"] = _rel_err(got, want)
    out["decode_max_abs"] = float((got - want).abs().max())
    # (b) mixed: the decode sequences at context+1 plus a new prefill chunk
    new2 = torch.randint(0, V, (decode,), generator=g)
    pre = torch.randint(0, V, (prefill,), generator=g)
    peer2 = StepPeer(weights, decode=decode, context=context + 1, prefill=prefill, kv_init="zeros")
    load_cache(peer2, context)
    peer2.set_tokens(torch.cat([new2, pre]).to(dev))
    got2 = peer2.step().float()
    want2 = ref.forward(StepBatch([SeqChunk([int(new2[b])], context, tables[b])
                                   for b in range(decode)]
                                  + [SeqChunk(pre.tolist(), 0, tables[decode])]))
    out["mixed_rel_err"] = _rel_err(got2, want2)
    out["mixed_max_abs"] = float((got2 - want2).abs().max())
    # greedy agreement where the reference is not a near tie
    agree, total = 0, 0
    for a, b in ((got, want), (got2, want2)):
        top2 = b.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.1 * b.std()
        agree += int((a.argmax(-1) == b.argmax(-1))[clear].sum())
        total += int(clear.sum())
    out["greedy_agree"] = f"{agree}/{total}"
    out["ok"] = (out["decode_rel_err"] < tol and out["mixed_rel_err"] < tol and agree == total
                 and bool(torch.isfinite(got).all() and torch.isfinite(got2).all()))
    return out
