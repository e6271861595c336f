"""A second peer for the GEMM tiles: CUTLASS's own CuTe DSL Hopper GEMM, beside cuBLAS, same run.

    python bench/cutlass_peer.py --example PATH/dense_gemm_persistent.py \
        --configs 128x256:1x1,128x256:2x1,128x128:1x2 --shapes O_PROJ:4096,DOWN:4096 --out X.json

Why: mk's GEMM mainloop runs ~20% under cuBLAS's rate at M >= 1024 (bench/GEMM_NOTES.md session
22) and neither operand bytes, ring depth nor the epilogue explains it. The persistent
warp-specialized GEMM example that ships with CUTLASS (TMA loads, a cooperative pair of wgmma
warpgroups, multicast clusters as an option) is the same design as mk's tiles without the
megakernel around them. Its rate at mk's tile (128 x 256, no cluster) says whether that tile
shape can reach cuBLAS at all on this GPU; its clusters and its 128 x 128 tiles say what the
shape / multicast would buy.

The example is NVIDIA's code and is not part of this repository: take
examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py from
github.com/NVIDIA/cutlass (tag v4.5.0 or later; session 23 used the file as of main 7107b0553)
and pass its path. It takes float16 operands only; the tensor pipe's bf16 and fp16 rates are the
same, and cuBLAS is timed in both to show it.

Shapes are those of one Llama-70B TP8 rank (bench/gemm.py): y[M, N] = x[M, K] @ w[N, K]^T, the
output in the operand type, no epilogue (the peer is "cuBLAS alone"). Timing: bench/gemm.py's
time_rotating (cold L2: buffer sets rotated, each launch between CUDA events behind a GPU
sleep), medians. One process per config compiles (in parallel) and then times under a file lock,
so the timings never overlap.
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # bench/gemm.py's timing

# N, K of each matrix of one Llama-70B TP8 rank (bench/gemm.py's shapes; GATE_UP's gate and up
# are one GEMM over 2 x 3584 columns)
SHAPES = {"O_PROJ": (8192, 1024), "DOWN": (8192, 3584), "GATE_UP": (7168, 8192),
          "QKV": (1280, 8192), "LM_HEAD": (16032, 8192)}
L2_BYTES = 60 * 2**20   # H200: 50 MiB of L2; a little more, so that rotation always misses


def parse_configs(text: str):
    out = []
    for item in [t for t in text.split(",") if t]:
        tile, _, cluster = item.partition(":")
        tm, tn = (int(v) for v in tile.split("x"))
        cm, cn = (int(v) for v in (cluster or "1x1").split("x"))
        out.append(((tm, tn), (cm, cn)))
    return out


def parse_shapes(text: str):
    out = []
    for item in [t for t in text.split(",") if t]:
        op, _, m = item.partition(":")
        if op not in SHAPES:
            raise SystemExit(f"unknown shape {op!r}; known: {', '.join(SHAPES)}")
        out.append((op, int(m)))
    return out


def load_example(path: str):
    spec = importlib.util.spec_from_file_location("cutlass_dense_gemm_persistent", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def buffer_sets(m: int, n: int, k: int, dtype):
    import torch
    per_set = 2 * (m * k + n * k + m * n)
    count = max(2, math.ceil(2 * L2_BYTES / per_set) + 1)
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device="cuda", dtype=dtype) * 0.1
        b = torch.randn(n, k, device="cuda", dtype=dtype) * 0.1
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        sets.append((a, b, c))
    return sets


def cute_view(t):
    """(rows, cols) row-major torch tensor -> the example's (rows, cols, L=1) cute tensor (the
    batch mode's stride past the matrix, as the example's own tensors have it)."""
    from cutlass.cute.runtime import from_dlpack
    rows, cols = t.shape
    view = t.as_strided((rows, cols, 1), (cols, 1, rows * cols))
    return from_dlpack(view, assumed_align=16).mark_layout_dynamic(leading_dim=1)


def worker(example: str, config, shapes, reps: int, lock_path: str) -> dict:
    import torch
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from gemm import time_rotating  # bench/gemm.py

    ex = load_example(example)
    tile, cluster = config
    # the DSL's HardwareInfo queries the driver without initialising it: let torch do that
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    gemm = ex.HopperWgmmaGemmPersistentKernel(cutlass.Float32, tile, cluster, 1, True)
    max_clusters = cutlass.utils.HardwareInfo().get_max_active_clusters(cluster[0] * cluster[1])
    stream_t = torch.cuda.Stream()
    stream = cuda.CUstream(stream_t.cuda_stream)
    # the layout is dynamic: one compile serves every shape
    a0, b0, c0 = buffer_sets(128, 256, 128, torch.float16)[0]
    compiled = cute.compile(gemm, cute_view(a0), cute_view(b0), cute_view(c0), max_clusters,
                            stream)
    rows = []
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # time alone
        for op, m in shapes:
            n, k = SHAPES[op]
            sets = buffer_sets(m, n, k, torch.float16)
            views = [(cute_view(a), cute_view(b), cute_view(c)) for a, b, c in sets]
            # correctness first (poisoned output), so a wrong kernel is never timed as fast
            a, b, c = sets[0]
            c.fill_(float("nan"))
            with torch.cuda.stream(stream_t):
                compiled(*views[0], stream)
            torch.cuda.synchronize()
            ref = (a.float() @ b.float().t())
            rel = ((c.float() - ref).norm() / ref.norm()).item()
            fns = [lambda v=v: compiled(*v, stream) for v in views]
            with torch.cuda.stream(stream_t):
                t_cutlass, _ = time_rotating(fns, reps)
            res = dict(op=op, m=m, n=n, k=k, tile=f"{tile[0]}x{tile[1]}",
                       cluster=f"{cluster[0]}x{cluster[1]}", rel_err=rel,
                       cutlass_us=t_cutlass, buffer_sets=len(sets))
            for name, dtype in (("cublas_fp16_us", torch.float16),
                                ("cublas_bf16_us", torch.bfloat16)):
                tsets = [(a.to(dtype), b.to(dtype)) for a, b, _ in sets]
                res[name], _ = time_rotating(
                    [lambda a=a, b=b: torch.matmul(a, b.t()) for a, b in tsets], reps)
                del tsets
            res["tflops_cutlass"] = 2 * m * n * k / res["cutlass_us"] / 1e6
            res["cutlass_over_cublas"] = res["cutlass_us"] / res["cublas_fp16_us"]
            rows.append(res)
            print(f"  {res['tile']:>7} {res['cluster']} {op:>7} M={m:<5} rel={rel:.1e} "
                  f"cutlass {t_cutlass:8.1f} us  cublas fp16 {res['cublas_fp16_us']:8.1f} "
                  f"bf16 {res['cublas_bf16_us']:8.1f}  ratio {res['cutlass_over_cublas']:.3f}",
                  flush=True)
            del sets, views
            torch.cuda.empty_cache()
    return dict(tile=tile, cluster=cluster, rows=rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--example", required=True,
                   help="path of CUTLASS's hopper dense_gemm_persistent.py (see the docstring)")
    p.add_argument("--configs", default="128x256:1x1,128x256:2x1,128x256:1x2,128x128:1x2",
                   help="TMxTN:CMxCN, comma-separated (tile; cluster of CTAs along M x N)")
    p.add_argument("--shapes", default="O_PROJ:4096,DOWN:4096,GATE_UP:4096,O_PROJ:1024,DOWN:1024")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not Path(a.example).is_file():
        p.error(f"--example {a.example}: no such file (see the docstring for where to get it)")
    shapes = parse_shapes(a.shapes)
    lock_path = os.environ.get("MK_PEER_LOCK", "/tmp/mk_cutlass_peer.lock")
    if a.worker is not None:
        r = worker(a.example, parse_configs(a.worker)[0], shapes, a.reps, lock_path)
        print("@@RESULT " + json.dumps(r), flush=True)
        return 0
    configs = parse_configs(a.configs)
    procs = []
    for (tm, tn), (cm, cn) in configs:
        spec = f"{tm}x{tn}:{cm}x{cn}"
        cmd = [sys.executable, __file__, "--example", a.example, "--shapes", a.shapes,
               "--reps", str(a.reps), "--worker", spec]
        procs.append((spec, subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)))
    results, failed = [], []
    for spec, pr in procs:
        out, _ = pr.communicate()
        found = [ln for ln in out.splitlines() if ln.startswith("@@RESULT ")]
        print(f"== {spec} (rc {pr.returncode})")
        print("\n".join(ln for ln in out.splitlines() if not ln.startswith("@@")))
        if pr.returncode or not found:
            failed.append(spec)
        else:
            results.append(json.loads(found[-1][len("@@RESULT "):]))
    rows = [r for res in results for r in res["rows"]]
    print(f"\n{'op':>8} {'M':>5} {'tile':>8} {'cluster':>7} {'cutlass us':>11} "
          f"{'cublas us':>10} {'ratio':>6} {'TF/s':>6}")
    for r in sorted(rows, key=lambda r: (r["op"], r["m"], r["tile"], r["cluster"])):
        print(f"{r['op']:>8} {r['m']:>5} {r['tile']:>8} {r['cluster']:>7} {r['cutlass_us']:>11.1f} "
              f"{r['cublas_fp16_us']:>10.1f} {r['cutlass_over_cublas']:>6.3f} "
              f"{r['tflops_cutlass']:>6.0f}")
    if a.out:
        import torch
        from mk.provenance import git_commit
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(dict(
            date=datetime.date.today().isoformat(), git_commit=git_commit(),
            device=torch.cuda.get_device_name(0), command="python " + " ".join(sys.argv),
            example="NVIDIA/cutlass examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/"
                    "dense_gemm_persistent.py (main 7107b0553)",
            failed=failed, rows=rows), indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
