"""A generation job through the megakernel backend, one step at a time, planned ahead, run ahead.

One Llama-70B TP8 rank (rank 0's shard as a TP-1 model, random bf16 weights: the work of one GPU
of the node without the communication) runs Engine.generate over --seqs prompts of --prompt-len
random tokens, --new-tokens each, at most --tokens-per-step tokens a step (continuous batching:
prefill chunks beside the decodes, then decodes alone). Each round runs the modes in turn (their
order rotated round to round): Engine.generate(overlap=False) (each step planned after the one
before is read back), overlap="plan" (step n + 1 planned and checked on the host while step n
runs, launched once step n's tokens are read) and overlap=True (step n + 1 also queued on the
device behind step n before its tokens are read: the device goes from step to step without
the host in between); a first overlap=False round compiles the megakernel's M classes and is
not counted. Per round: wall time, steps, steps queued ahead, new tokens / s, the backend's host
planning share, the megakernel's device time (each launch between two CUDA events) and the wall
time outside it a step (the host's critical path, the uploads and the sampling); last, the
median wall time of each mode, their ratios to one step at a time, and whether every mode gave
the same tokens (they must; ignore_eos: every mode runs the same steps).

    python bench/generate_overlap.py --out bench/results/genoverlap.json   # Hopper GPU, ~3 min
    python bench/generate_overlap.py --job 256:256:64:1024 --job 16:128:128:256   # two jobs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=256, help="prompts (default 256)")
    p.add_argument("--prompt-len", type=int, default=256, help="tokens a prompt (default 256)")
    p.add_argument("--new-tokens", type=int, default=64, help="new tokens a prompt (default 64)")
    p.add_argument("--tokens-per-step", type=int, default=1024,
                   help="the step's token budget (default 1024)")
    p.add_argument("--job", action="append", default=[], metavar="SEQS:PROMPT:NEW:STEP",
                   help="a job of SEQS prompts of PROMPT tokens, NEW new tokens each, STEP tokens "
                        "a step; repeatable, on one engine (its compiled kernels shared); "
                        "given, it replaces the job of the four options above")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each mode (default 3)")
    p.add_argument("--layers", type=int, default=80, help="layers of the rank (default 80)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the JSON report here")
    a = p.parse_args(argv)
    for name in ("seqs", "prompt_len", "new_tokens", "tokens_per_step", "rounds", "layers"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    jobs = []
    for text in a.job:
        try:
            job = tuple(int(v) for v in text.split(":"))
        except ValueError:
            job = ()
        if len(job) != 4 or min(job) < 1:
            p.error(f"--job {text!r} is not SEQS:PROMPT:NEW:STEP of positive integers")
        jobs.append(job)
    a.jobs = jobs or [(a.seqs, a.prompt_len, a.new_tokens, a.tokens_per_step)]
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from mk import megakernel as mkk
    try:
        mkk.require_gpu("bench/generate_overlap.py", hint="")
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from mk import peers
    from mk.config import KernelConfig, ParallelConfig
    from mk.engine import Engine
    from mk.provenance import run_record
    from launch.bench import LLAMA_70B

    par = ParallelConfig(tp_size=8, rank=0)
    cfg = replace(LLAMA_70B, num_layers=args.layers)
    device = torch.device("cuda")
    t0 = time.perf_counter()
    shard = peers.shard_as_tp1(peers.random_rank_weights(cfg, par, device, dtype=torch.bfloat16,
                                                         seed=args.seed))
    page = 16
    context = max(prompt + new for _, prompt, new, _ in args.jobs)
    kernel = KernelConfig(page_size=page, max_seqs=max(256, *(j[0] for j in args.jobs)),
                          max_context=context,
                          max_batch_tokens=max(4096, *(j[3] for j in args.jobs)),
                          num_kv_pages=max(seqs * -(-(prompt + new) // page)
                                           for seqs, prompt, new, _ in args.jobs))
    engine = Engine(shard, backend="megakernel", kernel=kernel, owns_weights=True)
    print(f"[genoverlap] weights and engine {time.perf_counter() - t0:.1f} s; "
          f"{torch.cuda.get_device_name()}", file=sys.stderr, flush=True)

    # each launch between two timing events: the megakernel's device time against the wall time
    # says what is left between two steps (the host's critical path: the wait for step n, the
    # sampling, the token read, the uploads, the launch)
    launches: list = []
    plain_launch = mkk.Megakernel.launch

    def timed_launch(self, prepared, check: bool = True, record: bool = False):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        rec = plain_launch(self, prepared, check=False, record=record or check)
        e1.record()
        launches.append((e0, e1))
        if check:
            self.finish_launch(rec)
            return None
        return rec if record else None

    def run(prompts, kw, overlap) -> dict:
        torch.cuda.synchronize()
        launches.clear()
        mkk.Megakernel.launch = timed_launch
        try:
            out = engine.generate(prompts, overlap=overlap, **kw)
        finally:
            mkk.Megakernel.launch = plain_launch
        torch.cuda.synchronize()
        st = engine.last_stats
        kernel_s = sum(a.elapsed_time(b) for a, b in launches) / 1e3
        return dict(overlap=overlap, wall_s=round(st.wall_s, 4), steps=st.steps,
                    ahead_steps=st.ahead_steps,
                    new_tokens=st.new_tokens, new_tokens_per_s=round(st.new_tokens_per_s, 1),
                    tokens_per_s=round(st.tokens_per_s, 1),
                    host_prepare_s=round(st.prepare_s or 0.0, 4),
                    host_launch_s=round(st.launch_s or 0.0, 4),
                    kernel_s=round(kernel_s, 4),
                    outside_kernel_ms_a_step=round((st.wall_s - kernel_s) / max(st.steps, 1)
                                                   * 1e3, 3),
                    tokens=out)

    modes = (False, "plan", True)
    names = {False: "one_step_at_a_time", "plan": "planned_ahead", True: "run_ahead"}
    g = torch.Generator().manual_seed(args.seed)
    reports, all_same = [], True
    for seqs, prompt_len, new_tokens, step_tokens in args.jobs:
        job = f"{seqs}:{prompt_len}:{new_tokens}:{step_tokens}"
        prompts = [torch.randint(3, shard.config.vocab_size, (prompt_len,), generator=g).tolist()
                   for _ in range(seqs)]
        kw = dict(max_new_tokens=new_tokens, ignore_eos=True, max_tokens_per_step=step_tokens)
        t0 = time.perf_counter()
        warm = run(prompts, kw, False)
        print(f"[genoverlap] job {job}: warm-up round (compiles) {time.perf_counter() - t0:.1f} s, "
              f"{warm['steps']} steps", file=sys.stderr, flush=True)
        rounds = []
        for r in range(args.rounds):
            for overlap in modes[r % 3:] + modes[:r % 3]:
                res = run(prompts, kw, overlap)
                rounds.append(res)
                print(f"round {r} job {job} overlap={overlap}: wall {res['wall_s']:.3f} s, "
                      f"{res['steps']} steps ({res['ahead_steps']} ahead), "
                      f"{res['new_tokens_per_s']:.1f} new tokens/s, host planning "
                      f"{res['host_prepare_s']:.3f} s, launches {res['host_launch_s']:.3f} s, "
                      f"kernels {res['kernel_s']:.3f} s, outside them "
                      f"{res['outside_kernel_ms_a_step']:.3f} ms a step", flush=True)
        same = all(r["tokens"] == warm["tokens"] for r in rounds)
        all_same = all_same and same
        med = {o: statistics.median(r["wall_s"] for r in rounds if r["overlap"] == o)
               for o in modes}
        ratios = {names[o]: round(med[o] / med[False], 4) for o in modes[1:]}
        print(f"median wall, job {job}: "
              + ", ".join(f"{names[o]} {med[o]:.3f} s" for o in modes)
              + "; over one step at a time: "
              + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
              + f"; tokens equal in every round: {same}", flush=True)
        for r in rounds:
            del r["tokens"]
        reports.append(dict(seqs=seqs, prompt_len=prompt_len, new_tokens=new_tokens,
                            tokens_per_step=step_tokens, warmup_steps=warm["steps"],
                            rounds=rounds, median_wall_s={names[o]: med[o] for o in modes},
                            over_one_step_at_a_time=ratios, tokens_equal=same))
    if args.out:
        report = dict(benchmark="generation job: one step at a time, planned ahead, run ahead "
                                "(bench/generate_overlap.py)",
                      **run_record(__file__, argv, device=torch.cuda.get_device_name()),
                      model="Llama-70B TP8 rank 0 as TP 1, random bf16 weights",
                      layers=args.layers, rounds=args.rounds, jobs=reports)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
