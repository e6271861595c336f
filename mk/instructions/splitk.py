"""SPLITK_REDUCE: finish one split-K GEMM output tile.

A GEMM-like tile (QKV_ROPE, O_PROJ, GATE_UP, DOWN; mk/instructions/matmul.py, qkv.py) may be cut
along K into nsplit split tiles (words A_NSPLIT / A_SPLIT_J / A_K0 / A_SPLIT_ROW of
mk/instructions/_common.py), each storing the float32 partial of its K slice to SPLITK rows
j * stride + row. One SPLITK_REDUCE per output tile, with the tile's header (layer, rows, columns)
and the signal the unsplit tile would have sent, then computes

    acc = sum_j SPLITK[j * stride + rows, columns]    float32, j = 0 .. nsplit-1 in order
    y   = acc.to(model dtype)                         the unsplit tile's F.linear output rounding
    the unsplit opcode's epilogue on y                (the family's `epilogue`, the same function
                                                       its unsplit tiles run)

Arguments:
    ARG0 + 0  the GEMM opcode it finishes (QKV_ROPE, O_PROJ, GATE_UP, DOWN)
    ARG0 + 1  nsplit
    ARG0 + 2  SPLITK row stride between splits
    ARG0 + 3 + i  the unsplit instruction's word ARG0 + i, i = 0 .. 6 (src, dst, epilogue or
              section, ...: decoded by the opcode's own family)
    ARG0 + 10 row scale: 1 (QKV_ROPE, GATE_UP under PlanConfig.norm_fold) = the split tiles ran
              on the raw residual rows h with the norm weight folded into the GEMM weight, so
              acc *= ROW_SCALE[row] (rsqrt(mean(h^2) + eps), float32) before y's rounding:
                  y = bf16(acc * r)      the RMSNORM folded into this GEMM
              2 (norm_fold=4) = the same with r = rsqrt(sum(ROW_PART[row, b:b + K / 64]) / K +
              eps) from the sums h's writers left (mk/instructions/_common.py A_ROW_PART), b =
              word ARG0 + 11, K the unsplit tile's K word: no row-scale norm before the GEMM
              0 = no scale
    ARG0 + 11 row scale 2: the ROW_PART set's first column b
SPLITK columns: the family's `splitk_cols` (GATE_UP: gate at [col0, col0+cols), up at
intermediate_local + the same).

The CuTe DSL body lives in mk/instructions/_splitk_kernel.py (GPU path only).
"""

from __future__ import annotations

import torch

from mk.instructions import _common as mc
from mk.instructions._common import arg, rows_of
from mk.instructions.base import Accesses, Buf, InstructionFamily, Region, family_of, register
from mk.ir import ARG0, NUM_ARGS, Instruction, Op

A_OP = ARG0
A_NSPLIT = ARG0 + 1
A_STRIDE = ARG0 + 2
A_WORDS = ARG0 + 3
UNSPLIT_WORDS = 7           # words ARG0 .. ARG0+6 of the unsplit instruction
A_ROW_SCALE = A_WORDS + UNSPLIT_WORDS   # 1: acc *= ROW_SCALE[row] before the rounding (norm fold)
A_ROW_PART_COL = A_ROW_SCALE + 1        # row scale FROM_ROW_PART: the set's first column
FROM_ROW_SCALE, FROM_ROW_PART = 1, 2    # the row scale word's values
ROW_SCALED = mc.ROW_SCALED             # the ops whose reduce may scale its rows
SPLITTABLE = (Op.QKV_ROPE, Op.O_PROJ, Op.GATE_UP, Op.DOWN)


def unsplit_instruction(instr: Instruction) -> Instruction:
    """The unsplit tile a reduce finishes (header + its own argument words; no waits)."""
    op = arg(instr, A_OP)
    if op not in [int(o) for o in SPLITTABLE]:
        raise ValueError(f"SPLITK_REDUCE finishes one of {[o.name for o in SPLITTABLE]}, got "
                         f"opcode {op}")
    if arg(instr, A_NSPLIT) < 1:
        raise ValueError(f"SPLITK_REDUCE needs nsplit >= 1, got {arg(instr, A_NSPLIT)}")
    k = A_WORDS - ARG0
    args = list(instr.args[k:k + UNSPLIT_WORDS]) + [0] * (NUM_ARGS - UNSPLIT_WORDS)
    return Instruction(opcode=op, layer=instr.layer, row0=instr.row0, rows=instr.rows,
                       col0=instr.col0, cols=instr.cols, signal=instr.signal,
                       signal_scope=instr.signal_scope, signal_rank=instr.signal_rank,
                       signal_count=instr.signal_count, args=args)


