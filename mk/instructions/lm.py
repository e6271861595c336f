"""LM_NORM: gather each sequence's last token row and apply the final RMSNorm.

LAST_NORMED rows [row0, row0+rows) (sequences s = row0 .. row0+rows-1) <-
    rmsnorm(HIDDEN[last_rows[s]]) * final_norm, last_rows from the metadata (M_OFF_LAST); the
planner groups the sequences whose last rows lie in one token block. The logits are then LM_HEAD
GEMM tiles (mk.instructions.matmul) over LAST_NORMED.

Arguments:
    ARG0 + 0  source buffer (HIDDEN)
    ARG0 + 1  destination buffer (LAST_NORMED)
    ARG0 + 2  metadata word of last_rows[row0]
    ARG0 + 3  hidden size

The CuTe DSL body will live in mk/instructions/lm_kernel.py (GPU path only).
"""

from __future__ import annotations

from mk.instructions._common import arg, need_meta, rows_of, runs
from mk.instructions.base import Accesses, InstructionFamily, NormWeight, Region, register
from mk.instructions.rows import norm_weight, rmsnorm
from mk.ir import ARG0, Instruction, Op

A_SRC = ARG0
A_DST = ARG0 + 1
A_LAST_OFF = ARG0 + 2
A_WIDTH = ARG0 + 3


@register
class LmNormFamily(InstructionFamily):
    opcodes = (Op.LM_NORM,)
    ARG_NAMES = {int(Op.LM_NORM): ("src", "dst", "last_off", "H")}

    def _src_rows(self, instr: Instruction, meta_tensor):
        off = arg(instr, A_LAST_OFF)
        return meta_tensor[off:off + instr.rows].long()

    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        need_meta(meta, Op.LM_NORM)
        H = arg(instr, A_WIDTH)
        r0, r1 = rows_of(instr)
        reads = tuple(Region(arg(instr, A_SRC), a, b, 0, H, rank)
                      for a, b in runs(self._src_rows(instr, meta.tensor).tolist()))
        return Accesses(reads, (Region(arg(instr, A_DST), r0, r1, 0, H, rank),))

    def run_torch(self, instr: Instruction, state) -> None:
        r0, r1 = rows_of(instr)
        x = state.buf(arg(instr, A_SRC))[self._src_rows(instr, state.meta.tensor)]
        w = state.weights
        y = rmsnorm(x, norm_weight(w, NormWeight.FINAL, 0), w.config.rms_norm_eps)
        state.buf(arg(instr, A_DST))[r0:r1].copy_(y)
