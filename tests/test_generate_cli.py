"""launch/generate.py as a user runs it: a subprocess from the repository root, no installation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def generate(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, MK_NO_PROGRESS="1")
    # run as a plain script: `import mk` must work from the checkout without installation
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, str(ROOT / "launch" / "generate.py"), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def last_json(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_default_tiny_model_json():
    p = generate("--json", "--max-new-tokens", "8", "--ignore-eos")
    out = last_json(p)
    tokens = out["tokens"]
    assert len(tokens) >= 1 and all(len(t) == 8 for t in tokens)
    assert all(isinstance(t, int) for seq in tokens for t in seq)
    assert "backend reference" in p.stderr and "cpu" in p.stderr.lower()
    # the run's throughput: every new token counted, one step per new token here (the prompts
    # fit one step), the reference backend reports no host-planning share
    stats = out["stats"]
    assert stats["sequences"] == len(tokens) and stats["new_tokens"] == 8 * len(tokens)
    assert stats["steps"] == 8 and stats["prepare_s"] is None and stats["wall_s"] > 0
    assert stats["launch_s"] is None
    assert stats["new_tokens_per_s"] == pytest.approx(stats["new_tokens"] / stats["wall_s"],
                                                      rel=1e-2)
    assert f"{stats['new_tokens']} new tokens in 8 steps" in p.stderr and "tokens/s" in p.stderr


def test_prompt_ids_repeated_one_list_per_sequence(tmp_path):
    p = generate("--json", "--max-new-tokens", "5", "--dtype", "float32",
                 "--prompt-ids", "1,2,3", "--prompt-ids", "7", "--prompt-ids", "9,8,7,6,5,4")
    tokens = last_json(p)["tokens"]
    assert len(tokens) == 3 and all(1 <= len(t) <= 5 for t in tokens)
    # a sequence's tokens do not depend on its batch mates; runs from another cwd work too
    alone = last_json(generate("--json", "--max-new-tokens", "5", "--dtype", "float32",
                               "--prompt-ids", "7", cwd=tmp_path))["tokens"]
    assert alone == [tokens[1]]
    # --no-overlap / --overlap plan (one step at a time / planned ahead; the reference backend
    # has no split step anyway: the engine takes the options and gives the same tokens)
    for flags in (["--no-overlap"], ["--overlap", "plan"]):
        one = last_json(generate("--json", "--max-new-tokens", "5", "--dtype", "float32",
                                 "--prompt-ids", "1,2,3", "--prompt-ids", "7", "--prompt-ids",
                                 "9,8,7,6,5,4", *flags))["tokens"]
        assert one == tokens, flags


def test_human_readable_output():
    p = generate("--max-new-tokens", "3", "--prompt-ids", "4,5")
    assert p.returncode == 0, p.stderr
    assert "sequence 0" in p.stdout and "new ids" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["--backend", "nope"], "invalid choice: 'nope'"),
    (["--overlap", "always"], "invalid choice: 'always'"),
    (["--prompt-ids", ""], "no empty prompt"),
    (["--prompt-ids", "1,,2"], "no empty prompt"),
    (["--prompt-ids", "1,x"], "not a list of integers"),
    (["--prompt-ids", "1,99999999"], "outside [0,"),
    (["--model", "/nonexistent/ckpt"], "not a directory"),
])
def test_bad_args_fail_clearly(args, message):
    p = generate("--json", "--max-new-tokens", "2", *args)
    assert p.returncode != 0
    assert message in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def checkpoint_with_tokenizer(tmp_path) -> Path:
    """A random HF checkpoint plus a word-level tokenizer (tokenizer.json) over its vocabulary."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from conftest import TINY_MHA, make_hf_checkpoint
    ckpt, _ = make_hf_checkpoint(tmp_path, **TINY_MHA)
    words = ["<unk>", "hello", "world"] + [f"w{i}" for i in range(TINY_MHA["vocab_size"] - 3)]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"}))
    return ckpt


def test_text_prompts_use_the_checkpoint_tokenizer(tmp_path):
    pytest.importorskip("transformers")
    ckpt = checkpoint_with_tokenizer(tmp_path / "tok")
    by_text = last_json(generate("--model", str(ckpt), "--json", "--max-new-tokens", "4",
                                 "--prompt", "hello world", "--prompt", "w5 w6 w7"))["tokens"]
    by_ids = last_json(generate("--model", str(ckpt), "--json", "--max-new-tokens", "4",
                                "--prompt-ids", "1,2", "--prompt-ids", "8,9,10"))["tokens"]
    assert by_text == by_ids
    p = generate("--model", str(ckpt), "--max-new-tokens", "4", "--prompt", "hello world")
    assert p.returncode == 0, p.stderr
    assert "prompt: 'hello world'" in p.stdout and "output: 'w" in p.stdout


def test_text_prompt_without_tokenizer_fails_clearly(tmp_path):
    from conftest import TINY_MHA, make_hf_checkpoint
    ckpt, _ = make_hf_checkpoint(tmp_path, **TINY_MHA)
    p = generate("--model", str(ckpt), "--max-new-tokens", "2", "--prompt", "hello")
    assert p.returncode != 0
    assert "needs a tokenizer" in p.stderr and "--prompt-ids" in p.stderr
