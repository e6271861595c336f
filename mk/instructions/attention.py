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
    by_last = 1 (PlanConfig.attn_combine_pairs): the megakernel runs this reduce in the consumers
        of the split to finish last, not as its own ticket: each split instruction of it (mode 1,
        same row0 / rows / col0 / cols) carries the reduce's signal counter, wait target, slot0
        and nsplit in ARG0 + 10 .. 13; its consumers store their partial rows themselves, then
        add the split's arrival to its own signal counter (the reduce's wait counter) with
        acq_rel, and the ones that bring it to the target combine the splits from the other
        splits' stored partials and their own registers into ATTN_OUT rows, which the storer
        stores before it signals the reduce's counter (a split that is not last signals
        nothing). The controller drops the reduce's ticket.
        The interpreter and the verifier run the reduce as written (the same semantics: it
        waits for every split, then combines and signals); check_last_combines says the split
        words agree with it.

ATTENTION arguments:                       ATTN_REDUCE arguments:
    ARG0 + 0  sequence index                  ARG0 + 0  slot0
    ARG0 + 1  pos0 (position of row0)         ARG0 + 1  nsplit
    ARG0 + 2  kv0                             ARG0 + 2  by_last (0 / 1)
    ARG0 + 3  kv1                             ARG0 + 6  qpk
                                              ARG0 + 7  head_dim
    ARG0 + 4  page table offset (metadata word)
    ARG0 + 5  mode: 0 direct, 1 partial
    ARG0 + 6  qpk: q heads per KV head on this rank
    ARG0 + 7  head_dim
    ARG0 + 8  slot (mode 1): first ATTN_PARTIAL / ATTN_LSE row of this split
    ARG0 + 9  new0: the sequence's first position written by this step (<= pos0; a sequence whose
              rows span several blocks has segments with pos0 > new0). Keys before it come from
              earlier steps, so the megakernel's EARLY_WEIGHTS loader may read them before the
              instruction's waits; 0 = none (the faces ignore it)
    ARG0 + 10 .. 13 (mode 2): the second unit's token row, pos0, page table offset and new0
    ARG0 + 10 .. 13 (mode 1 of a by_last reduce): its signal counter, wait target (its splits'
              arrivals), slot0, nsplit; arrivals 0 = the reduce is its own ticket