def sum_partials(sk: torch.Tensor, nsplit: int, stride: int, r0: int, r1: int,
                 cols: list[tuple[int, int]]) -> torch.Tensor:
    """sum_j SPLITK[j * stride + [r0, r1), cols] in float32, j in order (p0 + p1 + ...): the sum
    every reduce of the split partials does (SPLITK_REDUCE, the folded RMSNORM)."""
    acc = None
    for j in range(nsplit):
        part = torch.cat([sk[j * stride + r0:j * stride + r1, a:b] for a, b in cols], dim=1)
        acc = part.clone() if acc is None else acc.add_(part)   # in order j = 0, 1, ...
    return acc


def row_part_scale(state, r0: int, r1: int, b: int, K: int) -> torch.Tensor:
    """[rows, 1] float32 rsqrt(sum / K + eps) of rows r0 .. r1 - 1 from the ROW_PART set at
    column b (K / 64 columns; K the hidden width): norm_fold=4's statistic, from the sums of
    squares h's writers left (an unsplit tile's, and a split one's SPLITK_REDUCE)."""
    ss = state.buf(Buf.ROW_PART)[r0:r1, b:b + mc.row_part_groups(K)].sum(-1, True)
    return torch.rsqrt(ss / K + state.weights.config.rms_norm_eps)


def reduce_words(op: int, nsplit: int, stride: int, unsplit_args: dict,
                 row_scale: int = 0, row_part: int | None = None) -> dict:
    """The reduce's argument words ({word: value}) for the unsplit tile's {word: value} args;
    row_scale: 1 = scale the rows by ROW_SCALE, row_part: the first ROW_PART column of the set
    to scale them from instead (norm_fold=4); only QKV_ROPE / GATE_UP (ROW_SCALED)."""
    if (row_scale or row_part is not None) and int(op) not in [int(o) for o in ROW_SCALED]:
        raise ValueError(f"SPLITK_REDUCE scales rows only for {[o.name for o in ROW_SCALED]}, "
                         f"not opcode {int(op)}")
    out = {A_OP: int(op), A_NSPLIT: nsplit, A_STRIDE: stride,
           A_ROW_SCALE: FROM_ROW_PART if row_part is not None else int(bool(row_scale))}
    if row_part is not None:
        out[A_ROW_PART_COL] = int(row_part)
    for word, v in unsplit_args.items():
        i = word - ARG0
        if 0 <= i < UNSPLIT_WORDS:
            out[A_WORDS + i] = v
    return out


@register
class SplitkReduceFamily(InstructionFamily):
    opcodes = (Op.SPLITK_REDUCE,)
    ARG_NAMES = {int(Op.SPLITK_REDUCE): ("op", "nsplit", "stride") +
                 tuple(f"w{i}" for i in range(UNSPLIT_WORDS)) + ("row_scale", "row_part_col")}

    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        u = unsplit_instruction(instr)
        fam = family_of(u.opcode)
        stride = arg(instr, A_STRIDE)
        parts = tuple(reg for j in range(arg(instr, A_NSPLIT))
                      for reg in fam.splitk_regions(u, rank, j, stride))
        reads, writes = fam.epilogue_regions(u, rank, meta)
        r0, r1 = rows_of(u)
        if arg(instr, A_ROW_SCALE) == FROM_ROW_PART:
            b = arg(instr, A_ROW_PART_COL)
            parts += (Region(Buf.ROW_PART, r0, r1, b, b + mc.row_part_groups(arg(u, fam.K_WORD)),
                             rank),)
        elif arg(instr, A_ROW_SCALE):
            parts += (Region(Buf.ROW_SCALE, r0, r1, 0, 1, rank),)
        return Accesses(parts + tuple(reads), tuple(writes))

    def run_torch(self, instr: Instruction, state) -> None:
        u = unsplit_instruction(instr)
        fam = family_of(u.opcode)
        r0, r1 = rows_of(u)
        acc = sum_partials(state.buf(Buf.SPLITK), arg(instr, A_NSPLIT), arg(instr, A_STRIDE),
                           r0, r1, fam.splitk_cols(u))
        if arg(instr, A_ROW_SCALE) == FROM_ROW_PART:
            # the unsplit tile's norm_fold=4 scale (matmul.py's), from the writers' sums
            acc.mul_(row_part_scale(state, r0, r1, arg(instr, A_ROW_PART_COL),
                                    arg(u, fam.K_WORD)))
        elif arg(instr, A_ROW_SCALE):
            acc.mul_(state.buf(Buf.ROW_SCALE)[r0:r1, 0:1])
        fam.epilogue(u, state, acc.to(state.weights.dtype))

