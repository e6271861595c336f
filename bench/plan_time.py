"""Planning time of one step: a 4096-token step of Llama-70B, TP 8, one rank (not a timed test).

    python bench/plan_time.py [--repeat 15] [--policy op_major] [--raster 8] [--layers 80]

Prints, per batch shape, the instruction count and the median / min planning time in ms
(mk.plan.plan_step: metadata, tiles, counters, queue order, the int32 [N, 32] stream).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

try:
    import mk  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mk.batch import SeqChunk, StepBatch
from mk.config import KernelConfig, ModelConfig, ParallelConfig
from mk.plan import PlanConfig, Planner, plan_step

LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                 num_kv_heads=8, head_dim=128, vocab_size=128256)


def batches(kernel: KernelConfig):
    ps = kernel.page_size
    pages_per_seq = kernel.max_context // ps
    nxt = [0]

    def seq(tokens: int, start: int) -> SeqChunk:
        p0 = nxt[0]
        nxt[0] += pages_per_seq
        return SeqChunk([1] * tokens, start, list(range(p0, p0 + pages_per_seq)))

    out = {}
    nxt[0] = 0
    out["mixed: 256 decode (ctx 2048) + 3840 prefill tokens (chunks of 1280, start 0/1024/2048)"] = \
        StepBatch([seq(1, 2047) for _ in range(256)] + [seq(1280, s) for s in (0, 1024, 2048)])
    nxt[0] = 0
    out["prefill: 4 chunks of 1024 tokens (start 0)"] = StepBatch([seq(1024, 0) for _ in range(4)])
    nxt[0] = 0
    out["decode: 4096 sequences x 1 token (ctx 1024)"] = StepBatch([seq(1, 1023) for _ in range(4096)])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--policy", default=PlanConfig.policy)
    p.add_argument("--raster", type=int, default=PlanConfig.raster_blocks,
                   help="PlanConfig.raster_blocks (op_major's column order over token blocks)")
    p.add_argument("--layers", type=int, default=80)
    p.add_argument("--tp", type=int, default=8)
    args = p.parse_args(argv)
    model = ModelConfig(**{**LLAMA_70B, "num_layers": args.layers})
    kernel = KernelConfig(token_block=128, page_size=16, max_batch_tokens=4096, max_seqs=4096,
                          max_context=4096, num_kv_pages=4096 * 4096 // 16)
    par = ParallelConfig(args.tp, 0)
    cfg = PlanConfig(policy=args.policy, raster_blocks=args.raster)
    print(f"Llama-70B-shaped model, {args.layers} layers, TP {args.tp} rank 0, token block "
          f"{kernel.token_block}, policy {args.policy} (raster {args.raster}), tiles qkv {cfg.qkv_tile} o {cfg.o_tile} "
          f"mlp {cfg.mlp_tile} down {cfg.down_tile} lm {cfg.lm_tile}, kv split {cfg.kv_split}")
    planner = Planner(model, par, kernel, cfg, fast_path=False)   # the full plan every time
    for name, batch in batches(kernel).items():
        row = {}
        for label, fn in (("Planner (reused arena)", planner.plan),
                          ("plan_step (fresh arrays)", lambda b: plan_step(b, model, par, kernel, cfg))):
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                plan = fn(batch)
                times.append((time.perf_counter() - t) * 1e3)
            row[label] = times
        print(f"{name}\n    {batch.num_tokens} tokens, {len(plan)} instructions "
              f"({len(plan) * 128 / 2**20:.0f} MiB), {plan.num_counters} counters")
        for label, times in row.items():
            print(f"    {label}: median {statistics.median(times):.1f} ms, min {min(times):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
