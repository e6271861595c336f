"""End-to-end step benchmark: one tensor-parallel rank's decode step, megakernel vs PyTorch peers.

    python launch/bench.py                                   # Llama-70B TP8 rank 0, random bf16
    python launch/bench.py --batch 1,64 --layers 8 --reps 10 # a quick partial run
    python launch/bench.py --shape tiny --device cpu         # CPU smoke test (eager only)
    python launch/bench.py --model /ckpt/Llama-3.3-70B --tp 8 --rank 0
    torchrun --nproc-per-node 8 launch/bench.py --model /ckpt/Llama-3.3-70B

What is timed, per point (decode: B sequences, one new token each, every sequence at the stated
context C, i.e. its new token is position C-1 and attention reads C cached positions; mixed: the
decode part plus one prefill chunk of P tokens of a new sequence, positions 0..P-1):

  megakernel  the engine's "megakernel" backend (mk.engine.create_backend), one step through
              backend.forward(StepBatch); "n/a: <its error>" when it cannot run a model step.
              Its cache holds the peer's random K / V (seed_megakernel_kv) and, where a peer
              runs, its logits are compared with the eager step's (rel_err_vs_eager; over 0.25:
              status "error"); --systems megakernel alone checks nothing at the point
  eager       mk.peers.StepPeer.step(): a good plain-PyTorch step (fused QKV / gate_up GEMMs,
              contiguous KV cache, SDPA flash attention with GQA packing), launched op by op
  graph       the same step captured once in a CUDA graph and replayed
  compile     each layer compiled by torch.compile (--compile-mode), the step captured in a CUDA
              graph and replayed: the strongest PyTorch peer
  floor       max(bytes / copy bandwidth, flops / matmul rate), both rates measured in this run
              (a large device-to-device copy, an N^3 matmul in the model dtype); bytes and flops
              are counted by step_cost() below

One process = one rank's shard (default: rank 0 of TP 8 for the 70B shape). Tensor-parallel
communication is NOT simulated: no all-reduce after the o / down projections, no all-gather of the
logits, in any system. Under torchrun each rank times its own shard (no collective inside a step);
rank 0 reports the slowest rank per figure.

Timing: CUDA events around each step, the L2 flushed and new token ids copied in before each rep
(outside the events), --warmup steps first, the median of --reps reps. --plan-ab NAME:FIELDS ...:
plans that change only the megakernel's instruction stream timed on its one compiled kernel, rep
by rep interleaved with the plan's own (each variant's median, and the median of its per-rep
ratios to the base's: the A/B without the drift between separate runs). On the CPU (--device cpu):
time.perf_counter, no CUDA graphs and no torch.compile (graph and compile are skipped with a note).

Before timing, the peer's step is checked against mk.reference.ReferenceModel on a small model with
this rank's attention structure (decode and mixed steps; bf16 and float32); the run stops if they
disagree. The compiled step's logits are checked against the eager step's at every point.

Output: a table (last, on stdout; with --json on stderr, and one JSON object as the last line of
stdout), the JSON at --out (default bench/results/e2e_<date>.json for the full 70B TP8 run on a GPU,
e2e_<date>_<shape>_<device>.json otherwise; rewritten after every point), and a PNG next to it
(tokens/s vs batch per system and the floor) when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This checkout's mk, even when another copy of mk is installed in the environment.
sys.path.insert(0, str(ROOT))
import mk  # noqa: E402,F401

import torch

from mk import dist as mkdist
from mk.config import ConfigError, KernelConfig, ModelConfig, ParallelConfig, RopeConfig
from mk.provenance import git_commit, knob_env
from mk.tiny import TINY_CONFIG

# Shapes --------------------------------------------------------------------------------------------
_LLAMA3_ROPE = RopeConfig(theta=500000.0, scaling_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192)
LLAMA_70B = ModelConfig(hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                        num_kv_heads=8, head_dim=128, vocab_size=128256, rms_norm_eps=1e-5,
                        rope=_LLAMA3_ROPE, max_position_embeddings=131072, bos_token_id=128000,
                        eos_token_id=(128001, 128008, 128009))
LLAMA_8B = replace(LLAMA_70B, hidden_size=4096, intermediate_size=14336, num_layers=32,
                   num_heads=32)
# name -> (model config, TP size of the timed rank's shard)
SHAPES = {
    "70b-tp8": (LLAMA_70B, 8),
    "70b-tp4": (LLAMA_70B, 4),
    "8b": (LLAMA_8B, 1),
    "8b-tp8": (LLAMA_8B, 8),
    "tiny": (TINY_CONFIG, 1),
}
SYSTEMS = ("megakernel", "eager", "graph", "compile")
PEERS = ("eager", "graph", "compile")
DEFAULT_BATCH = "1,16,64,256,1024,4096"
MAX_BATCH = KernelConfig().max_batch_tokens        # tokens of one step the kernels are built for
DEFAULT_MIXED = "256:1024:1024"
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "fp16": torch.float16}


def default_context(batch: int) -> int:
    """The stated context per batch size: 1024 up to batch 1024, 256 above (KV cache ~43 GB for one
    70B TP8 rank at 1024 x 1024 and at 4096 x 256)."""
    return 1024 if batch <= 1024 else 256


def experiment_switches() -> dict:
    """The leave-one-out profiling switches set in the environment (MK_ATTN_EXPERIMENT,
    MK_GEMM_EXPERIMENT: parts of an instruction's work compiled out, bench/ATTENTION_NOTES.md);
    a megakernel built with any of them computes wrong outputs by design."""
    return {k: os.environ[k] for k in ("MK_ATTN_EXPERIMENT", "MK_GEMM_EXPERIMENT")
            if os.environ.get(k)}


class UsageError(Exception):
    """Bad arguments: reported as `error: ...`, exit code 2."""


def log(msg: str) -> None:
    if mkdist.rank() == 0:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


# Points --------------------------------------------------------------------------------------------
@dataclass
class Point:
    kind: str            # "decode" or "mixed"
    decode: int          # decode sequences (one token each)
    context: int         # their context length (the new token is position context-1)
    prefill: int = 0     # prefill tokens of one new sequence (positions 0..prefill-1)

    @property
    def tokens(self) -> int:
        return self.decode + self.prefill

    @property
    def label(self) -> str:
        if self.kind == "decode":
            return f"decode B={self.decode} ctx={self.context}"
        return f"mixed {self.decode}x ctx {self.context} + prefill {self.prefill}"

    @property
    def slug(self) -> str:
        """The label as a file-name part."""
        if self.kind == "decode":
            return f"decode_b{self.decode}_ctx{self.context}"
        return f"mixed_b{self.decode}_ctx{self.context}_p{self.prefill}"


# Cost model ----------------------------------------------------------------------------------------
def weight_bytes(cfg: ModelConfig, par: ParallelConfig, elt: int = 2) -> int:
    """Bytes of one rank's weights as RankWeights stores them (embedding and LM head shards, norms,
    fused QKV, o, fused gate/up, down of every layer)."""
    L, H, D = cfg.num_layers, cfg.hidden_size, cfg.head_dim
    hq, hkv = par.heads_local(cfg), par.kv_heads_local(cfg)
    Il, Vl = par.intermediate_local(cfg), par.vocab_local(cfg)
    per_layer = (hq + 2 * hkv) * D * H + H * hq * D + 2 * Il * H + H * Il + 2 * H
    return elt * (2 * Vl * H + H + L * per_layer)


def kv_cache_bytes(cfg: ModelConfig, par: ParallelConfig, point: Point, elt: int = 2) -> int:
    """Bytes of the KV cache a point needs on this rank (K and V, every layer, every position)."""
    per_token = 2 * cfg.num_layers * par.kv_heads_local(cfg) * cfg.head_dim * elt
    return per_token * (point.decode * point.context + point.prefill)


def activation_bytes_estimate(cfg: ModelConfig, par: ParallelConfig, point: Point,
                              elt: int = 2) -> int:
    """A generous estimate of a step's live activations (x4: the eager step and the two CUDA-graph
    pools hold their own, plus the compiled step's workspace)."""
    T, H = point.tokens, cfg.hidden_size
    D, hq, hkv = cfg.head_dim, par.heads_local(cfg), par.kv_heads_local(cfg)
    per_tok = 4 * H + (hq + 2 * hkv) * D + 3 * par.intermediate_local(cfg) + par.vocab_local(cfg)
    return 4 * T * per_tok * elt


