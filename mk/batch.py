"""One forward step's batch: decode tokens and prefill chunks of several sequences.

Shared by every backend (reference, vm, megakernel) and the planner. Token rows of a step are the
sequences' new tokens laid end to end in `seqs` order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SeqChunk:
    """The new tokens of one sequence in this step.

    tokens:    token ids fed this step (1 for a decode step, a prompt chunk for prefill)
    start_pos: position of tokens[0], i.e. how many tokens of the sequence the KV cache holds already
    pages:     the sequence's KV page table: page ids covering positions [0, start_pos + len(tokens))
    """

    tokens: list[int]
    start_pos: int
    pages: list[int]

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.tokens)


@dataclass
class StepBatch:
    seqs: list[SeqChunk] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.seqs)

    def validate(self, page_size: int, num_pages: int, max_tokens: int | None = None,
                 max_context: int | None = None) -> None:
        """Refuse a batch that the KV cache or the compiled shapes cannot hold."""
        if not self.seqs:
            raise ValueError("empty batch")
        if max_tokens is not None and self.num_tokens > max_tokens:
            raise ValueError(f"batch has {self.num_tokens} tokens, over the maximum {max_tokens}")
        for i, s in enumerate(self.seqs):
            if not s.tokens:
                raise ValueError(f"sequence {i} has no new tokens")
            if s.start_pos < 0:
                raise ValueError(f"sequence {i} has negative start_pos {s.start_pos}")
            if max_context is not None and s.end_pos > max_context:
                raise ValueError(f"sequence {i} reaches context {s.end_pos}, over the maximum "
                                 f"{max_context}")
            need = -(-s.end_pos // page_size)
            if len(s.pages) < need:
                raise ValueError(f"sequence {i} needs {need} KV pages for {s.end_pos} tokens, its "
                                 f"page table has {len(s.pages)}")
            bad = [p for p in s.pages[:need] if not 0 <= p < num_pages]
            if bad:
                raise ValueError(f"sequence {i} has KV page ids {bad} outside [0, {num_pages})")

    # Flattened per-token views -------------------------------------------------------------------
    def token_ids(self) -> torch.Tensor:
        return torch.tensor([t for s in self.seqs for t in s.tokens], dtype=torch.long)

    def positions(self) -> torch.Tensor:
        return torch.tensor([s.start_pos + i for s in self.seqs for i in range(len(s.tokens))],
                            dtype=torch.long)

    def seq_of_token(self) -> torch.Tensor:
        return torch.tensor([j for j, s in enumerate(self.seqs) for _ in s.tokens], dtype=torch.long)

    def last_token_rows(self) -> torch.Tensor:
        """Row of each sequence's last new token: the rows whose logits are sampled."""
        rows, r = [], 0
        for s in self.seqs:
            r += len(s.tokens)
            rows.append(r - 1)
        return torch.tensor(rows, dtype=torch.long)
