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
    ARG0 + 4  K: reduction width (columns of the source read; a split tile: its slice's width)
    ARG0 + 5  GATE_UP split tiles (and their SPLITK_REDUCE's copy): intermediate_local, the SPLITK
              column of the up part (the accesses have no weights to take it from)
    ARG0 + 6  O_PROJ / DOWN unsplit with RESIDUAL (PlanConfig.norm_fold=4): 1 + the ROW_PART
              column of the rows' sums of squares of h over the tile's 64-column groups, or 0
              (mk/instructions/_common.py A_ROW_PART)
    ARG0 + 8, 9  GATE_UP unsplit under PlanConfig.norm_fold=2: the epilogue wait (counter + 1,
              target; mk/instructions/_common.py A_EPI_WAIT): y = bf16(acc * ROW_SCALE[row]);
              under norm_fold=3 A_EPI_WAIT = SELF_SCALE: y = bf16(acc * rsqrt(mean(x^2) + eps))
              of the tile's own source rows x; under norm_fold=4 A_EPI_WAIT = ROW_PARTS and word
              9 the ROW_PART column b: y = bf16(acc * rsqrt(sum(ROW_PART[row, b:b + K / 64]) / K
              + eps))
    ARG0 + 10 .. 13  split-K words (mk/instructions/_common.py: A_NSPLIT, A_SPLIT_J, A_K0,
              A_SPLIT_ROW), O_PROJ / GATE_UP / DOWN only

Split-K (mk/instructions/splitk.py): a tile with nsplit >= 2 stores the float32 partial
x[rows, k0:k0+K] @ W[cols, k0:k0+K]^T to SPLITK rows j * stride + row (GATE_UP: gate part at
columns [col0, col0+cols), up part at [I + col0, I + col0 + cols)), no epilogue; SPLITK_REDUCE sums
the nsplit partials and runs `epilogue` below, the very function the unsplit tile runs.

The CuTe DSL bodies live in mk/instructions/_gemm_kernel.py (GPU path only); their tile shapes (BM
rows x BN columns per M class) in mk/tiles.py, shared with the planner's default tile widths.
"""

from __future__ import annotations

from enum import IntEnum

import torch
import torch.nn.functional as F

from mk.instructions._common import (A_K0, A_SPLIT_J, A_SPLIT_ROW, ROW_PART_COLS, SPLIT_ARG_NAMES,
                                     arg, cols_of, epilogue_wait, is_split, row_part_base,
                                     row_part_groups, row_part_scaled, rows_of, self_scaled)
from mk.instructions.base import Accesses, Buf, InstructionFamily, Region, register
from mk.instructions.rows import row_scale
from mk.instructions.splitk import row_part_scale
from mk.ir import ARG0, Instruction, Op

A_SRC = ARG0
A_DST = ARG0 + 1
A_EPI = ARG0 + 2
A_SLOT_STRIDE = ARG0 + 3
A_K = ARG0 + 4
A_UP_COL = ARG0 + 5
GEMM_ARG_NAMES = ("src", "dst", "epi", "stride", "K", "up_col")


def with_split_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """An opcode's argument names followed by the split-K words' names (for mk.ir's dump)."""
    last = max(SPLIT_ARG_NAMES) + 1
    return tuple(names[i] if i < len(names) else SPLIT_ARG_NAMES.get(i, str(i)) for i in range(last))


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


def row_part_regions(instr: Instruction, rank: int) -> tuple:
    """The ROW_PART columns an h-writing tile with an A_ROW_PART word writes: its rows, the
    slots of its columns (PlanConfig.norm_fold=4; mk/instructions/_common.py A_ROW_PART)."""
    b = row_part_base(instr)
    if b is None:
        return ()
    r0, r1 = rows_of(instr)
    c0, c1 = cols_of(instr)
    return (Region(Buf.ROW_PART, r0, r1, b + c0 // ROW_PART_COLS, b + row_part_groups(c1),
                   rank),)


def write_row_parts(instr: Instruction, state, dst: int) -> None:
    """An h-writing tile's A_ROW_PART face: for each of its rows the float32 sum of squares of
    its h values as stored (buffer dst) over each ROW_PART_COLS columns, into ROW_PART."""
    b = row_part_base(instr)
    if b is None:
        return
    r0, r1 = rows_of(instr)
    c0, c1 = cols_of(instr)
    if c0 % ROW_PART_COLS:
        raise ValueError(f"{Op(instr.opcode).name} tile at column {c0} writes ROW_PART: its columns "
                         f"must start on a multiple of {ROW_PART_COLS}")
    n = row_part_groups(c1 - c0)
    h = F.pad(state.buf(dst)[r0:r1, c0:c1].float(), (0, n * ROW_PART_COLS - (c1 - c0)))
    first = b + c0 // ROW_PART_COLS
    state.buf(Buf.ROW_PART)[r0:r1, first:first + n] = h.square().view(r1 - r0, n, -1).sum(-1)


class GemmLikeFamily(InstructionFamily):
    """The faces every GEMM tile opcode shares: x[rows, :K] @ W^T then `epilogue`, or (split-K)
    the float32 partial of one K slice into SPLITK. A family says which weight rows a tile
    multiplies (`weight`), where its K word is (K_WORD), and what its epilogue does to the tile's
    product y (`epilogue` / `epilogue_regions`); SPLITK_REDUCE calls the same two."""

    K_WORD = A_K
    SRC_WORD = A_SRC

    def weight(self, instr: Instruction, weights) -> torch.Tensor:
        """W [tile output columns, K_full]: the rows of y's columns, in y's column order."""
        raise NotImplementedError

    def epilogue(self, instr: Instruction, state, y: torch.Tensor) -> None:
        """Store the tile's product y [rows, W rows] (model dtype) as the opcode does."""
        raise NotImplementedError

    def epilogue_regions(self, instr: Instruction, rank: int, meta=None):
        """(reads, writes) of `epilogue`."""
        raise NotImplementedError

    def splitk_cols(self, instr: Instruction) -> list[tuple[int, int]]:
        """SPLITK column ranges of y's columns, in order (split tiles write, the reduce reads)."""
        return [cols_of(instr)]

    def splitk_regions(self, instr: Instruction, rank: int, j: int, stride: int) -> list[Region]:
        r0, r1 = rows_of(instr)
        return [Region(Buf.SPLITK, j * stride + r0, j * stride + r1, a, b, rank)
                for a, b in self.splitk_cols(instr)]

    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        r0, r1 = rows_of(instr)
        K = arg(instr, self.K_WORD)
        if is_split(instr):
            k0 = arg(instr, A_K0)
            src = Region(arg(instr, self.SRC_WORD), r0, r1, k0, k0 + K, rank)
            return Accesses((src,), tuple(self.splitk_regions(
                instr, rank, arg(instr, A_SPLIT_J), arg(instr, A_SPLIT_ROW))))
        src = (Region(arg(instr, self.SRC_WORD), r0, r1, 0, K, rank),)
        reads, writes = self.epilogue_regions(instr, rank, meta)
        writes = tuple(writes) + row_part_regions(instr, rank)
        rb = row_part_scaled(instr)
        if rb is not None:
            # norm_fold=4: the statistic from the sums h's writers left, read with src
            src += (Region(Buf.ROW_PART, r0, r1, rb, rb + row_part_groups(K), rank),)
        if epilogue_wait(instr) is None:
            # (a self-scaled tile's statistic comes from src itself: no further read)
            return Accesses(src + tuple(reads), writes)
        # the row scale is read after the epilogue wait, with the epilogue's own reads
        late = (Region(Buf.ROW_SCALE, r0, r1, 0, 1, rank),) + tuple(reads)
        return Accesses(src + late, writes, late)

    def run_torch(self, instr: Instruction, state) -> None:
        r0, r1 = rows_of(instr)
        K = arg(instr, self.K_WORD)
        w = self.weight(instr, state.weights)
        if not is_split(instr):
            x = state.buf(arg(instr, self.SRC_WORD))[r0:r1, :K]
            if self_scaled(instr):
                # norm_fold=3: the rows' statistic from the rows the tile multiplies (its K is
                # the hidden width), the expression of the row-scale RMSNORM's (rows.row_scale)
                acc = F.linear(x.float(), w.float())
                acc.mul_(row_scale(x, state.weights.config.rms_norm_eps))
                self.epilogue(instr, state, acc.to(state.weights.dtype))
                return
            rb = row_part_scaled(instr)
            if rb is not None:
                # norm_fold=4: the statistic from h's writers' sums of squares (its K is the
                # hidden width)
                acc = F.linear(x.float(), w.float())
                acc.mul_(row_part_scale(state, r0, r1, rb, K))
                self.epilogue(instr, state, acc.to(state.weights.dtype))
                return
            if epilogue_wait(instr) is None:
                self.epilogue(instr, state, gemm_tile(x, w))
                write_row_parts(instr, state, arg(instr, A_DST))
                return
            # the norm folded in (norm_fold=2): the float32 product scaled by ROW_SCALE, then one
            # rounding, as a row-scaled SPLITK_REDUCE finishes its split tiles
            acc = F.linear(x.float(), w.float())
            acc.mul_(state.buf(Buf.ROW_SCALE)[r0:r1, 0:1])
            self.epilogue(instr, state, acc.to(state.weights.dtype))
            return
        k0 = arg(instr, A_K0)
        x = state.buf(arg(instr, self.SRC_WORD))[r0:r1, k0:k0 + K]
        acc = F.linear(x.float(), w[:, k0:k0 + K].float())     # float32 partial, no rounding
        out = state.buf(Buf.SPLITK)
        base = arg(instr, A_SPLIT_J) * arg(instr, A_SPLIT_ROW)
        c = 0
        for a, b in self.splitk_cols(instr):
            out[base + r0:base + r1, a:b] = acc[:, c:c + b - a]
            c += b - a


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """GATE_UP's epilogue math on [gate | up] columns."""
    n = gu.shape[1] // 2
    return F.silu(gu[:, :n]) * gu[:, n:]


@register
class GemmFamily(GemmLikeFamily):
    opcodes = (Op.O_PROJ, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)
    ARG_NAMES = {int(op): with_split_names(GEMM_ARG_NAMES) for op in opcodes}

    def weight(self, instr: Instruction, weights) -> torch.Tensor:
        c0, c1 = cols_of(instr)
        if instr.opcode != Op.GATE_UP:
            return weight_rows(instr.opcode, weights, instr.layer, c0, c1)
        half = weights.gate_up.shape[1] // 2
        gu = weights.gate_up[instr.layer]
        # one GEMM over the tile's gate rows then up rows (the whole weight for a full-width
        # tile: the reference's very call, hence the same float32 summation order)
        return gu if (c0, c1) == (0, half) else torch.cat((gu[c0:c1], gu[half + c0:half + c1]))

    def splitk_cols(self, instr: Instruction) -> list[tuple[int, int]]:
        c0, c1 = cols_of(instr)
        if instr.opcode != Op.GATE_UP:
            return [(c0, c1)]
        up = arg(instr, A_UP_COL)
        if up < c1:
            raise ValueError(f"split GATE_UP tile cols [{c0}, {c1}) needs the up part's SPLITK "
                             f"column (intermediate_local) in word ARG0+5, got {up}")
        return [(c0, c1), (up + c0, up + c1)]

    def epilogue(self, instr: Instruction, state, y: torch.Tensor) -> None:
        if instr.opcode == Op.GATE_UP:
            y = silu_mul(y)
        store_tile(instr, state, y, arg(instr, A_EPI), arg(instr, A_DST), arg(instr, A_SLOT_STRIDE))

    def epilogue_regions(self, instr: Instruction, rank: int, meta=None):
        return store_regions(instr, rank, arg(instr, A_EPI), arg(instr, A_DST),
                             arg(instr, A_SLOT_STRIDE))
