"""EMBED: token rows [row0, row0+rows) x hidden columns [col0, col0+cols) of the embedding.

Vocab-sharded as in Megatron: rank r holds rows [r*V/n, (r+1)*V/n) of embed_tokens; a token outside
the shard contributes zeros (`embed[local] * mine`, as the reference does), and the partials of the
n ranks are summed by TP_REDUCE (SCATTER epilogue). At TP 1 the epilogue is STORE into HIDDEN.
The tile grid is the DOWN grid, so the counters it signals have the same targets as DOWN's.

Arguments:
    ARG0 + 0  destination buffer (HIDDEN at TP 1, RECV at TP > 1)
    ARG0 + 1  epilogue (matmul.Epi: STORE or SCATTER)
    ARG0 + 2  RECV slot stride in rows (SCATTER)
    ARG0 + 6  1 + the ROW_PART column of its rows' sums of squares, or 0 (mk/instructions/
              _common.py A_ROW_PART; PlanConfig.norm_fold=4, TP 1)
Token ids: metadata tokens[row] (mk.instructions._common.M_OFF_TOKENS).

The CuTe DSL body will live in mk/instructions/embed_kernel.py (GPU path only).
"""

from __future__ import annotations

from mk.instructions._common import M_OFF_TOKENS, arg, cols_of, rows_of
from mk.instructions.base import Accesses, InstructionFamily, register
from mk.instructions.matmul import row_part_regions, store_regions, store_tile, write_row_parts
from mk.ir import ARG0, Instruction, Op

A_DST = ARG0
A_EPI = ARG0 + 1
A_SLOT_STRIDE = ARG0 + 2


@register
class EmbedFamily(InstructionFamily):
    opcodes = (Op.EMBED,)
    ARG_NAMES = {int(Op.EMBED): ("dst", "epi", "stride")}

    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        reads, writes = store_regions(instr, rank, arg(instr, A_EPI), arg(instr, A_DST),
                                      arg(instr, A_SLOT_STRIDE))
        return Accesses(reads, tuple(writes) + row_part_regions(instr, rank))

    def run_torch(self, instr: Instruction, state) -> None:
        r0, r1 = rows_of(instr)
        c0, c1 = cols_of(instr)
        meta = state.meta.tensor
        off = int(meta[M_OFF_TOKENS])
        ids = meta[off + r0:off + r1].long()
        table = state.weights.embed
        vl = table.shape[0]
        local = ids - state.rank * vl
        mine = (local >= 0) & (local < vl)
        y = table[local.clamp(0, vl - 1), c0:c1]
        if state.tp > 1:
            y = y * mine[:, None].to(y.dtype)
        elif not bool(mine.all()):
            raise ValueError(f"EMBED: token ids outside [0, {vl}) in rows {r0}..{r1}")
        store_tile(instr, state, y, arg(instr, A_EPI), arg(instr, A_DST), arg(instr, A_SLOT_STRIDE))
        write_row_parts(instr, state, arg(instr, A_DST))
