"""Megakernel core micro-benchmarks (one GPU): dispatch overhead, cross-SM hand-off, launch cost,
RMSNorm work vs a CUDA-graph replay of separate torch kernels. Writes one JSON.

    python bench/megakernel_core.py --out bench/results/megakernel_core_<date>.json
    python bench/megakernel_core.py --sanitize      # a small plan once (for compute-sanitizer)
    python bench/megakernel_core.py --ab group:1000,thread:1000,thread:250 --out ...
        # + the core figures of other compile variants (handoff mode : backoff cap ns), measured
        #   in the same process for a before/after comparison ("group:1000" = the original kernel)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import mk.megakernel as M  # noqa: E402


def weights(H, L):
    g = torch.Generator().manual_seed(0)
    return types.SimpleNamespace(
        attn_norm=(1 + 0.1 * torch.randn(L, H, generator=g)).bfloat16(),
        mlp_norm=(1 + 0.1 * torch.randn(L, H, generator=g)).bfloat16(),
        final_norm=(1 + 0.1 * torch.randn(H, generator=g)).bfloat16(),
        config=types.SimpleNamespace(rms_norm_eps=1e-5))


def make_mk(T, H, L, journal=False, timeout_s=2.0, handoff=None, backoff_ns=None):
    w = weights(H, L)
    arena = torch.randn(3, T, H, device="cuda").bfloat16()
    return M.Megakernel(arena, M.norm_table(w).cuda(), L, 1e-5, journal=journal,
                        timeout_s=timeout_s, handoff=handoff or M.DEFAULT_HANDOFF,
                        backoff_ns=backoff_ns or M.DEFAULT_BACKOFF_NS), w


def graph_time_us(fn, per_graph=10, replays=20, warm=3):
    """Capture per_graph calls of fn into one CUDA graph; time replays; us per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            fn()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(replays):
        g.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / (replays * per_graph)


def mk_time_us(mk, stream, per_graph=10, replays=20):
    prep = mk.prepare(stream)
    go = mk.launcher(prep)
    go()
    mk.check()
    us = graph_time_us(go, per_graph, replays)
    mk.check()
    return us


def sanitize_run(handoff=None, backoff_ns=None):
    mk, w = make_mk(64, 1024, 2, timeout_s=60.0, handoff=handoff, backoff_ns=backoff_ns)
    print(f"sanitize: handoff {mk.handoff}, backoff_ns {mk.backoff_ns}", flush=True)
    s, n = M.plan_layers(64, 1024, 2, seed=1, noops=8)
    x0 = mk.arena.clone()
    mk.run(s)
    got = mk.arena.cpu()
    want = M.rows_oracle(s, x0.cpu(), w)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    s, n = M.plan_chain(40, 64, 1024, rows=8, ops=("copy", "add", "noop"), chains=4)
    mk.run(s)
    print("sanitize plan ok")


def rmsnorm_plan(T, H, L, rows):
    from mk.instructions.base import Buf, NormWeight
    from mk.instructions.rows import rows_instruction
    from mk.ir import Op, serialize
    ins = [rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, r, rows, 0, H, layer=l,
                            norm_weight=NormWeight.ATTN, signal=-1)
           for l in range(L) for r in range(0, T, rows)]
    return serialize(ins), len(ins)


