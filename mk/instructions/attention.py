"""ATTENTION and ATTN_REDUCE: causal attention over the paged KV cache, split over KV ranges.

ATTENTION: the query rows [row0, row0+rows) of ONE sequence (consecutive positions pos0, pos0+1, ..)
x KV heads [col0, col0+cols) of this rank (with their q heads: q head h reads KV head h // qpk)
x keys at positions [kv0, kv1). Row i attends to keys [kv0, min(kv1, pos0 + i + 1)). Keys live in
K_CACHE / V_CACHE rows layer * kv_layer_stride + page * page_size + pos % page_size, page =
metadata[page_off + pos // page_size].
    mode 0 (the whole context in one instruction): exactly the reference's math:
        scores = (q @ k^T) * D^-0.5 in the model dtype, causal mask, softmax in float32 cast back,
        probs @ v in the model dtype -> ATTN_OUT[rows, q head columns].
    mode 1 (one split of several): float32 partial output o_i = softmax-weighted v of the split
        (normalised within the split) -> ATTN_PARTIAL[slot + i, q head columns] and its
        log-sum-exp -> ATTN_LSE[slot + i, q heads] (-inf where the split holds no key for the row).
    mode 2 (a pair of decode units): two mode-0 instructions of one row each in one, the second
        sequence's row, position, page table and new0 in ARG0 + 10 .. 13 (its keys [kv0, pos + 1),
        kv0 = 0). The GPU body runs one unit per consumer warpgroup, where a single decode unit
        leaves the second idle (mk.plan pairs decode segments when the attention instructions
        outnumber the SMs: PlanConfig.attn_pair).
ATTN_REDUCE: rows x KV heads of one segment whose splits j = 0..nsplit-1 sit at slots
slot0 + j*rows: out = sum_j exp(lse_j - M) o_j / sum_j exp(lse_j - M), M = max_j lse_j, cast to the
model dtype -> ATTN_OUT.

ATTENTION arguments:                       ATTN_REDUCE arguments:
    ARG0 + 0  sequence index                  ARG0 + 0  slot0
    ARG0 + 1  pos0 (position of row0)         ARG0 + 1  nsplit
    ARG0 + 2  kv0                             ARG0 + 6  qpk
    ARG0 + 3  kv1                             ARG0 + 7  head_dim
    ARG0 + 4  page table offset (metadata word)
    ARG0 + 5  mode: 0 direct, 1 partial
    ARG0 + 6  qpk: q heads per KV head on this rank
    ARG0 + 7  head_dim
    ARG0 + 8  slot (mode 1): first ATTN_PARTIAL / ATTN_LSE row of this split
    ARG0 + 9  new0: the sequence's first position written by this step (<= pos0; a sequence whose
              rows span several blocks has segments with pos0 > new0). Keys before it come from
              earlier steps, so the megakernel's loader may read them before the instruction's
              waits (early weight loads); 0 = none (the faces ignore it)
    ARG0 + 10 .. 13 (mode 2): the second unit's token row, pos0, page table offset and new0

The CuTe DSL bodies will live in mk/instructions/attention_kernel.py (GPU path only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mk.instructions._common import (M_KV_LAYER_STRIDE, M_PAGE_SIZE, arg, need_meta, rows_of,
                                     runs)
from mk.instructions.base import Accesses, Buf, InstructionFamily, Region, register
from mk.ir import ARG0, Instruction, Op

A_SEQ = ARG0
A_POS0 = ARG0 + 1
A_KV0 = ARG0 + 2
A_KV1 = ARG0 + 3
A_PAGE_OFF = ARG0 + 4
A_MODE = ARG0 + 5
A_QPK = ARG0 + 6
A_HEAD_DIM = ARG0 + 7
A_SLOT = ARG0 + 8
A_NEW0 = ARG0 + 9
A_ROW0_B = ARG0 + 10        # mode 2: the second decode unit's token row, position, page table, new0
A_POS0_B = ARG0 + 11
A_PAGE_OFF_B = ARG0 + 12
A_NEW0_B = ARG0 + 13
# ATTN_REDUCE
A_SLOT0 = ARG0
A_NSPLIT = ARG0 + 1

MODE_DIRECT, MODE_PARTIAL, MODE_PAIR = 0, 1, 2
# query rows per M tile of the GPU body (_attention_kernel.MT: two warpgroups x 64): an
# instruction's tiles start at its row0, ATTN_TILE_ROWS // qpk tokens each, so the planner's
# prefill row chunks (PlanConfig.attn_chunk_rows) are whole tiles of the unchunked instruction
ATTN_TILE_ROWS = 128
# a pair's unit is one consumer warpgroup's 64 query rows: its token's q heads of the KV head
PAIR_MAX_QPK = 64

# Estimated SM time of an ATTENTION instruction (PlanConfig.attn_lpt queues a layer's longest
# first), ns per 64-key block (the GPU body's K / V page) the instruction reads: session 56's
# journal of the mixed step (70B TP8 rank, H100; bench/results/shares_default_aa93b11_*_s56*):
# a pair of 1024-key decode units 47.9 us of own time (its two units side by side, one per
# consumer warpgroup), a 16-token prompt chunk (one M tile) 34.2 us at ~520 keys on average; a
# lone decode unit ~0.8 of a pair (session 15: pairing cut ATTENTION's SM time 37%)
KEY_BLOCK = 64
COST_NS_PAIR_BLOCK = 3000
COST_NS_UNIT_BLOCK = 2400
COST_NS_TILE_BLOCK = 4200


def est_cost_ns(mode, rows, qpk: int, pos0, kv0, kv1, pos0_b):
    """Estimated SM time (ns) of ATTENTION instructions from their words (numpy arrays; pos0_b is
    read where mode is MODE_PAIR): the key blocks each unit reads (causal: a unit's rows see keys
    below pos0 + rows only) times a per-block rate; a prompt chunk by M tiles of ATTN_TILE_ROWS
    query rows, a pair by its longer unit (the two run side by side)."""
    rows, pos0, kv0, kv1 = (np.asarray(x, np.int64) for x in (rows, pos0, kv0, kv1))
    mode, pos0_b = np.asarray(mode, np.int64), np.asarray(pos0_b, np.int64)

    def blocks(end):
        return -(-np.maximum(end - kv0, 0) // KEY_BLOCK)

    own = blocks(np.minimum(kv1, pos0 + rows))
    pair = np.maximum(own, blocks(pos0_b + 1))      # the second unit: one decode row, unsplit
    tiles = -(-rows * qpk // ATTN_TILE_ROWS)
    return np.where(mode == MODE_PAIR, pair * COST_NS_PAIR_BLOCK,
                    np.where(rows == 1, own * COST_NS_UNIT_BLOCK,
                             tiles * own * COST_NS_TILE_BLOCK))


@dataclass(frozen=True)
class Unit:
    """One attention unit of an instruction: query rows [row0, row0 + rows) of one sequence at
    positions pos0.., keys [kv0, kv1), written directly (mode 0) or as a split (mode 1)."""

    row0: int
    rows: int
    pos0: int
    kv0: int
    kv1: int
    page_off: int
    mode: int


def units(instr: Instruction) -> tuple[Unit, ...]:
    """The instruction's units: one, or two direct decode units for MODE_PAIR."""
    mode = arg(instr, A_MODE)
    first = Unit(instr.row0, instr.rows, arg(instr, A_POS0), arg(instr, A_KV0),
                 arg(instr, A_KV1), arg(instr, A_PAGE_OFF),
                 MODE_DIRECT if mode == MODE_PAIR else mode)
    if mode != MODE_PAIR:
        return (first,)
    pos_b = arg(instr, A_POS0_B)
    return first, Unit(arg(instr, A_ROW0_B), 1, pos_b, arg(instr, A_KV0), pos_b + 1,
                       arg(instr, A_PAGE_OFF_B), MODE_DIRECT)