def step_cost(cfg: ModelConfig, par: ParallelConfig, point: Point, elt: int = 2) -> dict:
    """Bytes that one rank's step must move through HBM and flops it must compute, counted
    explicitly (the roofline floor is max(bytes / copy bandwidth, flops / matmul rate)).

    bytes:
      weights       every weight of the shard read once (the embedding table excepted: only the
                    rows of the step's tokens, see activations): per layer the fused QKV
                    [(hq+2hkv)*D, H], o [H, hq*D], fused gate/up [2*I/n, H], down [H, I/n] and the
                    two norm vectors; the final norm and the LM head shard [V/n, H]
      kv_read       decode: every decode sequence reads `context` cached positions of K and V in
                    every layer (hkv_local heads of D); the prefill chunk's attention reads its own
                    fresh K/V, counted as on-chip (0)
      kv_write      the K and V of every new token, every layer
      activations   a lower bound: the embedding rows of the step's tokens read once, the residual
                    stream [T, H] read and written once per layer, the logits [rows, V/n] written
                    once (everything else is assumed to stay on chip)
    flops (multiply-add = 2):
      linear        2 * T * (weights of the four projections) per layer, T = all new tokens
      lm_head       2 * rows * V/n * H, rows = one per sequence (decode tokens + 1 for the chunk)
      attention     QK^T and PV: 4 * hq_local * D per (query, key) pair: decode C keys per query,
                    prefill causal P(P+1)/2 pairs
      (norms, RoPE, SiLU and softmax are O(T*H) elementwise work: not counted)
    """
    L, H, D = cfg.num_layers, cfg.hidden_size, cfg.head_dim
    hq, hkv = par.heads_local(cfg), par.kv_heads_local(cfg)
    Il, Vl = par.intermediate_local(cfg), par.vocab_local(cfg)
    T = point.tokens
    rows = point.decode + (1 if point.prefill else 0)
    proj = (hq + 2 * hkv) * D * H + H * hq * D + 2 * Il * H + H * Il
    b_weights = weight_bytes(cfg, par, elt) - Vl * H * elt     # the embedding shard: rows only
    b_kv_read = L * 2 * hkv * D * elt * point.decode * point.context
    b_kv_write = L * 2 * hkv * D * elt * T
    b_act = elt * (T * H + L * 2 * T * H + rows * Vl)
    f_linear = 2 * T * proj * L
    f_lm = 2 * rows * Vl * H
    pairs = point.decode * point.context + point.prefill * (point.prefill + 1) // 2
    f_attn = 4 * hq * D * pairs * L
    return dict(bytes=b_weights + b_kv_read + b_kv_write + b_act,
                bytes_detail=dict(weights=b_weights, kv_read=b_kv_read, kv_write=b_kv_write,
                                  activations=b_act),
                flops=f_linear + f_lm + f_attn,
                flops_detail=dict(linear=f_linear, lm_head=f_lm, attention=f_attn))


def floor_of(cost: dict, bandwidth: float, flops_rate: float) -> dict:
    t_b = cost["bytes"] / bandwidth
    t_f = cost["flops"] / flops_rate
    return dict(ms=1e3 * max(t_b, t_f), bytes_ms=1e3 * t_b, flops_ms=1e3 * t_f,
                bound="memory" if t_b >= t_f else "compute", **cost)


# Timing --------------------------------------------------------------------------------------------
class Timer:
    """Median step time over reps: CUDA events (L2 flushed before each rep) or perf_counter."""

    def __init__(self, device: torch.device, flush_mib: int = 256, rep_gap_ms: float = 0.0):
        self.device = device
        self.cuda = device.type == "cuda"
        # idle time before each timed rep (--rep-gap-ms): the device drained, then the host
        # sleeps, so each rep starts from a rested GPU as a lone journaled launch does
        self.rep_gap_s = rep_gap_ms / 1e3
        self._flush = (torch.empty(flush_mib << 20, dtype=torch.uint8, device=device)
                       if self.cuda else None)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def rest(self) -> None:
        """The gap before a timed rep (none by default)."""
        if self.rep_gap_s > 0:
            self.sync()
            time.sleep(self.rep_gap_s)

    def run(self, fn, warmup: int, reps: int, before=None) -> list[float]:
        """Milliseconds of each rep of fn(); before(i) runs untimed before rep i."""
        for i in range(warmup):
            if before:
                before(i)
            fn()
        self.sync()
        if not self.cuda:
            out = []
            for i in range(reps):
                if before:
                    before(i)
                self.rest()
                t0 = time.perf_counter()
                fn()
                out.append(1e3 * (time.perf_counter() - t0))
            return out
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            if before:
                before(i)
            self._flush.zero_()
            self.rest()
            starts[i].record()
            fn()
            ends[i].record()
        self.sync()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def run_interleaved(self, fns: list, warmup: int, reps: int, before=None) -> list[list[float]]:
        """Milliseconds of each rep of each fns[k](), the reps interleaved: rep i runs every fn,
        in an order rotated by i (none always first after another's tail); before(k, i) runs
        untimed before fns[k]'s rep i. Reps taken moments apart share the clock and the
        temperature, so their ratio carries none of the drift between separate runs (session
        59: GEMM tiles' own times 2% apart in two runs of one plan within one call)."""
        n = len(fns)
        order = [(k, i) for i in range(max(reps, 1)) for k in [(i + j) % n for j in range(n)]]
        cur = [0]

        def pick(j):                            # the warm-up cycles through the first reps
            k, i = order[j % len(order)]
            cur[0] = k
            if before:
                before(k, i)
        flat = self.run(lambda: fns[cur[0]](), warmup * n, n * reps, pick)
        out = [[] for _ in range(n)]
        for (k, _), ms in zip(order, flat):
            out[k].append(ms)
        return out


def summarize(ms: list[float]) -> dict:
    q = sorted(ms)
    pick = lambda f: q[min(len(q) - 1, int(f * len(q)))]  # noqa: E731
    return dict(ms=statistics.median(q), min_ms=q[0], p10_ms=pick(0.1), p90_ms=pick(0.9),
                reps=len(q))


def measure_rates(device: torch.device, dtype: torch.dtype, timer: Timer, matmul_n: int,
                  copy_mib: int, reps: int) -> dict:
    """Copy bandwidth (bytes read + written per second of a large device-to-device copy) and
    matmul rate (2 N^3 / s of an N x N x N matmul in the model dtype), medians of reps."""
    src = torch.empty(copy_mib << 20, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    t = summarize(timer.run(lambda: dst.copy_(src), 3, reps))["ms"]
    bw = 2 * src.numel() / (t * 1e-3)
    del src, dst
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=dtype)
    t2 = summarize(timer.run(lambda: torch.matmul(a, b), 3, reps))["ms"]
    rate = 2 * matmul_n ** 3 / (t2 * 1e-3)
    del a, b
    return dict(copy_bandwidth_Bps=bw, copy_bytes=copy_mib << 20, copy_ms=t,
                matmul_flops_per_s=rate, matmul_n=matmul_n, matmul_ms=t2,
                matmul_dtype=str(dtype).replace("torch.", ""))


# Arguments -----------------------------------------------------------------------------------------
def _int_list(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} {text!r}: expected comma-separated integers") from None
    if not vals:
        raise UsageError(f"{what} {text!r}: empty list")
    return vals


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (launch/bench.py) for what is "
                                       "timed and how.")
    p.add_argument("--model", default=None, help="HF Llama checkpoint directory (this rank's "
                   "shard is loaded); default: random bf16 weights of --shape on the device")
    p.add_argument("--shape", default="70b-tp8", choices=sorted(SHAPES),
                   help="synthetic model shape (default 70b-tp8: Llama-3.x-70B, one rank of TP 8)")
    p.add_argument("--tp", type=int, default=None,
                   help="TP size of the shard (default: the shape's; with --model: 8; under "
                        "torchrun: the world size)")
    p.add_argument("--rank", type=int, default=0, help="which rank's shard (single process)")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N layers")
    p.add_argument("--batch", default=DEFAULT_BATCH,
                   help=f"decode batch sizes (default {DEFAULT_BATCH}; at most {MAX_BATCH}), or "
                        "none: no decode point (the --mixed step alone)")
    p.add_argument("--context", default=None,
                   help="context length: one value for every batch, or one per batch (default: "
                        "1024 for batch <= 1024, 256 above)")
    p.add_argument("--mixed", default=DEFAULT_MIXED,
                   help="the mixed step DECODE:CONTEXT:PREFILL (default %(default)s: 256 decode "
                        "tokens at context 1024 + one 1024-token prefill chunk), or 'none'")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated subset of {','.join(SYSTEMS)}")
    p.add_argument("--split-k", type=int, default=0,
                   help="megakernel: PlanConfig.split_k (0 auto, the backend's default; 1 never; "
                   "n >= 2 force)")
    p.add_argument("--page-size", type=int, default=16, choices=(16, 64, 256),
                   help="megakernel: KV cache page size in tokens (default %(default)s)")
    p.add_argument("--plan", default="", metavar="FIELD=VALUE,...",
                   help="megakernel: PlanConfig overrides of the backend's default plan "
                        "(mk.megakernel_step.DEFAULT_PLAN), e.g. kv_split=128,norm_fold=0 "
                        "(integer fields; --split-k sets split_k)")
    p.add_argument("--plan-ab", default="", metavar="NAME:FIELD=VALUE,... ...",
                   help="megakernel: each space-separated NAME:FIELD=VALUE,... plan (over --plan) "
                        "timed on the same compiled kernel, its reps interleaved with the "
                        "plan's own rep by rep: per variant its median and the median of its "
                        "per-rep ratios to the base's (a plan that needs another kernel or other "
                        "buffers is refused)")
    p.add_argument("--journal", action="store_true",
                   help="megakernel: after timing, one journaled launch per point (a compile "
                        "of its own): per-opcode time breakdown and a timeline PNG")
    p.add_argument("--journal-isolated", default="", metavar="OPS",
                   help="with --journal: also run each listed opcode's instructions of the "
                        "middle layer alone through the step's journaled kernel (their waits "
                        "and signals cleared: every tile ready at once, nothing else running) "
                        "and print their own time next to the step's: which part of a GEMM "
                        "tile's time in the step is its context, which the kernel variant")
    p.add_argument("--isolated-builds", default="", metavar="BUILDS",
                   help="with --journal-isolated: also run them through other builds of the "
                        "kernel on the step's buffers and weights, a comma list of "
                        + ", ".join(f"{k} ({v})" for k, v in ISOLATED_BUILDS.items()))
    p.add_argument("--profile-isolated", default="", metavar="BUILD:OP",
                   help="with --journal-isolated: that build's (full: the step's kernel) timed "
                        "launch of OP's isolated tiles between cudaProfilerStart / Stop, for "
                        "`ncu --profile-from-start off` (e.g. full:GATE_UP, lean:GATE_UP)")
    p.add_argument("--reps", type=int, default=None, help="timed reps per system (GPU 30, CPU 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (GPU 5, CPU 1)")
    p.add_argument("--rep-gap-ms", type=float, default=0.0,
                   help="idle this long before each timed rep (the device drained, the host "
                        "asleep), every system alike: steps from a rested GPU, against the "
                        "default back-to-back reps (the power cap's clock question: a lone "
                        "journaled launch runs 2-8%% under the timed reps)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode of the layers (default, max-autotune-no-cudagraphs, ...)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--device", default=None, help="torch device (default: cuda:LOCAL_RANK, else cpu)")
    p.add_argument("--memory-gb", type=float, default=None,
                   help="memory to plan for, in GB (default: free GPU memory, or available RAM)")
    p.add_argument("--matmul-n", type=int, default=None,
                   help="N of the N^3 matmul measuring the rate (GPU 8192, CPU 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-check", action="store_true",
                   help="do not check the peer against mk.reference before timing (not advised)")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/e2e_<date>...json)")
    p.add_argument("--png", default=None, help="PNG path (default: --out with .png)")
    p.add_argument("--no-png", action="store_true", help="do not draw the PNG")
    p.add_argument("--json", action="store_true",
                   help="print the JSON as the last line of stdout (the table goes to stderr)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="no timing: merge the points of earlier runs' JSON files (e.g. a run split "
                        "in two for a time limit) into --out, with its table and PNG")
    return p.parse_args(argv)


