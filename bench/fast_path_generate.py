"""Greedy generation through the megakernel backend with the planner's fast path on and off.

MK_PLAN_FAST_PATH alternates 0 1 0 1 in one process, so only round 0 pays the compile. Per round:
wall time, the backend's per-step prepare (plan + check + upload or rewrite) and launch times,
full stream uploads, fast-path plans; last, whether the tokens of both settings agree. The tiny
head_dim-128 model and the prompts of tests/test_megakernel_step_gpu.py.

    python bench/fast_path_generate.py          # on a Hopper GPU, about a minute
"""

from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def main() -> int:
    import torch

    from mk import megakernel as mkk
    try:
        mkk.require_gpu("bench/fast_path_generate.py", hint="")
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from test_megakernel_step_gpu import _prompts

    from mk.engine import Engine
    from mk.tiny import TINY_HD128_CONFIG, tiny_checkpoint

    ckpt = tiny_checkpoint(config=TINY_HD128_CONFIG)
    tokens = {}
    for rnd, fast in enumerate("0101"):
        os.environ["MK_PLAN_FAST_PATH"] = fast     # read when the backend builds its planner
        e = Engine.from_pretrained(ckpt, backend="megakernel", dtype=torch.bfloat16,
                                   device="cuda", progress=False, max_seqs=16, max_context=1024)
        be, prepare_s, launch_s = e.backend, [], []
        plain_run_step = be.run_step

        def run_step(prep, tokens=None, plain=plain_run_step, be=be, prepare_s=prepare_s,
                     launch_s=launch_s):
            r = plain(prep, tokens)
            prepare_s.append(be.last_prepare_s)
            launch_s.append(be.last_launch_s)
            return r

        be.run_step = run_step
        torch.cuda.synchronize()
        t = time.perf_counter()
        # one step at a time: each step's plan + check + upload (or rewrite) on the host, timed
        out = e.generate(_prompts(), max_new_tokens=64, ignore_eos=True, max_tokens_per_step=64,
                         overlap=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        p = prepare_s
        tokens.setdefault(fast, out)
        print(f"fast_path={fast} round {rnd}: wall {wall:.2f} s, steps {len(p)}, prepare sum "
              f"{sum(p):.2f} s max {max(p) * 1e3:.1f} ms, launch sum {sum(launch_s):.2f} s max "
              f"{max(launch_s) * 1e3:.1f} ms, uploads {be.stream_uploads}, fast plans "
              f"{be.planner.fast_plans}", flush=True)
    same = tokens["0"] == tokens["1"]
    print("tokens equal on/off:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