def core_figures(mk, T, H, L):
    """The figures a hand-off / backoff change can move, for one compiled variant."""
    G = mk.grid
    r = dict(handoff=mk.handoff, backoff_ns=mk.backoff_ns)
    k1, k2 = 50, 550
    ta = mk_time_us(mk, M.plan_noops(G * k1)[0], per_graph=5, replays=10)
    tb = mk_time_us(mk, M.plan_noops(G * k2)[0], per_graph=5, replays=10)
    r["dispatch_ns_per_instr_per_cta"] = round((tb - ta) * 1e3 / (k2 - k1), 1)
    tsa = mk_time_us(mk, M.plan_noops(G * k1, signal=True)[0], per_graph=5, replays=10)
    tsb = mk_time_us(mk, M.plan_noops(G * k2, signal=True)[0], per_graph=5, replays=10)
    r["dispatch_ns_per_instr_per_cta_with_signal"] = round((tsb - tsa) * 1e3 / (k2 - k1), 1)
    r["noop_plan_us"] = {f"{G * k1}": round(ta, 2), f"{G * k2}": round(tb, 2)}
    c1, c2 = 200, 1200
    h1 = mk_time_us(mk, M.plan_chain(c1, T, H, ops=("noop",))[0], per_graph=3, replays=5)
    h2 = mk_time_us(mk, M.plan_chain(c2, T, H, ops=("noop",))[0], per_graph=3, replays=5)
    r["handoff_ns_per_link"] = round((h2 - h1) * 1e3 / (c2 - c1), 1)
    # a chain of real (page-using) instructions: COPY -> RESIDUAL_ADD -> NOOP links across SMs
    p1 = mk_time_us(mk, M.plan_chain(60, T, H, rows=8, ops=("copy", "add", "noop"))[0],
                    per_graph=3, replays=5)
    p2 = mk_time_us(mk, M.plan_chain(360, T, H, rows=8, ops=("copy", "add", "noop"))[0],
                    per_graph=3, replays=5)
    r["page_chain_ns_per_link"] = round((p2 - p1) * 1e3 / 300, 1)
    for rows in (16, 64):
        r[f"rmsnorm_tile{rows}_us"] = round(mk_time_us(mk, rmsnorm_plan(T, H, L, rows)[0],
                                                       per_graph=5, replays=10), 2)
    s, _ = M.plan_layers(T, H, L, seed=5, noops=20)
    r["layers_plan_us"] = round(mk_time_us(mk, s, per_graph=3, replays=10), 2)
    r["layers_plan_instructions"] = int(s.shape[0])
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--handoff", default=None, help=f"hand-off mode (default {M.DEFAULT_HANDOFF})")
    ap.add_argument("--backoff-ns", type=int, default=None,
                    help=f"counter-wait backoff cap (default {M.DEFAULT_BACKOFF_NS})")
    ap.add_argument("--ab", default="", help="extra variants MODE:BACKOFF,... (core figures only)")
    ap.add_argument("--trace-dir", default=None)
    a = ap.parse_args()
    if a.sanitize:
        sanitize_run(a.handoff, a.backoff_ns)
        return 0
    props = torch.cuda.get_device_properties(0)
    res = dict(date=datetime.date.today().isoformat(),
               git_commit=os.environ.get("MK_COMMIT") or subprocess.run(
                   ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
               device=props.name, sms=props.multi_processor_count,
               command=" ".join([sys.executable] + sys.argv), torch=torch.__version__)
    T, H, L = 512, 8192, 8
    mk, w = make_mk(T, H, L, handoff=a.handoff, backoff_ns=a.backoff_ns)
    res["handoff"] = mk.handoff
    res["backoff_ns"] = mk.backoff_ns
    t0 = time.time()
    mk.run(M.plan_noops(1)[0])
    res["first_run_incl_compile_s"] = round(time.time() - t0, 2)
    G = mk.grid
    res["grid"] = G
    res["blocks_per_sm"] = mk.blocks_per_sm
    res["occupancy_source"] = mk.occupancy_source
    if a.ab:
        # same process, same GPU state: the default variant first, then each listed one
        ab = [core_figures(mk, T, H, L)]
        for spec in a.ab.split(","):
            mode, _, bo = spec.partition(":")
            mkv, _ = make_mk(T, H, L, handoff=mode, backoff_ns=int(bo) if bo else None)
            mkv.arena.copy_(mk.arena)
            mkv.run(M.plan_noops(1)[0])
            ab.append(core_figures(mkv, T, H, L))
            del mkv
            print(json.dumps(ab[-1]), flush=True)
        res["ab_core_figures"] = ab

    # 1. empty launches and dispatch overhead (NOOPs, no waits)
    t_empty = mk_time_us(mk, M.plan_noops(0)[0])
    res["empty_plan_launch_us"] = round(t_empty, 3)
    k1, k2 = 50, 550
    ta = mk_time_us(mk, M.plan_noops(G * k1)[0], per_graph=5, replays=10)
    tb = mk_time_us(mk, M.plan_noops(G * k2)[0], per_graph=5, replays=10)
    res["dispatch_ns_per_instr_per_cta"] = round((tb - ta) * 1e3 / (k2 - k1), 1)
    res["dispatch_ns_per_instr_aggregate"] = round((tb - ta) * 1e3 / (G * (k2 - k1)), 2)
    tsa = mk_time_us(mk, M.plan_noops(G * k1, signal=True)[0], per_graph=5, replays=10)
    tsb = mk_time_us(mk, M.plan_noops(G * k2, signal=True)[0], per_graph=5, replays=10)
    res["dispatch_ns_per_instr_per_cta_with_signal"] = round((tsb - tsa) * 1e3 / (k2 - k1), 1)
    res["noop_plan_us"] = {f"{G * k1}": round(ta, 2), f"{G * k2}": round(tb, 2)}

    # 2. cross-SM hand-off: one chain of NOOPs, each waits for the previous one's counter
    c1, c2 = 200, 1200
    h1 = mk_time_us(mk, M.plan_chain(c1, T, H, ops=("noop",))[0], per_graph=3, replays=5)
    h2 = mk_time_us(mk, M.plan_chain(c2, T, H, ops=("noop",))[0], per_graph=3, replays=5)
    res["handoff_ns_per_link"] = round((h2 - h1) * 1e3 / (c2 - c1), 1)

    # 3. journal: launch-to-first-instruction, fraction of chain links that crossed SMs
    mkj, _ = make_mk(T, H, L, journal=True)
    s, n = M.plan_chain(c1, T, H, ops=("noop",))
    mkj.run(s)
    mkj.run(s)
    import mk.trace as tr
    j, c = mkj.journal_rows(s.shape[0])
    res["journal_chain"] = tr.summary(j, c, s.shape[0])
    s2, _ = M.plan_layers(T, H, L, seed=5, noops=20)
    mkj.arena.copy_(mk.arena)
    mkj.run(s2)
    j2, c2_ = mkj.journal_rows(s2.shape[0])
    res["journal_layers"] = tr.summary(j2, c2_, s2.shape[0])
    if a.trace_dir:
        tr.write_chrome_trace(os.path.join(a.trace_dir, "megakernel_trace_layers.json"), j2, c2_,
                              s2.shape[0])
        res["timeline_renderer"] = tr.draw_timeline(
            os.path.join(a.trace_dir, "megakernel_timeline_layers.png"), j2, c2_, s2.shape[0],
            title=f"plan_layers T={T} H={H} L={L}: {s2.shape[0]} instructions")
    # journal of an empty launch for launch-to-first on a NOOP plan
    s3, _ = M.plan_noops(G * 4)
    mkj.run(s3)
    j3, c3 = mkj.journal_rows(s3.shape[0])
    res["journal_noops"] = tr.summary(j3, c3, s3.shape[0])

    # 4. RMSNorm work: L layers x (T / 16) row tiles of 16 rows, all independent
    from mk.instructions.base import Buf, NormWeight
    from mk.instructions.rows import rows_instruction
    from mk.ir import Op, serialize
    for rows in (16, 64):
        ins = [rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, r, rows, 0, H, layer=l,
                                norm_weight=NormWeight.ATTN, signal=-1)
               for l in range(L) for r in range(0, T, rows)]
        s4 = serialize(ins)
        t_mk = mk_time_us(mk, s4, per_graph=5, replays=10)
        x = mk.arena[0]
        y = mk.arena[1]
        wt = mk.normw
        eps = 1e-5

        def torch_tiles():
            for l in range(L):
                for r in range(0, T, rows):
                    xs = x[r:r + rows].float()
                    xs = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
                    y[r:r + rows].copy_(wt[l] * xs.to(torch.bfloat16))

        def torch_fused_tiles():
            for l in range(L):
                for r in range(0, T, rows):
                    y[r:r + rows].copy_(torch.nn.functional.rms_norm(x[r:r + rows], (H,), wt[l], eps))

        def torch_whole():
            for l in range(L):
                y.copy_(torch.nn.functional.rms_norm(x, (H,), wt[l], eps))
        t_hf = graph_time_us(torch_tiles, per_graph=2, replays=10)
        t_fused = graph_time_us(torch_fused_tiles, per_graph=2, replays=10)
        t_whole = graph_time_us(torch_whole, per_graph=5, replays=10)
        nbytes = 2 * L * T * H * 2
        res[f"rmsnorm_T{T}_H{H}_L{L}_tile{rows}"] = dict(
            instructions=len(ins), megakernel_us=round(t_mk, 2),
            cudagraph_torch_hf_formula_per_tile_us=round(t_hf, 2),
            cudagraph_torch_F_rms_norm_per_tile_us=round(t_fused, 2),
            cudagraph_torch_F_rms_norm_whole_T_per_layer_us=round(t_whole, 2),
            ratio_megakernel_over_graph_hf_tiles=round(t_mk / t_hf, 3),
            ratio_megakernel_over_graph_F_rms_norm_tiles=round(t_fused and t_mk / t_fused, 3),
            ratio_megakernel_over_graph_F_rms_norm_whole=round(t_mk / t_whole, 3),
            megakernel_GBps=round(nbytes / t_mk / 1e3, 1))
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
