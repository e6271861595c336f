"""Run under torchrun by tests/test_tp.py: one TP step and a sampled generation on every rank.

    python -m torch.distributed.run --standalone --nproc-per-node N tests/tp_worker.py CKPT OUT.pt

Rank 0 saves {"logits": [num_seqs, V], "sampled": [[...], ...]}; every rank checks that its
logits and tokens equal rank 0's.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from mk import dist as mkdist  # noqa: E402
from mk.batch import SeqChunk, StepBatch  # noqa: E402
from mk.engine import Engine  # noqa: E402

# Shared with test_tp.py: a batch mixing a prefill chunk at start_pos > 0 and decodes.
PREFIX = [[5, 6, 7, 8, 9], [1, 2]]
STEP = [[10, 11, 12], [3]]
SAMPLE_PROMPTS = [[5, 6, 7], [9, 10, 11, 12]]
SAMPLE_KW = dict(max_new_tokens=8, ignore_eos=True, temperature=0.8, top_k=50, top_p=0.95, seed=5)


def run_step(engine: Engine) -> torch.Tensor:
    tables = [engine.pages.allocate(("w", i), len(p) + len(s)) for i, (p, s) in enumerate(zip(PREFIX, STEP))]
    engine.step(StepBatch([SeqChunk(p, 0, t) for p, t in zip(PREFIX, tables)]))
    logits = engine.step(StepBatch([SeqChunk(s, len(p), t) for p, s, t in zip(PREFIX, STEP, tables)]))
    for i in range(len(PREFIX)):
        engine.pages.free(("w", i))
    return logits


def main():
    ckpt, out = sys.argv[1], sys.argv[2]
    mkdist.init_distributed(torch.device("cpu"))
    engine = Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", page_size=4,
                                    num_kv_pages=64, progress=False)
    logits = run_step(engine)
    sampled = engine.generate(SAMPLE_PROMPTS, **SAMPLE_KW)
    mine = torch.cat([logits.flatten(), torch.tensor([t for s in sampled for t in s], dtype=torch.float32)])
    ref = mine.clone()
    dist.broadcast(ref, src=0)
    assert torch.equal(mine, ref), f"rank {dist.get_rank()} disagrees with rank 0"
    if dist.get_rank() == 0:
        torch.save({"logits": logits, "sampled": sampled, "world": dist.get_world_size()}, out)
    mkdist.destroy()


if __name__ == "__main__":
    main()
