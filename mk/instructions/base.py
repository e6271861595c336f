"""What every instruction family provides, and the registry that maps opcodes to families.

A family file in mk/instructions/ holds three faces of its opcodes side by side:

1. `accesses(instr, ctx)`: the buffer regions the instruction reads and writes, for the planner and
   the static verifier (mk.verify). Regions are rectangles of named 2D buffers, on a rank.
2. `run_torch(instr, state)`: its exact semantics in torch, for the CPU interpreter (mk.vm).
3. its CuTe DSL device body, for the megakernel (mk.megakernel), imported only on the GPU path:
   keep `import cutlass` inside the body module or function so that `import mk` needs no GPU.

Families register with `@register`; `family_of(opcode)` finds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

from mk.ir import Instruction, Op

if TYPE_CHECKING:
    from mk.weights import RankWeights


class Buf(IntEnum):
    """Named activation buffers of one rank, each 2D [rows, width] (rows = token rows unless said).

    The instruction-stream work adds the buffers of the model's instructions here.
    """

    HIDDEN = 0      # residual stream [T, H]
    NORMED = 1      # rmsnorm output [T, H]
    SCRATCH = 2     # tests: a second [T, H] buffer
    # The model's buffers (shapes: mk.plan.buffer_shapes; T = KernelConfig.max_batch_tokens,
    # hq/hkv = local q/KV heads, D = head_dim, I = intermediate_size, V = vocab_size, n = TP size)
    Q = 3               # post-RoPE queries [T, hq*D]
    ATTN_OUT = 4        # attention output [T, hq*D]
    MLP_ACT = 5         # silu(gate) * up [T, I/n]
    RECV = 6            # TP partial sums [n*T, H]: rows p*T + t hold source rank p's partial of row t
    ATTN_PARTIAL = 7    # split-KV partial outputs, float32 [P, hq*D]; rows are slots (mk.plan)
    ATTN_LSE = 8        # split-KV log-sum-exp, float32 [P, hq]
    LAST_NORMED = 9     # final-norm rows of each sequence's last token [max_seqs, H]
    LOGITS = 10         # float32 [max_seqs, V/n] (this rank's vocab shard)
    K_CACHE = 11        # [L*num_pages*page_size, hkv*D]: row (layer*num_pages + page)*page_size + slot
    V_CACHE = 12        # same layout as K_CACHE
    SPLITK = 13         # split-K partials, float32 [max_split * split rows, splitk width] (mk.plan):
                        # rows j * stride + t hold split j's partial of token row t
    ROW_SCALE = 14      # float32 [T, 1]: rsqrt(mean(h^2) + eps) of each token row, written by a
                        # row-scale RMSNORM (dst ROW_SCALE) and read by the SPLITK_REDUCE that
                        # scales the folded GEMM's rows, or by the unsplit tile's epilogue
                        # (PlanConfig.norm_fold). On the GPU it is
                        # not a tensor of its own: the last T floats of the SPLITK allocation
                        # (mk.plan.buffer_shapes pads SPLITK for it), so no kernel parameter more
    ROW_PART = 15       # float32 [T, 2 * ceil(H / 64)]: per token row, the sums of squares of
                        # its h values over each 64 columns, two sets (the attention norm's h, the
                        # MLP norm's), written by the tiles that write h and read by the unsplit
                        # QKV_ROPE / GATE_UP tiles that scale their rows by them
                        # (PlanConfig.norm_fold=4, mk/instructions/_common.py A_ROW_PART). On
                        # the GPU also in the SPLITK allocation, before ROW_SCALE


class NormWeight(IntEnum):
    """Which stacked norm weight an RMSNORM instruction applies (its ARG0+2)."""

    ATTN = 0    # weights.attn_norm[layer]
    MLP = 1     # weights.mlp_norm[layer]
    FINAL = 2   # weights.final_norm


@dataclass(frozen=True)
class Region:
    """Rows [row0, row1) x columns [col0, col1) of buffer `buf` on rank `rank`."""

    buf: int
    row0: int
    row1: int
    col0: int
    col1: int
    rank: int = 0

    def overlaps(self, other: "Region") -> bool:
        return (self.buf == other.buf and self.rank == other.rank
                and self.row0 < other.row1 and other.row0 < self.row1
                and self.col0 < other.col1 and other.col0 < self.col1)


@dataclass(frozen=True)
class Accesses:
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    # the reads (a subset of `reads`) made only after the instruction's epilogue wait
    # (mk.instructions._common.epilogue_wait): its other reads are ordered by its waits alone,
    # these and its writes by those and the epilogue wait (mk.verify)
    late: tuple[Region, ...] = ()


class ExecState(Protocol):
    """What run_torch sees: one rank's buffers and weights (mk.vm provides it)."""

    rank: int
    weights: "RankWeights"  # this rank's weights (mk.weights)

    def buf(self, buf_id: int, rank: int | None = None):  # -> torch.Tensor [rows, width]
        ...


class InstructionFamily:
    opcodes: tuple[Op, ...] = ()

    def accesses(self, instr: Instruction, rank: int) -> Accesses:
        raise NotImplementedError

    def run_torch(self, instr: Instruction, state: ExecState) -> None:
        raise NotImplementedError


_REGISTRY: dict[int, InstructionFamily] = {}


def register(cls):
    family = cls()
    for op in cls.opcodes:
        if int(op) in _REGISTRY:
            raise RuntimeError(f"opcode {op!r} registered twice")
        _REGISTRY[int(op)] = family
    return cls


def family_of(opcode: int) -> InstructionFamily:
    _load_all()
    try:
        return _REGISTRY[int(opcode)]
    except KeyError:
        raise ValueError(f"unknown opcode {opcode}") from None


def _load_all():
    # Importing the family modules registers them; the list grows with the opcode table.
    import importlib
    import pkgutil

    import mk.instructions as pkg
    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name != "base" and not m.name.startswith("_"):
            importlib.import_module(f"mk.instructions.{m.name}")