def kv_cache_rows(meta_tensor: torch.Tensor, layer: int, page_off: int, kv0: int, kv1: int) -> torch.Tensor:
    """K/V cache rows of positions [kv0, kv1) of the sequence whose page table is at page_off."""
    ps = int(meta_tensor[M_PAGE_SIZE])
    pos = torch.arange(kv0, kv1)
    pages = meta_tensor[page_off + pos // ps].long()
    return layer * int(meta_tensor[M_KV_LAYER_STRIDE]) + pages * ps + pos % ps


def _heads(instr: Instruction):
    qpk, D = arg(instr, A_QPK), arg(instr, A_HEAD_DIM)
    h0, h1 = instr.col0 * qpk, (instr.col0 + instr.cols) * qpk
    return qpk, D, h0, h1


@register
class AttentionFamily(InstructionFamily):
    opcodes = (Op.ATTENTION, Op.ATTN_REDUCE)
    ARG_NAMES = {int(Op.ATTENTION): ("seq", "pos0", "kv0", "kv1", "page_off", "mode", "qpk", "D",
                                     "slot", "new0", "row0_b", "pos0_b", "page_off_b", "new0_b"),
                 int(Op.ATTN_REDUCE): ("slot0", "nsplit", "_", "_", "_", "_", "qpk", "D")}

    # accesses ---------------------------------------------------------------------------------
    def accesses(self, instr: Instruction, rank: int, meta=None) -> Accesses:
        r0, r1 = rows_of(instr)
        qpk, D, h0, h1 = _heads(instr)
        if instr.opcode == Op.ATTN_REDUCE:
            s0, ns = arg(instr, A_SLOT0), arg(instr, A_NSPLIT)
            reads = (Region(Buf.ATTN_PARTIAL, s0, s0 + ns * instr.rows, h0 * D, h1 * D, rank),
                     Region(Buf.ATTN_LSE, s0, s0 + ns * instr.rows, h0, h1, rank))
            return Accesses(reads, (Region(Buf.ATTN_OUT, r0, r1, h0 * D, h1 * D, rank),))
        need_meta(meta, Op.ATTENTION)
        kc0, kc1 = instr.col0 * D, (instr.col0 + instr.cols) * D
        reads, writes = [], []
        for u in units(instr):
            kv1 = max(u.kv0, min(u.kv1, u.pos0 + u.rows))      # no key: a split after the rows
            reads.append(Region(Buf.Q, u.row0, u.row0 + u.rows, h0 * D, h1 * D, rank))
            for a, b in runs(kv_cache_rows(meta.tensor, instr.layer, u.page_off, u.kv0,
                                           kv1).tolist()):
                reads += [Region(Buf.K_CACHE, a, b, kc0, kc1, rank),
                          Region(Buf.V_CACHE, a, b, kc0, kc1, rank)]
            if u.mode == MODE_DIRECT:
                writes.append(Region(Buf.ATTN_OUT, u.row0, u.row0 + u.rows, h0 * D, h1 * D, rank))
            else:
                s = arg(instr, A_SLOT)
                writes += [Region(Buf.ATTN_PARTIAL, s, s + u.rows, h0 * D, h1 * D, rank),
                           Region(Buf.ATTN_LSE, s, s + u.rows, h0, h1, rank)]
        return Accesses(tuple(reads), tuple(writes))

    # torch semantics --------------------------------------------------------------------------
    def run_torch(self, instr: Instruction, state) -> None:
        if instr.opcode == Op.ATTN_REDUCE:
            return self._reduce(instr, state)
        for u in units(instr):
            self._unit(instr, u, state)

    def _unit(self, instr: Instruction, u: Unit, state) -> None:
        r0, R = u.row0, u.rows
        r1 = r0 + R
        qpk, D, h0, h1 = _heads(instr)
        pos0, kv0 = u.pos0, u.kv0
        kv1 = min(u.kv1, pos0 + R)
        if kv1 <= kv0 and u.mode == MODE_PARTIAL:
            # a split after every row of the unit (a chunk of a split prompt segment,
            # PlanConfig.attn_chunk_splits): no key, o = 0 and lse = -inf, as the GPU body
            # writes them
            slot = arg(instr, A_SLOT)
            state.buf(Buf.ATTN_PARTIAL)[slot:slot + R, h0 * D:h1 * D].zero_()
            state.buf(Buf.ATTN_LSE)[slot:slot + R, h0:h1].fill_(float("-inf"))
            return
        m = state.meta.tensor
        idx = kv_cache_rows(m, instr.layer, u.page_off, kv0, kv1)
        kc0, kc1 = instr.col0 * D, (instr.col0 + instr.cols) * D
        k = state.buf(Buf.K_CACHE)[idx, kc0:kc1].view(-1, instr.cols, D)
        v = state.buf(Buf.V_CACHE)[idx, kc0:kc1].view(-1, instr.cols, D)
        q = state.buf(Buf.Q)[r0:r1, h0 * D:h1 * D].view(R, h1 - h0, D)
        qh = q.transpose(0, 1)                                        # [heads, R, D]
        kh = k.transpose(0, 1).repeat_interleave(qpk, dim=0)          # [heads, C, D]
        vh = v.transpose(0, 1).repeat_interleave(qpk, dim=0)
        scores = torch.matmul(qh, kh.transpose(1, 2)) * (D ** -0.5)   # model dtype, as reference
        qpos = torch.arange(pos0, pos0 + R, device=scores.device)[:, None]
        kpos = torch.arange(kv0, kv1, device=scores.device)[None, :]
        masked = kpos > qpos                                          # [R, C]
        if u.mode == MODE_DIRECT:
            if bool(masked.any()):
                scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, vh)                             # [heads, R, D]
            state.buf(Buf.ATTN_OUT)[r0:r1, h0 * D:h1 * D].copy_(out.transpose(0, 1).reshape(R, -1))
            return
        s = scores.float().masked_fill(masked, float("-inf"))
        mx = s.amax(dim=-1, keepdim=True)                             # -inf: no key for the row
        mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
        p = torch.exp(s - mx)
        den = p.sum(dim=-1, keepdim=True)
        o = torch.matmul(p, vh.float()) / torch.where(den > 0, den, torch.ones_like(den))
        lse = torch.where(den > 0, mx + torch.log(den), torch.full_like(den, float("-inf")))
        slot = arg(instr, A_SLOT)
        state.buf(Buf.ATTN_PARTIAL)[slot:slot + R, h0 * D:h1 * D].copy_(o.transpose(0, 1).reshape(R, -1))
        state.buf(Buf.ATTN_LSE)[slot:slot + R, h0:h1].copy_(lse[..., 0].transpose(0, 1))

    def _reduce(self, instr: Instruction, state) -> None:
        r0, r1 = rows_of(instr)
        R = r1 - r0
        qpk, D, h0, h1 = _heads(instr)
        s0, ns = arg(instr, A_SLOT0), arg(instr, A_NSPLIT)
        o = state.buf(Buf.ATTN_PARTIAL)[s0:s0 + ns * R, h0 * D:h1 * D].view(ns, R, h1 - h0, D)
        lse = state.buf(Buf.ATTN_LSE)[s0:s0 + ns * R, h0:h1].view(ns, R, h1 - h0)
        mx = lse.amax(dim=0, keepdim=True)
        wgt = torch.exp(lse - mx)                                     # [ns, R, heads]
        out = (wgt[..., None] * o).sum(dim=0) / wgt.sum(dim=0)[..., None]
        dst = state.buf(Buf.ATTN_OUT)
        dst[r0:r1, h0 * D:h1 * D].copy_(out.reshape(R, -1).to(dst.dtype))