def resolve(args, world: int, rank: int) -> dict:
    """Validate the arguments; returns the plan of the run (raises UsageError)."""
    plan_overrides(args.plan)
    plan_variants(args.plan_ab, args.plan)
    if args.journal_isolated:
        if not args.journal:
            raise UsageError("--journal-isolated: runs with --journal only (the journaled kernel)")
        from mk.ir import Op
        bad = [o for o in args.journal_isolated.split(",") if o and o not in Op.__members__]
        if bad:
            raise UsageError(f"--journal-isolated: unknown opcode(s) {', '.join(bad)}")
        isolated_builds(args.isolated_builds, args.journal_isolated, args.profile_isolated)
    elif args.isolated_builds or args.profile_isolated:
        flag = "--isolated-builds" if args.isolated_builds else "--profile-isolated"
        raise UsageError(f"{flag}: runs with --journal-isolated only")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        raise UsageError(f"--systems: unknown system(s) {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join(SYSTEMS)}")
    if args.plan_ab and "megakernel" not in systems:
        raise UsageError("--plan-ab: times the megakernel's plans; --systems has no megakernel")
    batches = [] if args.batch.strip().lower() == "none" else _int_list(args.batch, "--batch")
    for b in batches:
        if not 1 <= b <= MAX_BATCH:
            raise UsageError(f"--batch {b}: a step holds 1 to {MAX_BATCH} sequences "
                             f"(KernelConfig.max_batch_tokens)")
    if args.context is None or not batches:
        contexts = [default_context(b) for b in batches]
    else:
        contexts = _int_list(args.context, "--context")
        if len(contexts) == 1:
            contexts = contexts * len(batches)
        elif len(contexts) != len(batches):
            raise UsageError(f"--context: give one value or one per batch ({len(batches)}), got "
                             f"{len(contexts)}")
    points = [Point("decode", b, c) for b, c in zip(batches, contexts)]
    if args.mixed and args.mixed.lower() != "none":
        try:
            d, c, pf = (int(x) for x in args.mixed.split(":"))
        except ValueError:
            raise UsageError(f"--mixed {args.mixed!r}: expected DECODE:CONTEXT:PREFILL such as "
                             f"{DEFAULT_MIXED}, or none") from None
        if d < 0 or pf < 1 or (d and c < 1):
            raise UsageError(f"--mixed {args.mixed!r}: needs DECODE >= 0, CONTEXT >= 1, PREFILL >= 1")
        if d + pf > MAX_BATCH:
            raise UsageError(f"--mixed {args.mixed!r}: {d + pf} tokens, over the {MAX_BATCH} "
                             f"tokens of a step (KernelConfig.max_batch_tokens)")
        points.append(Point("mixed", d, c, pf))
    if not points:
        raise UsageError("--batch none with --mixed none: no point to run")
    for pt in points:
        if pt.decode and pt.context < 1:
            raise UsageError(f"{pt.label}: context must be >= 1")
    for name in ("reps", "warmup", "layers", "matmul_n"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "warmup" else 1):
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {v}")
    if not 0 <= args.rep_gap_ms <= 60_000:
        raise UsageError(f"--rep-gap-ms must be in [0, 60000], got {args.rep_gap_ms:g}")

    # the model
    if args.model is not None:
        model_dir = Path(args.model)
        if not model_dir.is_dir():
            raise UsageError(f"--model {model_dir}: not a directory")
        try:
            cfg = ModelConfig.from_pretrained(model_dir)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        tp_default = 8
        shape_name = model_dir.name
    else:
        cfg, tp_default = SHAPES[args.shape]
        shape_name = args.shape
    if world > 1:
        if args.tp is not None and args.tp != world:
            raise UsageError(f"--tp {args.tp} under torchrun with {world} processes: the TP size "
                             f"is the world size")
        tp, r = world, rank
    else:
        tp = args.tp or tp_default
        r = args.rank
    try:
        par = ParallelConfig(tp_size=tp, rank=r)
        par.validate_for(cfg)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if args.layers is not None:
        if args.layers > cfg.num_layers:
            raise UsageError(f"--layers {args.layers}: the model has {cfg.num_layers} layers")
        cfg = replace(cfg, num_layers=args.layers)
    for pt in points:
        if pt.context + pt.prefill > cfg.max_position_embeddings or \
                pt.prefill > cfg.max_position_embeddings:
            raise UsageError(f"{pt.label}: context {max(pt.context, pt.prefill)} is past the "
                             f"model's max_position_embeddings {cfg.max_position_embeddings}")
    return dict(systems=systems, points=points, cfg=cfg, par=par, shape=shape_name)


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def check_memory(cfg, par, points: list[Point], memory: int, elt: int,
                 weights_loaded: bool = False) -> dict:
    """Refuse (UsageError) any point whose weights + KV cache + activations would not fit."""
    wb = 0 if weights_loaded else weight_bytes(cfg, par, elt)
    reserve = (1 << 30) + memory // 50 if memory > (8 << 30) else memory // 20
    need = {}
    for pt in points:
        kv = kv_cache_bytes(cfg, par, pt, elt)
        act = activation_bytes_estimate(cfg, par, pt, elt)
        total = wb + kv + act + reserve
        need[pt.label] = dict(weights=wb, kv_cache=kv, activations=act, reserve=reserve,
                              total=total)
        if total > memory:
            gb = lambda x: f"{x / 1e9:.2f} GB"  # noqa: E731
            raise UsageError(
                f"{pt.label}: the KV cache needs {gb(kv)} ({pt.decode * pt.context + pt.prefill} "
                f"tokens x {kv // max(1, pt.decode * pt.context + pt.prefill)} B), + weights "
                f"{gb(wb)} + activations ~{gb(act)} + reserve {gb(reserve)} = {gb(total)}, over the "
                f"{gb(memory)} of memory available; lower --context or --batch (or --layers)")
    return need


# Systems -------------------------------------------------------------------------------------------
def _err(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:600]


def plan_overrides(text: str) -> dict:
    """--plan's FIELD=VALUE,... as PlanConfig keyword arguments (mk.plan.parse_plan_overrides)."""
    from mk.plan import parse_plan_overrides
    try:
        return parse_plan_overrides(text)
    except ValueError as e:
        raise UsageError(f"--plan: {e}") from None


def plan_variants(text: str, base: str = "") -> dict:
    """--plan-ab's NAME:FIELD=VALUE,... entries as {NAME: PlanConfig overrides, --plan's
    under each} (raises UsageError)."""
    out = {}
    for item in text.split():
        name, sep, fields = item.partition(":")
        if not sep or not name or not fields:
            raise UsageError(f"--plan-ab: {item!r} is not NAME:FIELD=VALUE,...")
        if name in out or name == "base":
            raise UsageError(f"--plan-ab: the name {name!r} is taken")
        try:
            out[name] = {**plan_overrides(base), **plan_overrides(fields)}
        except UsageError as e:
            raise UsageError(f"--plan-ab {name}: {str(e).removeprefix('--plan: ')}") from None
    return out


