"""Next-token sampling from float32 logits: greedy, temperature, top-k, top-p.

Each sequence draws from its own torch.Generator seeded from (seed, sequence index), so a
sequence's tokens do not depend on which other sequences share its steps. Under tensor parallelism
every rank holds the same full logits and the same generators, so every rank draws the same token;
`broadcast_tokens` makes that a guarantee (rank 0's choice wins). Generators live on the logits'
device, so a seed reproduces its tokens on the same kind of device (CPU and CUDA streams differ).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0     # 0: greedy (argmax)
    top_k: int = 0               # 0: no top-k filter
    top_p: float = 1.0           # 1: no nucleus filter
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(seed: int, seq_index: int, device="cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    # a simple mix so that neighbouring sequences get unrelated streams
    g.manual_seed((int(seed) * 1_000_003 + int(seq_index) * 7919 + 12345) % (2 ** 63))
    return g


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / top-p set to -inf. logits [B, V] float32."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p (the first is always kept)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams,
           generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """Tokens [B] (long) from logits [B, V]; generators: one per row (needed unless greedy)."""
    return sample_rows(logits, list(range(logits.shape[0])), params, generators)


def sample_rows(logits: torch.Tensor, rows: list[int], params: SamplingParams,
                generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """Tokens [S] (long) for logits [S, V] where only `rows` are wanted (their generators, in
    order, unless greedy); the other rows hold argmax (greedy) or 0 and draw nothing from any
    generator. Indexes rows by Python ints only: no host-to-device index copy, which would wait
    for the work queued on the device (the engine samples step n while it runs)."""
    logits = logits.float()
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    if generators is None or len(generators) != len(rows):
        raise ValueError("sampling with temperature needs one generator per sampled row")
    # one softmax over every row (row-wise: the sampled rows' values do not depend on the rest)
    probs = torch.softmax(filter_logits(logits / params.temperature, params.top_k, params.top_p), -1)
    out = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    for j, g in zip(rows, generators):
        out[j] = torch.multinomial(probs[j], 1, generator=g)[0]
    return out


def broadcast_tokens(tokens: torch.Tensor, group=None, device=None) -> torch.Tensor:
    """Make every rank hold rank 0's tokens (a no-op without an initialized process group)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return tokens
    t = tokens.to(device if device is not None else tokens.device).contiguous()
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(t, src=src, group=group)
    return t.to(tokens.device)
