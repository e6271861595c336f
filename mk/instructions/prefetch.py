"""L2_PREFETCH: bring rows [col0, col0+cols) x K columns [k0, k1) of one layer's weight matrix of a
GEMM opcode into the GPU's L2 cache. No output, no architectural effect: a hint for the SMs that
would otherwise idle while a layer's attention runs on a few of them (PlanConfig.l2_prefetch_mib),
so that the next GEMM (O_PROJ, then the first K columns of GATE_UP's split slices) reads part of its
weights from L2 instead of HBM.

Weight rows are the GEMM's output columns (col0 / cols, like the opcode's own tiles), in the layer
stacked [L, N, K] weights of the opcode (GATE_UP: gate rows then up rows); the layer word picks L.

Arguments:
    ARG0 + 0  the GEMM opcode whose weights (QKV_ROPE, O_PROJ, GATE_UP, DOWN)
    ARG0 + 1  k0: first K column (a multiple of 8: 16-byte bulk prefetch granules)
    ARG0 + 2  k1: end K column (a multiple of 8, or K)

Torch face: nothing (the interpreter's state is unchanged). GPU body:
mk/instructions/_prefetch_kernel.py (the loader warp issues cp.async.bulk.prefetch.L2).
"""

from __future__ import annotations

from mk.instructions._common import arg
from mk.instructions.base import Accesses, InstructionFamily, register
from mk.ir import ARG0, Instruction, Op

A_WOP = ARG0
A_K0 = ARG0 + 1
A_K1 = ARG0 + 2
WEIGHT_OPS = (Op.QKV_ROPE, Op.O_PROJ, Op.GATE_UP, Op.DOWN)
GRANULE = 8                 # K columns per 16-byte bulk prefetch granule (bf16)


def check(instr: Instruction, n_rows: int, k: int) -> None:
    """ValueError unless the instruction names a stacked GEMM weight and a range inside it of
    n_rows x k (the weight's rows and K) on 16-byte granules."""
    op, k0, k1 = arg(instr, A_WOP), arg(instr, A_K0), arg(instr, A_K1)
    if op not in [int(o) for o in WEIGHT_OPS]:
        raise ValueError(f"L2_PREFETCH of the weights of opcode {op}: one of "
                         f"{[o.name for o in WEIGHT_OPS]}")
    if instr.cols <= 0 or instr.col0 < 0 or instr.col0 + instr.cols > n_rows:
        raise ValueError(f"L2_PREFETCH rows [{instr.col0}, {instr.col0 + instr.cols}) outside the "
                         f"{Op(op).name} weight's {n_rows} rows")
    if not 0 <= k0 < k1 <= k or k0 % GRANULE or (k1 % GRANULE and k1 != k) or k % GRANULE:
        raise ValueError(f"L2_PREFETCH K columns [{k0}, {k1}) of K = {k}: need 0 <= k0 < k1 <= K "
                         f"on {GRANULE}-column granules")


@register
class L2PrefetchFamily(InstructionFamily):
    opcodes = (Op.L2_PREFETCH,)
    ARG_NAMES = {int(Op.L2_PREFETCH): ("wop", "k0", "k1")}

    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        return Accesses((), ())         # weights are read-only; no buffer is touched

    def run_torch(self, instr: Instruction, state) -> None:
        w = state.weights
        stacked = {int(Op.QKV_ROPE): w.qkv, int(Op.O_PROJ): w.o, int(Op.GATE_UP): w.gate_up,
                   int(Op.DOWN): w.down}.get(arg(instr, A_WOP))
        if stacked is None:
            raise ValueError(f"L2_PREFETCH of the weights of opcode {arg(instr, A_WOP)}")
        check(instr, stacked.shape[-2], stacked.shape[-1])
