"""QKV_ROPE: a GEMM tile of the fused qkv projection, RoPE, and the KV-cache append.

A tile covers token rows [row0, row0+rows) and whole heads of ONE section of the qkv output
columns [col0, col0+cols) (q heads, then k heads, then v heads of this rank; see mk.weights):
    q section: RoPE, then Q[rows, cols]                      (Q columns = qkv columns)
    k section: RoPE, then K_CACHE[kv row of each token, cols - section start]
    v section:            V_CACHE[kv row of each token, cols - section start]
KV row of token row t: layer * kv_layer_stride + kv_slot[t] (metadata M_OFF_SLOT, M_KV_LAYER_STRIDE).
RoPE as in Hugging Face: cos/sin from float32 math cast to the model dtype,
`x * cos + rotate_half(x) * sin` in the model dtype.

Arguments:
    ARG0 + 0  source buffer (NORMED)
    ARG0 + 1  q destination buffer (Q)
    ARG0 + 2  section: 0 q, 1 k, 2 v
    ARG0 + 3  first qkv column of the section
    ARG0 + 4  head_dim
    ARG0 + 5  K: reduction width (hidden size; a split tile: its slice's width)
    ARG0 + 8, 9  unsplit under PlanConfig.norm_fold=2: the epilogue wait (counter + 1, target;
              mk/instructions/_common.py A_EPI_WAIT): y = bf16(acc * ROW_SCALE[row]) before RoPE;
              norm_fold=3 (A_EPI_WAIT = SELF_SCALE): the rows' statistic from the source rows;
              norm_fold=4 (A_EPI_WAIT = ROW_PARTS): from ROW_PART's columns [word 9, + K / 64)
    ARG0 + 10 .. 13  split-K words (mk/instructions/_common.py): a split tile stores its float32
              partial to SPLITK rows j * stride + row, columns [col0, col0+cols) of the qkv space;
              SPLITK_REDUCE (mk/instructions/splitk.py) then runs `QkvFamily.epilogue` (RoPE, store)

The CuTe DSL body lives in mk/instructions/_gemm_kernel.py (GPU path only: head_dim 128, tiles of
whole heads of one section, mk/tiles.py's QKV_ROPE shapes).
"""

from __future__ import annotations

import functools
import math

import torch

from mk.instructions._common import (M_KV_LAYER_STRIDE, M_OFF_POS, M_OFF_SLOT, arg, cols_of,
                                     need_meta, rows_of, runs)
from mk.instructions.base import Buf, Region, register
from mk.instructions.matmul import GemmLikeFamily, weight_rows, with_split_names
from mk.ir import ARG0, Instruction, Op

A_SRC = ARG0
A_DST = ARG0 + 1
A_SECTION = ARG0 + 2
A_SEC_COL0 = ARG0 + 3
A_HEAD_DIM = ARG0 + 4
A_K = ARG0 + 5

SEC_Q, SEC_K, SEC_V = 0, 1, 2


# RoPE (Hugging Face's formulas, written out here: the reference is not imported) -------------------
@functools.lru_cache(maxsize=16)
def inv_freq(head_dim: int, rope) -> torch.Tensor:
    base = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(
        dtype=torch.float) / head_dim))
    if rope.scaling_type is None:
        return base
    if rope.scaling_type != "llama3":
        raise ValueError(f"unsupported RoPE scaling {rope.scaling_type!r}")
    factor, lo, hi = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    old = rope.original_max_position_embeddings
    lo_wavelen, hi_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > lo_wavelen, base / factor, base)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < hi_wavelen) * ~(wavelen > lo_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    f = positions[:, None].float() * freqs[None, :]
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D], cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None, :]) + (rot * sin[:, None, :])


def kv_rows(meta, layer: int, r0: int, r1: int) -> torch.Tensor:
    """K/V cache rows of token rows [r0, r1) in `layer` (int64 tensor)."""
    m = meta.tensor
    off = int(m[M_OFF_SLOT])
    return m[off + r0:off + r1].long() + layer * int(m[M_KV_LAYER_STRIDE])


@register
class QkvFamily(GemmLikeFamily):
    opcodes = (Op.QKV_ROPE,)
    ARG_NAMES = {int(Op.QKV_ROPE): with_split_names(("src", "dst", "section", "sec_col0", "D", "K"))}
    K_WORD = A_K
    SRC_WORD = A_SRC

    def weight(self, instr: Instruction, weights) -> torch.Tensor:
        c0, c1 = cols_of(instr)
        return weight_rows(Op.QKV_ROPE, weights, instr.layer, c0, c1)

    def epilogue_regions(self, instr: Instruction, rank: int, meta=None):
        r0, r1 = rows_of(instr)
        c0, c1 = cols_of(instr)
        sec = arg(instr, A_SECTION)
        if sec == SEC_Q:
            return (), (Region(arg(instr, A_DST), r0, r1, c0, c1, rank),)
        need_meta(meta, Op.QKV_ROPE)
        buf = Buf.K_CACHE if sec == SEC_K else Buf.V_CACHE
        k0, k1 = c0 - arg(instr, A_SEC_COL0), c1 - arg(instr, A_SEC_COL0)
        writes = tuple(Region(buf, a, b, k0, k1, rank)
                       for a, b in runs(kv_rows(meta, instr.layer, r0, r1).tolist()))
        return (), writes

    def epilogue(self, instr: Instruction, state, y: torch.Tensor) -> None:
        r0, r1 = rows_of(instr)
        c0, c1 = cols_of(instr)
        D = arg(instr, A_HEAD_DIM)
        sec = arg(instr, A_SECTION)
        if sec in (SEC_Q, SEC_K):
            m = state.meta.tensor
            off = int(m[M_OFF_POS])
            pos = m[off + r0:off + r1].long().to(y.device)   # the metadata lives on the host
            cos, sin = rope_cos_sin(pos, inv_freq(D, state.weights.config.rope).to(y.device), y.dtype)
            y = apply_rope(y.view(r1 - r0, -1, D), cos, sin).reshape(r1 - r0, c1 - c0)
        if sec == SEC_Q:
            state.buf(arg(instr, A_DST))[r0:r1, c0:c1].copy_(y)
            return
        cache = state.buf(Buf.K_CACHE if sec == SEC_K else Buf.V_CACHE)
        k0 = c0 - arg(instr, A_SEC_COL0)
        cache[kv_rows(state.meta, instr.layer, r0, r1), k0:k0 + (c1 - c0)] = y.to(cache.dtype)
