"""TP_REDUCE: the reduce + all-gather half of the tensor-parallel reduce-scatter scheme.

On rank q, for token rows [row0, row0+rows) and q's hidden slice [col0, col0+cols) (H/n columns):
    s   = RECV[0*stride + rows, cols] + RECV[1*stride + rows, cols] + ... + RECV[(n-1)*stride + ...]
          summed in the FIXED rank order 0, 1, .., n-1 (deterministic, the same on every run)
    out = HIDDEN[rows, cols] + s   (residual = 1: after O_PROJ / DOWN)   or   s   (EMBED)
    HIDDEN[rows, cols] = out on EVERY rank (the all-gather); the signal has scope ALL.
RECV slot p of rank q is written by rank p's SCATTER epilogues (mk.instructions.matmul).

Arguments:
    ARG0 + 0  RECV buffer
    ARG0 + 1  destination (HIDDEN)
    ARG0 + 2  residual: 1 add dst's own rows, 0 not
    ARG0 + 3  slot stride in rows
    ARG0 + 4  n: TP size

The GPU body (storer-warp stores to peers' symmetric HIDDEN, then a .sys release signal) will live
in mk/instructions/comm_kernel.py.
"""

from __future__ import annotations

from mk.instructions._common import arg, cols_of, rows_of
from mk.instructions.base import Accesses, InstructionFamily, Region, register
from mk.ir import ARG0, Instruction, Op

A_SRC = ARG0
A_DST = ARG0 + 1
A_RESIDUAL = ARG0 + 2
A_SLOT_STRIDE = ARG0 + 3
A_NRANKS = ARG0 + 4


@register
class CommFamily(InstructionFamily):
    opcodes = (Op.TP_REDUCE,)
    ARG_NAMES = {int(Op.TP_REDUCE): ("src", "dst", "residual", "stride", "n")}

    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        r0, r1 = rows_of(instr)
        c0, c1 = cols_of(instr)
        src, dst, st, n = arg(instr, A_SRC), arg(instr, A_DST), arg(instr, A_SLOT_STRIDE), arg(instr, A_NRANKS)
        reads = [Region(src, p * st + r0, p * st + r1, c0, c1, rank) for p in range(n)]
        if arg(instr, A_RESIDUAL):
            reads.append(Region(dst, r0, r1, c0, c1, rank))
        writes = tuple(Region(dst, r0, r1, c0, c1, q) for q in range(n))
        return Accesses(tuple(reads), writes)

    def run_torch(self, instr: Instruction, state) -> None:
        r0, r1 = rows_of(instr)
        c0, c1 = cols_of(instr)
        src, dst, st, n = arg(instr, A_SRC), arg(instr, A_DST), arg(instr, A_SLOT_STRIDE), arg(instr, A_NRANKS)
        recv = state.buf(src)
        s = recv[r0:r1, c0:c1]
        for p in range(1, n):
            s = s + recv[p * st + r0:p * st + r1, c0:c1]
        if arg(instr, A_RESIDUAL):
            s = state.buf(dst)[r0:r1, c0:c1] + s
        for q in range(n):
            state.buf(dst, rank=q)[r0:r1, c0:c1].copy_(s)
