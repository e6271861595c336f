"""The megakernel backend's host work per step, on the CPU (not a timed test): one Llama-70B TP8
rank seen as a TP-1 model (what launch/bench.py times on the GPU), decode at the bench's batch
sizes and the mixed step. Per point: the plan (mk.plan.Planner, arena reused; in full, and, for
decode points, the next decode step through the planner's fast path), the host check
of the stream (mk.megakernel.check_plan) in full and on StepPlan.representative_stream (what
MegakernelStepBackend.prepare runs), the stream's bytes and the bytes a step the fast path cannot
take uploads (StepPlan.device_stream); last, the launch's parameter building
(launch_args_ms). Medians of --repeat.

    python bench/host_step.py [--repeat 7] [--out bench/results/host_step_<date>.json]

Needs nvidia-cutlass-dsl importable (the check's tile rules), no GPU (meta tensors).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mk.batch import SeqChunk, StepBatch  # noqa: E402
from mk.config import KernelConfig, ModelConfig, ParallelConfig  # noqa: E402
from mk.peers import shard_config  # noqa: E402
from mk.megakernel_step import default_plan_config  # noqa: E402
from mk.plan import Planner  # noqa: E402

LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                 num_kv_heads=8, head_dim=128, vocab_size=128256)
POINTS = [(1, 1024, 0), (16, 1024, 0), (64, 1024, 0), (256, 1024, 0), (1024, 1024, 0),
          (4096, 256, 0), (256, 1024, 1024)]        # (decode sequences, context, prefill tokens)


def rank_model() -> ModelConfig:
    """Rank 0 of TP 8 as a TP-1 model of the shard's shapes (mk.peers.shard_as_tp1's config)."""
    return shard_config(ModelConfig(**LLAMA_70B), ParallelConfig(8, 0))


def point_batch(decode: int, ctx: int, prefill: int, page: int) -> StepBatch:
    per = -(-max(ctx, prefill) // page)
    seqs = [SeqChunk([1], ctx - 1, list(range(i * per, (i + 1) * per))) for i in range(decode)]
    if prefill:
        seqs.append(SeqChunk([1] * prefill, 0, list(range(decode * per, (decode + 1) * per))))
    return StepBatch(seqs)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def launch_args_ms(repeat: int) -> dict:
    """The host time of Megakernel._args, the launch's ~33 kernel parameters as DLPack views
    (mk.megakernel._dl, ~8 us each): before session 60 every launch built them twice (the
    compiled-variant lookup, then the launch); now once per kernel, the stream's once per upload.
    On CPU tensors of the parameters' dtypes and ranks (the views' cost does not depend on the
    device or the sizes)."""
    import torch

    import mk.megakernel as M
    from mk.instructions import _rows_kernel as rk
    mk = object.__new__(M.Megakernel)
    mk.arena = torch.zeros(3, 64, 128, dtype=torch.bfloat16)
    mk.counters = torch.zeros(1024, dtype=torch.int32)
    mk.state = torch.zeros(rk.STATE_WORDS, dtype=torch.int32)
    mk.normw = torch.zeros(8, 128, dtype=torch.bfloat16)
    mk.journal = torch.zeros(1, M.JOURNAL_WORDS, dtype=torch.int64)
    mk.jcta = torch.zeros(4, M.JCTA_WORDS, dtype=torch.int64)
    mk._gemm_t = (M.gemm_tensor_args(None, device="cpu") + M.family_tensor_args(None, device="cpu")
                  + [torch.zeros(8, 8, dtype=torch.float32)])
    mk._align = [4 if t.dtype == torch.int32 else 16 for t in mk._gemm_t]
    mk._align[len(M.GEMM_OPS) * 3 + 3 + 3] = 4
    mk.n_layers, mk.eps, mk.timeout_ns, mk.grid = 80, 1e-5, 10**10, 132
    mk._fixed_args, mk._stream_arg = None, (None, None)
    stream = torch.zeros(1000, 32, dtype=torch.int32)

    def every_launch_twice():           # the launch before session 60
        for _ in range(2):
            mk._fixed_args, mk._stream_arg = None, (None, None)
            mk._args(stream, 1, None)

    def cached():
        mk._args(stream, 1, None)
    cached()
    return dict(parameters=len(mk._args(stream, 1, None)),
                built_twice_per_launch_ms=round(timed(every_launch_twice, repeat), 3),
                cached_ms=round(timed(cached, repeat), 3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import mk.megakernel as M
    from mk.megakernel_step import meta_operands
    model, page = rank_model(), 16
    rows = []
    print(f"{'point':<34}{'instrs':>9}{'MiB':>7}{'upload':>8}{'plan ms':>9}{'next ms':>9}"
          f"{'check full':>12}{'check repr':>12}")
    for decode, ctx, prefill in POINTS:
        seqs = decode + (1 if prefill else 0)
        per = -(-max(ctx, prefill) // page)
        kernel = KernelConfig(page_size=page, max_seqs=4096, max_context=max(ctx, prefill),
                              max_batch_tokens=4096, num_kv_pages=seqs * per)
        cfg = default_plan_config()               # the megakernel backend's default
        planner = Planner(model, ParallelConfig(), kernel, cfg, fast_path=False)
        batch = point_batch(decode, ctx, prefill, page)
        plan = planner.plan(batch)
        # a generation loop's next decode steps (positions + 1, the same KV splits: the fast path)
        steps = [point_batch(decode, ctx - 1 + d, prefill, page) for d in (-1, 0)]
        fast = Planner(model, ParallelConfig(), kernel, cfg)
        fast.plan(steps[1])
        turn = [0]

        def plan_next():
            turn[0] ^= 1
            fast.plan(steps[turn[0]])
        nbuf, T, H, kw = meta_operands(model, kernel, cfg, batch.num_tokens)
        n_ctr = 1 << 22

        def check_full():
            M.check_plan(plan.instrs, nbuf, T, H, n_ctr, **kw)

        def check_repr():
            M.check_plan(plan.representative_stream(), nbuf, T, H, n_ctr, **kw)
        label = f"decode B={decode} ctx={ctx}" + (f" + prefill {prefill}" if prefill else "")
        r = dict(point=label, instructions=len(plan), stream_bytes=len(plan) * 128,
                 # what a step the fast path cannot take copies (StepPlan.device_stream)
                 upload_bytes=plan.uploaded_rows() * 128,
                 plan_ms=round(timed(lambda: planner.plan(batch), args.repeat), 2),
                 plan_next_decode_ms=(round(timed(plan_next, args.repeat), 2)
                                      if not prefill else None),
                 check_full_ms=round(timed(check_full, max(1, args.repeat // 2)), 2),
                 check_representative_ms=round(timed(check_repr, args.repeat), 2))
        rows.append(r)
        nxt = r["plan_next_decode_ms"]
        print(f"{label:<34}{r['instructions']:>9}{r['stream_bytes'] / 2**20:>7.1f}"
              f"{r['upload_bytes'] / 2**20:>8.2f}{r['plan_ms']:>9.1f}"
              f"{'-' if nxt is None else f'{nxt:.2f}':>9}"
              f"{r['check_full_ms']:>12.1f}{r['check_representative_ms']:>12.2f}", flush=True)
    launch_args = launch_args_ms(max(args.repeat, 20))
    print(f"launch arguments ({launch_args['parameters']} parameters): built twice per launch "
          f"{launch_args['built_twice_per_launch_ms']:.3f} ms, cached "
          f"{launch_args['cached_ms']:.3f} ms", flush=True)
    from mk.provenance import run_record
    report = run_record(__file__, argv,
                        machine=f"{platform.processor() or platform.machine()}, "
                                f"{os.cpu_count()} cores (CPU only)",
                        model="Llama-70B TP8 rank 0 as TP 1", points=rows,
                        launch_args=launch_args)
    out = Path(args.out) if args.out else \
        ROOT / "bench" / "results" / f"host_step_{datetime.date.today().isoformat()}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
