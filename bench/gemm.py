"""GEMM-tile instructions over whole matrices on one GPU vs torch (cuBLAS) + the same epilogue.

    python bench/gemm.py                       # everything below, one command
    python bench/gemm.py --ops O_PROJ --m 1024 --reps 20
    python bench/gemm.py --check-only          # correctness only (fast)
    python bench/gemm.py --suite --no-compile --bench-m 256,1024,4096
                                               # one process per op: checks in parallel (with
                                               # deadlines), then timing one op at a time

Shapes: one Llama-70B TP8 rank (hidden 8192, intermediate 3584 per rank, 8 q heads + 1 kv head of
128 -> qkv 1280, vocab shard 16032), M (token rows; sequences for LM_HEAD) in {64, 256, 1024, 4096}.
Per (opcode, M):
  1. correctness: fresh random inputs, the output poisoned (NaN; for RESIDUAL the rows past M),
     run over the whole matrix through mk.megakernel (its GEMM slot of the M class: the bodies
     of mk/instructions/_gemm_kernel.py), compared with the opcode's torch face
     (mk.instructions.matmul.GemmFamily.run_torch, instruction by instruction): bf16 relative
     Frobenius error < 1e-2 inside, poison intact outside; plus an odd-M case (rows tail) per op
  2. timing, cold L2 (R buffer sets rotated, R x bytes > 2 x L2), each launch between CUDA events
     behind a GPU sleep (host launch cost hidden), medians:
        mk          mk.megakernel (one persistent launch: the whole GEMM + fused epilogue)
        cublas      torch.matmul alone
        torch       torch.matmul + the epilogue in eager torch (the unfused peer)
        compile     torch.compile of (matmul + epilogue), where it compiles
     ratios mk/torch and mk/compile in the same run (the acceptance: mk <= torch at every shape,
     <= 0.9 x at M >= 1024)
  --split-k auto (the default): each op's tiles cut along K as the step's planner cuts them at
  that M (mk.plan.PlanConfig.split_factors with its defaults: QKV_ROPE and GATE_UP up to 256
  tokens, O_PROJ and DOWN up to 128), each split tile storing a float32 partial and one
  SPLITK_REDUCE per tile finishing it (the epilogue); the check and the timing both run that
  stream. `none`: whole tiles only (the table of sessions 3-11); an integer: that many splits.
Writes bench/results/gemm_<date>.json and a PNG chart next to it; prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mk.config import RopeConfig  # noqa: E402
from mk.instructions.base import Buf  # noqa: E402
from mk.instructions.matmul import GemmFamily  # noqa: E402
from mk.ir import Op, deserialize  # noqa: E402
from mk.provenance import knob_env  # noqa: E402

H, I_LOCAL, QKV, V_LOCAL, D_ATTN = 8192, 3584, 1280, 16032, 1024
MS = (64, 256, 1024, 4096)
OPS = ("QKV_ROPE", "O_PROJ", "GATE_UP", "DOWN", "LM_HEAD")
# op -> (K, weight rows N, output columns, src buffer, dst buffer)
SHAPES = {
    "O_PROJ": (D_ATTN, H, H, Buf.ATTN_OUT, Buf.HIDDEN),
    "GATE_UP": (H, 2 * I_LOCAL, I_LOCAL, Buf.NORMED, Buf.MLP_ACT),
    "DOWN": (I_LOCAL, H, H, Buf.MLP_ACT, Buf.HIDDEN),
    "LM_HEAD": (H, V_LOCAL, V_LOCAL, Buf.LAST_NORMED, Buf.LOGITS),
    "QKV_ROPE": (H, QKV, 1024, Buf.NORMED, Buf.Q),
}
HEAD_DIM = 128
QKV_SECTIONS = [(0, 0, 1024), (1, 1024, 1152), (2, 1152, 1280)]   # q (8 heads), k, v
KV_PER_LAYER = 8192        # K/V cache rows per layer in the bench (num_pages * page_size)
# Llama 3.x RoPE (theta 500000, llama3 scaling x8)
ROPE = RopeConfig(theta=500000.0, scaling_type="llama3", factor=8.0, low_freq_factor=1.0,
                  high_freq_factor=4.0, original_max_position_embeddings=8192)
POISON = float("nan")


try:  # GPU path (imports cutlass); the plan builders need it, the CPU-side helpers do not
    from mk.instructions import _gemm_kernel as gk  # noqa: E402
except ImportError:  # pragma: no cover
    gk = None
from mk.instructions import qkv as qk  # noqa: E402

GROUP_M = 8            # tiles raster: GROUP_M row tiles x all column tiles, then the next group
SPLIT_K = "auto"       # --split-k: "auto" (the planner's factor), "none" or an integer
PLAN = {}              # --plan: PlanConfig fields for "auto" (mk.plan.parse_plan_overrides)


def plan_tiles(op, cfg: gk.TileConfig, m: int, n_out: int, k: int, layer: int = 0,
               src: int = 0, dst: int = 0, signal_base: int | None = 0, group_m: int = GROUP_M):
    """The instructions of one whole GEMM (rows [0, m) x output columns [0, n_out)), in mk.ir
    format with matmul.py's argument words, in grouped raster order (group_m row tiles share each
    weight tile while it is in L2). signal_base: row tile i signals counter signal_base + i (target:
    the number of column tiles), None for no signals. Returns (int32 [n, 32] tensor, n_counters)."""
    from mk.instructions.matmul import A_EPI, A_K, A_SLOT_STRIDE, A_DST, A_SRC
    from mk.ir import ARG0, NUM_ARGS, Instruction, serialize
    mt = -(-m // cfg.bm)
    nt = -(-n_out // cfg.bn)
    epi = int(gk.epi_of(op)) if gk.epi_of(op) != gk.EPI_STORE_F32 else 0
    out = []
    for g0 in range(0, mt, group_m):
        for j in range(nt):
            for i in range(g0, min(mt, g0 + group_m)):
                args = [0] * NUM_ARGS
                args[A_SRC - ARG0], args[A_DST - ARG0], args[A_EPI - ARG0] = src, dst, epi
                args[A_SLOT_STRIDE - ARG0], args[A_K - ARG0] = 0, k
                r0, c0 = i * cfg.bm, j * cfg.bn
                out.append(Instruction(
                    int(op), layer=layer, row0=r0, rows=min(cfg.bm, m - r0), col0=c0,
                    cols=min(cfg.bn, n_out - c0),
                    signal=(-1 if signal_base is None else signal_base + i), args=args))
    return serialize(out), (0 if signal_base is None else signal_base + mt)


def plan_qkv(cfg: gk.TileConfig, m: int, sections, k: int, head_dim: int = 128, layer: int = 0,
             src: int = 0, dst: int = 0, signal_base: int | None = 0, group_m: int = GROUP_M):
    """QKV_ROPE tiles over rows [0, m): sections = [(section, first col, end col)] of the qkv
    output (q, k, v), column tiles of cfg.bn within each section (qkv.py's argument words)."""
    from mk.ir import ARG0, NUM_ARGS, Instruction, serialize
    mt = -(-m // cfg.bm)
    out = []
    for g0 in range(0, mt, group_m):
        for sec, s0, s1 in sections:
            for c0 in range(s0, s1, cfg.bn):
                for i in range(g0, min(mt, g0 + group_m)):
                    args = [0] * NUM_ARGS
                    for word, v in ((qk.A_SRC, src), (qk.A_DST, dst), (qk.A_SECTION, sec),
                                    (qk.A_SEC_COL0, s0), (qk.A_HEAD_DIM, head_dim), (qk.A_K, k)):
                        args[word - ARG0] = v
                    r0 = i * cfg.bm
                    out.append(Instruction(
                        int(Op.QKV_ROPE), layer=layer, row0=r0, rows=min(cfg.bm, m - r0), col0=c0,
                        cols=min(cfg.bn, s1 - c0),
                        signal=(-1 if signal_base is None else signal_base + i), args=args))
    return serialize(out), (0 if signal_base is None else signal_base + mt)


def unsplit_plan(op: str, m: int, layer: int = 1):
    """(tile config, unsplit instructions, counters used) of op's whole matrix at M = m on the
    table's tile, reading and writing SHAPES' buffers (plan_qkv for QKV_ROPE, plan_tiles
    otherwise)."""
    K, _, NO, src, dst = SHAPES[op]
    cfg = gk.choose_tile(Op[op], m)
    if op == "QKV_ROPE":
        return (cfg, *plan_qkv(cfg, m, QKV_SECTIONS, K, HEAD_DIM, layer=layer, src=int(src),
                               dst=int(dst)))
    return (cfg, *plan_tiles(Op[op], cfg, m, NO, K, layer=layer, src=int(src), dst=int(dst)))


def split_stream(instrs: torch.Tensor, nsplit: int, stride: int, ctr0: int, up_col: int = 0,
                 k_bounds=None, reduce_rows=0):
    """Each unsplit GEMM tile of `instrs` -> nsplit split tiles (K slices k_bounds [nsplit + 1],
    default near-equal multiples of 64, like mk.plan) signalling a new counter ctr0 + i, then
    (after every split tile of the stream) its SPLITK_REDUCE waiting for them (target nsplit)
    and sending the unsplit tile's signal: one per tile, or with reduce_rows > 0 (an int, or
    {tile row0: rows}) one per slice of at most that many of the tile's rows, tile by tile
    (mk.plan's row slices). Uneven slices (a short last one, the planner's uneven_split) queue
    every tile's last slice after all the others, as mk.plan does. Returns (int32 [n, 32]
    stream, counters used)."""
    import mk.instructions._common as mc
    from mk.instructions import matmul as mm
    from mk.instructions import splitk as sk
    from mk.ir import ARG0, Instruction, serialize
    from mk.plan import PlanConfig
    splits, reduces = [], []
    for i, u in enumerate(deserialize(instrs.cpu())):
        kw = qk.A_K if u.opcode == int(Op.QKV_ROPE) else mm.A_K
        K = u.args[kw - ARG0]
        assert K // 64 >= nsplit, (K, nsplit)
        b = [int(v) for v in (PlanConfig().k_slices(K, nsplit) if k_bounds is None
                              else k_bounds)]                    # the planner's K slices
        for j in range(nsplit):
            args = list(u.args)
            args[kw - ARG0] = b[j + 1] - b[j]
            args[mc.A_NSPLIT - ARG0], args[mc.A_SPLIT_J - ARG0] = nsplit, j
            args[mc.A_K0 - ARG0], args[mc.A_SPLIT_ROW - ARG0] = b[j], stride
            if u.opcode == int(Op.GATE_UP):
                args[mm.A_UP_COL - ARG0] = up_col
            splits.append(Instruction(u.opcode, layer=u.layer, row0=u.row0, rows=u.rows,
                                      col0=u.col0, cols=u.cols, waits=list(u.waits),
                                      signal=ctr0 + i, args=args))
        unsplit = {ARG0 + k: v for k, v in enumerate(u.args)}
        if u.opcode == int(Op.GATE_UP):
            unsplit[mm.A_UP_COL] = up_col
        words = sk.reduce_words(u.opcode, nsplit, stride, unsplit)
        args = [0] * len(u.args)
        for w, v in words.items():
            args[w - ARG0] = v
        h = (reduce_rows.get(u.row0, 0) if isinstance(reduce_rows, dict) else reduce_rows) \
            or u.rows
        for r0 in range(u.row0, u.row0 + u.rows, h):
            reduces.append(Instruction(int(Op.SPLITK_REDUCE), layer=u.layer, row0=r0,
                                       rows=min(h, u.row0 + u.rows - r0), col0=u.col0,
                                       cols=u.cols, waits=[(ctr0 + i, nsplit)], signal=u.signal,
                                       signal_count=u.signal_count, args=list(args)))
    widths = [int(k_bounds[j + 1] - k_bounds[j]) for j in range(nsplit)] if k_bounds is not None \
        else []
    if widths and len(set(widths[:-1])) == 1 and widths[-1] < widths[0]:
        splits = ([s for i, s in enumerate(splits) if i % nsplit != nsplit - 1]
                  + splits[nsplit - 1::nsplit])
    return serialize(splits + reduces), ctr0 + len(instrs)


def nsplit_for(op: str, m: int, ntiles: int, split=None, sms: int | None = None) -> int:
    """The K splits of op's ntiles tiles at M = m: split (default SPLIT_K) "none" -> 1, an
    integer -> itself, "auto" -> mk.plan.PlanConfig.split_factors (the backend's split_k 0, sms SMs,
    default this GPU's): the factor the step's planner would give op in a step of m tokens."""
    split = SPLIT_K if split is None else split
    if op == "LM_HEAD" or split == "none":
        return 1
    if split != "auto":
        return int(split)
    sms = sms or torch.cuda.get_device_properties(0).multi_processor_count
    o = Op[op]
    return auto_plan(sms).split_factors(m, {o: ntiles}, {o: SHAPES[op][0]})[o]


def auto_plan(sms: int):
    """The PlanConfig whose split-K the "auto" rows follow: split_k=0 (auto, as the megakernel
    backend plans, mk.megakernel_step) on sms SMs, with --plan's fields."""
    from mk.plan import PlanConfig
    return PlanConfig(split_k=0, num_sms=sms, **PLAN)


def step_reduce_rows(op: str, m: int, instrs: torch.Tensor, nsplit: int, sms: int) -> dict:
    """{row tile's row0: rows per SPLITK_REDUCE slice (0: the whole tile)} of op's split tiles
    `instrs` (unsplit, one row tile a token block, as the step's rows family) as the step's
    planner would cut them in a step of m tokens on sms SMs (PlanConfig.reduce_slice_rows)."""
    tiles = deserialize(instrs.cpu())
    block_rows = dict(sorted({u.row0: u.rows for u in tiles}.items()))
    rows = auto_plan(sms).reduce_slice_rows(Op[op], m, list(block_rows.values()),
                                            len(tiles) // len(block_rows), nsplit)
    return {r0: int(h) for r0, h in zip(block_rows, rows)}


def split_plan(op: str, m: int, instrs: torch.Tensor, nctr: int, T: int, split=None):
    """(stream, nsplit, SPLITK workspace or None): instrs cut into split tiles + reduces where
    nsplit_for says so (the workspace: nsplit x T float32 rows of the op's partial width,
    poisoned), else instrs unchanged."""
    ns = nsplit_for(op, m, int(instrs.shape[0]), split)
    if ns < 2:
        return instrs, 1, None
    K, N, NO, _, _ = SHAPES[op]
    up = N // 2 if op == "GATE_UP" else 0
    width = 2 * up if op == "GATE_UP" else (QKV if op == "QKV_ROPE" else NO)
    k_bounds = None                 # a forced factor: near-equal slices, whole-tile reduces
    reduce_rows = 0
    if (SPLIT_K if split is None else split) == "auto":
        # the planner's slices for its factor (uneven ones above 256 tokens: QKV_ROPE at 1024)
        # and its reduces' row slices
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        k_bounds = auto_plan(sms).op_k_slices(m, int(instrs.shape[0]), K, ns)
        reduce_rows = step_reduce_rows(op, m, instrs, ns, sms)
    stream, _ = split_stream(instrs, ns, T, nctr, up, k_bounds, reduce_rows)
    sk = torch.full((ns * T, width), POISON, dtype=torch.float32, device="cuda")
    return stream, ns, sk


def tile_name(cfg, nsplit: int) -> str:
    return cfg.name if nsplit < 2 else f"{cfg.name}/k{nsplit}"


# ------------------------------------------------------------------------------------- runner
class MkGemm:
    """One opcode's whole-matrix plans through mk.megakernel (the GEMM slot of M class m; a
    small dummy rows arena): h.launch(h.prepare(instrs, x, w, y[, meta, invf, kv])),
    h.launcher(prepared), h.check()."""

    _dummy = None

    def __init__(self, op, m: int, timeout_s: float = 2.0):
        self.op, self.m, self.timeout_s = Op(op), m, timeout_s
        self.last = None

    def prepare(self, instrs, x, w, y, meta=None, inv_freq=None, kv=None, splitk=None):
        """splitk: the SPLITK workspace of a split stream (split_plan), else None."""
        import mk.megakernel as M
        if MkGemm._dummy is None:
            MkGemm._dummy = (torch.zeros(3, 64, 1024, dtype=torch.bfloat16, device="cuda"),
                             torch.zeros(3, 1024, dtype=torch.bfloat16, device="cuda"))
        arena, normw = MkGemm._dummy
        _, _, _, src, dst = SHAPES[self.op.name]
        g = M.GemmOperands(x, w, y, int(src), int(dst))
        mkk = M.Megakernel(arena, normw, 1, 1e-5, timeout_s=self.timeout_s, verbose=False,
                           gemm={self.op: g}, gemm_m=self.m, meta=meta, inv_freq=inv_freq, kv=kv,
                           splitk=splitk)
        self.last = mkk
        return mkk, mkk.prepare(instrs)

    def launcher(self, prepared):
        mkk, p = prepared
        return mkk.launcher(p)

    def launch(self, prepared, hang_s: float = 20.0):
        mkk, p = prepared
        mkk.launch(p, check=False)
        mkk.wait(hang_s)
        mkk.check()

    def check(self):
        if self.last is not None:
            self.last.check()


# ------------------------------------------------------------------------------------- problems
def make_problem(op: str, m: int, extra_rows: int = 64, seed: int = 0):
    """Fresh random x [m + extra, K], w [L=2, N, K] (or [N, K] for LM_HEAD), y (poisoned)."""
    K, N, NO, _, _ = SHAPES[op]
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = m + extra_rows
    x = torch.randn(T, K, device="cuda", generator=g).bfloat16()
    if op == "LM_HEAD":
        w = (torch.randn(N, K, device="cuda", generator=g) / math.sqrt(K)).bfloat16()
    else:
        w = (torch.randn(2, N, K, device="cuda", generator=g) / math.sqrt(K)).bfloat16()
    if op == "LM_HEAD":
        y = torch.full((T, NO), POISON, device="cuda", dtype=torch.float32)
    elif op in ("O_PROJ", "DOWN"):
        y = torch.randn(T, NO, device="cuda", generator=g).bfloat16()
        y[m:] = POISON
    else:
        y = torch.full((T, NO), POISON, device="cuda", dtype=torch.bfloat16)
    return x, w, y


def face_weights(op: str, w):
    ns = types.SimpleNamespace()
    if op == "O_PROJ":
        ns.o = w
    elif op == "DOWN":
        ns.down = w
    elif op == "GATE_UP":
        ns.gate_up = w
    elif op == "LM_HEAD":
        ns.lm_head = w
    return ns


class FaceState:
    """What GemmFamily.run_torch sees: .buf(id), .weights, .rank."""

    def __init__(self, bufs, weights):
        self.bufs, self.weights, self.rank = bufs, weights, 0

    def buf(self, i, rank=None):
        return self.bufs[int(i)]


def run_face(op: str, instrs, x, w, y):
    K, N, NO, src, dst = SHAPES[op]
    out = y.clone()
    st = FaceState({src: x, dst: out}, face_weights(op, w))
    fam = GemmFamily()
    for ins in deserialize(instrs.cpu()):
        fam.run_torch(ins, st)
    return out


def make_qkv_problem(m: int, extra_rows: int = 64, seed: int = 0, layers: int = 2):
    """x, w [L, 1280, K], Q (poisoned), kv [2, L*KV_PER_LAYER, 128] (poisoned), meta, inv_freq."""
    from mk.instructions import _common as mc
    from mk.instructions.qkv import inv_freq
    K = H
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = m + extra_rows
    x = torch.randn(T, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(layers, QKV, K, device="cuda", generator=g) / math.sqrt(K)).bfloat16()
    q = torch.full((T, 1024), POISON, device="cuda", dtype=torch.bfloat16)
    kv = torch.full((2, layers * KV_PER_LAYER, HEAD_DIM), POISON, device="cuda",
                    dtype=torch.bfloat16)
    pos = torch.randint(0, 100_000, (T,), device="cuda", generator=g, dtype=torch.int32)
    slot = torch.randperm(KV_PER_LAYER, device="cuda", generator=g)[:T].int()
    meta = torch.zeros(mc.META_HEADER + 2 * T, dtype=torch.int32, device="cuda")
    meta[mc.M_NUM_TOKENS] = T
    meta[mc.M_OFF_POS] = mc.META_HEADER
    meta[mc.M_OFF_SLOT] = mc.META_HEADER + T
    meta[mc.M_KV_LAYER_STRIDE] = KV_PER_LAYER
    meta[mc.META_HEADER:mc.META_HEADER + T] = pos
    meta[mc.META_HEADER + T:] = slot
    invf = inv_freq(HEAD_DIM, ROPE).float().cuda()
    return x, w, q, kv, meta, invf


def run_qkv_face(instrs, x, w, q, kv, meta):
    from mk.instructions.qkv import QkvFamily
    qo, kvo = q.clone(), kv.clone()
    st = FaceState({Buf.NORMED: x, Buf.Q: qo, Buf.K_CACHE: kvo[0], Buf.V_CACHE: kvo[1]},
                   types.SimpleNamespace(qkv=w, config=types.SimpleNamespace(rope=ROPE)))
    st.meta = types.SimpleNamespace(tensor=meta)
    import mk.instructions.qkv as qkv_mod
    orig = qkv_mod.inv_freq
    qkv_mod.inv_freq = lambda d, rope: orig(d, rope).to(meta.device)   # the face on the GPU
    try:
        fam = QkvFamily()
        for ins in deserialize(instrs.cpu()):
            fam.run_torch(ins, st)
    finally:
        qkv_mod.inv_freq = orig
    return qo, kvo


def check_qkv(m: int, layer: int = 1, seed: int = 0):
    x, w, q, kv, meta, invf = make_qkv_problem(m, seed=seed)
    cfg, unsplit, nctr = unsplit_plan("QKV_ROPE", m, layer)
    # the oracle: the unsplit tiles' faces (a split stream must match them within bf16 rounding)
    rq, rkv = run_qkv_face(unsplit, x, w, q, kv, meta)
    instrs, ns, sk = split_plan("QKV_ROPE", m, unsplit, nctr, x.shape[0])
    h = MkGemm(Op.QKV_ROPE, m)
    h.launch(h.prepare(instrs, x, w, q, meta, invf, kv, sk))
    torch.cuda.synchronize()
    written = ~torch.isnan(rkv)
    eq = rel_err(q[:m], rq[:m])
    ekv = rel_err(kv[written], rkv[written])
    finite = bool(torch.isfinite(q[:m]).all()) and bool(torch.isfinite(kv[written]).all())
    poison_ok = bool(torch.isnan(q[m:]).all()) and bool(torch.isnan(kv[~written]).all())
    ok = finite and poison_ok and eq < 1e-2 and ekv < 1e-2
    res = dict(op="QKV_ROPE", m=m, tile=tile_name(cfg, ns), nsplit=ns, rel_err=max(eq, ekv),
               rel_err_q=eq,
               rel_err_kv=ekv, finite=finite, poison_intact=poison_ok, ok=ok,
               n_instr=int(instrs.shape[0]))
    if not ok:
        from mk.instructions import _common as mc
        T = int(meta[mc.M_NUM_TOKENS])
        rows = meta[mc.META_HEADER + T:mc.META_HEADER + T + m].long() + layer * KV_PER_LAYER
        res["diag_q"] = diagnose(q[:m], rq[:m], cfg.bm, cfg.bn)
        res["diag_k"] = diagnose(kv[0, rows], rkv[0, rows], cfg.bm, 128)
        res["diag_v"] = diagnose(kv[1, rows], rkv[1, rows], cfg.bm, 128)
        res["kv_written_by_kernel_outside_face_rows"] = int((~torch.isnan(kv) & ~written).sum())
    return res


def qkv_torch_fn(m, layer=1):
    """matmul + RoPE (qkv.py's formulas) + Q copy + K/V scatter, eager torch (the unfused peer)."""
    from mk.instructions.qkv import apply_rope, rope_cos_sin

    def f(x, w, q, kv, pos, slot, invf):
        y = torch.matmul(x, w.t())
        cos, sin = rope_cos_sin(pos, invf, y.dtype)
        qq = apply_rope(y[:, :1024].view(m, 8, HEAD_DIM), cos, sin).reshape(m, 1024)
        kk = apply_rope(y[:, 1024:1152].view(m, 1, HEAD_DIM), cos, sin).reshape(m, HEAD_DIM)
        q[:m].copy_(qq)
        rows = slot.long() + layer * KV_PER_LAYER
        kv[0].index_copy_(0, rows, kk)
        kv[1].index_copy_(0, rows, y[:, 1152:1280])
    return f


def bench_qkv(m: int, reps: int, l2_bytes: int, do_compile: bool):
    set_bytes = 2 * QKV * H * 2 + (m + 64) * H * 2
    R = min(16, max(2, math.ceil(3 * l2_bytes / set_bytes)))
    sets = [make_qkv_problem(m, seed=100 + i) for i in range(R)]
    cfg, unsplit, nctr = unsplit_plan("QKV_ROPE", m, 1)
    instrs, ns, sk = split_plan("QKV_ROPE", m, unsplit, nctr, m + 64)
    h = MkGemm(Op.QKV_ROPE, m)
    mk_us, _ = time_rotating([h.launcher(h.prepare(instrs, x, w, q, meta, invf, kv, sk))
                              for x, w, q, kv, meta, invf in sets], reps)
    h.check()
    from mk.instructions import _common as mc
    f = qkv_torch_fn(m)

    def args(st):
        x, w, q, kv, meta, invf = st
        T = meta[mc.M_NUM_TOKENS].item()
        pos = meta[mc.META_HEADER:mc.META_HEADER + m]
        slot = meta[mc.META_HEADER + T:mc.META_HEADER + T + m]
        return x[:m], w[1], q, kv, pos, slot, invf
    argl = [args(st) for st in sets]
    cub_us, _ = time_rotating([(lambda a=a: torch.matmul(a[0], a[1].t())) for a in argl], reps)
    torch_us, _ = time_rotating([(lambda a=a: f(*a)) for a in argl], reps)
    comp_us, comp_err, comp_rel = None, None, None
    if do_compile:
        try:
            fc = torch.compile(f, dynamic=False)
            a0 = argl[0]
            # the rows both peers write: q's first m, and the K / V cache rows of the m slots
            rows = a0[5].long() + KV_PER_LAYER
            q, kv = a0[2], a0[3]

            def poison():
                q[:m].fill_(float("nan"))
                for half in kv:
                    half.index_fill_(0, rows, float("nan"))
            comp_rel = compile_peer_check(
                lambda: fc(*a0), lambda: f(*a0),
                lambda: [q[:m], kv[0].index_select(0, rows), kv[1].index_select(0, rows)],
                poison)
            comp_us, _ = time_rotating([(lambda a=a: fc(*a)) for a in argl], reps, warm=3)
        except Exception as e:  # noqa: BLE001
            comp_err = f"{type(e).__name__}: {str(e)[:200]}"
        comp_us, comp_err = compile_peer_result(comp_rel, comp_us, comp_err)
    flops = 2.0 * m * QKV * H
    return dict(op="QKV_ROPE", m=m, n=QKV, k=H, tile=tile_name(cfg, ns), nsplit=ns,
                n_instr=int(instrs.shape[0]),
                buffer_sets=R, mk_us=mk_us, cublas_us=cub_us, torch_us=torch_us,
                compile_us=comp_us, compile_error=comp_err, compile_rel_err=comp_rel,
                mk_tflops=flops / mk_us / 1e6,
                cublas_tflops=flops / cub_us / 1e6, ratio_vs_torch=mk_us / torch_us,
                ratio_vs_cublas=mk_us / cub_us,
                ratio_vs_compile=(mk_us / comp_us) if comp_us else None)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def diagnose(got, ref, tile_bm: int = 128, tile_bn: int = 128) -> dict:
    """Where a wrong [m, n] output differs from the face (for a failed check; CPU-side reading):
    NaN count, bad rows/cols (first few, and as residues mod the tile shape), whether the values of
    a bad row are a permutation of the face's (fragment mapping) and the error of the worst tile."""
    g, r = got.float(), ref.float()
    m, n = r.shape
    err = (g - r).abs()
    tol = 1e-2 * r.abs().clamp_min(r.abs().mean())
    bad = ~(err <= tol)                       # NaN counts as bad
    out = dict(nan=int(torch.isnan(g).sum()), bad_frac=float(bad.float().mean()))
    if not bool(bad.any()):
        return out
    brow = bad.any(1).nonzero().flatten()
    bcol = bad.any(0).nonzero().flatten()
    out.update(bad_rows=int(brow.numel()), bad_cols=int(bcol.numel()),
               first_bad_rows=brow[:12].tolist(), first_bad_cols=bcol[:12].tolist(),
               bad_row_residues=sorted(set((brow % tile_bm).tolist()))[:64],
               bad_col_residues=sorted(set((bcol % tile_bn).tolist()))[:128])
    i = int(brow[0])
    a, b = g[i].nan_to_num(0.0).sort().values, r[i].sort().values
    out["row_is_permutation"] = bool(((a - b).abs() <= 2e-2 * b.abs().clamp_min(1e-3)).all())
    mt, nt = -(-m // tile_bm), -(-n // tile_bn)
    terr = torch.zeros(mt, nt)
    for ti in range(mt):
        for tj in range(nt):
            blk = bad[ti * tile_bm:(ti + 1) * tile_bm, tj * tile_bn:(tj + 1) * tile_bn]
            terr[ti, tj] = blk.float().mean()
    out["bad_tiles"] = int((terr > 0).sum())
    out["tiles"] = int(terr.numel())
    bi = (terr > 0).nonzero()[:8].tolist()
    out["first_bad_tiles"] = bi
    # a few (row, col, got, ref) samples
    idx = bad.nonzero()[:6].tolist()
    out["samples"] = [(a_, b_, float(g[a_, b_]), float(r[a_, b_])) for a_, b_ in idx]
    return out


def check_case(op: str, m: int, layer: int = 1, seed: int = 0):
    if op == "QKV_ROPE":
        return check_qkv(m, layer, seed)
    x, w, y = make_problem(op, m, seed=seed)
    cfg, unsplit, nctr = unsplit_plan(op, m, 0 if op == "LM_HEAD" else layer)
    # the oracle: the unsplit tiles' faces (a split stream must match them within bf16 rounding)
    ref = run_face(op, unsplit, x, w, y)
    instrs, ns, sk = split_plan(op, m, unsplit, nctr, x.shape[0])
    h = MkGemm(Op[op], m)
    h.launch(h.prepare(instrs, x, w, y, splitk=sk))
    torch.cuda.synchronize()
    inside = rel_err(y[:m], ref[:m])
    finite = bool(torch.isfinite(y[:m]).all())
    poison_ok = bool(torch.isnan(y[m:]).all())
    ok = finite and poison_ok and inside < 1e-2
    res = dict(op=op, m=m, tile=tile_name(cfg, ns), nsplit=ns, rel_err=inside, finite=finite,
               poison_intact=poison_ok, ok=ok, n_instr=int(instrs.shape[0]))
    if not ok:
        res["diag"] = diagnose(y[:m], ref[:m], cfg.bm, cfg.bn)
        if op in ("O_PROJ", "DOWN"):
            # the residual alone: is y - y0 == the GEMM (then only the residual add is wrong)?
            y0 = make_problem(op, m, seed=seed)[2]
            prod = (ref[:m].float() - y0[:m].float())
            res["rel_err_minus_residual"] = rel_err(y[:m].float() - y0[:m].float(), prod)
    return res


# ------------------------------------------------------------------------------------- timing
def gpu_sleep_cycles():
    # ~2 ms at 1.98 GHz: covers the host's enqueue of event + launch + event. The megakernel's
    # Python launcher (DLPack views of ~30 arguments) takes far more than the 0.1 ms this was: the
    # first run through mk.megakernel timed host gaps (O_PROJ M=4096 "745 us" against a 155 us
    # kernel in its own journal; bench/results/gemm_megakernel_2026-11-29.log)
    return int(os.environ.get("MK_BENCH_SLEEP_CYCLES", 4e6))


def time_rotating(fns, reps: int, warm: int = 2):
    """fns: list of no-arg callables (one per buffer set), rotated; median GPU us per call."""
    for i in range(warm * len(fns)):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    ts = []
    for r in range(reps):
        fn = fns[r % len(fns)]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(gpu_sleep_cycles())
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    ts.sort()
    return ts[len(ts) // 2], ts


def torch_fns(op: str, x, w, y, m: int):
    """(cublas-only, matmul + eager epilogue) for one buffer set; same math as the fused body."""
    xm = x[:m]
    if op == "LM_HEAD":
        wt = w
        cub = lambda: torch.matmul(xm, wt.t())                         # noqa: E731
        eager = lambda: y[:m].copy_(torch.matmul(xm, wt.t()).float())  # noqa: E731
    elif op == "GATE_UP":
        wt = w[1]
        cub = lambda: torch.matmul(xm, wt.t())                         # noqa: E731

        def eager():
            gu = torch.matmul(xm, wt.t())
            g, u = gu.split(I_LOCAL, dim=1)
            y[:m].copy_(F.silu(g) * u)
    else:
        wt = w[1]
        cub = lambda: torch.matmul(xm, wt.t())                         # noqa: E731
        eager = lambda: y[:m].add_(torch.matmul(xm, wt.t()))          # noqa: E731
    return cub, eager


def epilogue_fn(op: str):
    """The torch.compile peer's function of op (matmul + the epilogue, returning the output; the
    inputs: x, w and, for O_PROJ / DOWN, the residual r), uncompiled."""
    if op == "LM_HEAD":
        def f(x, w):
            return torch.matmul(x, w.t()).float()
    elif op == "GATE_UP":
        def f(x, w):
            g, u = torch.matmul(x, w.t()).split(I_LOCAL, dim=1)
            return F.silu(g) * u
    else:
        def f(x, w, r):
            return r + torch.matmul(x, w.t())
    return f


def compiled_fn(op: str):
    return torch.compile(epilogue_fn(op), dynamic=False)


# the torch.compile peer is timed only if its output matches eager torch's (bf16 relative error)
COMPILE_TOL = 1e-2


def compile_peer_check(run_compiled, run_eager, outputs=None, poison=None) -> float:
    """The compiled peer against the eager one on one buffer set; returns the worst relative
    error (inf where the compiled peer left poison). Without `outputs` run_compiled / run_eager
    return their result tensors. With it (a callable returning the tensors both peers write, or
    copies of them) run_eager() writes them, they are copied, poison() fills them with NaN in
    place, and run_compiled() writes them again."""
    if outputs is None:
        ref, got = [run_eager()], [run_compiled()]
    else:
        run_eager()
        ref = [b.clone() for b in outputs()]
        poison()
        run_compiled()
        got = outputs()
    worst = 0.0
    for g, r in zip(got, ref):
        if torch.isnan(g.float()).any() and not torch.isnan(r.float()).any():
            return float("inf")
        worst = max(worst, rel_err(g, r))
    return worst


def compile_peer_result(rel: float, us: float | None, err: str | None):
    """(compile_us, compile_error) of a checked peer: no time where it failed its check."""
    if err is None and not rel <= COMPILE_TOL:
        return None, f"torch.compile output differs from eager torch: rel_err {rel:.3g}"
    return us, err


def bench_case(op: str, m: int, reps: int, l2_bytes: int, do_compile: bool):
    if op == "QKV_ROPE":
        return bench_qkv(m, reps, l2_bytes, do_compile)
    K, N, NO, _, _ = SHAPES[op]
    wbytes = N * K * 2 * (1 if op == "LM_HEAD" else 2)
    set_bytes = wbytes + (m + 64) * (K * 2 + NO * 4)
    R = max(2, math.ceil(3 * l2_bytes / set_bytes))
    R = min(R, 16)
    sets = [make_problem(op, m, seed=100 + i) for i in range(R)]
    for _, _, y in sets:
        y.nan_to_num_(0.0)
    cfg, unsplit, nctr = unsplit_plan(op, m, 0 if op == "LM_HEAD" else 1)
    instrs, ns, sk = split_plan(op, m, unsplit, nctr, m + 64)
    h = MkGemm(Op[op], m)
    mk_fns = [h.launcher(h.prepare(instrs, x, w, y, splitk=sk)) for x, w, y in sets]
    mk_us, _ = time_rotating(mk_fns, reps)
    h.check()
    pairs = [torch_fns(op, x, w, y, m) for x, w, y in sets]
    cub_us, _ = time_rotating([p[0] for p in pairs], reps)
    torch_us, _ = time_rotating([p[1] for p in pairs], reps)
    comp_us, comp_err, comp_rel = None, None, None
    if do_compile:
        try:
            f, f_eager = compiled_fn(op), epilogue_fn(op)
            if op in ("O_PROJ", "DOWN"):
                cargs = [(x[:m], w[1], y[:m]) for x, w, y in sets]
            elif op == "GATE_UP":
                cargs = [(x[:m], w[1]) for x, w, _ in sets]
            else:
                cargs = [(x[:m], w) for x, w, _ in sets]
            comp_rel = compile_peer_check(lambda: f(*cargs[0]), lambda: f_eager(*cargs[0]))
            comp_us, _ = time_rotating([(lambda a=a: f(*a)) for a in cargs], reps, warm=3)
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            comp_err = f"{type(e).__name__}: {str(e)[:200]}"
        comp_us, comp_err = compile_peer_result(comp_rel, comp_us, comp_err)
    flops = 2.0 * m * N * K
    row = dict(op=op, m=m, n=N, k=K, tile=tile_name(cfg, ns), nsplit=ns,
               n_instr=int(instrs.shape[0]), buffer_sets=R,
               mk_us=mk_us, cublas_us=cub_us, torch_us=torch_us, compile_us=comp_us,
               compile_error=comp_err, compile_rel_err=comp_rel,
               mk_tflops=flops / mk_us / 1e6, cublas_tflops=flops / cub_us / 1e6,
               ratio_vs_torch=mk_us / torch_us, ratio_vs_cublas=mk_us / cub_us,
               ratio_vs_compile=(mk_us / comp_us) if comp_us else None)
    del sets, mk_fns, pairs
    torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------------- output
def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart")
        return None
    rows = [r for r in rows if r.get("mk_us")]
    if not rows:
        return None
    labels = [f"{r['op']}\nM={r['m']}" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(rows)), 4.5))
    wdt = 0.38
    ax.bar([i - wdt / 2 for i in xs], [r["ratio_vs_torch"] for r in rows], wdt,
           label="mk / (cuBLAS + eager epilogue)")
    if any(r.get("ratio_vs_compile") for r in rows):
        ax.bar([i + wdt / 2 for i in xs], [r["ratio_vs_compile"] or 0 for r in rows], wdt,
               label="mk / torch.compile")
    else:
        ax.bar([i + wdt / 2 for i in xs], [r["ratio_vs_cublas"] for r in rows], wdt,
               label="mk / cuBLAS matmul alone")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.9, color="g", lw=0.8, ls="--", label="target at M >= 1024")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("time ratio (lower is better)")
    ax.set_title("GEMM-tile instructions (Llama-70B TP8 rank shapes), median, cold L2")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def table(rows):
    hdr = (f"{'op':8s} {'M':>5s} {'tile':13s} {'mk us':>9s} {'cuBLAS':>9s} {'+epi':>9s} "
           f"{'compile':>9s} {'mk/torch':>8s} {'mk/cuBL':>8s} {'mk/comp':>8s} {'mk TF/s':>8s} "
           f"{'cuBL TF/s':>9s}")
    out = [hdr]
    for r in rows:
        if "mk_us" not in r:
            out.append(f"{r['op']:8s} {str(r['m']):>5s} ERROR {r.get('error', '')[:120]}")
            continue
        cu = f"{r['compile_us']:9.1f}" if r["compile_us"] else f"{'-':>9s}"
        rc = f"{r['ratio_vs_compile']:8.2f}" if r["ratio_vs_compile"] else f"{'-':>8s}"
        out.append(f"{r['op']:8s} {r['m']:5d} {r['tile']:13s} {r['mk_us']:9.1f} {r['cublas_us']:9.1f} "
                   f"{r['torch_us']:9.1f} {cu} {r['ratio_vs_torch']:8.2f} {r['ratio_vs_cublas']:8.2f} {rc} "
                   f"{r['mk_tflops']:8.0f} {r['cublas_tflops']:9.0f}")
    for r in rows:
        if r.get("compile_error"):
            out.append(f"  torch.compile peer, {r['op']} M={r['m']}: {r['compile_error']}")
    return "\n".join(out)


def _commit():
    try:
        return os.environ.get("MK_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


def _print_check(c):
    extra = c.get("error", "")
    if not c["ok"] and "diag" in c:
        extra += f" diag={json.dumps(c['diag'])[:600]}"
    if not c["ok"] and "diag_q" in c:
        extra += (f" q={json.dumps(c['diag_q'])[:300]} k={json.dumps(c['diag_k'])[:300]}"
                  f" v={json.dumps(c['diag_v'])[:300]}")
    print(f"[check] {c['op']:8s} M={c['m']:5d} {c.get('tile', '?'):13s} "
          f"rel_err={c.get('rel_err', float('nan')):.2e} poison_intact={c.get('poison_intact')} "
          f"-> {'PASS' if c['ok'] else 'FAIL'} {extra}", flush=True)


def run_checks(op: str, ms, partial=None):
    """partial(list): called after each case (the child keeps its results across a later hang)."""
    out = []
    for m in ms:
        print(f"[start] {op} M={m}", flush=True)
        t0 = time.time()
        try:
            c = check_case(op, m, seed=m)
        except Exception as e:  # noqa: BLE001 - recorded; the run goes on
            c = dict(op=op, m=m, ok=False, error=f"{type(e).__name__}: {e}",
                     trace=traceback.format_exc()[-2000:])
        c["wall_s"] = round(time.time() - t0, 2)
        out.append(c)
        _print_check(c)
        if partial:
            partial(out)
        if "MegakernelHang" in c.get("error", "") or "launch failure" in c.get("error", "") or \
                "illegal" in c.get("error", "").lower():
            # the context is gone (or a kernel still runs): later cases would only repeat this
            for m2 in ms[ms.index(m) + 1:]:
                out.append(dict(op=op, m=m2, ok=False, error="skipped: earlier case broke the "
                                                              "CUDA context"))
            if partial:
                partial(out)
                sys.stdout.flush()
                os._exit(3)
            break
    return out


def run_bench(op: str, ms, reps: int, l2: int, do_compile: bool, partial=None):
    rows = []
    for m in ms:
        try:
            r = bench_case(op, m, reps, l2, do_compile)
        except Exception as e:  # noqa: BLE001
            r = dict(op=op, m=m, error=f"{type(e).__name__}: {e}",
                     trace=traceback.format_exc()[-2000:])
        rows.append(r)
        print(table([r]).splitlines()[-1], flush=True)
        if partial:
            partial(rows)
    return rows


def child(a, ops, check_ms, bench_ms, l2) -> int:
    """One opcode in its own process (--suite spawns these): checks, then '@@CHECKS_DONE ok', then
    waits for 'GO' on stdin (the parent runs the timed parts one at a time), then timing."""
    op = ops[0]
    res = dict(checks=[], rows=[])

    def partial(cs):
        res["checks"] = cs
        Path(a.out).write_text(json.dumps(res, indent=1))
    res["checks"] = run_checks(op, check_ms, partial)
    ok = all(c["ok"] for c in res["checks"])
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"@@CHECKS_DONE {int(ok)}", flush=True)
    if not bench_ms:
        return 0
    line = sys.stdin.readline().strip()
    if line != "GO":
        return 0
    torch.cuda.synchronize()
    def partial_rows(rows):
        res["rows"] = rows
        Path(a.out).write_text(json.dumps(res, indent=1))
    res["rows"] = run_bench(op, bench_ms, a.reps, l2, not a.no_compile, partial_rows)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print("@@BENCH_DONE", flush=True)
    return 0


def suite(a, ops, check_ms, bench_ms, res, out: Path) -> bool:
    """Checks of every op in parallel processes (each with a deadline), then the timing of the ops
    that passed, one process at a time (same process as its checks: no second compile). A hang or
    a crash costs one op, not the run."""
    import threading
    tmp = out.parent / f".{out.stem}_parts"
    tmp.mkdir(parents=True, exist_ok=True)
    for f in tmp.glob("*.json"):
        f.unlink()
    procs = {}
    for op in ops:
        cmd = [sys.executable, "-u", str(Path(__file__).resolve()), "--child", "--ops", op,
               "--m", ",".join(map(str, check_ms)), "--odd-m", "0",
               "--bench-m", ",".join(map(str, bench_ms)) if bench_ms else "",
               "--reps", str(a.reps), "--split-k", a.split_k, "--plan", a.plan,
               "--out", str(tmp / f"{op}.json")]
        if a.no_compile:
            cmd.append("--no-compile")
        pr = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1)
        st = dict(proc=pr, checks_done=threading.Event(), ok=False, bench_done=False, lines=[])

        def reader(op=op, st=st):
            for line in st["proc"].stdout:
                line = line.rstrip("\n")
                st["lines"].append(line)
                if line.startswith("@@CHECKS_DONE"):
                    st["ok"] = line.split()[1] == "1"
                    st["checks_done"].set()
                elif line.startswith("@@BENCH_DONE"):
                    st["bench_done"] = True
                else:
                    print(f"[{op}] {line}", flush=True)
            st["checks_done"].set()
        st["thread"] = threading.Thread(target=reader, daemon=True)
        st["thread"].start()
        procs[op] = st
    deadline = time.time() + a.check_timeout
    for op, st in procs.items():
        if not st["checks_done"].wait(max(0.0, deadline - time.time())):
            print(f"[suite] {op}: checks past the {a.check_timeout:.0f} s deadline: killed", flush=True)
            st["proc"].kill()
            st["timeout"] = "checks"
    if a.timing_after_pid:
        # a correctness job beside the checks (pytest) must be gone before anything is timed
        t_end = time.time() + 75
        while os.path.exists(f"/proc/{a.timing_after_pid}") and time.time() < t_end:
            time.sleep(0.5)
    for op, st in procs.items():
        pr = st["proc"]
        if pr.poll() is not None or not bench_ms:
            continue
        if not st["ok"]:
            pr.stdin.write("QUIT\n")
            pr.stdin.flush()
            continue
        pr.stdin.write("GO\n")
        pr.stdin.flush()
        try:
            pr.wait(a.bench_timeout)
        except subprocess.TimeoutExpired:
            print(f"[suite] {op}: timing past {a.bench_timeout:.0f} s: killed", flush=True)
            pr.kill()
            st["timeout"] = "bench"
    all_ok = True
    for op, st in procs.items():
        try:
            st["proc"].wait(30)
        except subprocess.TimeoutExpired:
            st["proc"].kill()
        st["thread"].join(5)
        part = tmp / f"{op}.json"
        got = json.loads(part.read_text()) if part.exists() else dict(checks=[], rows=[])
        died = st["proc"].returncode not in (0, None) and all(c["ok"] for c in got["checks"])
        if st.get("timeout") == "checks" or not got["checks"] or died:
            got["checks"].append(dict(op=op, m=None, ok=False,
                                      error=f"no result ({st.get('timeout', 'process died')}, rc "
                                            f"{st['proc'].returncode})",
                                      tail="\n".join(st["lines"][-30:])))
        for c in got["checks"]:
            res["checks"].append(c)
            all_ok &= bool(c["ok"])
        res["rows"] += got["rows"]
        if st.get("timeout") == "bench":
            res["rows"].append(dict(op=op, m=None, error="timing timed out"))
        part.unlink(missing_ok=True)
    try:
        tmp.rmdir()
    except OSError:
        pass
    return all_ok


def _dryrun():
    """MK_GEMM_DRYRUN=1: fake checks/timings (no GPU), to test the --suite orchestration on a CPU.
    MK_GEMM_DRYRUN=fail:OP makes OP fail, hang:OP makes its checks hang."""
    g = globals()
    mode = os.environ["MK_GEMM_DRYRUN"]
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(
        name="dryrun", multi_processor_count=132, L2_cache_size=50 << 20)
    torch.cuda.synchronize = lambda: None

    def fake_check(op, m, layer=1, seed=0):
        if mode == f"hang:{op}":
            time.sleep(3600)
        return dict(op=op, m=m, tile="t", rel_err=1e-3, ok=mode != f"fail:{op}")

    def fake_bench(op, m, reps, l2, do_compile):
        return dict(op=op, m=m, tile="t", mk_us=10.0, cublas_us=9.0, torch_us=11.0,
                    compile_us=None, ratio_vs_torch=10 / 11, ratio_vs_cublas=10 / 9,
                    ratio_vs_compile=None, mk_tflops=1.0, cublas_tflops=1.0)
    g["check_case"], g["bench_case"] = fake_check, fake_bench


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--m", default=",".join(map(str, MS)), help="check (and timing) M values")
    p.add_argument("--bench-m", default=None, help="timing M values (default: --m)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--split-k", default="auto",
                   help="auto (the planner's K splits at each M), none, or a split count")
    p.add_argument("--plan", default="", metavar="FIELD=VALUE,...",
                   help="PlanConfig fields for --split-k auto (as launch/bench.py --plan), e.g. "
                        "splitk_qkv_max_tokens=512: the planner's split factor and slices "
                        "with them")
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--odd-m", type=int, default=200, help="extra correctness M (rows tail); 0: none")
    p.add_argument("--suite", action="store_true",
                   help="one process per op: checks in parallel, then timing one op at a time")
    p.add_argument("--check-timeout", type=float, default=240.0)
    p.add_argument("--bench-timeout", type=float, default=150.0)
    p.add_argument("--timing-after-pid", type=int, default=0,
                   help="--suite: start the timing only once this process has exited")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.split_k not in ("auto", "none") and not (a.split_k.isdigit() and int(a.split_k) >= 1):
        p.error(f"--split-k must be auto, none or a positive integer, got {a.split_k!r}")
    from mk.plan import parse_plan_overrides
    try:
        plan = parse_plan_overrides(a.plan)
    except ValueError as e:
        p.error(f"--plan: {e}")
    if plan and a.split_k != "auto":
        p.error(f"--plan applies to --split-k auto, not {a.split_k!r}")
    global SPLIT_K, PLAN
    SPLIT_K, PLAN = a.split_k, plan
    if os.environ.get("MK_GEMM_DRYRUN"):
        _dryrun()
    assert torch.cuda.is_available(), "bench/gemm.py needs a GPU"
    ops = [o.strip().upper() for o in a.ops.split(",") if o.strip()]
    ms = [int(v) for v in a.m.split(",") if v.strip()]
    check_ms = sorted(set(ms + ([a.odd_m] if a.odd_m else [])))     # smallest first
    bench_ms = [] if a.check_only else (
        ms if a.bench_m is None else [int(v) for v in a.bench_m.split(",") if v.strip()])
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    if a.child:
        return child(a, ops, check_ms, bench_ms, l2)
    date = datetime.date.today().isoformat()
    out = Path(a.out or Path(__file__).parent / "results" / f"gemm_{date}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    res = dict(device=props.name, sms=props.multi_processor_count, l2_bytes=l2, date=date,
               git_commit=_commit(), torch=torch.__version__,
               command="python bench/gemm.py " + " ".join(sys.argv[1:] if argv is None else argv),
               reg_split="mk.megakernel.reg_split: 72/216, 80/208 with QKV_ROPE",
               split_k=a.split_k, plan=PLAN, env=knob_env(), checks=[], rows=[])
    t0 = time.time()
    if a.suite:
        all_ok = suite(a, ops, check_ms, bench_ms, res, out)
    else:
        all_ok = True
        for op in ops:
            cs = run_checks(op, check_ms)
            res["checks"] += cs
            all_ok &= all(c["ok"] for c in cs)
        for op in ops if bench_ms else ():
            res["rows"] += run_bench(op, bench_ms, a.reps, l2, not a.no_compile)
    print("\n== correctness (bf16 rel Frobenius err vs the torch face; < 1e-2, poison intact)")
    for c in res["checks"]:
        print(f"  {c['op']:8s} M={str(c['m']):>5s} {c.get('tile', '?'):13s} "
              f"rel_err={c.get('rel_err', float('nan')):.2e} -> {'PASS' if c['ok'] else 'FAIL'} "
              f"{c.get('error', '')[:160]}")
    if res["rows"]:
        print("\n== timing (median us, cold L2; mk/torch = vs cuBLAS + eager epilogue)")
        print(table([r for r in res["rows"] if r.get("m") is not None]))
        res["chart"] = chart(res["rows"], str(out.with_suffix(".png")))
    res["all_checks_pass"] = all_ok
    res["wall_s"] = time.time() - t0
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out} ({'all checks PASS' if all_ok else 'CHECK FAILURES'})")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
