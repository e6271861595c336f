"""Generate tokens with mk, on one process or tensor-parallel under torchrun.

    python launch/generate.py --prompt-ids 1,2,3 --max-new-tokens 16
    torchrun --nproc-per-node 8 launch/generate.py --model /ckpt/Llama-3.3-70B --prompt "Hello"

Without --model it runs the tiny random checkpoint (mk.tiny). With --json, rank 0 prints exactly
one JSON object on the last line of stdout: {"tokens": [[new ids of seq 0], ...]}. Everything
else (device, backend, progress) goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

# The checkout this script lives in comes first: an mk installed from another copy must not shadow it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import mk  # noqa: F401, E402

import torch

from mk import dist as mkdist
from mk.engine import available_backends

DEFAULT_PROMPTS = [[1, 15, 27, 3, 99, 42, 7], [1, 100, 5]]
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
          "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class UsageError(Exception):
    pass


def log(msg: str) -> None:
    if mkdist.rank() == 0:
        print(f"[mk] {msg}", file=sys.stderr, flush=True)


def parse_ids(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(
            f"--prompt-ids {text!r}: expected comma-separated token ids such as 1,2,3 (no empty prompt)")
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids {text!r}: not a list of integers") from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"--prompt-ids {text!r}: token ids must be >= 0")
    return ids


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="HF Llama checkpoint directory (default: the tiny random checkpoint)")
    p.add_argument("--prompt-ids", type=parse_ids, action="append", default=None, metavar="IDS",
                   help="comma-separated token ids of one prompt; repeat for several sequences")
    p.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                   help="prompt text (needs the checkpoint's tokenizer and transformers); repeatable")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--backend", default="reference", choices=available_backends())
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS token")
    p.add_argument("--max-tokens-per-step", type=int, default=None,
                   help="token budget of one step (chunks long prefills)")
    p.add_argument("--overlap", choices=("ahead", "plan", "off"), default="ahead",
                   help="with the megakernel backend: 'ahead' (default) plans step n + 1 while "
                        "step n runs and queues it on the device behind step n; 'plan' plans it "
                        "while step n runs and launches it once step n is read back; 'off' one "
                        "step at a time (the tokens are the same)")
    p.add_argument("--no-overlap", action="store_true", help="the same as --overlap off")
    p.add_argument("--page-size", type=int, default=None, help="KV cache page size in tokens")
    p.add_argument("--num-kv-pages", type=int, default=None, help="KV cache pages per rank")
    p.add_argument("--device", default=None, help="torch device (default: cuda:LOCAL_RANK, else cpu)")
    p.add_argument("--json", action="store_true",
                   help='print {"tokens": [[...], ...]} as the last line of stdout (rank 0)')
    args = p.parse_args(argv)
    if args.prompt_ids and args.prompt:
        p.error("give either --prompt-ids or --prompt, not both")
    if args.prompt is not None and any(not t for t in args.prompt):
        p.error("--prompt: empty prompt text")
    if args.max_new_tokens < 0:
        p.error(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        p.error(f"--temperature must be >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        p.error(f"--top-p must lie in (0, 1], got {args.top_p}")
    return args


def load_tokenizer(model_dir: Path, required: bool):
    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        if required:
            raise UsageError(f"--prompt needs a tokenizer, but {model_dir} has none of "
                             f"{', '.join(TOKENIZER_FILES)}; pass token ids with --prompt-ids")
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        if required:
            raise UsageError("--prompt needs the transformers package to tokenize "
                             "(pip install transformers), or pass token ids with --prompt-ids") from None
        return None
    return AutoTokenizer.from_pretrained(str(model_dir))


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device) if args.device else mkdist.default_device()
    mkdist.init_distributed(device)
    try:
        return run(args, device)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, KeyError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        mkdist.destroy()


def run(args, device: torch.device) -> int:
    from mk.engine import Engine

    if args.model is None:
        from mk.tiny import default_model_config, tiny_checkpoint
        model_dir = Path(tiny_checkpoint(config=default_model_config(args.backend)))
        log(f"no --model: using the tiny random checkpoint {model_dir}")
    else:
        model_dir = Path(args.model)
        if not model_dir.is_dir():
            raise UsageError(f"--model {model_dir}: not a directory")

    tokenizer = load_tokenizer(model_dir, required=bool(args.prompt))
    if args.prompt:
        prompts = [tokenizer(t)["input_ids"] for t in args.prompt]
    else:
        prompts = args.prompt_ids or DEFAULT_PROMPTS

    world = mkdist.world_size()
    where = f"GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else \
        "CPU (no GPU: slow, exact)" if not torch.cuda.is_available() else "CPU"
    log(f"backend {args.backend} on {where} ({device}), TP {world}, dtype {args.dtype}")

    kernel_kw = {k: v for k, v in dict(page_size=args.page_size, num_kv_pages=args.num_kv_pages).items()
                 if v is not None}
    engine = Engine.from_pretrained(model_dir, backend=args.backend, dtype=DTYPES[args.dtype],
                                    device=device, **kernel_kw)
    outs = engine.generate(prompts, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                           seed=args.seed, ignore_eos=args.ignore_eos,
                           max_tokens_per_step=args.max_tokens_per_step,
                           overlap=({"ahead": True, "plan": "plan", "off": False}
                                    [args.overlap] if not args.no_overlap else False))
    if mkdist.rank() != 0:
        return 0
    stats = engine.last_stats
    log(stats.summary())
    if args.json:
        sys.stdout.flush()
        print(json.dumps({"tokens": outs, "stats": {
            **dataclasses.asdict(stats), "new_tokens_per_s": round(stats.new_tokens_per_s, 3),
            "tokens_per_s": round(stats.tokens_per_s, 3)}}), flush=True)
        return 0
    for i, (p, o) in enumerate(zip(prompts, outs)):
        print(f"--- sequence {i}: {len(p)} prompt tokens, {len(o)} new tokens")
        if tokenizer is not None:
            print(f"prompt: {tokenizer.decode(p)!r}")
            print(f"output: {tokenizer.decode(o)!r}")
        print(f"prompt ids: {p}")
        print(f"new ids:    {o}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
