"""Tensor parallelism on the CPU (gloo): torchrun with 2 and 4 ranks against one process.

GQA_LLAMA3 has 2 KV heads, so TP 4 replicates them; TIED_HEADDIM shards a tied vocabulary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import GQA_LLAMA3, TIED_HEADDIM, make_hf_checkpoint
from mk.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tp_worker  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[3, 17, 45, 2, 99, 120, 7], [7], [11, 12, 13, 14, 15]]
NEW_TOKENS = 16


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", MK_NO_PROGRESS="1")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-4000:]}"
    return p


def single_process_tokens(ckpt) -> list[list[int]]:
    engine = Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", progress=False)
    return engine.generate(PROMPTS, max_new_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    return make_hf_checkpoint(tmp_path_factory.mktemp("gqa"), **GQA_LLAMA3)[0]


@pytest.mark.parametrize("nproc", [2, 4])
def test_generate_cli_tp_matches_single_process(gqa, nproc):
    args = ["launch/generate.py", "--model", str(gqa), "--json", "--dtype", "float32", "--ignore-eos",
            "--max-new-tokens", str(NEW_TOKENS)]
    for p in PROMPTS:
        args += ["--prompt-ids", ",".join(map(str, p))]
    out = torchrun(nproc, *args)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, f"only rank 0 prints, got:\n{out.stdout}"
    assert json.loads(lines[-1])["tokens"] == single_process_tokens(gqa)
    assert f"TP {nproc}" in out.stderr


def test_tp_logits_and_sampling_match(tmp_path):
    ckpt = make_hf_checkpoint(tmp_path, **TIED_HEADDIM)[0]
    torchrun(2, "tests/tp_worker.py", str(ckpt), str(tmp_path / "tp.pt"))
    got = torch.load(tmp_path / "tp.pt")
    assert got["world"] == 2
    engine = Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", page_size=4,
                                    num_kv_pages=64, progress=False)
    torch.testing.assert_close(got["logits"], tp_worker.run_step(engine), atol=1e-5, rtol=0)
    assert got["sampled"] == engine.generate(tp_worker.SAMPLE_PROMPTS, **tp_worker.SAMPLE_KW)
