"""The instruction stream: opcodes, the 32-word int32 instruction format, counters.

The planner emits one int32 tensor [N, 32]; the CPU interpreter (mk.vm) and the megakernel execute
the same bytes. The header words below are fixed: the megakernel's controller reads them without
knowing the opcode. Opcode-specific arguments live in words ARG0..ARG_LAST and are named by each
instruction family in mk/instructions/.

Counters are int32 slots in one array per rank. An instruction waits until counter[c] >= target for
each of its (c, target) pairs, runs, then adds 1 to its signal counter (on its own rank, on one
named peer rank, or on every rank, see SignalScope) after its stores are visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch

INSTR_WORDS = 32
MAX_WAITS = 4
NO_COUNTER = -1

# Header words -------------------------------------------------------------------------------------
W_OPCODE = 0
W_LAYER = 1
W_ROW0 = 2          # first token row of the step's flattened token dimension
W_ROWS = 3          # number of token rows
W_COL0 = 4          # first output column (or head, for attention) of the tile
W_COLS = 5          # number of output columns (or heads)
W_WAIT0 = 6         # MAX_WAITS pairs (counter, target): words 6..13
W_SIGNAL = 14       # counter to signal, NO_COUNTER for none
W_SIGNAL_SCOPE = 15 # SignalScope
W_SIGNAL_RANK = 16  # the peer rank for SignalScope.PEER
W_SIGNAL_COUNT = 17 # how much to add (normally 1)
ARG0 = 18           # opcode-specific arguments: words 18..31
ARG_LAST = INSTR_WORDS - 1
NUM_ARGS = INSTR_WORDS - ARG0


class SignalScope(IntEnum):
    LOCAL = 0   # this rank's counter
    PEER = 1    # rank W_SIGNAL_RANK's counter (through symmetric memory on the GPU)
    ALL = 2     # every rank's counter, this one included


@dataclass
class Instruction:
    """One decoded instruction. `args` has NUM_ARGS words, meaning given by the opcode's family."""

    opcode: int
    layer: int = 0
    row0: int = 0
    rows: int = 0
    col0: int = 0
    cols: int = 0
    waits: list[tuple[int, int]] = field(default_factory=list)
    signal: int = NO_COUNTER
    signal_scope: int = SignalScope.LOCAL
    signal_rank: int = 0
    signal_count: int = 1
    args: list[int] = field(default_factory=lambda: [0] * NUM_ARGS)

    def encode(self) -> list[int]:
        if len(self.waits) > MAX_WAITS:
            raise ValueError(f"instruction has {len(self.waits)} waits, the format holds {MAX_WAITS}")
        if len(self.args) > NUM_ARGS:
            raise ValueError(f"instruction has {len(self.args)} args, the format holds {NUM_ARGS}")
        w = [0] * INSTR_WORDS
        w[W_OPCODE] = int(self.opcode)
        w[W_LAYER] = self.layer
        w[W_ROW0], w[W_ROWS], w[W_COL0], w[W_COLS] = self.row0, self.rows, self.col0, self.cols
        for i in range(MAX_WAITS):
            c, t = self.waits[i] if i < len(self.waits) else (NO_COUNTER, 0)
            w[W_WAIT0 + 2 * i], w[W_WAIT0 + 2 * i + 1] = c, t
        w[W_SIGNAL], w[W_SIGNAL_SCOPE] = self.signal, int(self.signal_scope)
        w[W_SIGNAL_RANK], w[W_SIGNAL_COUNT] = self.signal_rank, self.signal_count
        w[ARG0:ARG0 + len(self.args)] = [int(a) for a in self.args]
        return w

    @classmethod
    def decode(cls, words) -> "Instruction":
        w = [int(x) for x in words]
        waits = [(w[W_WAIT0 + 2 * i], w[W_WAIT0 + 2 * i + 1]) for i in range(MAX_WAITS)
                 if w[W_WAIT0 + 2 * i] != NO_COUNTER]
        return cls(opcode=w[W_OPCODE], layer=w[W_LAYER], row0=w[W_ROW0], rows=w[W_ROWS],
                   col0=w[W_COL0], cols=w[W_COLS], waits=waits, signal=w[W_SIGNAL],
                   signal_scope=w[W_SIGNAL_SCOPE], signal_rank=w[W_SIGNAL_RANK],
                   signal_count=w[W_SIGNAL_COUNT], args=w[ARG0:])


def serialize(instrs: list[Instruction]) -> torch.Tensor:
    """Instructions -> one contiguous int32 tensor [N, INSTR_WORDS]."""
    return torch.tensor([i.encode() for i in instrs], dtype=torch.int32).reshape(-1, INSTR_WORDS)


def deserialize(stream: torch.Tensor) -> list[Instruction]:
    if stream.dtype != torch.int32 or stream.dim() != 2 or stream.shape[1] != INSTR_WORDS:
        raise ValueError(f"an instruction stream is int32 [N, {INSTR_WORDS}], got "
                         f"{stream.dtype} {list(stream.shape)}")
    return [Instruction.decode(row) for row in stream.tolist()]


class Op(IntEnum):
    """The opcode table. Each opcode's three faces live in one file of mk/instructions/."""

    NOOP = 0            # does nothing but wait and signal (dispatch-overhead tests)
    COPY = 1            # dst rows <- src rows
    RMSNORM = 2         # dst rows <- rmsnorm(src rows) * weight[layer]
    RESIDUAL_ADD = 3    # dst rows <- dst rows + src rows
    # The model's instructions (QKV + RoPE, attention, O-proj, gate/up, down, LM head and the TP
    # communication steps) are added by the instruction-stream work, numbered from 8 up.
