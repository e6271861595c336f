"""Adversarial plans for the static verifier: per mutation class, how many mutants the verifier
rejects, and whether each rejection is real (the executor shows a stall or a wrong output).

    python bench/verify_mutations.py [--per-class 150] [--budget 50] [--seed 0]

Columns: generated; equivalent = no interleaving tried shows a stall or a wrong output (these are
not counted as bugs: e.g. a move that keeps the queue deadlock-free); bugs = the rest; rejected =
bugs the verifier refuses (must equal bugs); shown = rejected mutants the executor breaks (must
equal rejected: the verifier is right, not just strict); missed = accepted bugs (must be 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mk import mutate as M  # noqa: E402
from mk.verify import check  # noqa: E402


def evaluate(per_class: int = 150, budget: int = 50, seed: int = 0, verbose: bool = False):
    plans = M.valid_plans()
    refs = {}
    for k, p in enumerate(plans):
        status, refs[k] = M.Executor(p).run(K=1)
        assert status == "ok"
        assert not check(p.tensors(), p.num_counters), f"valid plan refused: {p.desc}"
    mutants = M.generate(plans, per_class, seed)
    rows: dict[str, dict[str, int]] = {}
    problems = []
    t_verify = t_exec = 0.0
    for n, mut in enumerate(mutants):
        row = rows.setdefault(mut.cls, dict(generated=0, equivalent=0, bugs=0, rejected=0, shown=0,
                                            missed=0, strict=0, stall=0, wrong=0))
        row["generated"] += 1
        t0 = time.perf_counter()
        findings = check(mut.plan.tensors(), mut.plan.num_counters)
        t1 = time.perf_counter()
        v = M.judge(plans[mut.source], mut, findings, budget=budget, seed=n, reference=refs[mut.source])
        t_exec += time.perf_counter() - t1
        t_verify += t1 - t0
        bug = v.outcome != "same"
        row["bugs"] += bug
        row["equivalent"] += not bug
        row["rejected"] += bool(findings) and bug
        row["shown"] += bool(findings) and bug
        row[v.outcome if bug else "equivalent"] += 0
        if bug:
            row[v.outcome] += 1
        if bug and not findings:
            row["missed"] += 1
            problems.append(f"MISSED  {mut.cls}: {mut.desc} [{plans[mut.source].desc}] -> {v.outcome} {v.how}")
        if findings and not bug:
            row["strict"] += 1
            problems.append(f"STRICT  {mut.cls}: {mut.desc} [{plans[mut.source].desc}] -> "
                            f"{findings[0]}")
        if verbose:
            print(f"{mut.cls:22s} {v.outcome:6s} runs={v.runs:2d} findings={len(findings)} {mut.desc}")
    return rows, problems, len(mutants), t_verify, t_exec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=150)
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    t = time.perf_counter()
    rows, problems, n, tv, te = evaluate(a.per_class, a.budget, a.seed, a.verbose)
    hdr = (f"{'class':22s} {'generated':>9s} {'equiv':>6s} {'bugs':>5s} {'rejected':>8s} "
           f"{'shown':>6s} {'(stall':>6s} {'wrong)':>6s} {'missed':>6s} {'strict':>6s}")
    print(hdr)
    print("-" * len(hdr))
    tot = {}
    for cls, r in rows.items():
        print(f"{cls:22s} {r['generated']:9d} {r['equivalent']:6d} {r['bugs']:5d} {r['rejected']:8d} "
              f"{r['shown']:6d} {r['stall']:6d} {r['wrong']:6d} {r['missed']:6d} {r['strict']:6d}")
        for k, v in r.items():
            tot[k] = tot.get(k, 0) + v
    print("-" * len(hdr))
    print(f"{'total':22s} {tot['generated']:9d} {tot['equivalent']:6d} {tot['bugs']:5d} "
          f"{tot['rejected']:8d} {tot['shown']:6d} {tot['stall']:6d} {tot['wrong']:6d} "
          f"{tot['missed']:6d} {tot['strict']:6d}")
    print(f"\n{n} mutants; verifier {tv:.1f} s, executor {te:.1f} s, total {time.perf_counter() - t:.1f} s")
    for p in problems[:40]:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
