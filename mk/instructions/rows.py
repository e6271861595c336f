"""Row-wise instructions on [token rows x columns] tiles: NOOP, COPY, RESIDUAL_ADD, RMSNORM.

Arguments (words after ARG0):
    ARG0 + 0  source buffer (Buf)       COPY, RESIDUAL_ADD, RMSNORM
    ARG0 + 1  destination buffer (Buf)  COPY, RESIDUAL_ADD, RMSNORM
    ARG0 + 2  norm weight (NormWeight)  RMSNORM
    ARG0 + 3  nsplit                    RMSNORM folded with a split GEMM's reduce (0: plain)
    ARG0 + 4  SPLITK row stride         RMSNORM folded (the split tiles' A_SPLIT_ROW)
Rows [row0, row0 + rows). COPY and RESIDUAL_ADD act on columns [col0, col0 + cols); RMSNORM always
normalises whole rows (its statistic needs every column), so its col0/cols must span the width.
A row-scale RMSNORM (destination Buf.ROW_SCALE; PlanConfig.norm_fold) writes only each row's
    ROW_SCALE[row, 0] = rsqrt(mean(src[row]^2) + eps)    float32
for the SPLITK_REDUCE of the GEMM its norm is folded into (mk/instructions/splitk.py, row scale);
its norm weight word is not read (the weight is folded into that GEMM's weight, mk.weights).
A folded RMSNORM (nsplit > 0) first finishes the split O_PROJ or DOWN tiles of its rows (the MLP
norm O_PROJ's, the next attention norm DOWN's: mk/plan.py fold_*_reduce), exactly as their
SPLITK_REDUCE would (mk/instructions/splitk.py; the residual epilogue into the source buffer):
    h = bf16(src + bf16(sum_j SPLITK[j * stride + rows, 0:H]))   float32 sum, j in order
    src rows = h, then dst rows = rmsnorm(h)
so the step is bitwise that of the unfolded plan, one instruction (and one hop) shorter.

The CuTe DSL bodies live in mk/instructions/rows_kernel.py (GPU path only).
"""

from __future__ import annotations

import torch

from mk.instructions.base import Accesses, Buf, InstructionFamily, NormWeight, Region, register
from mk.instructions.splitk import sum_partials
from mk.ir import ARG0, NUM_ARGS, Instruction, Op

A_SRC = ARG0
A_DST = ARG0 + 1
A_NORM_WEIGHT = ARG0 + 2
A_RED_NSPLIT = ARG0 + 3
A_RED_STRIDE = ARG0 + 4


def rows_instruction(op: Op, src: Buf, dst: Buf, row0: int, rows: int, col0: int, cols: int,
                     layer: int = 0, norm_weight: NormWeight = NormWeight.ATTN, **header) -> Instruction:
    args = [0] * NUM_ARGS
    args[A_SRC - ARG0], args[A_DST - ARG0], args[A_NORM_WEIGHT - ARG0] = int(src), int(dst), int(norm_weight)
    return Instruction(opcode=op, layer=layer, row0=row0, rows=rows, col0=col0, cols=cols,
                       args=args, **header)


def _arg(instr: Instruction, word: int) -> int:
    return instr.args[word - ARG0]


@register
class RowsFamily(InstructionFamily):
    opcodes = (Op.NOOP, Op.COPY, Op.RESIDUAL_ADD, Op.RMSNORM)

    def accesses(self, instr: Instruction, rank: int) -> Accesses:
        if instr.opcode == Op.NOOP:
            return Accesses((), ())
        r0, r1 = instr.row0, instr.row0 + instr.rows
        c0, c1 = instr.col0, instr.col0 + instr.cols
        src = Region(_arg(instr, A_SRC), r0, r1, c0, c1, rank)
        dst = Region(_arg(instr, A_DST), r0, r1, c0, c1, rank)
        if instr.opcode == Op.RESIDUAL_ADD:
            return Accesses((src, dst), (dst,))
        if instr.opcode == Op.RMSNORM and _arg(instr, A_DST) == Buf.ROW_SCALE:
            dst = Region(Buf.ROW_SCALE, r0, r1, 0, 1, rank)
        if instr.opcode == Op.RMSNORM and _arg(instr, A_RED_NSPLIT) > 0:
            stride = _arg(instr, A_RED_STRIDE)
            parts = tuple(Region(Buf.SPLITK, j * stride + r0, j * stride + r1, c0, c1, rank)
                          for j in range(_arg(instr, A_RED_NSPLIT)))
            return Accesses(parts + (src,), (src, dst))
        return Accesses((src,), (dst,))

    def run_torch(self, instr: Instruction, state) -> None:
        op = instr.opcode
        if op == Op.NOOP:
            return
        r0, r1 = instr.row0, instr.row0 + instr.rows
        c0, c1 = instr.col0, instr.col0 + instr.cols
        src = state.buf(_arg(instr, A_SRC))[r0:r1, c0:c1]
        scale_only = op == Op.RMSNORM and _arg(instr, A_DST) == Buf.ROW_SCALE
        dst_buf = state.buf(_arg(instr, A_DST))
        dst = dst_buf[r0:r1, 0:1] if scale_only else dst_buf[r0:r1, c0:c1]
        if op == Op.COPY:
            dst.copy_(src)
        elif op == Op.RESIDUAL_ADD:
            dst.copy_(dst + src)
        elif op == Op.RMSNORM:
            nsplit = _arg(instr, A_RED_NSPLIT)
            if nsplit > 0:
                # the split tiles' reduce, as SplitkReduceFamily.run_torch + RESIDUAL store_tile
                acc = sum_partials(state.buf(Buf.SPLITK), nsplit, _arg(instr, A_RED_STRIDE),
                                   r0, r1, [(c0, c1)])
                src.copy_(src + acc.to(state.weights.dtype))
            eps = state.weights.config.rms_norm_eps
            if scale_only:
                dst.copy_(row_scale(src, eps))
                return
            weight = norm_weight(state.weights, _arg(instr, A_NORM_WEIGHT), instr.layer)
            dst.copy_(rmsnorm(src, weight, eps))
        else:
            raise ValueError(f"RowsFamily cannot run opcode {op}")


def norm_weight(weights, which: int, layer: int) -> torch.Tensor:
    if which == NormWeight.ATTN:
        return weights.attn_norm[layer]
    if which == NormWeight.MLP:
        return weights.mlp_norm[layer]
    if which == NormWeight.FINAL:
        return weights.final_norm
    raise ValueError(f"unknown norm weight {which}")


def row_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """[rows, 1] float32 rsqrt(mean(x^2) + eps): RMSNorm's statistic, the same expression."""
    xf = x.float()
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face LlamaRMSNorm: statistic in float32, scale applied in the model dtype."""
    xf = x.float()
    xf = xf * row_scale(x, eps)
    return weight * xf.to(x.dtype)
