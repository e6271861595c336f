"""GEMM tiles: O_PROJ, GATE_UP, DOWN, LM_HEAD (and the tile core that QKV_ROPE and EMBED share).

A tile is token rows [row0, row0+rows) x output columns [col0, col0+cols) of `x @ W^T`, with x the
source buffer's rows (all K columns) and W the opcode's weight rows [col0, col0+cols) of `layer`.
The tile is then stored by an epilogue (`Epi`), shared by every GEMM-like family:

    STORE     dst[rows, cols] = y                       (LM_HEAD -> LOGITS, EMBED at TP 1)
    RESIDUAL  dst[rows, cols] = dst[rows, cols] + y     (O_PROJ / DOWN at TP 1: HIDDEN += y)
    SCATTER   on rank q = signal_rank: dst_q[p*stride + rows, cols] = y, p = this rank
              (O_PROJ / DOWN / EMBED at TP > 1: a partial sum into the owner's RECV slot p)
    SILU_MUL  GATE_UP: dst[rows, cols] = silu(x @ Wg[cols]^T) * (x @ Wu[cols]^T)

Arguments:
    ARG0 + 0  source buffer (Buf)
    ARG0 + 1  destination buffer (Buf)
    ARG0 + 2  epilogue (Epi)
    ARG0 + 3  RECV slot stride in rows (SCATTER)
    ARG0 + 4  K: reduction width (columns of the source read)

The CuTe DSL bodies live in mk/instructions/_gemm_kernel.py (GPU path only); their tile shapes (BM
rows x BN columns per M class) in mk/tiles.py, shared with the planner's default tile widths.
"""

from __future__ import annotations

from enum import IntEnum

import torch
import torch.nn.functional as F

from mk.instructions._common import arg, cols_of, rows_of
from mk.instructions.base import Accesses, InstructionFamily, Region, register
from mk.ir import ARG0, Instruction, Op

A_SRC = ARG0
A_DST = ARG0 + 1
A_EPI = ARG0 + 2
A_SLOT_STRIDE = ARG0 + 3
A_K = ARG0 + 4
GEMM_ARG_NAMES = ("src", "dst", "epi", "stride", "K")


class Epi(IntEnum):
    STORE = 0
    RESIDUAL = 1
    SCATTER = 2
    SILU_MUL = 3


def gemm_tile(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The tile product, `F.linear` as in the reference (model dtype in, model dtype out)."""
    return F.linear(x, w)


def weight_rows(op: int, weights, layer: int, c0: int, c1: int) -> torch.Tensor:
    if op == Op.O_PROJ:
        return weights.o[layer][c0:c1]
    if op == Op.DOWN:
        return weights.down[layer][c0:c1]
    if op == Op.LM_HEAD:
        return weights.lm_head[c0:c1]
    if op == Op.QKV_ROPE:
        return weights.qkv[layer][c0:c1]
    raise ValueError(f"no single weight for opcode {op}")


def store_tile(instr: Instruction, state, y: torch.Tensor, epi: int, dst: int, stride: int = 0) -> None:
    """Write tile y [rows, cols] through epilogue `epi` (STORE / RESIDUAL / SCATTER)."""
    r0, r1 = rows_of(instr)
    c0, c1 = cols_of(instr)
    if epi == Epi.STORE or epi == Epi.SILU_MUL:
        state.buf(dst)[r0:r1, c0:c1].copy_(y)
    elif epi == Epi.RESIDUAL:
        d = state.buf(dst)[r0:r1, c0:c1]
        d.copy_(d + y)
    elif epi == Epi.SCATTER:
        p = state.rank
        state.buf(dst, rank=instr.signal_rank)[p * stride + r0:p * stride + r1, c0:c1].copy_(y)
    else:
        raise ValueError(f"unknown epilogue {epi}")


def store_regions(instr: Instruction, rank: int, epi: int, dst: int, stride: int):
    """(reads, writes) of an epilogue."""
    r0, r1 = rows_of(instr)
    c0, c1 = cols_of(instr)
    if epi in (Epi.STORE, Epi.SILU_MUL):
        return (), (Region(dst, r0, r1, c0, c1, rank),)
    if epi == Epi.RESIDUAL:
        reg = Region(dst, r0, r1, c0, c1, rank)
        return (reg,), (reg,)
    if epi == Epi.SCATTER:
        return (), (Region(dst, rank * stride + r0, rank * stride + r1, c0, c1, instr.signal_rank),)
    raise ValueError(f"unknown epilogue {epi}")


@register
class GemmFamily(InstructionFamily):
    opcodes = (Op.O_PROJ, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)
    ARG_NAMES = {int(op): GEMM_ARG_NAMES for op in opcodes}

    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        r0, r1 = rows_of(instr)
        src = Region(arg(instr, A_SRC), r0, r1, 0, arg(instr, A_K), rank)
        reads, writes = store_regions(instr, rank, arg(instr, A_EPI), arg(instr, A_DST),
                                      arg(instr, A_SLOT_STRIDE))
        return Accesses((src,) + reads, writes)

    def run_torch(self, instr: Instruction, state) -> None:
        r0, r1 = rows_of(instr)
        c0, c1 = cols_of(instr)
        x = state.buf(arg(instr, A_SRC))[r0:r1, :arg(instr, A_K)]
        w = state.weights
        if instr.opcode == Op.GATE_UP:
            half = w.gate_up.shape[1] // 2
            gu = w.gate_up[instr.layer]
            # one GEMM over the tile's gate rows then up rows (the whole weight for a full-width
            # tile: the reference's very call, hence the same float32 summation order)
            wt = gu if (c0, c1) == (0, half) else torch.cat((gu[c0:c1], gu[half + c0:half + c1]))
            gy = gemm_tile(x, wt)
            y = F.silu(gy[:, :c1 - c0]) * gy[:, c1 - c0:]
        else:
            y = gemm_tile(x, weight_rows(instr.opcode, w, instr.layer, c0, c1))
        store_tile(instr, state, y, arg(instr, A_EPI), arg(instr, A_DST), arg(instr, A_SLOT_STRIDE))