The CuTe DSL bodies will live in mk/instructions/attention_kernel.py (GPU path only).
"""

from __future__ import annotations

from dataclasses import dataclass

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
A_COMBINE_SIGNAL = ARG0 + 10  # mode 1, combined by the last split (ATTN_REDUCE by_last): see above
A_COMBINE_ARRIVALS = ARG0 + 11
A_COMBINE_SLOT0 = ARG0 + 12
A_COMBINE_NSPLIT = ARG0 + 13
# ATTN_REDUCE
A_SLOT0 = ARG0
A_NSPLIT = ARG0 + 1
A_BY_LAST = ARG0 + 2

MODE_DIRECT, MODE_PARTIAL, MODE_PAIR = 0, 1, 2
# query rows per M tile of the GPU body (_attention_kernel.MT: two warpgroups x 64): an
# instruction's tiles start at its row0, ATTN_TILE_ROWS // qpk tokens each, so the planner's
# prefill row chunks (PlanConfig.attn_chunk_rows) are whole tiles of the unchunked instruction
ATTN_TILE_ROWS = 128
# a pair's unit is one consumer warpgroup's 64 query rows: its token's q heads of the KV head
PAIR_MAX_QPK = 64
# (row, head) pairs a last-split combine may hold: one decode unit of the swapped chain (a
# token's q heads of one KV head: _attention_kernel.SWAP_ROWS rows on one warpgroup, whose
# registers hold the unit's own partial), so a split instruction of one KV head and one token;
# bigger segments keep their ATTN_REDUCE ticket
COMBINE_MAX_PAIRS = 8
# steps of at most this many tokens get last-split reduces (the planner's by_last): the M class
# the megakernel compiles the combine into (mk.megakernel.attn_combine_for); decode splits come
# in small steps (B <= 32, or B=64 with kv_spread_min_splits=2)
COMBINE_MAX_TOKENS = 64


def combine_built() -> bool:
    """Whether the megakernel is built with the last-split combine (MK_ATTN_COMBINE=1; off by
    default until timed, mk/megakernel.py ATTN_COMBINE). Read from the environment, so the CPU
    side (the backend's refusals) needs no cutlass."""
    import os
    v = os.environ.get("MK_ATTN_COMBINE", "0")
    if v not in ("0", "1"):
        raise ValueError(f"MK_ATTN_COMBINE={v!r}: expected 0 or 1")
    return v == "1"


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
    # ARG0 + 10 .. 13: a pair's second unit (mode 2) or a last-split combine's words (mode 1)
    ARG_NAMES = {int(Op.ATTENTION): ("seq", "pos0", "kv0", "kv1", "page_off", "mode", "qpk", "D",
                                     "slot", "new0", "row0_b|c_sig", "pos0_b|c_arr",
                                     "page_off_b|c_slot0", "new0_b|c_nsplit"),
                 int(Op.ATTN_REDUCE): ("slot0", "nsplit", "by_last", "_", "_", "_", "qpk", "D")}

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
            kv1 = min(u.kv1, u.pos0 + u.rows)
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


def check_last_combines(words) -> list[str]:
    """What is wrong with a stream's last-split combines (int32 words [N, INSTR_WORDS], one rank):
    each ATTN_REDUCE with by_last = 1 has exactly one wait (counter c, target n) in its first wait
    slot, signals by 1, holds at most COMBINE_MAX_PAIRS (row, head) pairs of one KV head (one
    swapped decode unit per split instruction), waits on a counter no
    other such reduce waits on, and exactly n ATTENTION instructions signal c, each by 1, in mode
    1 with the reduce's layer, rows, heads, qpk and head_dim and with its signal counter, n, slot0
    and nsplit in their combine words; no other mode-1 ATTENTION carries combine arrivals. The
    megakernel runs the reduce from those words, so this is what makes the interpreter's and the
    verifier's view of it (the reduce as written) the GPU's. Vectorised (it runs per launch).
    Empty list: consistent."""
    import numpy as np

    from mk.ir import (MAX_WAITS, NO_COUNTER, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0, W_ROWS,
                       W_SIGNAL, W_SIGNAL_COUNT, W_WAIT0)
    w = np.asarray(words, dtype=np.int64)
    if w.size == 0:
        return []
    op = w[:, W_OPCODE]
    red_all = op == int(Op.ATTN_REDUCE)
    out = []
    odd = np.flatnonzero(red_all & (w[:, A_BY_LAST] != 0) & (w[:, A_BY_LAST] != 1))
    if len(odd):
        out.append(f"ATTN_REDUCE #{int(odd[0])}: by_last is {int(w[odd[0], A_BY_LAST])}, not 0 "
                   f"or 1 ({len(odd)} such)")
    red = np.flatnonzero(red_all & (w[:, A_BY_LAST] == 1))
    att = np.flatnonzero((op == int(Op.ATTENTION)) & (w[:, A_MODE] == MODE_PARTIAL))
    r = w[red]
    waits_used = (r[:, W_WAIT0:W_WAIT0 + 2 * MAX_WAITS:2] != NO_COUNTER)
    shape_bad = ((~waits_used[:, 0]) | waits_used[:, 1:].any(axis=1)
                 | (r[:, W_SIGNAL] == NO_COUNTER) | (r[:, W_SIGNAL_COUNT] != 1))
    for k in np.flatnonzero(shape_bad)[:1]:
        out.append(f"ATTN_REDUCE #{int(red[k])}: a last-split combine needs exactly one wait (the "
                   f"first slot) and one signal of 1 ({int(shape_bad.sum())} such)")
    pairs = r[:, W_ROWS] * r[:, W_COLS] * r[:, A_QPK]
    for k in np.flatnonzero((pairs > COMBINE_MAX_PAIRS) | (r[:, W_COLS] != 1))[:1]:
        out.append(f"ATTN_REDUCE #{int(red[k])}: {int(pairs[k])} (row, head) pairs of "
                   f"{int(r[k, W_COLS])} KV heads; a last-split combine holds at most "
                   f"{COMBINE_MAX_PAIRS} of one")
    c, n = r[:, W_WAIT0], r[:, W_WAIT0 + 1]
    order = np.argsort(c, kind="stable")
    cs = c[order]
    dup = np.flatnonzero(cs[1:] == cs[:-1])
    if len(dup):
        out.append(f"ATTN_REDUCE #{int(red[order[dup[0] + 1]])}: waits on counter "
                   f"{int(cs[dup[0]])}, as another last-split combine does")
    # each mode-1 ATTENTION's reduce: the by_last one waiting on its signal counter (or none)
    pos = np.searchsorted(cs, w[att, W_SIGNAL])
    pos_c = np.minimum(pos, max(len(cs) - 1, 0))
    has = (pos < len(cs)) & (cs[pos_c] == w[att, W_SIGNAL]) if len(cs) else np.zeros(len(att), bool)
    stray = att[~has & (w[att, A_COMBINE_ARRIVALS] != 0)]
    if len(stray):
        out.append(f"ATTENTION #{int(stray[0])} carries combine arrivals "
                   f"{int(w[stray[0], A_COMBINE_ARRIVALS])} but no by_last ATTN_REDUCE waits for "
                   f"its signal counter ({len(stray)} such)")
    mine = att[has]
    k_of = order[pos_c[has]]                 # index into red of each combined split
    got = np.bincount(k_of, minlength=len(red))
    short = np.flatnonzero(got != n)
    if len(short):
        k = short[0]
        out.append(f"ATTN_REDUCE #{int(red[k])}: waits for {int(n[k])} arrivals on counter "
                   f"{int(c[k])}, {int(got[k])} ATTENTION instructions signal it")
    rk = r[k_of]
    want = {"layer": (W_LAYER, rk[:, W_LAYER]), "row0": (W_ROW0, rk[:, W_ROW0]),
            "rows": (W_ROWS, rk[:, W_ROWS]), "col0": (W_COL0, rk[:, W_COL0]),
            "cols": (W_COLS, rk[:, W_COLS]), "signal count": (W_SIGNAL_COUNT, 1),
            "qpk": (A_QPK, rk[:, A_QPK]), "head_dim": (A_HEAD_DIM, rk[:, A_HEAD_DIM]),
            "combine signal": (A_COMBINE_SIGNAL, rk[:, W_SIGNAL]),
            "combine arrivals": (A_COMBINE_ARRIVALS, rk[:, W_WAIT0 + 1]),
            "combine slot0": (A_COMBINE_SLOT0, rk[:, A_SLOT0]),
            "combine nsplit": (A_COMBINE_NSPLIT, rk[:, A_NSPLIT])}
    for what, (word, v) in want.items():
        bad = np.flatnonzero(w[mine, word] != v)
        if len(bad):
            j = bad[0]
            exp = int(v if np.ndim(v) == 0 else v[j])
            out.append(f"ATTENTION #{int(mine[j])} (a split of ATTN_REDUCE #{int(red[k_of[j]])}, "
                       f"by its last split): its {what} is {int(w[mine[j], word])}, the reduce's "
                       f"is {exp} ({len(bad)} such)")
    return out
