"""GEMM-tile instructions over whole matrices on one GPU vs torch (cuBLAS) + the same epilogue.

    python bench/gemm.py                       # everything below, one command
    python bench/gemm.py --ops O_PROJ --m 1024 --reps 20
    python bench/gemm.py --check-only          # correctness only (fast)

Shapes: one Llama-70B TP8 rank (hidden 8192, intermediate 3584 per rank, 8 q heads + 1 kv head of
128 -> qkv 1280, vocab shard 16032), M (token rows; sequences for LM_HEAD) in {64, 256, 1024, 4096}.
Per (opcode, M):
  1. correctness: fresh random inputs, the output poisoned (NaN; for RESIDUAL the rows past M),
     the harness run over the whole matrix (bench/gemm_harness.py: the megakernel's roles and the
     GEMM bodies of mk/instructions/_gemm_kernel.py), compared with the opcode's torch face
     (mk.instructions.matmul.GemmFamily.run_torch, instruction by instruction): bf16 relative
     Frobenius error < 1e-2 inside, poison intact outside; plus an odd-M case (rows tail) per op
  2. timing, cold L2 (R buffer sets rotated, R x bytes > 2 x L2), each launch between CUDA events
     behind a GPU sleep (host launch cost hidden), medians:
        mk          the harness (one persistent launch: the whole GEMM + fused epilogue)
        cublas      torch.matmul alone
        torch       torch.matmul + the epilogue in eager torch (the unfused peer)
        compile     torch.compile of (matmul + epilogue), where it compiles
     ratios mk/torch and mk/compile in the same run (the acceptance: mk <= torch at every shape,
     <= 0.9 x at M >= 1024)
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
    from bench.gemm_harness import GemmHarness, plan_qkv
    from mk.instructions import _gemm_kernel as gk
    cfg = gk.choose_tile(Op.QKV_ROPE, m)
    x, w, q, kv, meta, invf = make_qkv_problem(m, seed=seed)
    instrs, _ = plan_qkv(cfg, m, QKV_SECTIONS, H, HEAD_DIM, layer=layer, src=int(Buf.NORMED),
                         dst=int(Buf.Q))
    rq, rkv = run_qkv_face(instrs, x, w, q, kv, meta)
    h = GemmHarness(Op.QKV_ROPE, cfg)
    h.launch(h.prepare(instrs, x, w, q, meta, invf, kv))
    torch.cuda.synchronize()
    written = ~torch.isnan(rkv)
    eq = rel_err(q[:m], rq[:m])
    ekv = rel_err(kv[written], rkv[written])
    finite = bool(torch.isfinite(q[:m]).all()) and bool(torch.isfinite(kv[written]).all())
    poison_ok = bool(torch.isnan(q[m:]).all()) and bool(torch.isnan(kv[~written]).all())
    ok = finite and poison_ok and eq < 1e-2 and ekv < 1e-2
    return dict(op="QKV_ROPE", m=m, tile=cfg.name, rel_err=max(eq, ekv), rel_err_q=eq,
                rel_err_kv=ekv, finite=finite, poison_intact=poison_ok, ok=ok,
                n_instr=int(instrs.shape[0]))


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
    from bench.gemm_harness import GemmHarness, plan_qkv
    from mk.instructions import _gemm_kernel as gk
    cfg = gk.choose_tile(Op.QKV_ROPE, m)
    set_bytes = 2 * QKV * H * 2 + (m + 64) * H * 2
    R = min(16, max(2, math.ceil(3 * l2_bytes / set_bytes)))
    sets = [make_qkv_problem(m, seed=100 + i) for i in range(R)]
    instrs, _ = plan_qkv(cfg, m, QKV_SECTIONS, H, HEAD_DIM, layer=1, src=int(Buf.NORMED),
                         dst=int(Buf.Q))
    h = GemmHarness(Op.QKV_ROPE, cfg)
    mk_us, _ = time_rotating([h.launcher(h.prepare(instrs, x, w, q, meta, invf, kv))
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
    comp_us, comp_err = None, None
    if do_compile:
        try:
            fc = torch.compile(f, dynamic=False)
            comp_us, _ = time_rotating([(lambda a=a: fc(*a)) for a in argl], reps, warm=3)
        except Exception as e:  # noqa: BLE001
            comp_err = f"{type(e).__name__}: {str(e)[:200]}"
    flops = 2.0 * m * QKV * H
    return dict(op="QKV_ROPE", m=m, n=QKV, k=H, tile=cfg.name, n_instr=int(instrs.shape[0]),
                buffer_sets=R, mk_us=mk_us, cublas_us=cub_us, torch_us=torch_us,
                compile_us=comp_us, compile_error=comp_err, mk_tflops=flops / mk_us / 1e6,
                cublas_tflops=flops / cub_us / 1e6, ratio_vs_torch=mk_us / torch_us,
                ratio_vs_cublas=mk_us / cub_us,
                ratio_vs_compile=(mk_us / comp_us) if comp_us else None)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_case(op: str, m: int, layer: int = 1, seed: int = 0):
    if op == "QKV_ROPE":
        return check_qkv(m, layer, seed)
    from bench.gemm_harness import GemmHarness, plan_tiles
    from mk.instructions import _gemm_kernel as gk
    K, N, NO, src, dst = SHAPES[op]
    cfg = gk.choose_tile(Op[op], m)
    x, w, y = make_problem(op, m, seed=seed)
    lay = 0 if op == "LM_HEAD" else layer
    instrs, nctr = plan_tiles(Op[op], cfg, m, NO, K, layer=lay, src=int(src), dst=int(dst))
    ref = run_face(op, instrs, x, w, y)
    h = GemmHarness(Op[op], cfg)
    h.launch(h.prepare(instrs, x, w, y))
    torch.cuda.synchronize()
    inside = rel_err(y[:m], ref[:m])
    finite = bool(torch.isfinite(y[:m]).all())
    poison_ok = bool(torch.isnan(y[m:]).all())
    ok = finite and poison_ok and inside < 1e-2
    return dict(op=op, m=m, tile=cfg.name, rel_err=inside, finite=finite, poison_intact=poison_ok,
                ok=ok, n_instr=int(instrs.shape[0]))


# ------------------------------------------------------------------------------------- timing
def gpu_sleep_cycles():
    return int(2e5)      # ~0.1 ms at 1.98 GHz: covers the host's enqueue of event + launch + event


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


def compiled_fn(op: str):
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
    return torch.compile(f, dynamic=False)


def bench_case(op: str, m: int, reps: int, l2_bytes: int, do_compile: bool):
    if op == "QKV_ROPE":
        return bench_qkv(m, reps, l2_bytes, do_compile)
    from bench.gemm_harness import GemmHarness, plan_tiles
    from mk.instructions import _gemm_kernel as gk
    K, N, NO, src, dst = SHAPES[op]
    cfg = gk.choose_tile(Op[op], m)
    wbytes = N * K * 2 * (1 if op == "LM_HEAD" else 2)
    set_bytes = wbytes + (m + 64) * (K * 2 + NO * 4)
    R = max(2, math.ceil(3 * l2_bytes / set_bytes))
    R = min(R, 16)
    sets = [make_problem(op, m, seed=100 + i) for i in range(R)]
    for _, _, y in sets:
        y.nan_to_num_(0.0)
    lay = 0 if op == "LM_HEAD" else 1
    instrs, _ = plan_tiles(Op[op], cfg, m, NO, K, layer=lay, src=int(src), dst=int(dst))
    h = GemmHarness(Op[op], cfg)
    mk_fns = [h.launcher(h.prepare(instrs, x, w, y)) for x, w, y in sets]
    mk_us, _ = time_rotating(mk_fns, reps)
    h.check()
    pairs = [torch_fns(op, x, w, y, m) for x, w, y in sets]
    cub_us, _ = time_rotating([p[0] for p in pairs], reps)
    torch_us, _ = time_rotating([p[1] for p in pairs], reps)
    comp_us, comp_err = None, None
    if do_compile:
        try:
            f = compiled_fn(op)
            if op in ("O_PROJ", "DOWN"):
                cfns = [(lambda x=x, w=w, y=y: f(x[:m], w[1], y[:m])) for x, w, y in sets]
            elif op == "GATE_UP":
                cfns = [(lambda x=x, w=w: f(x[:m], w[1])) for x, w, _ in sets]
            else:
                cfns = [(lambda x=x, w=w: f(x[:m], w)) for x, w, _ in sets]
            comp_us, _ = time_rotating(cfns, reps, warm=3)
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            comp_err = f"{type(e).__name__}: {str(e)[:200]}"
    flops = 2.0 * m * N * K
    row = dict(op=op, m=m, n=N, k=K, tile=cfg.name, n_instr=int(instrs.shape[0]), buffer_sets=R,
               mk_us=mk_us, cublas_us=cub_us, torch_us=torch_us, compile_us=comp_us,
               compile_error=comp_err,
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
    labels = [f"{r['op']}\nM={r['m']}" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(rows)), 4.5))
    wdt = 0.38
    ax.bar([i - wdt / 2 for i in xs], [r["ratio_vs_torch"] for r in rows], wdt,
           label="mk / (cuBLAS + eager epilogue)")
    ax.bar([i + wdt / 2 for i in xs], [r["ratio_vs_compile"] or 0 for r in rows], wdt,
           label="mk / torch.compile")
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
    hdr = (f"{'op':8s} {'M':>5s} {'tile':9s} {'mk us':>9s} {'cuBLAS':>9s} {'+epi':>9s} "
           f"{'compile':>9s} {'mk/torch':>8s} {'mk/comp':>8s} {'mk TF/s':>8s}")
    out = [hdr]
    for r in rows:
        if "mk_us" not in r:
            out.append(f"{r['op']:8s} {r['m']:5d} ERROR {r.get('error', '')[:80]}")
            continue
        cu = f"{r['compile_us']:9.1f}" if r["compile_us"] else f"{'-':>9s}"
        rc = f"{r['ratio_vs_compile']:8.2f}" if r["ratio_vs_compile"] else f"{'-':>8s}"
        out.append(f"{r['op']:8s} {r['m']:5d} {r['tile']:9s} {r['mk_us']:9.1f} {r['cublas_us']:9.1f} "
                   f"{r['torch_us']:9.1f} {cu} {r['ratio_vs_torch']:8.2f} {rc} {r['mk_tflops']:8.0f}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--m", default=",".join(map(str, MS)))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--odd-m", type=int, default=200, help="extra correctness M (rows tail); 0: none")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    assert torch.cuda.is_available(), "bench/gemm.py needs a GPU"
    ops = [o.strip().upper() for o in a.ops.split(",") if o.strip()]
    ms = [int(v) for v in a.m.split(",") if v.strip()]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    date = datetime.date.today().isoformat()
    out = Path(a.out or Path(__file__).parent / "results" / f"gemm_{date}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        commit = os.environ.get("MK_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = None
    res = dict(device=props.name, sms=props.multi_processor_count, l2_bytes=l2, date=date,
               git_commit=commit, torch=torch.__version__, checks=[], rows=[])
    t0 = time.time()
    all_ok = True
    for op in ops:
        for m in ms + ([a.odd_m] if a.odd_m else []):
            try:
                c = check_case(op, m, seed=m)
            except Exception as e:  # noqa: BLE001 - recorded; the run goes on
                c = dict(op=op, m=m, ok=False, error=f"{type(e).__name__}: {e}",
                         trace=traceback.format_exc()[-2000:])
            res["checks"].append(c)
            all_ok &= bool(c["ok"])
            print(f"[check] {op:8s} M={m:5d} {c.get('tile', '?'):9s} rel_err={c.get('rel_err', float('nan')):.2e} "
                  f"poison_intact={c.get('poison_intact')} -> {'PASS' if c['ok'] else 'FAIL'} "
                  f"{c.get('error', '')}", flush=True)
    if not a.check_only:
        for op in ops:
            for m in ms:
                try:
                    r = bench_case(op, m, a.reps, l2, not a.no_compile)
                except Exception as e:  # noqa: BLE001
                    r = dict(op=op, m=m, error=f"{type(e).__name__}: {e}",
                             trace=traceback.format_exc()[-2000:])
                res["rows"].append(r)
                print(table([r]).splitlines()[-1], flush=True)
        print(table(res["rows"]))
        png = chart(res["rows"], str(out.with_suffix(".png")))
        res["chart"] = png
    res["all_checks_pass"] = all_ok
    res["wall_s"] = time.time() - t0
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out} ({'all checks PASS' if all_ok else 'CHECK FAILURES'})")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