def make_megakernel(weights, point: Point, split_k: int = 0, page: int = 16,
                    plan: dict | None = None):
    """The engine's megakernel backend for the point (raises when it cannot run a step). The
    token and sequence maxima are the same at every point (MAX_BATCH), so the buffers the kernel
    is compiled against keep their shapes and one variant per M class serves every point; the KV
    cache holds exactly the point's pages."""
    from mk.megakernel_step import MegakernelStepBackend, default_plan_config
    from mk.peers import shard_as_tp1
    kernel = megakernel_kernel_config(point, page)
    # one rank's shard as a TP-1 model of the shard's shapes: the work of the rank without the
    # tensor-parallel communication, exactly what the peers time
    # the backend's default plan (norm_fold=4: it folds a copy of the shard's norm weights; the
    # peers run the unfolded shard) with --split-k and --plan over it
    shard = shard_as_tp1(weights)
    return MegakernelStepBackend(shard, kernel,
                                 plan_cfg=default_plan_config(shard.config, split_k=split_k,
                                                              **(plan or {}))), kernel


def megakernel_kernel_config(point: Point, page: int = 16) -> KernelConfig:
    """The megakernel's KernelConfig at a point (the maxima of every point, the point's pages)."""
    per = -(-max(point.context, point.prefill, 1) // page)
    seqs = point.decode + (1 if point.prefill else 0)
    return KernelConfig(page_size=page, max_seqs=max(MAX_BATCH, seqs),
                        max_context=max(point.context, point.prefill, 1),
                        max_batch_tokens=max(MAX_BATCH, point.tokens),
                        num_kv_pages=max(1, seqs) * per)


def megakernel_batch(point: Point, kernel: KernelConfig, ids: list[int]):
    from mk.batch import SeqChunk, StepBatch
    per = -(-max(point.context, point.prefill, 1) // kernel.page_size)
    seqs = [SeqChunk([ids[i]], point.context - 1, list(range(i * per, (i + 1) * per)))
            for i in range(point.decode)]
    if point.prefill:
        seqs.append(SeqChunk(ids[point.decode:point.tokens], 0,
                             list(range(point.decode * per, (point.decode + 1) * per))))
    return StepBatch(seqs)


def default_plan_fields() -> dict:
    """The megakernel backend's default plan (mk.megakernel_step.DEFAULT_PLAN) that --plan goes
    over, for the JSON: a later reader (bench/schedsim.py) replans a point as it ran."""
    from mk.megakernel_step import DEFAULT_PLAN
    return dict(DEFAULT_PLAN)


def seed_megakernel_kv(be, point: Point, kernel: KernelConfig, seed: int) -> None:
    """The decode sequences' cached positions in the megakernel's paged cache (megakernel_batch's
    pages: sequence i's are i * per ..), the values StepPeer(seed=seed) caches (mk.peers.
    random_kv_layers), so that the two steps compute the same logits (run_point compares them)."""
    from mk.peers import random_kv_layers
    if not point.decode:
        return
    m, ps = be.model, kernel.page_size
    per = -(-max(point.context, point.prefill, 1) // ps)
    g = torch.Generator(device=be.device).manual_seed(seed)
    caches = be.kv_cache()
    for which, layer, kv in random_kv_layers(g, m.num_layers, point.decode, m.num_kv_heads,
                                             point.context, m.head_dim, caches[0].dtype):
        seqs = caches[which][layer, :point.decode * per].reshape(point.decode, per * ps,
                                                                 m.num_kv_heads, m.head_dim)
        seqs[:, :point.context].copy_(kv.permute(0, 2, 1, 3))


def check_backend_against_reference(name: str, weights, tol: float = 2e-2) -> dict:
    """A backend's decode step vs mk.reference on a small TP-1 model: prefill 3 prompts through
    both, decode one token each, compare logits."""
    from mk.batch import SeqChunk, StepBatch
    from mk.engine import create_backend
    kernel = KernelConfig(page_size=16, max_seqs=4, max_context=64, max_batch_tokens=256)
    ref = create_backend("reference", weights, kernel)
    be = create_backend(name, weights, kernel)
    g = torch.Generator().manual_seed(1)
    V = weights.config.vocab_size
    tables = [list(range(i * 4, (i + 1) * 4)) for i in range(3)]
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (36, 20, 7)]
    pre = StepBatch([SeqChunk(p, 0, tables[i]) for i, p in enumerate(prompts)])
    ref.forward(pre)
    be.forward(pre)
    new = torch.randint(0, V, (3,), generator=g).tolist()
    dec = StepBatch([SeqChunk([new[i]], len(p), tables[i]) for i, p in enumerate(prompts)])
    a, b = be.forward(dec).float().cpu(), ref.forward(dec).float().cpu()
    rel = rel_err(a, b)
    return dict(rel_err=rel, ok=rel < tol and bool(torch.isfinite(a).all()))


def host_full_step_ms(be, batch, mk, cuda: bool, whole: bool = False) -> float | None:
    """The host's share of a step the planner's fast path cannot take (a prefill chunk, a batch
    of another structure: every step of a job over many prompts until its prompts are in): the
    full plan, the check of its representative rows, the stream's upload (StepPlan.
    device_stream; whole: all of it, as before session 59) and the metadata's copy. Median of 3
    after one that allocates the planner's arena (ms). The same batch as the timed step: the
    held stream and metadata stay as they are."""
    from mk.plan import Planner
    try:
        planner = Planner(be.model, be.planner.parallel, be.kernel, be.plan_cfg, fast_path=False)
        ms = []
        for _ in range(4):
            t0 = time.perf_counter()
            plan = planner.plan(batch)
            stream = plan.instrs.to(be.device) if whole else plan.device_stream(be.device)
            mk.prepare(stream, meta_page_size=be.kernel.page_size,
                       check_stream=plan.representative_stream())
            be.meta[:plan.meta.tensor.numel()].copy_(plan.meta.tensor)
            if cuda:
                torch.cuda.synchronize()
            ms.append(1e3 * (time.perf_counter() - t0))
    except Exception as e:  # noqa: BLE001  a side figure: the step is still timed
        log(f"host_full_step_ms{' (whole upload)' if whole else ''} failed: {_err(e)}")
        return None
    return round(sorted(ms[1:])[1], 3)


def time_megakernel(be, batch, pool, timer: Timer, warm: int, reps: int, cuda: bool,
                    variants: dict | None = None) -> dict:
    """The megakernel's step time on the GPU, like the graph peers': the step is planned and its
    metadata uploaded once (host_plan_ms, reported beside: the host's share of a generation
    loop's step, most of which mk.engine's loop hides by planning step n+1 while the GPU runs
    step n; host_full_step_ms: the same for a step the fast path cannot take), the launch
    is captured in a CUDA graph and replayed, and new token ids are written into the metadata
    before each rep (untimed, as the peers' set_tokens). variants
    ({name: PlanConfig overrides}, --plan-ab): each plan's step on the same compiled kernel, its
    reps interleaved with the base's (plan_ab: its times and its per-rep ratios to the base)."""
    from mk.instructions import _common as mc
    t0 = time.perf_counter()
    mk, handle, plan = be.prepare(batch)
    plan_ms = 1e3 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    mk.launch(handle, check=True)               # compiles the step's variant on first use
    first_s = time.perf_counter() - t0
    # the host's share of a step in steady state (plan + check + upload; the first prepare above
    # also built the M class's Megakernel; the same batch again takes the planner's fast path
    # and the device-side rewrite, as a generation loop's decode steps do)
    steady = []
    for _ in range(3):
        t0 = time.perf_counter()
        mk, handle, plan = be.prepare(batch)
        if cuda:
            torch.cuda.synchronize()
        steady.append(1e3 * (time.perf_counter() - t0))
    info = dict(host_plan_ms=round(sorted(steady)[1], 3), first_prepare_ms=round(plan_ms, 3),
                host_full_step_ms=host_full_step_ms(be, batch, mk, cuda),
                host_full_step_whole_upload_ms=host_full_step_ms(be, batch, mk, cuda, whole=True),
                instructions=int(plan.instrs.shape[0]),
                first_launch_s=round(first_s, 2), grid=mk.grid)
    # (name, plan, handle, its metadata on the device: None where be.meta holds it throughout)
    runs = [("base", plan, handle, None)]
    if variants:
        runs[0] = ("base", plan, handle, plan.meta.tensor.to(be.device))
        for name, fields in variants.items():
            vmk, vhandle, vplan, vmeta = be.prepare_variant(
                batch, replace(be.plan_cfg, **fields))
            assert vmk is mk, "a variant of the same batch is of the same M class"
            runs.append((name, vplan, vhandle, vmeta))
    fns, befores = [], []
    for name, p, h, meta in runs:
        T, off = p.meta.num_tokens, int(p.meta.tensor[mc.M_OFF_TOKENS])

        def before(i, meta=meta, T=T, off=off):
            if meta is not None:
                be.meta[:meta.numel()].copy_(meta)
            be.meta[off:off + T].copy_(pool[i % pool.shape[0], :T])
        before(0)                               # capture() runs the step once
        if name != "base":
            mk.launch(h, check=True)            # its first step checked, as the base's above
        go = mk.launcher(h)
        if cuda:
            try:
                graph, _ = capture(go, be.device)
                fn, how = graph.replay, "CUDA graph replay"
            except Exception as e:  # noqa: BLE001  not capturable here: time the plain launch
                fn, how = go, f"direct launch (graph capture failed: {_err(e)})"
        else:
            fn, how = go, "direct launch"
        info.setdefault("launch", how)
        fns.append(fn)
        befores.append(before)
    if len(fns) == 1:
        ms = timer.run(fns[0], warm, reps, befores[0])
    else:
        every = timer.run_interleaved(fns, warm, reps, lambda k, i: befores[k](i))
        ms = every[0]
        info["plan_ab"] = {
            name: dict(plan=variants[name], instructions=int(p.instrs.shape[0]),
                       **summarize(every[k]),
                       ratio=summarize([a / b for a, b in zip(every[k], ms)]))
            for k, (name, p, _, _) in enumerate(runs) if k}
    mk.check()                                  # a bounded wait that timed out fails the point
    return dict(status="ok", **summarize(ms), **info)


def journal_breakdown(be, batch, point: Point, args) -> dict:
    """One more launch of the point's step through the variant that writes the per-instruction
    journal (a compile of its own): where the step's time goes per opcode (mk.trace.by_opcode)
    and along the chain that set its end (mk.trace.critical_path, per layer), printed, and a
    timeline PNG beside --out. The journal's timer reads cost a little, so its
    span is a bit over the timed step."""
    import mk.trace as tr
    from mk.ir import W_LAYER
    be.journal, be._kernels = True, {}
    be.journal_capacity = max(1 << 16, int(be.planner.plan(batch).instrs.shape[0]))
    try:
        mk, handle, plan = be.prepare(batch)
        mk.launch(handle, check=True)
        n = int(plan.instrs.shape[0])
        j, c = mk.journal_rows(n)
        layer_of = plan.instrs[:, W_LAYER].tolist()
        r = tr.by_opcode(j, c, n, layer_of=layer_of)
        log(f"{point.label}: megakernel journal\n{tr.format_by_opcode(r)}")
        # the same per kind of instruction: QKV_ROPE's sections, ATTENTION's modes and, in a
        # step of decode and prompt tokens, which of them a tile's rows are
        names = tr.variant_names(plan.instrs.cpu(),
                                 [len(s.tokens) > 1 for s in batch.seqs for _ in s.tokens])
        if len(set(names)) > len(r.get("ops", {})):
            r["by_variant"] = tr.by_opcode(j, c, n, layer_of=layer_of, name_of=names)
            log(f"{point.label}: by kind of instruction\n"
                f"{tr.format_by_opcode(r['by_variant'])}")
        from mk.instructions._gemm_kernel import KTRACE as ktrace
        if ktrace:
            # the GEMM tiles' K steps in the step (the variant was built with MK_GEMM_KTRACE)
            r["ktrace"] = tr.gemm_ktrace(j, n, ktrace)
            log(f"{point.label}: GEMM K steps\n{tr.format_gemm_ktrace(r['ktrace'])}")
        # the chain that set the step's end, per layer (mk.trace.critical_path)
        r["critical_path"] = cp = tr.critical_path(j, c, n, plan.instrs.cpu())
        layers = be.model.num_layers
        log(f"{point.label}: critical path\n{tr.format_critical_path(cp, per=layers)}")
        if args.journal_isolated:
            r["isolated"] = isolated_runs(mk, plan, args.journal_isolated, layers, r, ktrace,
                                          builds=_items(args.isolated_builds),
                                          profile=args.profile_isolated)
        if args.out:
            stem = f"{os.path.splitext(args.out)[0]}_{point.slug}"
            # the raw rows, for offline analysis (python -m mk.trace <pt> trace.json [png])
            # (the journal's own 32 words: a K-step trace's are read above, and large)
            torch.save(dict(journal=j[:, :tr.KT_BASE].clone(), jcta=c, n=n,
                            instrs=plan.instrs.cpu()),
                       stem + "_journal.pt")
            png = stem + "_timeline.png"
            tr.draw_timeline(png, j, c, n, title=f"megakernel {point.label}")
            r["timeline_png"] = os.path.basename(png)
        return r
    finally:
        be.journal, be._kernels = False, {}


def isolated_subplan(instrs, op: str, layer: int):
    """The step's instructions of opcode `op` (an mk.ir.Op name) in `layer`, their waits and
    signals cleared (ready at once; they touch no counter), for isolated_runs; None if none.
    A row-scaled tile's epilogue wait (PlanConfig.norm_fold=2) is cleared too: its norm is not
    in the sub-plan, and the tile then skips the row scale (16 multiplies a row, not timed). A
    self-scaled tile (norm_fold=3) keeps its mark: its statistic is its own work, timed."""
    from mk.instructions._common import A_EPI_TARGET, A_EPI_WAIT, ROW_SCALED, SELF_SCALE
    from mk.ir import MAX_WAITS, NO_COUNTER, W_LAYER, W_OPCODE, W_SIGNAL, W_WAIT0, Op
    if op not in Op.__members__:
        raise SystemExit(f"--journal-isolated: unknown opcode {op!r}")
    sel = (instrs[:, W_OPCODE] == int(Op[op])) & (instrs[:, W_LAYER] == layer)
    sub = instrs[sel].clone()
    if not len(sub):
        return None
    for k in range(MAX_WAITS):
        sub[:, W_WAIT0 + 2 * k] = NO_COUNTER
        sub[:, W_WAIT0 + 2 * k + 1] = 0
    sub[:, W_SIGNAL] = NO_COUNTER
    if Op[op] in ROW_SCALED:
        waits = sub[:, A_EPI_WAIT] != SELF_SCALE
        sub[waits, A_EPI_WAIT] = 0
        sub[waits, A_EPI_TARGET] = 0
    return sub


# --isolated-builds: the kernel builds an opcode's isolated tiles can also run through, on the
# step's buffers and weights, besides the step's own ("full"). bench/GEMM_NOTES.md session 42:
# with only its GEMM slot compiled in ("lean", the harness's build) a GATE_UP / DOWN K step takes
# ~1200 SM cycles, in the step's build ~1510, on the same data; the others tell which part of the
# build costs it.
ISOLATED_BUILDS = {      # the builds of mk.megakernel.BUILDS besides "full"
    "lean": "only that opcode's GEMM slot: no attention, gather or other GEMM opcodes",
    "gemms": "every GEMM slot of the step, no attention or gather",
    "families": "that opcode's GEMM slot with the attention and gather families",
}
# the opcodes the other builds run: QKV_ROPE's tiles need the step's metadata, inverse
# frequencies and K/V caches, which only "gemms" and the step's build take
BUILD_OPS = ("O_PROJ", "GATE_UP", "DOWN", "LM_HEAD")


def _items(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def isolated_builds(builds: str, ops: str, profile: str) -> None:
    """Validate --isolated-builds / --profile-isolated against --journal-isolated's opcodes
    (raises UsageError)."""
    bad = [b for b in _items(builds) if b not in ISOLATED_BUILDS]
    if bad:
        raise UsageError(f"--isolated-builds: unknown build(s) {', '.join(bad)}; choose from "
                         f"{', '.join(ISOLATED_BUILDS)}")
    if _items(builds):
        other = [o for o in _items(ops) if o not in BUILD_OPS]
        if other:
            raise UsageError(f"--isolated-builds: GEMM opcodes without step metadata only "
                             f"({', '.join(BUILD_OPS)}), not {', '.join(other)}")
    if profile:
        build, _, op = profile.partition(":")
        if build not in ("full", *_items(builds)) or op not in _items(ops):
            raise UsageError(f"--profile-isolated: {profile!r} is not BUILD:OP with BUILD full or "
                             f"one of --isolated-builds and OP one of --journal-isolated")


def build_kernel(mk, op: str, build: str):
    """A journaled Megakernel of --isolated-builds' `build` over the step kernel mk's buffers,
    norm table, weights and split-K workspace, with the same M class, split opcodes, hand-off,
    backoff, claim policy and journal size (the setmaxnreg split follows its GEMM slots, as the
    step's does: MK_REG_LOW / MK_REG_HIGH force one)."""
    import mk.megakernel as M
    from mk.ir import Op
    one_slot, with_families = M.BUILDS[build]
    gemm = {Op[op]: mk.gemm[Op[op]]} if one_slot else dict(mk.gemm)
    families = {}
    if with_families:
        families.update(meta=mk.meta, kv=mk.kv, attn=mk.attn, embed=mk.embed,
                        last_normed=mk.last_normed, l2_prefetch=mk.l2_prefetch)
    elif Op.QKV_ROPE in gemm:
        families.update(meta=mk.meta, inv_freq=mk.inv_freq, kv=mk.kv)
    return M.Megakernel(mk.arena, mk.normw, mk.n_layers, mk.eps,
                        n_counters=mk.counters.numel(), journal=True,
                        timeout_s=mk.timeout_ns / 1e9, journal_capacity=mk.journal.shape[0],
                        verbose=False, handoff=mk.handoff, backoff_ns=mk.backoff_ns,
                        gemm=gemm, gemm_m=mk.gemm_m, splitk=mk.splitk, split_ops=mk.split_ops,
                        claim_after_loads=mk.claim_after_loads, **families)


def isolated_runs(mk, plan, ops: str, layers: int, step: dict, ktrace: int,
                  builds: list[str] = (), profile: str = "") -> dict:
    """--journal-isolated: each opcode's instructions of the middle layer launched alone through
    the step's journaled kernel (isolated_subplan; the step's buffers, metadata and weights as
    the step left them), their own time per instruction (mk.trace.by_opcode) against the step's,
    and their K-step trace when the variant has one. Without signals the storer skips its fence
    and release (~1 us a tile, after the consumers: mostly under the next tile's mainloop).
    builds: the same sub-plans through those builds too (build_kernel; key "builds" of each
    opcode's result); profile "BUILD:OP": that timed launch between cudaProfilerStart / Stop."""
    import mk.trace as tr
    instrs = plan.instrs.cpu()
    out = {}
    kernels = {}

    def run(kernel, op, sub, build):
        h = kernel.prepare(sub)
        kernel.launch(h, check=True)               # warm: the first launch of this stream
        # a tile writes the K-trace words of its own K steps only: the rows' words past them
        # would still hold an earlier launch's (session 42: DOWN's 56 steps after GATE_UP's 64)
        kernel.journal.zero_()
        profiled = profile == f"{build}:{op}"
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        kernel.launch(h, check=True)
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        j, c = kernel.journal_rows(len(sub))
        d = tr.by_opcode(j, c, len(sub))["ops"].get(op, {})
        res = dict(count=int(len(sub)), own_mean_us=d.get("own_mean_us"),
                   step_own_mean_us=step["ops"].get(op, {}).get("own_mean_us"))
        if ktrace:
            res["ktrace"] = tr.gemm_ktrace(j, len(sub), ktrace)
        label = "isolated" if build == "full" else f"isolated-{build}"
        log(f"{label} {op} (layer {layers // 2}, {len(sub)} instructions): own "
            f"{res['own_mean_us']} us per instruction, in the step {res['step_own_mean_us']}")
        if ktrace:
            log(tr.format_gemm_ktrace(res["ktrace"]))
        return res

    for op in _items(ops):
        sub = isolated_subplan(instrs, op, layers // 2)
        if sub is None:
            out[op] = None
            continue
        out[op] = run(mk, op, sub, "full")
        out[op]["builds"] = {}
        for build in builds:
            key = build if build == "gemms" else (build, op)    # "gemms" serves every opcode
            if key not in kernels:
                kernels[key] = build_kernel(mk, op, build)
            out[op]["builds"][build] = run(kernels[key], op, sub, build)
    return out


def run_point(point: Point, weights, args, systems: list[str], timer: Timer, device,
              mk_state: dict, floor: dict) -> dict:
    """Every requested system at one point; a failing system is recorded, the others still run."""
    from mk.peers import StepPeer
    res: dict[str, dict] = {}
    cuda = device.type == "cuda"
    reps, warm = args.reps, args.warmup
    gen = torch.Generator(device=device).manual_seed(args.seed + 7)
    vl = weights.embed.shape[0]
    v0 = weights.parallel.rank * vl
    pool = torch.randint(v0, v0 + vl, (max(reps, 1) + warm, point.tokens), generator=gen,
                         device=device)
    mk_logits = None            # the megakernel's logits of pool[0], checked against the peer's

    # megakernel ---------------------------------------------------------------------------------
    if "megakernel" in systems:
        if mk_state.get("error"):
            res["megakernel"] = dict(status="n/a", error=mk_state["error"])
        else:
            be = None
            try:
                be, kernel = make_megakernel(weights, point, args.split_k, args.page_size,
                                             plan_overrides(args.plan))
                batch = megakernel_batch(point, kernel, pool[0].tolist())
                seed_megakernel_kv(be, point, kernel, args.seed)
                res["megakernel"] = time_megakernel(be, batch, pool, timer, warm, reps, cuda,
                                                    plan_variants(args.plan_ab, args.plan))
                for name, v in res["megakernel"].get("plan_ab", {}).items():
                    log(f"{point.label}: --plan-ab {name}: {v['ms']:.3f} ms against the base's "
                        f"{res['megakernel']['ms']:.3f}, per-rep ratio median "
                        f"{v['ratio']['ms']:.4f} (p10 {v['ratio']['p10_ms']:.4f}, p90 "
                        f"{v['ratio']['p90_ms']:.4f})")
                # pool[0]'s logits once more, for the comparison with the eager peer below
                mk_logits = be.forward(batch).float().cpu()
                if args.journal and cuda:
                    res["megakernel"]["journal"] = journal_breakdown(be, batch, point, args)
            except Exception as e:  # noqa: BLE001  a backend that cannot run: n/a, keep going
                res["megakernel"] = dict(status="n/a", error=_err(e))
                if os.environ.get("MK_BENCH_TRACEBACK"):
                    traceback.print_exc()
            del be
            _free(device)

    peers = [s for s in PEERS if s in systems]
    if not peers:
        return res
    peer = None
    try:
        peer = StepPeer(weights, decode=point.decode, context=point.context,
                        prefill=point.prefill, seed=args.seed)
        peer.set_tokens(pool[0])
        ref_logits = peer.step().float()       # the eager step's logits, for the other checks
    except Exception as e:  # noqa: BLE001  e.g. out of memory: no peer at this point
        log(f"{point.label}: the PyTorch peer failed: {_err(e)}")
        for s in peers:
            res[s] = dict(status="error", error=f"building the peer: {_err(e)}")
        peer = None
        _free(device)
        return res
    if not bool(torch.isfinite(ref_logits).all()):
        log(f"{point.label}: warning: the eager step's logits are not all finite")
    if mk_logits is not None and res.get("megakernel", {}).get("status") == "ok":
        megakernel_agrees(point, res["megakernel"], mk_logits, ref_logits.cpu())
    before = lambda i: peer.set_tokens(pool[i % pool.shape[0]])  # noqa: E731
    if "eager" in systems:
        try:
            res["eager"] = dict(status="ok", **summarize(timer.run(peer.step, warm, reps, before)))
        except Exception as e:  # noqa: BLE001
            res["eager"] = dict(status="error", error=_err(e))
            _free(device)
    for name in ("graph", "compile"):
        if name not in systems:
            continue
        if not cuda:
            res[name] = dict(status="skipped", error="CUDA graphs and torch.compile are timed on "
                             "a GPU only (CPU run)")
            continue
        graph = out = None
        try:
            info = {}
            if name == "compile":
                t0 = time.perf_counter()
                peer.compile_layers(args.compile_mode)
                peer.set_tokens(pool[0])
                got = peer.step().float()      # compiles (and autotunes)
                torch.cuda.synchronize(device)
                info["compile_s"] = round(time.perf_counter() - t0, 1)
                rel = rel_err(got, ref_logits)
                info["rel_err_vs_eager"] = rel
                _agree(point, "compiled step", rel)
            graph, out = capture(peer.step, device)
            peer.set_tokens(pool[0])
            graph.replay()
            torch.cuda.synchronize(device)
            rel = rel_err(out.float(), ref_logits)
            info["replay_rel_err_vs_eager"] = rel
            _agree(point, f"{name}: replayed CUDA graph", rel)
            ms = timer.run(graph.replay, warm, reps, before)
            res[name] = dict(status="ok", **summarize(ms), **info)
        except Exception as e:  # noqa: BLE001
            res[name] = dict(status="error", error=_err(e))
            log(f"{point.label}: {name} failed: {_err(e)}")
            if os.environ.get("MK_BENCH_TRACEBACK"):
                traceback.print_exc()
        finally:
            peer.eager_layers()
            graph = out = None
            _free(device)
    del peer
    _free(device)
    return res


# Logits of a compiled / replayed step vs the eager step's, at the benchmark's shape. Other kernels
# round differently, and over 80 random layers bf16 rounding differences grow, so only a gross
# difference (a wrong step, not rounding) stops the system; anything above WARN_REL is logged.
WARN_REL, FAIL_REL = 2e-2, 0.25


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref||: how far a system's logits are from the reference's."""
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def _agree(point: Point, what: str, rel: float) -> None:
    if not rel < FAIL_REL:           # also NaN
        raise RuntimeError(f"{what} differs from the eager step: relative error {rel:.3g} of the "
                           f"logits (limit {FAIL_REL})")
    if rel >= WARN_REL:
        log(f"{point.label}: note: {what} vs eager step: relative error {rel:.3g} of the logits")


def megakernel_agrees(point: Point, res: dict, mk_logits: torch.Tensor,
                      ref_logits: torch.Tensor) -> None:
    """The megakernel's logits of the point's step (the same weights, tokens and cache) vs the
    eager peer's, into res (rel_err_vs_eager); over FAIL_REL the point's time does not count:
    status "error" (a wrong step, not rounding)."""
    if mk_logits.shape != ref_logits.shape:
        res.update(status="error", error=f"megakernel logits {tuple(mk_logits.shape)} vs the "
                   f"eager step's {tuple(ref_logits.shape)}")
        log(f"{point.label}: {res['error']}")
        return
    rel = rel_err(mk_logits, ref_logits)
    res["rel_err_vs_eager"] = rel
    try:
        _agree(point, "megakernel step", rel)
    except RuntimeError as e:
        res.update(status="error", error=str(e))
        log(f"{point.label}: {e}")


def capture(fn, device):
    """Warm up on a side stream, then capture fn() in a CUDA graph; returns (graph, output)."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _free(device) -> None:
    import gc
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def finish_point(point: Point, res: dict, floor: dict) -> dict:
    """Figures and ratios of one point: tokens/s, each system / floor, megakernel / best peer."""
    for r in res.values():
        if r.get("status") == "ok":
            r["tokens_per_s"] = point.tokens / (r["ms"] * 1e-3)
            r["over_floor"] = r["ms"] / floor["ms"]
    ok_peers = {k: v for k, v in res.items() if k in PEERS and v.get("status") == "ok"}
    best = min(ok_peers, key=lambda k: ok_peers[k]["ms"]) if ok_peers else None
    mk = res.get("megakernel", {})
    return dict(kind=point.kind, batch=point.decode, context=point.context, prefill=point.prefill,
                tokens=point.tokens, label=point.label, floor=floor, results=res,
                strongest_peer=best,
                megakernel_over_strongest_peer=(mk["ms"] / ok_peers[best]["ms"]
                                                if best and mk.get("status") == "ok" else None),
                floor_over_strongest_peer=(floor["ms"] / ok_peers[best]["ms"] if best else None))


# Output --------------------------------------------------------------------------------------------
def default_out(shape: str, cfg, full_layers: int, device) -> Path:
    date = datetime.date.today().isoformat()
    if shape == "70b-tp8" and cfg.num_layers == full_layers and device.type == "cuda":
        name = f"e2e_{date}.json"
    else:
        lay = f"-L{cfg.num_layers}" if cfg.num_layers != full_layers else ""
        name = f"e2e_{date}_{shape}{lay}_{device.type}.json"
    return ROOT / "bench" / "results" / name


def fmt_ms(r: dict | None) -> str:
    if not r:
        return "-"
    if r.get("status") == "ok":
        return f"{r['ms']:.3f} ({r['over_floor']:.2f}x)"
    return r.get("status", "?")


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def table(report: dict) -> str:
    systems = report["systems"]
    head = ["step", "batch", "ctx", "prefill", "floor ms"] + [f"{s} ms (/floor)" for s in systems] \
        + ["best tok/s", "mk/best peer"]
    rows = []
    for p in report["points"]:
        res = p["results"]
        best = p["strongest_peer"]
        tps = f"{res[best]['tokens_per_s']:,.0f} ({best})" if best else "-"
        ratio = p["megakernel_over_strongest_peer"]
        rows.append([p["kind"], str(p["batch"]), str(p["context"]), str(p["prefill"] or "-"),
                     f"{p['floor']['ms']:.3f} {p['floor']['bound'][0]}"]
                    + [fmt_ms(res.get(s)) for s in systems]
                    + [tps, f"{ratio:.2f}" if ratio is not None else "n/a"])
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    m = report["measured"]
    out.append("")
    out.append(f"floor = max(bytes / {_si(m['copy_bandwidth_Bps'], 'B/s')} copy, flops / "
               f"{_si(m['matmul_flops_per_s'], 'FLOP/s')} {m['matmul_dtype']} "
               f"{m['matmul_n']}^3 matmul), both measured in this run; m/c = memory/compute bound")
    notes = list(report["notes"])
    errs = {}
    for p in report["points"]:
        for s, r in p["results"].items():
            if r.get("status") != "ok" and r.get("error"):
                errs.setdefault((s, r["error"]), []).append(p["label"])
    for (s, e), where in errs.items():
        notes.append(f"{s}: {'n/a' if s == 'megakernel' else 'not timed'}: {e}"
                     + (f" [{len(where)} points]" if len(where) > 1 else f" [{where[0]}]"))
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def draw_png(report: dict, path: Path) -> str | None:
    """tokens/s vs batch (decode points), one line per timed system and the floor."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG (pip install matplotlib)"
    pts = [p for p in report["points"] if p["kind"] == "decode"]
    if not pts:
        return "no decode points: no PNG"
    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = [p["batch"] for p in pts]
    ax.plot(xs, [p["tokens"] / (p["floor"]["ms"] * 1e-3) for p in pts], "k--", marker="",
            label="roofline floor")
    styles = {"megakernel": "o-", "eager": "s:", "graph": "^-.", "compile": "D-"}
    for s in report["systems"]:
        xy = [(p["batch"], p["results"][s]["tokens_per_s"]) for p in pts
              if p["results"].get(s, {}).get("status") == "ok"]
        if xy:
            ax.plot(*zip(*xy), styles.get(s, "o-"), label=s)
        elif s == "megakernel":
            ax.plot([], [], "o-", label="megakernel (n/a)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{b}\nctx {p['context']}" for b, p in zip(xs, pts)], fontsize=8)
    ax.set_xlabel("decode batch (sequences), context")
    ax.set_ylabel("tokens / s (one rank, no TP communication)")
    ax.set_title(f"{report['shape']['name']} rank {report['shape']['rank']}/{report['shape']['tp']}"
                 f", {report['shape']['layers']} layers, {report['device']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def merge_ranks(reports: list[dict]) -> dict:
    """Rank 0's report with each figure replaced by the slowest rank's (the step's pace)."""
    base = reports[0]
    if len(reports) == 1:
        return base
    for i, p in enumerate(base["points"]):
        for s, r in p["results"].items():
            if r.get("status") != "ok":
                continue
            per = [rep["points"][i]["results"].get(s, {}) for rep in reports]
            if all(x.get("status") == "ok" for x in per):
                r["per_rank_ms"] = [x["ms"] for x in per]
                r["ms"] = max(r["per_rank_ms"])
            else:
                bad = next(x for x in per if x.get("status") != "ok")
                p["results"][s] = dict(status=bad.get("status", "error"),
                                       error="on another rank: " + str(bad.get("error")))
        base["points"][i] = finish_point(Point(p["kind"], p["batch"], p["context"], p["prefill"]),
                                         p["results"], p["floor"])
    base["checks"]["per_rank_ok"] = [rep["checks"].get("peer", {}).get("ok") for rep in reports]
    return base


# Main ----------------------------------------------------------------------------------------------
MERGED_NOTE = "merged from"


def merge_files(paths: list[str]) -> dict:
    """One report from several runs' JSON: points in order (decode by batch, then mixed), a later
    file's point replacing an earlier one of the same shape; each point keeps the floor of its run."""
    reports = []
    for p in paths:
        try:
            reports.append(json.loads(Path(p).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"--merge {p}: cannot read a bench JSON ({e})") from None
        if "points" not in reports[-1] or "shape" not in reports[-1]:
            raise UsageError(f"--merge {p}: not a launch/bench.py JSON (no points)")
    base = json.loads(json.dumps(reports[0]))
    for r in reports[1:]:
        if (r["shape"], r["device"]) != (base["shape"], base["device"]):
            raise UsageError(f"--merge: {paths[0]} and another file differ in shape or device")
    pts: dict = {}
    for r in reports:
        for p in r["points"]:
            pts[(p["kind"], p["batch"], p["context"], p["prefill"])] = p
    base["points"] = sorted(pts.values(), key=lambda p: (p["kind"] != "decode", p["batch"],
                                                          p["context"], p["prefill"]))
    base["systems"] = [s for s in SYSTEMS if any(s in r["systems"] for r in reports)]
    base["complete"] = all(r.get("complete") for r in reports)
    # a merged input contributes the runs it was merged from (one flat list, one note)
    base["merged_from"] = [src for p, r in zip(paths, reports) for src in r.get("merged_from") or
                           [dict(path=str(p), command=r.get("command"), date=r.get("date"),
                                 git_commit=r.get("git_commit"), measured=r.get("measured"))]]
    base["notes"] = [n for n in base["notes"] if not n.startswith(MERGED_NOTE)] + [
        f"{MERGED_NOTE} {len(base['merged_from'])} runs (each point keeps the floor measured in "
        f"its run)"]
    return base


def emit(report: dict, out_path: Path, args) -> None:
    """Write the JSON (and the PNG), print the table last (rank 0 only)."""
    write_json(report, out_path)
    msg_png = None
    if not args.no_png:
        png = Path(args.png) if args.png else out_path.with_suffix(".png")
        msg_png = draw_png(report, png)
        if msg_png is None:
            report["png"] = str(png)
            write_json(report, out_path)
    text = table(report)
    log(f"wrote {out_path}" + (f" and {report['png']}" if report.get("png") else ""))
    if msg_png:
        log(msg_png)
    if args.json:
        print(text, file=sys.stderr, flush=True)
        print(json.dumps(report, default=str), flush=True)
    else:
        print(text, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        try:
            report = merge_files(args.merge)
            out = Path(args.out) if args.out else \
                ROOT / "bench" / "results" / f"e2e_{datetime.date.today().isoformat()}.json"
            emit(report, out, args)
            return 0
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    try:
        device = torch.device(args.device) if args.device else mkdist.default_device()
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {device}: no CUDA GPU is visible (use --device cpu)")
    except RuntimeError as e:
        print(f"error: --device {args.device}: {e}", file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        mkdist.init_distributed(device)
        return run(args, device)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, KeyError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        if os.environ.get("MK_BENCH_TRACEBACK"):
            traceback.print_exc()
        return 1
    finally:
        mkdist.destroy()


def run(args, device: torch.device) -> int:
    world, rank = mkdist.world_size(), mkdist.rank()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    plan = resolve(args, world, rank)
    cfg, par, systems, points = plan["cfg"], plan["par"], plan["systems"], plan["points"]
    dtype = DTYPES[args.dtype]
    elt = torch.empty((), dtype=dtype).element_size()
    cuda = device.type == "cuda"
    args.reps = args.reps or (30 if cuda else 5)
    args.warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    memory = int(args.memory_gb * 1e9) if args.memory_gb is not None else available_memory(device)
    need = check_memory(cfg, par, points, memory, elt)
    full_layers = (ModelConfig.from_pretrained(args.model).num_layers if args.model
                   else SHAPES[args.shape][0].num_layers)
    out_path = Path(args.out) if args.out else default_out(plan["shape"], cfg, full_layers, device)
    where = torch.cuda.get_device_name(device) if cuda else "CPU"
    log(f"{plan['shape']}: rank {par.rank} of TP {par.tp_size}, {cfg.num_layers} layers, "
        f"{args.dtype}, on {where} ({device}); {len(points)} points, systems {','.join(systems)}")
    if not cuda:
        log("CPU run: perf_counter timing; graph and compile are GPU-only and are skipped")

    notes = [
        "one rank's shard; tensor-parallel communication is NOT simulated (no all-reduce after "
        "o/down, no logits all-gather) in any system",
        "peer = mk.peers.StepPeer: fused QKV and gate/up GEMMs, contiguous KV cache "
        "[L, B, kv_heads, C, D] written with index_put_, SDPA (flash) decode with GQA packing, "
        "causal SDPA for the prefill chunk; a step = embedding + all layers + final norm + LM head "
        "(no sampling)",
        f"decode points: every sequence at the stated context C (new token at position C-1); "
        f"timing: {'CUDA events, L2 flushed before each rep' if cuda else 'perf_counter'}, "
        f"{args.warmup} warm-up, median of {args.reps} reps, new token ids every rep"
        + (f", each rep after {args.rep_gap_ms:g} ms idle" if args.rep_gap_ms else ""),
    ]
    if world > 1:
        notes.append(f"torchrun: {world} ranks, each timed its own shard; figures are the slowest "
                     f"rank's")

    # rates for the floor
    timer = Timer(device)
    rates = measure_rates(device, dtype, timer, args.matmul_n or (8192 if cuda else 512),
                          1024 if cuda else 64, 20 if cuda else 3)
    # the floor's rates back to back as always; the points' reps with --rep-gap-ms
    timer.rep_gap_s = args.rep_gap_ms / 1e3
    log(f"measured: copy {_si(rates['copy_bandwidth_Bps'], 'B/s')}, matmul "
        f"{_si(rates['matmul_flops_per_s'], 'FLOP/s')}")

    # the correctness guard (small model with this rank's attention structure)
    from mk import peers
    checks: dict = {}
    if not args.skip_check:
        small = peers.check_config(cfg, par)
        for dt, tol in ((torch.float32, 1e-3), (dtype, 2e-2)):
            w_small = peers.random_rank_weights(small, ParallelConfig(), device, dtype=dt,
                                                seed=args.seed)
            c = peers.check_against_reference(w_small, tol=tol)
            checks[f"peer_vs_reference_{str(dt).replace('torch.', '')}"] = c
            if not c["ok"]:
                raise RuntimeError(f"the PyTorch peer does not match mk.reference on a small "
                                   f"model ({str(dt)}): {c}; refusing to time it")
        checks["peer"] = dict(ok=True, model=dict(hidden=small.hidden_size,
                                                   heads=small.num_heads,
                                                   kv_heads=small.num_kv_heads,
                                                   head_dim=small.head_dim,
                                                   layers=small.num_layers))
        c = checks[f"peer_vs_reference_{str(dtype).replace('torch.', '')}"]
        log(f"peer matches mk.reference on a small model (decode + mixed step): relative error "
            f"{c['decode_rel_err']:.2g} / {c['mixed_rel_err']:.2g} in {args.dtype}, "
            f"{checks['peer_vs_reference_float32']['decode_rel_err']:.2g} in float32")
    else:
        checks["peer"] = dict(ok=None, skipped=True)
        notes.append("--skip-check: the peer was NOT checked against mk.reference")

    # the megakernel: can it run a model step at all? (checked once, on the small model)
    mk_state: dict = {}
    if "megakernel" in systems:
        try:
            small = peers.check_config(cfg, par)
            w_small = peers.random_rank_weights(small, ParallelConfig(), device, dtype=dtype,
                                                seed=args.seed)
            c = check_backend_against_reference("megakernel", w_small)
            checks["megakernel_vs_reference"] = c
            exp = experiment_switches()
            if not c["ok"] and exp:
                # leave-one-out profiling builds compute garbage on purpose: timed, and said so
                notes.append(f"megakernel built with {exp}: outputs wrong by design (profiling "
                             f"only), its small-model check failed as expected: {c}")
            elif not c["ok"]:
                mk_state["error"] = f"its logits differ from mk.reference on a small model: {c}"
        except Exception as e:  # noqa: BLE001
            mk_state["error"] = _err(e)
        if mk_state.get("error"):
            log(f"megakernel: n/a: {mk_state['error']}")

    # the weights
    t0 = time.perf_counter()
    if args.model:
        from mk.weights import load_rank_weights
        weights = load_rank_weights(args.model, par, dtype=dtype, device=device,
                                    progress=rank == 0)
        if args.layers:
            weights = peers.slice_layers(weights, args.layers)
            _free(device)
        source = f"checkpoint {args.model}"
    else:
        weights = peers.random_rank_weights(cfg, par, device, dtype=dtype, seed=args.seed)
        source = f"random {args.dtype} weights generated on {device} (seed {args.seed})"
    log(f"weights: {source}, {weight_bytes(cfg, par, elt) / 1e9:.2f} GB, "
        f"{time.perf_counter() - t0:.1f} s")

    report = dict(
        benchmark="e2e step (launch/bench.py)", complete=False,
        date=datetime.datetime.now().isoformat(timespec="seconds"), git_commit=git_commit(),
        device=where, device_type=device.type, torch=torch.__version__,
        cuda=torch.version.cuda, command=" ".join(shlex.quote(a) for a in [
            "torchrun" if world > 1 else "python", *sys.argv]),
        world_size=world,
        shape=dict(name=plan["shape"], hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
                   layers=cfg.num_layers, full_layers=full_layers, heads=cfg.num_heads,
                   kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab=cfg.vocab_size,
                   tp=par.tp_size, rank=par.rank, heads_local=par.heads_local(cfg),
                   kv_heads_local=par.kv_heads_local(cfg),
                   intermediate_local=par.intermediate_local(cfg),
                   vocab_local=par.vocab_local(cfg), dtype=args.dtype,
                   weight_bytes=weight_bytes(cfg, par, elt)),
        weights=source, systems=systems, compile_mode=args.compile_mode, split_k=args.split_k,
        page_size=args.page_size, plan=plan_overrides(args.plan),
        default_plan=default_plan_fields(), env=knob_env(),
        reps=args.reps, warmup=args.warmup, rep_gap_ms=args.rep_gap_ms, memory_bytes=memory,
        memory_plan=need,
        measured=rates, checks=checks, notes=notes, points=[])

    for pt in points:
        cost = step_cost(cfg, par, pt, elt)
        floor = floor_of(cost, rates["copy_bandwidth_Bps"], rates["matmul_flops_per_s"])
        t0 = time.perf_counter()
        res = run_point(pt, weights, args, systems, timer, device, mk_state, floor)
        entry = finish_point(pt, res, floor)
        report["points"].append(entry)
        best = entry["strongest_peer"]
        mk_err = res.get("megakernel", {}).get("rel_err_vs_eager")
        log(f"{pt.label}: floor {floor['ms']:.3f} ms; " + ", ".join(
            f"{s} {r['ms']:.3f} ms" if r.get("status") == "ok" else f"{s} {r.get('status')}"
            for s, r in res.items()) + (f"; best peer {best}" if best else "")
            + (f"; megakernel logits vs eager {mk_err:.3g}" if mk_err is not None else "")
            + f" ({time.perf_counter() - t0:.0f} s)")
        if rank == 0 and world == 1:
            write_json(report, out_path)        # partial results survive a time limit

    if world > 1:
        import torch.distributed as dist
        gathered = [None] * world
        dist.all_gather_object(gathered, report)
        report = merge_ranks(gathered)
    if rank != 0:
        return 0
    report["complete"] = True
    emit(report, out_path, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
